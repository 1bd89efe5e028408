"""The pages of mapped arrays: where an array's bytes lie in memory, and the calls that bring them in
ahead of use (MADV_WILLNEED) or hand them back after it (MADV_PAGEOUT).

A weight that is a view of a file mapping (the model file's, or the weight cache file's) costs
memory only while its pages are resident, and they are clean: dropping them costs nothing but a
read when they are needed again. That is what running within a memory budget rests on. An
array of the process's own (numpy's memory) has no file behind it and cannot be dropped.

Handing pages back takes three calls. MADV_PAGEOUT (Linux 5.4) reclaims the pages of the
range it can isolate; MADV_DONTNEED unmaps the others (one another CPU has just faulted in stays
mapped through a pageout); posix_fadvise(POSIX_FADV_DONTNEED) on the file then drops what is left
from the page cache, pages this process never mapped too (a weight cache file it has just
written). Only pages no other process maps go, so processes sharing a model do not take its
pages from each other. Then a memory cgroup stops charging them. The file is known from the
mapping: a `FileMapping` records its path, offset and `OpenFile`.

An `OpenFile` is a descriptor of the mapped file, kept as long as a mapping of it lives, with the
file's size and modification time when it was mapped. Reads that must not go through the mapping
use it: a file truncated after it was mapped makes a read of a page past its new end through the
mapping raise SIGBUS, which ends the process; a pread of it returns short, which is an error to
raise. It is the file the mapping maps, whatever is at its path now (a file replaced by a rename
keeps the old one). `OpenFile.changed` tells whether the file was truncated or rewritten in place
since (one fstat): sessions ask before each run.
"""

import ctypes
import ctypes.util
import mmap
import os
import stat
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from .errors import ModelFileChangedError

PAGE = mmap.PAGESIZE
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_PAGEOUT = 21
WILLNEED_CHUNK = 2 << 20
DIRECT_IO_ALIGNMENT = 4096  # of offsets and lengths in a file opened with O_DIRECT, and of the memory


class OpenFile:
    """An open descriptor of a mapped file (closed when the last holder goes), and the file's
    size and modification time when it was mapped. `what` names the file in messages: "model
    file", "external data file", "weight cache file"."""

    __slots__ = ("fd", "path", "what", "size", "mtime_ns", "_fds", "__weakref__")

    def __init__(self, fd, path, what="file"):
        self.fd, self.path, self.what = fd, path, what
        self._fds = [fd]  # with the direct-I/O descriptor once opened: closed together
        weakref.finalize(self, _close_all, self._fds)
        self.remember()

    def remember(self):
        """Take the file as it is now as the file that was mapped (a file just written)."""
        now = os.fstat(self.fd)
        self.size, self.mtime_ns = now.st_size, now.st_mtime_ns

    def changed(self):
        """What changed in the file since it was mapped, in words, or None: its size (truncated or
        grown), or its modification time (rewritten in place). A rename over its path is not a
        change of it, nor a change of its owner or mode. One fstat: about a microsecond."""
        now = os.fstat(self.fd)
        if now.st_size != self.size:
            return f"size {self.size} -> {now.st_size} bytes"
        if now.st_mtime_ns != self.mtime_ns:
            return f"rewritten in place (same size, modification time {self.mtime_ns} -> {now.st_mtime_ns} ns)"
        return None

    def check(self):
        """Raise ModelFileChangedError if the file changed since it was mapped."""
        change = self.changed()
        if change is not None:
            raise ModelFileChangedError(f"{self.what} {self.path} changed after the session was created: "
                                        f"{change}; make a new session", path=self.path)

    def read_into(self, buffer, offset, least=None):
        """Fill the writable `buffer` from byte `offset` of the file with pread, not through the mapping;
        returns the bytes read. Fewer than `least` (default: all of it) means the file is now shorter
        than when it was mapped: ModelFileChangedError."""
        view = memoryview(buffer).cast("B")
        least = len(view) if least is None else least
        done = 0
        while done < least:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got <= 0:
                raise ModelFileChangedError(
                    f"{self.what} {self.path} ends at byte {offset + done}, inside a weight mapped from it "
                    f"(bytes {offset} to {offset + least}): it was truncated after the session was created; "
                    f"make a new session", path=self.path)
            done += got
        return done

    def direct_fd(self):
        """A descriptor of the same file for direct I/O (O_DIRECT: reads that pass the page cache by,
        so they leave nothing in memory to drop), opened once; None where the filesystem refuses it.
        Reopened through /proc/self/fd, so that it is this file even if another now has its path."""
        if len(self._fds) == 1:
            fd = None
            if hasattr(os, "O_DIRECT"):
                try:
                    fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_DIRECT)
                except OSError:
                    fd = None
            with _direct_lock:
                if len(self._fds) == 1:
                    self._fds.append(fd)
                elif fd is not None:
                    os.close(fd)
        return self._fds[1]


