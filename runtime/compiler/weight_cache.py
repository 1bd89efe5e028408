"""Packed weights in a cache file instead of anonymous memory: the packer `compile_graph` hands
to kernels (`Kernel.pack`), after TFLite's XNNPACK weight cache.

One file per model and packing options (`cache_key`). A value packed for the first
time is written into the file being built and handed back as a read-only view of
that file, mapped shared: the anonymous copy that made it goes at once. A value
the file already holds is handed back without being made. `commit` publishes the
file (atomically: see cache_file.py), with the entries of an older file kept, so
a later session, in this process or another, maps it and packs nothing.

The cache never fails a session: a file that is stale, truncated or corrupt is
rebuilt, and a directory that cannot be written (read-only, full, no mmap)
turns the cache off for the session with one warning. A file whose views a plan
holds and that is truncated or rewritten in place afterwards (by someone else:
nnrun only ever renames a new file into place) fails the session's next run
instead (`files`: the session checks them), since a read of its views could end
the process.
"""

import hashlib
import os
import threading
import warnings

import numpy as np

from .. import __version__
from ..cache_file import DTYPES, FORMAT_VERSION, STAMP_SUFFIX, CacheFile, CacheFileError, CacheWriter
from .release import mapped_weights

SAMPLE = 64  # bytes of each weight's start and end that the key hashes


def default_directory():
    """$NNRUN_WEIGHT_CACHE, else $XDG_CACHE_HOME/nnrun/weights, else ~/.cache/nnrun/weights."""
    if os.environ.get("NNRUN_WEIGHT_CACHE"):
        return os.environ["NNRUN_WEIGHT_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nnrun", "weights")


def cache_key(graph, disabled_passes=()):
    """What makes the packed bytes what they are, as text.

    The model's content is hashed without reading its weights, so that a warm start
    stays instant: every byte of each file outside the weights' payloads (the graph's
    structure: ops, attributes, names, shapes, dtypes, where each payload lies), each
    payload's length and its first and last 64 bytes, and the file's size and
    modification time. A weight edited in place keeps none of these unchanged unless
    its first and last bytes and the file's mtime are all restored on purpose; any other
    change (another model, a re-export, a different file at the same path) changes the
    key. nnrun's version, the cache format and the disabled passes complete it: each can
    change what a kernel packs. The bytes are read with pread, not through the mapping:
    touching a weight's first and last bytes there would make its pages (and with the
    kernel's fault-around, its neighbours') resident: 1.9 of mediapipe's iris model's 2.6 MB.
    """
    h = hashlib.sha256()
    by_source = {}
    for w in mapped_weights(graph):
        by_source.setdefault(id(w.source), (w.source, []))[1].append(w)
    sources = list(by_source.values())
    if graph.source is not None and id(graph.source) not in by_source:
        sources.insert(0, (graph.source, []))
    for source, weights in sources:
        h.update(f"file:{source.size}:{_mtime(source)}".encode())
        spans = sorted({(w.offset, w.nbytes) for w in weights})
        position = 0
        for offset, nbytes in spans:
            end = offset + nbytes
            if offset > position:
                _hash_bytes(h, source, position, offset)
            h.update(f"payload:{offset}:{nbytes}".encode())
            _hash_bytes(h, source, offset, min(end, offset + SAMPLE))
            _hash_bytes(h, source, max(offset, end - SAMPLE), end)
            position = max(position, end)
        _hash_bytes(h, source, position, source.size)
    return (f"model={h.hexdigest()};nnrun={__version__};format={FORMAT_VERSION};numpy={np.__version__};"
            f"disabled={','.join(sorted(disabled_passes))}")


def _hash_bytes(h, source, start, end, chunk=1 << 20):
    """h.update with bytes [start, end) of `source`, read from its file (MappedFile.read) a chunk
    at a time: no copy of a long run of structure (typed-field tensors) at once."""
    for at in range(start, end, chunk):
        h.update(source.read(at, min(end, at + chunk)))


def list_directory(directory):
    """The cache files of `directory`: (path, bytes, seconds since written, label or a reason)."""
    import time

    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".nnw"):
            continue
        path = os.path.join(directory, name)
        try:
            age = time.time() - os.stat(path).st_mtime
            size = os.path.getsize(path)
        except OSError:
            continue
        try:
            label = CacheFile(path, None).label or "(no label)"
        except CacheFileError as e:
            label = f"(invalid: {e})"
        found.append((path, size, age, label))
    return found


def model_origin(path):
    """A model file's identity as the cache records it: {"size", "mtime_ns"}; {} when unknown."""
    try:
        stat = os.stat(path)
    except (OSError, TypeError):
        return {}
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _mtime(source):
    """The mtime of the file mapped (not of whatever has its path now), or "-" for bytes."""
    file = getattr(source, "file", None)
    return str(file.mtime_ns) if file is not None else "-"


