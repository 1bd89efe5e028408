"""The kernels' thread pool: a kernel splits its work into chunks, and the run's threads take them.

numpy releases the GIL inside its loops over large arrays, so Python threads each running a numpy
op over their own block of a tensor run at once. A `Pool` keeps `threads - 1` worker threads for
the life of the process (sessions of one size share it); the thread that calls `run` is the
first and takes chunks too. Chunks are handed out one at a time from a counter, so a thread that
wakes late (a worker's wake-up costs tens of microseconds) takes fewer, and a small job is done by
the caller alone before any worker has woken: splitting never waits on a thread that has not
started.

The pool a run uses is set by the session around the run (`enter`, `leave`), in a context
variable, so sessions of different sizes may run at once in different threads.

A session with compiled kernels on several threads runs them on numba's team instead (`team`):
threads that spin between launches, where this pool's sleep. Two sets of spinning threads (the
team's and BLAS's), or a sleeping one beside a spinning one, take the same cores from each other,
so such a run has a pool of one thread and BLAS on one, its products shared on the team too.
"""

import contextlib
import contextvars
import functools
import itertools
import math
import os
import queue
import threading

import numpy as np

# The least share of an array op a thread is given: a worker takes tens of microseconds to wake
# (~30 us on a virtual machine), and every numpy call a thread makes while another runs waits
# for the GIL as long again. Measured on a 2-core virtual machine (bias and ReLU over a conv
# output): 112K elements 38 us whole, 79 us in two shares; 784K 298 -> 248 us; 3.2M 0.91 ->
# 0.61 ms. So only ops of 512K elements and more are split.
MIN_SHARE = 1 << 18
SPLIT_FROM = 2 * MIN_SHARE


class Pool:
    """`threads - 1` worker threads, started on first use and kept; the caller works too."""

    def __init__(self, threads):
        self.threads = threads
        self._tasks = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def _start(self):
        with self._lock:
            if not self._started:
                for k in range(self.threads - 1):
                    threading.Thread(target=self._work, name=f"nnrun-worker-{k + 1}", daemon=True).start()
                self._started = True

    def _work(self):
        while True:
            job = self._tasks.get()
            # In the caller's context: numpy's error state (the executor ignores inf and NaN) is
            # a context variable, and a worker thread has its own.
            job.context.copy().run(job.help)

    def run(self, chunk, count):
        """chunk(i) for i in range(count) on the pool's threads; returns when all are done,
        raising the first exception a chunk raised. While the chunks run, the BLAS library runs
        on the calling thread only (see `_blas_alone`)."""
        helpers = min(self.threads, count) - 1
        if helpers <= 0:
            for i in range(count):
                chunk(i)
            return
        if not self._started:
            self._start()
        job = _Job(chunk, count)
        pinned = _blas_alone()
        try:
            for _ in range(helpers):
                self._tasks.put(job)
            job.help()
            job.wait()
        finally:
            for library, count in pinned:
                library.set_num_threads(count)


def _blas_alone():
    """Set every BLAS library running on more than one thread to one; returns (library, count)
    pairs to put back. A chunk that calls BLAS (a softmax's row sums, a layer norm's means as
    matrix-vector products) would otherwise start the library's threads from each of the pool's
    threads at once, more threads than cores: a softmax over 12 x 512 x 512 took 7.8 ms in two
    shares against 5.7 ms whole. The count is read per split (a fraction of a microsecond). Like
    the count a run sets (threads.RunThreads), it is the process's: runs splitting on several
    threads at once may find it pinned already, and leave it so."""
    from ..threads import controller

    pinned = []
    for library in controller().lib_controllers:
        if library.user_api != "blas":
            continue
        count = library.get_num_threads()
        if count > 1:
            library.set_num_threads(1)
            pinned.append((library, count))
    return pinned


class _Job:
    """One `Pool.run`: chunks handed out by a counter; the thread that finishes the last one
    releases the caller. A worker that gets the job after every chunk is taken does nothing."""

    __slots__ = ("chunk", "count", "context", "_next", "_done", "_finished", "error")

    def __init__(self, chunk, count):
        self.chunk, self.count, self.error = chunk, count, None
        self.context = contextvars.copy_context()
        self._next, self._done = itertools.count(), itertools.count(1)
        self._finished = threading.Lock()
        self._finished.acquire()

    def help(self):
        while (i := next(self._next)) < self.count:
            try:
                self.chunk(i)
            except BaseException as e:  # handed to the caller, which raises it
                if self.error is None:
                    self.error = e
            if next(self._done) == self.count:
                self._finished.release()

    def wait(self):
        self._finished.acquire()
        if self.error is not None:
            raise self.error


SERIAL = Pool(1)
_pools = {1: SERIAL}
_pools_lock = threading.Lock()


def pool(threads):
    """The process's pool of `threads` threads."""
    threads = max(1, int(threads))
    with _pools_lock:
        found = _pools.get(threads)
        if found is None:
            found = _pools[threads] = Pool(threads)
        return found


def _forget_pools():
    # A forked child has none of its parent's worker threads: its pools start their own.
    global _pools_lock
    _pools_lock = threading.Lock()
    _pools.clear()
    _pools[1] = SERIAL