_direct_lock = threading.Lock()


def _close_all(fds):
    for fd in fds:
        if fd is not None:
            os.close(fd)


FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"))


def kind_of(mode):
    """What a file that is not a regular one is, in words ("a FIFO (named pipe)"), or None."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in FILE_KINDS if test(mode)), f"not a regular file (mode {mode:o})")


class NotRegularFile(OSError):
    """`open_regular`'s refusal: the path is `kind` ("a FIFO (named pipe)")."""

    def __init__(self, kind):
        super().__init__(f"it is {kind}, not a regular file")
        self.kind = kind


def open_regular(path):
    """A descriptor of `path` open for reading, which must be a regular file (a symlink to one is).

    A FIFO, a device or a directory could block the open or a read forever, or never end:
    `NotRegularFile` names what it is, before anything is read. The file is opened without
    blocking and checked again by its descriptor, so one swapped in between is refused too.
    """
    kind = kind_of(os.stat(path).st_mode)
    if kind is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            kind = kind_of(os.fstat(fd).st_mode)
        except OSError:
            os.close(fd)
            raise
        if kind is None:
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
    raise NotRegularFile(kind)


class FileMapping(mmap.mmap):
    """A read-only mapping of (part of) a file that remembers which: `path`, `file_offset`, the
    offset in the file of its first byte, and `file`, the OpenFile it maps."""

    path = None
    file_offset = 0
    file = None


def map_file(file, length, offset=0):
    """A FileMapping of `length` bytes of the OpenFile `file` from `offset` (0: to its end)."""
    mapping = FileMapping(file.fd, length, access=mmap.ACCESS_READ, offset=offset)
    mapping.path, mapping.file_offset, mapping.file = file.path, offset, file
    return mapping


@dataclass(frozen=True)
class Region:
    """Whole pages of memory: [address, address + length), and where they lie in their file."""
    address: int
    length: int
    path: str = None
    file_offset: int = 0
    # The OpenFile, weakly: a region kept somewhere (a prefetch thread's table) keeps no file open.
    # While a plan that reads the region lives, its arrays keep the mapping, and the mapping the file.
    opened: object = field(default=None, compare=False, repr=False)

    @property
    def file(self):
        """The OpenFile of the region's mapping (what pread and fadvise use), or None: none known,
        or the mapping is gone."""
        return self.opened() if self.opened is not None else None


def region_of(array, inward=False):
    """The pages holding `array`'s bytes when they lie in a file mapping, else None (memory of
    the process's own, or a view of bytes). `inward` keeps only pages wholly inside the array:
    what may be dropped without touching a neighbour's bytes."""
    mapping = _mapping_of(array) if isinstance(array, np.ndarray) and array.nbytes else None
    if mapping is None:
        return None
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    if inward:
        first, last = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    else:
        first, last = start // PAGE * PAGE, -(-end // PAGE) * PAGE
    if last <= first:
        return None
    path = getattr(mapping, "path", None)
    offset = 0
    if path is not None:
        offset = mapping.file_offset + first - np.frombuffer(mapping, np.uint8).ctypes.data
    file = getattr(mapping, "file", None)
    return Region(first, last - first, path, offset, weakref.ref(file) if file is not None else None)


