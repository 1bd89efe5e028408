"""The weight cache's file: packed weights written once, then mapped read-only and shared.

A cache file holds named arrays for one key (what makes the packed bytes what they
are: the model's content, nnrun's and this format's versions, the options that
change packing). Its layout:

    header, 64 bytes    magic "NNRUNWC\\0", format version (u32), crc32 of the index (u32),
                        sha256 of the key (32 bytes), index offset (u64), index length (u64)
    payloads            each array's bytes, at an offset aligned to 64 bytes (to a page
                        for arrays of 64 KiB and more), so a view of it is aligned for
                        any dtype and BLAS
    index               JSON: the key, and per array its name, offset, nbytes, dtype,
                        shape and the checksum of its bytes (`checksum`)

A writer fills a temporary file beside the target and renames it into place
after fsync, so a reader never sees a half-written file and writers racing on
one key each publish a whole one (the last rename wins). A reader checks the
header, the index and every extent before it makes a view, and an array's checksum
when it first hands it out: a stale, truncated or corrupt file raises
`CacheFileError`, and the caller rebuilds it. Nothing here trusts a size or an
offset the file states before checking it against the file's length.

Checking every checksum costs a read of the whole file (about 10 ms per 100 MB
on one core), which would be most of a warm start. So once a file has passed, a
stamp beside it (`<file>.verified`) records its identity: device, inode, size,
mtime and ctime, in nanoseconds. A later reader whose file has the same identity
skips the checksums. Any write to the file changes its ctime, which no one can
set back (utime sets it to now), so a file written after its stamp fails the
match, with one exception: a write within the same tick of the filesystem's
clock (a few ms) as the stamped ctime. As git does with a "racily clean" index,
no stamp is written for a file whose ctime is less than `SETTLED_S` old: such a
file is checked in full until it has settled. What a stamp cannot see is a change
below the filesystem (a disk flipping bits); the header and the index are still
checked on every open.
"""

import hashlib
import json
import mmap
import os
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .paging import FileMapping, OpenFile, open_regular

MAGIC = b"NNRUNWC\0"
FORMAT_VERSION = 2  # 2: per-array block checksums instead of crc32
HEADER = struct.Struct("<8sII32sQQ")  # magic, version, index crc32, key digest, index offset, length
ALIGNMENT = 64
PAGE = 4096
LARGE = 64 << 10  # arrays this large start on a page
STAMP_SUFFIX = ".verified"
SETTLED_S = 2.0  # a file changed more recently than this is not stamped (see above)
DTYPES = frozenset(np.dtype(t).str for t in (
    np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
    np.int64, np.uint64, np.bool_))


class CacheMapping(FileMapping):
    """A mapping of a cache file: what `in_cache_file` recognises a cached array by."""


def in_cache_file(array):
    """Whether `array` views the bytes of a cache file (a CacheFile's or a CacheWriter's mapping)."""
    while isinstance(array, np.ndarray):
        array = array.base
    if isinstance(array, memoryview):
        array = array.obj
    return isinstance(array, CacheMapping)


class CacheFileError(Exception):
    """The file is not a valid cache file for this key: rebuild it."""


def checksum(data):
    """A Fletcher-style pair of 64-bit sums over 4 KiB blocks of little-endian words, and the
    tail bytes: [sum of the block sums, sum of each block sum times its position, tail].

    It reads memory at numpy's summing speed (about 10 GB/s; zlib's crc32 manages 2), so a
    warm start that checks 100 MB spends 10 ms on it, not 50. What it catches: any change to
    one word (the first sum), blocks swapped, shifted or zeroed (the second, which weighs a
    block by its position), a wrong length (the extents, before this). What it misses, as
    any 128-bit sum may: changes within one block that cancel exactly, such as two words
    swapped; a disk or a filesystem does not fail that way."""
    data = memoryview(data).cast("B")
    count = len(data) // 8
    words = np.frombuffer(data, "<u8", count=count)
    full = count // 512
    blocks = words[:full * 512].reshape(full, 512).sum(axis=1, dtype=np.uint64)
    rest = int(words[full * 512:].sum(dtype=np.uint64))
    positions = np.arange(1, full + 1, dtype=np.uint64)
    plain = int(blocks.sum(dtype=np.uint64)) + rest
    weighted = int((blocks * positions).sum(dtype=np.uint64)) + rest * (full + 1)
    return [plain % 2**64, weighted % 2**64, int.from_bytes(data[count * 8:], "little")]


def key_digest(key):
    return hashlib.sha256(key.encode()).digest()