class WeightCache:
    """The packer of one model's plans: values by name, from the cache file or into it."""

    def __init__(self, directory, key, label="", origin=None, write_back_bytes=None):
        self.key = key
        self.label = label  # the model's path
        self.origin = origin or {}  # the model file's size and mtime: what tells a superseded file
        self.directory = directory
        self.write_back_bytes = write_back_bytes  # see CacheWriter: set under a memory budget
        self.path = os.path.join(directory, hashlib.sha256(key.encode()).hexdigest()[:32] + ".nnw")
        self.made = 0  # values packed and written this session
        self.held = 0  # values the file already held
        self.cached_bytes = 0  # bytes handed out as views of a cache file
        self.off_reason = None  # set when the cache turned itself off
        self._lock = threading.RLock()
        self._writer = None
        self._file = None
        self._file_groups = None
        self._opened = False  # the file is opened at the first value asked for: at PREPARE
        # The OpenFiles of the cache files whose views were handed out (each file committed, each
        # file read): what must not change while a plan reads them. Replaced, never changed in place.
        self.files = ()

    def _holding(self, file):
        if all(f is not file for f in self.files):
            self.files = (*self.files, file)

    def _open(self):
        self._opened = True
        try:
            self._file = CacheFile(self.path, self.key)
            self._file.verify()  # every checksum at once, on every core, before any value is used
        except CacheFileError:
            self._file = None  # missing, stale or damaged: what is asked for is made and written anew

    def pack(self, name, make):
        """The value `name` (an array or a tuple of arrays): the file's copy, or `make`'s, kept."""
        with self._lock:
            if not self._opened:
                self._open()
            held = self._held(name)
            if held is not None:
                self.held += 1
                return held
            value = make() if callable(make) else make
            if self.off_reason is not None or (isinstance(value, (tuple, list)) and not value):
                return value
            self.made += 1
            try:
                if isinstance(value, (tuple, list)):
                    kept = tuple(self._keep(f"{name}#{k}/{len(value)}", v) for k, v in enumerate(value))
                else:
                    kept = self._keep(name, value)
            except (OSError, ValueError) as e:
                self._turn_off(e)
                return value
            return kept

    def _held(self, name):
        if self._file is None:
            return None
        try:
            if name in self._file:
                view = self._file.array(name)
                self.cached_bytes += view.nbytes
                self._holding(self._file.file)
                return view
            parts = self._groups().get(name)
            if parts:
                views = tuple(self._file.array(part) for part in parts)
                self.cached_bytes += sum(v.nbytes for v in views)
                self._holding(self._file.file)
                return views
        except CacheFileError:
            self._file, self._file_groups = None, None  # damaged: made again, the file rebuilt
        return None

    def _groups(self):
        """The file's tuple values, complete ones only: name -> the names of its parts in order."""
        if self._file_groups is None:
            found = {}
            for entry in self._file.names():
                base, sep, position = entry.rpartition("#")
                k, _, n = position.partition("/")
                if sep and k.isdigit() and n.isdigit():
                    found.setdefault((base, int(n)), {})[int(k)] = entry
            self._file_groups = {base: [parts[k] for k in range(n)] for (base, n), parts in found.items()
                                 if len(parts) == n}
        return self._file_groups

    def _keep(self, name, array):
        if not isinstance(array, np.ndarray) or array.dtype.str not in DTYPES:
            return array
        if self._writer is None:
            self._writer = CacheWriter(self.path, self.key, self.label, self.origin, self.write_back_bytes)
        if name in self._writer:
            return array
        view = self._writer.add_mapped(name, array)
        self.cached_bytes += view.nbytes
        return view

    def commit(self):
        """Publish what was packed since the last commit, with the older file's entries kept."""
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is None:
                return
            try:
                if self._file is not None:
                    for name in self._file.names():
                        if name not in writer:
                            writer.add(name, self._file.array(name))
                writer.commit()
                self._holding(writer.file)  # the file the views add_mapped handed out map
                self._file, self._file_groups = CacheFile(self.path, self.key), None
            except (OSError, ValueError, CacheFileError) as e:
                writer.abort()
                self._turn_off(e)
                return
            self._prune_superseded()

    def _prune_superseded(self):
        """Remove the files written for an earlier version of this model's file: same path, another
        size or mtime. No session can ask for them again, and a model re-exported often would
        otherwise leave one file per export. Files for other options of the same model stay."""
        if not self.label or not self.origin:
            return
        for path, _, _, _ in list_directory(self.directory):
            if os.path.abspath(path) == os.path.abspath(self.path):
                continue
            try:
                other = CacheFile(path, None)
            except CacheFileError:
                continue
            if other.label == self.label and other.origin and other.origin != self.origin:
                for stale in (path, path + STAMP_SUFFIX):
                    try:
                        os.remove(stale)
                    except OSError:
                        pass

    @property
    def state(self):
        """"off" (turned off), "miss" (something was packed and written), "hit" (everything came
        from the file) or "unused" (nothing to pack)."""
        if self.off_reason is not None:
            return "off"
        if self.made:
            return "miss"
        return "hit" if self.held else "unused"

    def abort(self):
        """Drop what was packed since the last commit (PREPARE failed); views of it stay valid."""
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.abort()

    def _turn_off(self, error):
        if self.off_reason is None:
            self.off_reason = f"{type(error).__name__}: {error}"
            warnings.warn(f"nnrun: the weight cache at {self.path} is off for this session "
                          f"({self.off_reason}); packed weights stay in memory", RuntimeWarning, stacklevel=3)