os.register_at_fork(after_in_child=_forget_pools)


def default_threads():
    """The physical cores this process may run on (onnxruntime's default for intra_op_num_threads)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(usable, _physical_cores() or usable))


@functools.lru_cache(maxsize=1)
def _physical_cores():
    """The machine's physical cores (psutil reads /sys: ~50 us, so once per process), or None."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.cpu_count(logical=False)


_CURRENT = contextvars.ContextVar("nnrun_pool", default=SERIAL)


def current():
    """The pool of the run in progress (one thread outside a run)."""
    return _CURRENT.get()


def enter(a_pool):
    """Kernels use `a_pool` until leave(the token returned)."""
    return _CURRENT.set(a_pool)


def leave(token):
    _CURRENT.reset(token)


_PLANNED = contextvars.ContextVar("nnrun_planned_threads", default=None)


class Planned:
    """What plans made for a session's threads ask of them: `threads`, and `team` set where a plan
    splits a compiled kernel over numba's team (`asks_team`)."""

    __slots__ = ("threads", "team")

    def __init__(self, threads):
        self.threads, self.team = max(1, threads), False


@contextlib.contextmanager
def planned(threads):
    """Plans made inside are for runs on a pool of `threads` (compile_graph: the session's); yields
    the Planned record, whose `team` says after whether a plan asked for the team."""
    record = Planned(threads)
    token = _PLANNED.set(record)
    try:
        yield record
    finally:
        _PLANNED.reset(token)


def planned_threads():
    """The threads of the pool the plan being made runs on (1 outside PREPARE)."""
    record = _PLANNED.get()
    return 1 if record is None else record.threads


def asks_team():
    """Marks the plans being made as splitting compiled kernels over numba's team: the session's
    runs then run on it alone (threads.RunThreads.begin)."""
    record = _PLANNED.get()
    if record is not None and record.threads > 1:
        record.team = True


# The shares compiled kernels split into on numba's team of threads (jit.py's `on_team`), in a
# session whose runs use it (threads.RunThreads.begin); 1 elsewhere. numba's threads spin
# between launches (~4 us a launch); the kernels' pool wakes a sleeping thread (~30 us, far more on
# a busy virtual machine), and BLAS's threads spin too: a session on the team runs on it alone.
_TEAM = contextvars.ContextVar("nnrun_team", default=1)


def team():
    """The shares of a compiled kernel on the run's team (1: not on a team)."""
    return _TEAM.get()


def enter_team(shares):
    return _TEAM.set(shares)


def leave_team(token):
    _TEAM.reset(token)


def ranges(total, parts):
    """[start, end) of `parts` near-equal ranges covering [0, total) (fewer when total is smaller)."""
    parts = max(1, min(parts, total))
    step = -(-total // parts)
    return [(s, min(total, s + step)) for s in range(0, total, step)]


def parts(work, unit=None):
    """How many shares an op of `work` (elements, or multiply-adds) is split into on the run's
    threads: one per thread, each at least `unit` of it (None: MIN_SHARE elements)."""
    return max(1, min(current().threads, work // (MIN_SHARE if unit is None else unit)))


def over_axis(length, elements, work):
    """work(start, end) over ranges covering [0, length) of an axis of an op over `elements`
    elements: once, whole, or split across the run's threads when it is large."""
    count = parts(elements)
    if count <= 1 or length <= 1:
        work(0, length)
        return
    spans = ranges(length, count)
    current().run(lambda i: work(*spans[i]), len(spans))


def over_leading(shape, work, kept=None):
    """work(index) for index tuples that cut [start, end) of one axis of an op over `shape`, in
    shares on the run's threads: the first axis longer than 1 when every axis before it has
    length 1 (so a cut of a contiguous array stays contiguous), and one of `kept` when given.
    Where there is none, or the op is small, work((...,)) once: the whole, even of a 0-d array."""
    count = parts(math.prod(shape))
    axis = None
    if count > 1:
        for a, n in enumerate(shape):
            if n > 1:
                axis = a if kept is None or a in kept else None
                break
    if axis is None:
        work((Ellipsis,))
        return
    lead = (slice(None),) * axis
    over_axis(shape[axis], math.prod(shape), lambda start, end: work(lead + (slice(start, end),)))


def elementwise(op, out, *operands):
    """op(out, *operands) for a broadcasting op (numpy's rules), split across the run's threads
    along the first axis of `out` long enough: each operand is cut where it has that axis."""
    count = parts(out.size)
    axis = next((a for a, n in enumerate(out.shape) if n >= count), None) if count > 1 else None
    if axis is None:
        op(out, *operands)
        return
    over_axis(out.shape[axis], out.size,
              lambda start, end: op(*(_cut(a, axis, start, end, out.ndim) for a in (out, *operands))))


def _cut(a, axis, start, end, ndim):
    """a's part [start, end) of the broadcast axis `axis` of an ndim-dim result (all of it where a
    lacks that axis or broadcasts along it)."""
    if not isinstance(a, np.ndarray):
        return a
    own = axis - (ndim - a.ndim)
    if own < 0 or a.shape[own] == 1:
        return a
    return a[(slice(None),) * own + (slice(start, end),)]
