"""The threads a session's runs use: the BLAS library's (numpy's matrix products) and the kernels'
pool (ops/parallel.py).

`intra_op_num_threads` sizes both, as onnxruntime's option sizes its own pool; 0 (the default)
is the physical cores for the pool and the library's own default for BLAS. Finding the
thread-pool libraries loaded in the process is the expensive part of threadpoolctl (a walk over
every shared library: about 0.1 ms here, 1 ms in a process with more libraries loaded), so it is
done once per process. Each run then reads each library's count (a microsecond) and only where it
differs sets it and puts it back after the run: a process whose BLAS already uses the session's
count (the default, the physical cores, or a caller who set it) pays nothing more.
"""

import threading
from contextlib import nullcontext

from .ops import parallel

_controller = None
_lock = threading.Lock()


def controller():
    """The process's threadpoolctl controller, made on first use."""
    global _controller
    with _lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        return _controller


class _Bounded:
    """Sets each thread-pool library that does not use `threads` threads to it; puts it back after."""

    __slots__ = ("libraries", "threads", "changed")

    def __init__(self, libraries, threads):
        self.libraries, self.threads, self.changed = libraries, threads, ()

    def __enter__(self):
        changed = []
        for library in self.libraries:
            count = library.get_num_threads()
            if count != self.threads:
                library.set_num_threads(self.threads)
                changed.append((library, count))
        self.changed = changed
        return self

    def __exit__(self, *exc):
        for library, count in self.changed:
            library.set_num_threads(count)
        return False


def limited(threads):
    """A context in which the BLAS library uses `threads` threads (0: its default)."""
    if not threads:
        return nullcontext()
    return _Bounded(controller().lib_controllers, threads)


def kernel_threads(intra_op_num_threads):
    """The size of the kernels' pool for a session's `intra_op_num_threads` (0: the physical cores)."""
    return intra_op_num_threads if intra_op_num_threads > 0 else parallel.default_threads()


class _Running:
    """BLAS bounded (where `blas` is set) and the kernels' pool set, for one run."""

    __slots__ = ("blas", "pool", "token")

    def __init__(self, blas, pool):
        self.blas, self.pool, self.token = blas, pool, None

    def __enter__(self):
        self.blas.__enter__()
        self.token = parallel.enter(self.pool)
        return self

    def __exit__(self, *exc):
        parallel.leave(self.token)
        return self.blas.__exit__(*exc)


def running(intra_op_num_threads):
    """The context of one run: BLAS bounded to `intra_op_num_threads` (0: left as it is) and the
    kernels' pool of `kernel_threads(intra_op_num_threads)`."""
    return _Running(limited(intra_op_num_threads), parallel.pool(kernel_threads(intra_op_num_threads)))