def _mapping_of(array):
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


class Pager:
    """madvise and mincore on regions (Linux; elsewhere every call does nothing)."""

    def __init__(self):
        self._libc = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            self._libc = libc
        except (OSError, AttributeError):
            pass
        self._pageout = MADV_PAGEOUT
        self.lock = threading.Lock()  # for callers: a check and a madvise that must not interleave

    def willneed(self, region):
        """Start reading the region's pages in (the kernel reads ahead; this does not wait for it).

        One madvise reads at most the device's readahead limit (a few MiB) of what it is asked
        for, so a larger region is asked for in chunks; and its pages are then in memory (or being
        read) when `read_in` reads them, which would otherwise read ahead past the region's end.
        """
        if self._libc is None:
            return
        for start in range(0, region.length, WILLNEED_CHUNK):
            self._libc.madvise(region.address + start, min(WILLNEED_CHUNK, region.length - start), MADV_WILLNEED)

    def touch(self, region):
        """Fault every page of the region in, returning once all are in memory (a byte of each page
        read by numpy, which leaves the GIL to other threads while the faults wait for the disk)."""
        if self._libc is None or region.length <= 0:
            return
        pages = np.frombuffer((ctypes.c_ubyte * region.length).from_address(region.address), np.uint8)
        np.bitwise_or.reduce(pages[::PAGE])

    def read_in(self, region, bounce):
        """Bring the region's pages into the page cache, returning once all are there: read with
        pread into `bounce` (a buffer of our own, reused chunk by chunk), not through the mapping,
        so that a file truncated since it was mapped raises ModelFileChangedError here instead of
        SIGBUS. A region of no known file is touched through the mapping."""
        file = region.file
        if file is None:
            if region.opened is None:
                self.touch(region)
            return  # else the mapping is gone with its file: nothing to read
        chunk = len(bounce)
        for start in range(0, region.length, chunk):
            length = min(chunk, region.length - start)
            # The region's last page may run past the file's end: only the file's bytes are due.
            due = max(0, min(length, file.size - (region.file_offset + start)))
            file.read_into(bounce[:length], region.file_offset + start, least=due)

    def drop(self, region):
        """Hand the region's pages back: unmapped, and out of the page cache."""
        if self._libc is None:
            return
        if self._libc.madvise(region.address, region.length, self._pageout) != 0 and self._pageout != MADV_DONTNEED:
            self._pageout = MADV_DONTNEED  # a kernel before 5.4
        # MADV_PAGEOUT leaves mapped a page it cannot isolate (one another CPU has just faulted
        # in): unmap every page, then drop from the page cache what is left.
        self._libc.madvise(region.address, region.length, MADV_DONTNEED)
        file = region.file
        if file is not None:
            os.posix_fadvise(file.fd, region.file_offset, region.length, os.POSIX_FADV_DONTNEED)

    def direct_fd(self, file):
        """A descriptor of the OpenFile `file` for direct I/O, or None where the filesystem refuses it."""
        return file.direct_fd()

    def resident_bytes(self, region):
        """How many of the region's bytes are in memory now (mincore), or None where unknown."""
        if self._libc is None:
            return None
        pages = region.length // PAGE
        vector = (ctypes.c_ubyte * max(pages, 1))()
        if self._libc.mincore(region.address, region.length, vector) != 0:
            return None
        return sum(v & 1 for v in vector[:pages]) * PAGE


PAGER = Pager()


def round_up(nbytes, alignment):
    return -(-nbytes // alignment) * alignment


def storage_bytes():
    """Bytes this process has had read from storage so far (/proc/self/io), or 0 where unknown."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
