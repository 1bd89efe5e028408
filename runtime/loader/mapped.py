"""Mapped model files.

A `MappedFile` owns a read-only mmap of one file (or wraps caller-owned bytes).
An `ExternalData` (weights.py) names one tensor inside it. Nothing here reads a
weight byte, and `MappedFile.release` hands the pages of packed weights back to
the kernel (`madvise(MADV_DONTNEED)`), sparing pages that an unreleased weight
still shares.

Only a regular file is mapped: a FIFO, a device or a directory is refused before
a byte of it is read (`paging.open_regular`). The file's descriptor stays open
with the mapping (`MappedFile.file`, a `paging.OpenFile`): the structure is read
through it, and a session checks by it before each run that the file was not
truncated or rewritten since.
"""

import bisect
import mmap
import os

import numpy as np

from ..errors import ModelError, ModelFileError
from ..paging import OpenFile, map_file, open_regular
from ..weights import ExternalData, check_extent  # noqa: F401 - the loader's names for them

PAGE_SIZE = mmap.PAGESIZE


class MappedFile:
    """A read-only mapping of a model or external-data file, or a view of bytes."""

    def __init__(self, buffer, path=None, mapping=None, file=None):
        self.path = path
        self._mmap = mapping
        self.file = file  # the OpenFile mapped, for `read` and the check before a run; None for bytes
        self.buffer = memoryview(buffer).cast("B")
        self.size = len(self.buffer)
        # Byte ranges of weights that have not been released; sorted by start.
        self._live_starts = []
        self._live_ranges = []
        self.released_bytes = 0

    @classmethod
    def open(cls, path, what="model file"):
        """The mapping of the regular file `path`; `what` names it in messages ("model file")."""
        path = os.fspath(path)
        try:
            fd = open_regular(path)
        except OSError as e:
            raise ModelFileError(f"cannot map {what} {path!r}: {e.strerror or e}") from None
        file = OpenFile(fd, path, what)  # closes fd when the last holder goes
        try:
            if file.size == 0:
                return cls(b"", path=path)
            mapping = map_file(file, 0)
        except OSError as e:
            raise ModelFileError(f"cannot map {what} {path!r}: {e.strerror or e}") from None
        return cls(mapping, path=path, mapping=mapping, file=file)

    @classmethod
    def from_bytes(cls, data):
        return cls(data)

    @property
    def releasable(self):
        return self._mmap is not None

    @property
    def address(self):
        """The address of the first byte, to tell which arrays lie inside."""
        if not self.size:
            return 0
        return np.frombuffer(self.buffer, dtype=np.uint8).ctypes.data

    def tracked_ranges(self):
        """Byte ranges of weights not yet released."""
        return tuple(self._live_ranges)

    def track(self, offset, nbytes):
        """Record a weight's byte range, so a release spares pages it shares."""
        i = bisect.bisect(self._live_starts, offset)
        self._live_starts.insert(i, offset)
        self._live_ranges.insert(i, (offset, offset + nbytes))

    def _shared_with_live(self, page_start, page_end):
        # Weight ranges do not overlap, so only the last one starting before
        # page_end can reach into the page.
        i = bisect.bisect_left(self._live_starts, page_end)
        return i > 0 and self._live_ranges[i - 1][1] > page_start

    def release_containing(self, offset):
        """Release the tracked weight whose bytes include `offset`; returns the bytes dropped."""
        i = bisect.bisect_right(self._live_starts, offset)
        if i == 0:
            return 0
        start, end = self._live_ranges[i - 1]
        if not start <= offset < end:
            return 0
        return self.release(start, end - start)

    def release(self, offset, nbytes):
        """Drop the pages of [offset, offset+nbytes) that no tracked weight still uses.

        The weight's range stops being tracked. The pages are clean and file backed,
        so touching them again only re-reads them from the file.
        """
        try:
            i = self._live_ranges.index((offset, offset + nbytes))
        except ValueError:
            return 0
        del self._live_starts[i]
        del self._live_ranges[i]
        if self._mmap is None or nbytes == 0:
            return 0
        start = offset - offset % PAGE_SIZE
        end = -(-(offset + nbytes) // PAGE_SIZE) * PAGE_SIZE
        end = min(end, -(-self.size // PAGE_SIZE) * PAGE_SIZE)
        if self._shared_with_live(start, start + PAGE_SIZE):
            start += PAGE_SIZE
        if end > start and self._shared_with_live(end - PAGE_SIZE, end):
            end -= PAGE_SIZE
        if end <= start:
            return 0
        length = min(end, self.size) - start
        self._mmap.madvise(mmap.MADV_DONTNEED, start, length)
        self.released_bytes += end - start
        return end - start

    def read(self, start, end):
        """Bytes [start, end) of the file, read with pread rather than through the mapping.

        The loader walks the model's structure with this, so no page of the mapping
        becomes resident at MODEL_LOAD: a kernel that caches the file in large
        folios maps a whole folio (up to 2 MB) on one touch of the mapping. For a
        MappedFile over bytes it is a view.
        """
        if self.file is None:
            return self.buffer[start:end]
        data = os.pread(self.file.fd, end - start, start)
        if len(data) != end - start:
            raise ModelError(f"{self.path}: short read at byte offset {start} "
                             f"(the file changed while it was loaded)")
        return data

    def resident_bytes(self):
        """RSS of this mapping as /proc/self/smaps reports it (Linux), else None."""
        if self._mmap is None:
            return None
        return mapping_rss_bytes(self.address)


def mapping_rss_bytes(address):
    """The Rss of the /proc/self/smaps region that contains `address`."""
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and ":" not in head:
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= address < hi
                elif inside and line.startswith("Rss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
