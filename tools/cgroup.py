"""A memory cgroup of its own for one process: how the benchmark measures a memory limit for real.

The kernel, not the runtime, enforces the limit: every page the process faults in, anonymous or
file-backed (the page cache of the model it reads included), is charged to the cgroup, and when the
charge would pass the limit the kernel reclaims (drops clean file pages, which must then be read
again) or, failing that, kills the process. Swap is limited to nothing beyond the limit, as in a
container with `--memory` set, so anonymous memory cannot hide there.

Both hierarchies are handled: cgroup v2 (`memory.max`, `memory.swap.max`, `memory.peak`,
`memory.events`) and v1 (`memory.limit_in_bytes`, `memory.memsw.limit_in_bytes`,
`memory.max_usage_in_bytes`, `memory.oom_control`). Creating one needs root (or a delegated
subtree); `available()` says whether this machine can.
"""

import os
import uuid

from nnrun.memory_limit import parse_size  # noqa: F401  (the size syntax of --memory-cap)

V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def drop_page_cache(paths):
    """Drop the files' pages from the page cache (those no process maps), so that the next reader
    reads them from disk and a memory cgroup charges them to it."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _v2_root():
    for root in V2_ROOTS:
        try:
            with open(os.path.join(root, "cgroup.controllers")) as f:
                if "memory" in f.read().split():
                    return root
        except OSError:
            continue
    return None


def available():
    """None when a memory cgroup can be made here, else why not."""
    if _v2_root() is None and not os.path.isdir(V1_ROOT):
        return "no memory cgroup hierarchy is mounted"
    root = _v2_root() or V1_ROOT
    if not os.access(root, os.W_OK):
        return f"{root} is not writable (run as root, or delegate a cgroup subtree)"
    return None


class MemoryCgroup:
    """A fresh memory cgroup limited to `limit_bytes` (memory and swap); `remove()` when done."""

    def __init__(self, limit_bytes, prefix="nnrun-bench"):
        self.limit_bytes = int(limit_bytes)
        root = _v2_root()
        self.version = 2 if root else 1
        root = root or V1_ROOT
        self.path = os.path.join(root, f"{prefix}-{uuid.uuid4().hex[:12]}")
        os.mkdir(self.path)
        try:
            if self.version == 2:
                self._write("memory.max", self.limit_bytes)
                self._write("memory.swap.max", 0)
            else:
                self._write("memory.limit_in_bytes", self.limit_bytes)
                try:  # memsw exists only with swap accounting on; without it there is no swap to use
                    self._write("memory.memsw.limit_in_bytes", self.limit_bytes)
                except OSError:
                    pass
        except BaseException:
            self.remove()
            raise

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def _read(self, name):
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read()
        except OSError:
            return None

    def enter(self):
        """Move the calling process into the cgroup (for `preexec_fn`, in the child before exec)."""
        self._write("cgroup.procs", os.getpid())

    def peak_bytes(self):
        """The most memory charged at once since creation (v2 memory.peak needs Linux 5.19)."""
        text = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def oom_kills(self):
        """Processes the kernel killed for want of memory in this cgroup."""
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control") or ""
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def remove(self):
        try:
            os.rmdir(self.path)
        except OSError:
            pass
