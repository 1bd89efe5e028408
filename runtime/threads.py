"""How many threads the BLAS library (numpy's matrix products) uses while a session runs.

`intra_op_num_threads` bounds it per run, as onnxruntime's option bounds its own pool. Finding the
thread-pool libraries loaded in the process is the expensive part of threadpoolctl (a walk over
every shared library: about 0.1 ms here, 1 ms in a process with more libraries loaded), so it is
done once per process; each run then only sets the count and puts it back (a few microseconds),
which a caller running a small model hundreds of times per second does not notice.
"""

import threading
from contextlib import nullcontext

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


def limited(threads):
    """A context in which the BLAS library uses at most `threads` threads (0: its default)."""
    if not threads:
        return nullcontext()
    return controller().limit(limits=threads)
