"""The spill file of one run state: activations written out between two uses and read back.

The file is unlinked from the start (nothing is left behind, whatever ends the process) and lies
on a disk: $NNRUN_SPILL_DIR, else the system's temporary directory unless that is in memory
(tmpfs, ramfs: a spill there would cost the memory it frees), else the user's cache directory.

It is written and read with direct I/O (O_DIRECT: from and into the arena, past the page cache,
so a spill costs no memory beside the arena; the plan put every spilled part at a page-aligned
offset, whole pages long). Both go on a thread of its own, one at a time: a write while the step
after the activation's last use runs, a read while the step before its next use runs; the step
after each waits for it. Where the filesystem refuses direct I/O the file is written through the
page cache, and each write is synced and dropped from it before the next transfer.
"""

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


def filesystem_of(path):
    """The type of the filesystem `path` lies on (from /proc/self/mountinfo), or None."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    path = os.path.realpath(path)
    best, kind = "", None
    for fields in mounts:
        point = fields[4].replace("\\040", " ")
        separator = fields.index("-")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[separator + 1]
    return kind


def spill_directory():
    chosen = os.environ.get("NNRUN_SPILL_DIR")
    if chosen:
        return chosen
    temporary = tempfile.gettempdir()
    if filesystem_of(temporary) not in MEMORY_FILESYSTEMS:
        return temporary
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "nnrun", "spill")
    os.makedirs(directory, exist_ok=True)
    return directory


def _bytes(view):
    return memoryview(view.reshape(-1).view(np.uint8))


def _open(directory):
    """(descriptor, whether direct): an unnamed file in `directory`, direct I/O where it allows."""
    for flags in (os.O_TMPFILE | os.O_RDWR | getattr(os, "O_DIRECT", 0), os.O_TMPFILE | os.O_RDWR):
        try:
            return os.open(directory, flags, 0o600), bool(flags & getattr(os, "O_DIRECT", 0))
        except (OSError, AttributeError):
            continue
    fd, path = tempfile.mkstemp(dir=directory, prefix="nnrun-spill-")
    os.unlink(path)
    return fd, False


class SpillFile:
    def __init__(self, directory=None):
        self.fd, self.direct = _open(directory or spill_directory())
        self._io = ThreadPoolExecutor(1, thread_name_prefix="nnrun-spill")
        self.written_bytes = 0
        self.read_bytes = 0

    def write(self, data, offset):
        """Start writing the arena bytes `data` (uint8, whole pages) at `offset`; a future to wait on
        before the arena reuses them."""
        self.written_bytes += data.nbytes
        return self._io.submit(self._transfer, os.pwritev, data, offset)

    def read_back(self, data, offset):
        """Start reading the bytes at `offset` into the arena bytes `data`; a future to wait on."""
        self.read_bytes += data.nbytes
        return self._io.submit(self._transfer, os.preadv, data, offset)

    def _transfer(self, call, data, offset):
        view = _bytes(data)
        done = 0
        while done < len(view):
            moved = call(self.fd, [view[done:]], offset + done)
            if moved <= 0:
                raise OSError(f"the spill file ended at byte {offset + done}, {len(view) - done} bytes short")
            done += moved
        if not self.direct:  # through the page cache: out of it before the next transfer
            if call is os.pwritev:
                os.fdatasync(self.fd)
            os.posix_fadvise(self.fd, offset, len(view), os.POSIX_FADV_DONTNEED)

    def __del__(self):
        try:
            self._io.shutdown(wait=False)
            os.close(self.fd)
        except (OSError, AttributeError):
            pass
