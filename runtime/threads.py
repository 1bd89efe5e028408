"""The threads a session's runs use: the BLAS libraries' (numpy's; nnrun's own runs on one thread
and is kept so, ops/blas.py) and the kernels' pool (ops/parallel.py).

`intra_op_num_threads` sizes both, as onnxruntime's option sizes its own pool; 0 (the default)
is the physical cores for the pool and the library's own default for BLAS. Finding the
thread-pool libraries loaded in the process is the expensive part of threadpoolctl (a walk over
every shared library: about 0.1 ms here, 1 ms in a process with more libraries loaded), so it is
done once per session, when it is made, and a session sizes its pool once (`RunThreads`). Each
run then reads each library's count (a fraction of a microsecond, through OpenBLAS's own functions:
`counter`) and only where it differs sets it and puts it back after the run. A run whose plan
splits compiled kernels over numba's team (Plan.on_team) runs on it alone: the pool of one thread,
every library on one (ops/parallel.py).
"""

import ctypes
import threading

from .ops import blas, jit, parallel

_controller = None
_lock = threading.Lock()


def controller(refresh=False):
    """The process's threadpoolctl controller, made on first use; with `refresh`, made again, so
    that it knows the libraries loaded since (scipy's own OpenBLAS, loaded by a model that needs
    scipy.special after nnrun first looked)."""
    global _controller
    with _lock:
        if _controller is None or refresh:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        return _controller


def kernel_threads(intra_op_num_threads):
    """The size of the kernels' pool for a session's `intra_op_num_threads` (0: the physical cores)."""
    return intra_op_num_threads if intra_op_num_threads > 0 else parallel.default_threads()


class RunThreads:
    """The threads of a session's runs, fixed when the session is made (onnxruntime reads
    `intra_op_num_threads` then too): the kernels' pool, and the BLAS count a run sets in each
    library where the library's differs, put back after the run (0: left as it is).

    `begin()` before a run returns what `end(state)` needs after it; nothing is kept on the object,
    so runs on several threads at once each have their own state. A run costs one contextvar set
    and, with a BLAS bound, a read of each library's count: about a microsecond.
    """

    __slots__ = ("threads", "blas", "libraries", "counts", "_counters", "_alone")

    def __init__(self, intra_op_num_threads):
        self.threads = kernel_threads(intra_op_num_threads)
        self.blas = intra_op_num_threads if intra_op_num_threads > 0 else 0
        blas.library()  # nnrun's own BLAS, loaded first, so that the look below finds it
        # looked up again for each session (~0.1 ms): a library loaded since the last look is bounded
        # too. nnrun's own BLAS runs on one thread whatever the session (ops/blas.py), put back to
        # one should the program have changed it.
        bounded = []
        for library in controller(refresh=True).lib_controllers:
            count = 1 if blas.is_own(library.filepath) else self.blas
            if count:
                bounded.append((library, count))
        self.libraries = tuple(library for library, _ in bounded)
        self.counts = tuple(count for _, count in bounded)
        self._counters = tuple((*counter(library), count) for library, count in bounded)
        # On numba's team (`begin(on_team=True)`) every library on one thread: see parallel.team.
        self._alone = tuple((get, set_, 1) for get, set_, _ in self._counters) if self.threads > 1 else None

    def begin(self, on_team=False):
        """Before a run; `on_team`: its plan splits compiled kernels over numba's team (Plan.on_team),
        which it then runs on alone: the kernels' pool of one thread, BLAS on one."""
        team = on_team and self.threads > 1 and jit.team_shares(self.threads)
        changed = None
        for get, set_, wanted in self._alone if team else self._counters:
            count = get()
            if count != wanted:
                set_(wanted)
                changed = (changed or ()) + ((set_, count),)
        # The pool is looked up per run (a dict lookup): after a fork the parent's workers are gone
        # and the child's pool is made anew.
        pool = parallel.SERIAL if team else parallel.pool(self.threads)
        return parallel.enter(pool), parallel.enter_team(team or 1), changed

    def end(self, state):
        token, team, changed = state
        parallel.leave_team(team)
        parallel.leave(token)
        for set_, count in changed or ():
            set_(count)


def counter(library):
    """(get, set) of a threadpoolctl library's thread count: OpenBLAS's own C functions where it runs
    its own threads (the builds numpy's and nnrun's wheels bring), as threadpoolctl calls them but
    without its Python around each call (~1-2 us a call, where a run on one thread made four: 5.4
    against 1.7 us a run in all); threadpoolctl's methods for any other library."""
    if library.internal_api == "openblas" and getattr(library, "threading_layer", None) == "pthreads":
        try:
            handle = ctypes.CDLL(library.filepath)
        except OSError:
            return library.get_num_threads, library.set_num_threads
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_", "_64"):
                get = getattr(handle, f"{prefix}openblas_get_num_threads{suffix}", None)
                set_ = getattr(handle, f"{prefix}openblas_set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    get.restype, get.argtypes = ctypes.c_int, []
                    set_.restype, set_.argtypes = None, [ctypes.c_int]
                    return get, set_
    return library.get_num_threads, library.set_num_threads