def _aligned(offset, nbytes):
    step = PAGE if nbytes >= LARGE else ALIGNMENT
    return -(-offset // step) * step


class CacheWriter:
    """Writes arrays into a temporary file beside `path`; `commit` publishes it atomically."""

    def __init__(self, path, key, label="", origin=None, write_back_bytes=None):
        self.path = os.fspath(path)
        # Under a memory limit, dirty pages of the file being written count against it until the
        # disk has them: written back every `write_back_bytes`, they become pages the kernel may drop.
        self.write_back_bytes = write_back_bytes
        self._unsynced = 0
        self.key = key
        self.label = label  # what the file is for, shown to people (a model's path); not checked
        self.origin = origin or {}  # the model file's identity when written (its size, mtime); not checked
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        self._file = open(self._tmp, "w+b")  # readable too: add_mapped maps what it wrote
        # The file as its mappings know it, under the name it will have; its size and mtime are
        # taken again at commit, once it is written (`file`, for the check before a run).
        self.file = OpenFile(os.dup(self._file.fileno()), self.path, "weight cache file")
        self._file.write(b"\0" * HEADER.size)
        self._offset = HEADER.size
        self._entries = []
        self._names = set()

    def add(self, name, array, page=False):
        """Append `array` (C-contiguous copy if need be) under `name`; returns its offset.
        `page` starts it on a page, whatever its size (so that it can be mapped alone)."""
        if name in self._names:
            raise ValueError(f"array {name!r} added twice")
        array = np.ascontiguousarray(array)
        if array.dtype.str not in DTYPES:
            raise ValueError(f"dtype {array.dtype} cannot be cached")
        start = _aligned(self._offset, LARGE if page else array.nbytes)
        self._file.write(b"\0" * (start - self._offset))
        data = memoryview(array).cast("B") if array.nbytes else b""
        self._file.write(data)
        self._offset = start + array.nbytes
        self._unsynced += array.nbytes
        if self.write_back_bytes and self._unsynced >= self.write_back_bytes:
            self._file.flush()
            os.fdatasync(self._file.fileno())
            self._unsynced = 0
        self._entries.append({"name": name, "offset": start, "nbytes": array.nbytes, "dtype": array.dtype.str,
                              "shape": list(array.shape), "checksum": checksum(data)})
        self._names.add(name)
        return start

    def add_mapped(self, name, array):
        """Append `array` and return a read-only view of its bytes in this file, mapped shared:
        the copy the caller made can go, and the view stays valid once the file is renamed."""
        array = np.ascontiguousarray(array)
        start = self.add(name, array, page=True)
        if not array.nbytes:
            view = np.empty(array.shape, array.dtype)
        else:
            self._file.flush()
            region = CacheMapping(self._file.fileno(), array.nbytes, access=mmap.ACCESS_READ, offset=start)
            region.path, region.file_offset, region.file = self.path, start, self.file  # as it will be, committed
            view = np.frombuffer(region, dtype=array.dtype, count=array.size).reshape(array.shape)
        view.flags.writeable = False
        return view

    def __contains__(self, name):
        return name in self._names

    def commit(self):
        """Write the index and the header, fsync, and rename into place; returns the path."""
        index = json.dumps({"key": self.key, "label": self.label, "origin": self.origin, "entries": self._entries},
                           separators=(",", ":")).encode()
        index_offset = _aligned(self._offset, 0)
        self._file.write(b"\0" * (index_offset - self._offset))
        self._file.write(index)
        self._file.seek(0)
        self._file.write(HEADER.pack(MAGIC, FORMAT_VERSION, zlib.crc32(index), key_digest(self.key),
                                     index_offset, len(index)))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.file.remember()
        self._file.close()
        os.replace(self._tmp, self.path)
        _fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        return self.path

    def abort(self):
        """Drop the temporary file; the target is left as it was."""
        self._file.close()
        try:
            os.remove(self._tmp)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if kind is None:
            self.commit()
        else:
            self.abort()


def _fsync_directory(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not open directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CacheFile:
    """A cache file mapped read-only: its arrays as views of a shared file mapping.

    `key` None opens a file whatever its key (to list a cache directory)."""

    def __init__(self, path, key):
        self.path = os.fspath(path)
        try:
            fd = open_regular(self.path)  # a FIFO would block the open
        except OSError as e:
            raise CacheFileError(f"cannot open {self.path}: {e.strerror or e}") from None
        # Kept open with the mapping: the check before a run asks it whether the file changed.
        self.file = OpenFile(fd, self.path, "weight cache file")
        try:
            stat = os.fstat(fd)
            size = stat.st_size
            if size < HEADER.size:
                raise CacheFileError(f"{self.path} is {size} bytes, shorter than its header")
            self.size = size
            # The header and the index are read with pread, not through the mapping: a touch of
            # the mapping maps the pages around it too (fault-around), arrays' pages among them,
            # and a page mapped twice is one the process cannot hand back (MADV_PAGEOUT skips it).
            self._entries = self._read_index(key, lambda start, length: os.pread(fd, length, start))
            self._mmap = CacheMapping(fd, 0, access=mmap.ACCESS_READ)
            self._mmap.path, self._mmap.file = self.path, self.file
        except OSError as e:
            raise CacheFileError(f"cannot map {self.path}: {e.strerror or e}") from None
        self._identity = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        self._buffer = memoryview(self._mmap)
        self._checked = set()
        self._lock = threading.Lock()

    def _read_index(self, key, read):
        magic, version, index_crc, digest, index_offset, index_length = HEADER.unpack(read(0, HEADER.size))
        if magic != MAGIC:
            raise CacheFileError(f"{self.path} is not a cache file (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise CacheFileError(f"{self.path} has format {version}, this nnrun writes {FORMAT_VERSION}")
        if key is not None and digest != key_digest(key):
            raise CacheFileError(f"{self.path} was written for another key")
        if index_offset < HEADER.size or index_offset + index_length > self.size:
            raise CacheFileError(f"{self.path}: index at {index_offset} (+{index_length}) lies outside its "
                                 f"{self.size} bytes")
        index = read(index_offset, index_length)
        if len(index) != index_length:
            raise CacheFileError(f"{self.path}: the index is cut short")
        if zlib.crc32(index) != index_crc:
            raise CacheFileError(f"{self.path}: the index's checksum does not match")
        try:
            table = json.loads(index)
            if key is not None and table["key"] != key:
                raise CacheFileError(f"{self.path} was written for another key")
            self.key, self.label = str(table["key"]), str(table.get("label", ""))
            self.origin = table.get("origin") if isinstance(table.get("origin"), dict) else {}
            entries = {}
            for e in table["entries"]:
                entry = (int(e["offset"]), int(e["nbytes"]), str(e["dtype"]), tuple(int(d) for d in e["shape"]),
                         [int(v) for v in e["checksum"]])
                entries[str(e["name"])] = entry
        except (ValueError, KeyError, TypeError) as e:
            raise CacheFileError(f"{self.path}: the index is malformed ({e})") from None
        for name, (offset, nbytes, dtype, shape, _) in entries.items():
            if dtype not in DTYPES or any(d < 0 for d in shape):
                raise CacheFileError(f"{self.path}: array {name!r} has dtype {dtype} and shape {shape}")
            count = 1
            for d in shape:
                count *= d
            if count * np.dtype(dtype).itemsize != nbytes:
                raise CacheFileError(f"{self.path}: array {name!r} is {nbytes} bytes, its shape says otherwise")
            if offset % ALIGNMENT or offset < HEADER.size or offset + nbytes > index_offset:
                raise CacheFileError(f"{self.path}: array {name!r} at {offset} (+{nbytes}) is misplaced")
        return entries

    def names(self):
        return list(self._entries)

    def verify(self, workers=None):
        """Check every array's checksum now, on `workers` threads (numpy's sums release the GIL), unless
        the file's stamp says it passed as it is (see the module's docstring). Raises
        CacheFileError at the first mismatch; stamps the file when it passed and has settled."""
        if self._stamp() == self._identity:
            with self._lock:
                self._checked.update(self._entries)
            return
        todo = [name for name in self._entries if name not in self._checked]
        workers = workers or min(len(todo), os.cpu_count() or 1)
        if workers <= 1:
            for name in todo:
                self.array(name)
        else:
            with ThreadPoolExecutor(workers) as pool:
                for _ in pool.map(self.array, todo):
                    pass
        if time.time_ns() - self._identity[4] >= SETTLED_S * 1e9:
            self._write_stamp()

    def _stamp(self):
        try:
            with open(self.path + STAMP_SUFFIX) as f:
                return json.load(f).get("identity")
        except (OSError, ValueError, AttributeError):
            return None

    def _write_stamp(self):
        """Atomically, and silently not at all in a directory that cannot be written."""
        tmp = f"{self.path}{STAMP_SUFFIX}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"identity": self._identity}, f)
            os.replace(tmp, self.path + STAMP_SUFFIX)
        except OSError:
            try:
                os.remove(tmp)
            except OSError:
                pass

    def __contains__(self, name):
        return name in self._entries

    def nbytes(self):
        return sum(e[1] for e in self._entries.values())

    def array(self, name):
        """A read-only view of array `name`; its checksum is checked the first time it is asked for."""
        try:
            offset, nbytes, dtype, shape, crc = self._entries[name]
        except KeyError:
            raise CacheFileError(f"{self.path} has no array {name!r}") from None
        data = self._buffer[offset:offset + nbytes]
        if name not in self._checked:
            if checksum(data) != crc:
                raise CacheFileError(f"{self.path}: array {name!r} does not match its checksum")
            with self._lock:
                self._checked.add(name)
        view = np.frombuffer(data, dtype=np.dtype(dtype), count=nbytes // np.dtype(dtype).itemsize).reshape(shape)
        view.flags.writeable = False
        return view
