"""Kernels compiled by numba (`pip install 'nnrun[jit]'`), for plans that ask for them: the one
place that decides whether they are used.

numpy and BLAS are nnrun's kernel language; numba serves what numpy runs far below the machine's
speed because it takes many short passes where one would do: depthwise convolution (two passes
per tap, or rows too short to vectorise: _jit_depthwise.py), a convolution's bias and
activation (HardSwish is five passes over the output: _jit_activation.py), and a pointwise
convolution's product by its weight packed at PREPARE, with the bias and activation in the same
call (BLAS packs the weight again on every call, and runs narrow products below its speed:
_jit_gemm.py).

They are opt-in, per session (`SessionOptions.compiled_kernels = True`, `nnrun --jit`) or per
process (`NNRUN_JIT=1`), because numba costs what nnrun exists to save: loading it and the kernel
takes ~0.4 s and ~125 MB of RSS (~55 MB of it anonymous) once per process, more than a whole
ResNet-50 run holds. Plans that do not ask, or a process without numba, take the numpy paths,
which compute the same sums (the compiled products in another order, with fused multiply-adds:
the last bits differ, as between two BLAS libraries).

On several threads the products, depthwise convolutions and BLAS products of a plan with compiled
kernels run in shares on numba's team of threads (`team_shares`, `on_team`: OpenMP's or TBB's
threading layer, whose threads spin between launches), the session's runs on it alone
(parallel.team). Where the team does not serve (one core, no thread-safe layer), plans keep to
the kernels' pool and BLAS's own threads, as before.

A kernel is compiled (or loaded from numba's on-disk cache) when the first plan that uses it is
made, at PREPARE, so a run never compiles. Asked for where numba is missing or fails to compile,
they warn once per process and the numpy paths are used.
"""

import contextlib
import contextvars
import functools
import os
import threading
import warnings

import numpy as np

# `mode` of a compiled kernel's activation (_jit_activation.activate), with its two parameters:
# CLAMP to [p0, p1] (ReLU, Clip), LEAKY (slope p0 below zero), HARD_SIGMOID clip(p0 * v + p1, 0, 1),
# HARD_SWISH v * that. Each computes what activation.py's numpy formula does, in the same order.
CLAMP = 0
LEAKY = 1
HARD_SIGMOID = 2
HARD_SWISH = 3


def activation_mode(activation, dtype):
    """(mode, p0, p1, what is left to apply after, or None) of a fused activation
    (activation.apply_activation's (op type, params), or None) for a compiled kernel.

    Kernels ask on every run, for the activation their node carries: the answer is kept by the
    activation object's identity (with the object itself, so that its id is not reused)."""
    key = (id(activation), dtype)
    found = _MODES.get(key)
    if found is None or found[0] is not activation:
        if len(_MODES) > 4096:  # sessions come and go: never more than this many kept
            _MODES.clear()
        found = _MODES[key] = (activation, _activation_mode(activation, np.dtype(dtype)))
    return found[1]


_MODES = {}


def _activation_mode(activation, dtype):
    t = dtype.type
    if activation is None:
        return CLAMP, t(-np.inf), t(np.inf), None
    kind, params = activation
    if kind == "Relu":
        return CLAMP, t(0), t(np.inf), None
    if kind == "Clip":
        # A bound left out is the type's lowest or max, as activation.clip has it (which
        # onnxruntime's clamp of +-inf agrees with).
        limits = np.finfo(dtype)
        low, high = params.get("min"), params.get("max")
        return CLAMP, t(limits.min if low is None else low), t(limits.max if high is None else high), None
    if kind == "LeakyRelu":
        alpha = params.get("alpha")
        return LEAKY, t(0.01 if alpha is None else alpha), t(0), None
    if kind == "HardSwish":  # x * HardSigmoid(x) with alpha 1/6, beta 1/2
        return HARD_SWISH, t(1 / 6), t(0.5), None
    if kind == "HardSigmoid":
        alpha, beta = params.get("alpha"), params.get("beta")
        return HARD_SIGMOID, t(0.2 if alpha is None else alpha), t(0.5 if beta is None else beta), None
    return CLAMP, t(-np.inf), t(np.inf), activation


_CHOICE = contextvars.ContextVar("nnrun_jit", default=None)
_lock = threading.Lock()
_kernels = {}  # (kernel name, dtype) -> the compiled kernel, or None when it cannot be had
_failed = None  # why numba cannot be used in this process, once found


@contextlib.contextmanager
def chosen(on):
    """Plans made inside use compiled kernels if `on` (None: as the environment says)."""
    token = _CHOICE.set(on)
    try:
        yield
    finally:
        _CHOICE.reset(token)


def wanted():
    """Whether plans made now ask for compiled kernels (not whether numba is there)."""
    choice = _CHOICE.get()
    if choice is None:
        return os.environ.get("NNRUN_JIT", "0").lower() in ("1", "true", "yes", "on")
    return bool(choice)


def depthwise_kernel(dtype):
    """The compiled depthwise convolution (_jit_depthwise.depthwise) for `dtype` (float32 or
    float64), compiled now if need be; None when compiled kernels are off or unavailable."""
    return _kernel("depthwise", dtype)


def depthwise_channels_last_kernel(dtype):
    """The compiled depthwise convolution of small images (_jit_depthwise.depthwise_channels_last),
    as depthwise_kernel."""
    return _kernel("depthwise_channels_last", dtype)


def depthwise_nhwc_kernels(dtype):
    """(pad, convolve): the compiled depthwise convolution of a channels-last image
    (_jit_depthwise.pad_channels_last, depthwise_nhwc), as depthwise_kernel."""
    return _kernel("depthwise_nhwc", dtype)


def few_channels_kernel(dtype):
    """The compiled convolution of few input channels (_jit_depthwise.few_channels), as depthwise_kernel."""
    return _kernel("few_channels", dtype)


def max_pool_kernel(dtype):
    """The compiled max pooling (_jit_depthwise.max_pool), as depthwise_kernel."""
    return _kernel("max_pool", dtype)


def epilogue_kernel(dtype):
    """The compiled bias and activation (_jit_activation.bias_activation) for `dtype`, as
    depthwise_kernel."""
    return _kernel("epilogue", dtype)


def tiled_product_kernel(dtype):
    """The compiled product by a packed weight (the module _jit_gemm: `pack`, `product` and its
    constants) for float32, as depthwise_kernel; None for other types and, on x86, where the
    machine has no AVX2 and FMA (LLVM would make its vector fused multiply-adds calls to a library
    function, slower than BLAS)."""
    if np.dtype(dtype) != np.float32 or not wanted() or not _vector_fma():  # (wanted first: llvmlite is large)
        return None
    return _kernel("tiled_product", dtype)


def team_shares(threads):
    """The shares a compiled kernel splits into on numba's team for a run of `threads`: min(threads,
    the team's size) where the team serves, else 0. It serves where numba loads a thread-safe
    threading layer (OpenMP's or TBB's; the workqueue it falls back on without them ends the
    process when two threads launch at once, as two sessions' runs may) and its kernels pass their
    self-check; checked once, by the first plan that asks (runs, where `wanted` is not set, find
    the answer)."""
    if threads < 2:
        return 0
    size = _team.get("size")
    if size is None:
        if _kernel("depthwise", np.float32) is None:  # (numba there, and compiled kernels wanted)
            return 0
        with _lock:
            size = _team.get("size")
            if size is None:
                size = _team["size"] = _team_size()
    return min(threads, size) if size > 1 else 0


_team = {}


def _no_team_in_child():
    # A forked child has none of its parent's team, and OpenMP's runtime does not start one again
    # after a fork (it would wait on threads that are not there): the child runs without a team.
    if _team.get("size"):
        _team.clear()
        _team["size"] = 0


os.register_at_fork(after_in_child=_no_team_in_child)


def _team_size():
    """numba's team size (NUMBA_NUM_THREADS) where the team serves (see team_shares), else 0."""
    try:
        from numba import set_num_threads, threading_layer
        from numba.core import config

        if config.NUMBA_NUM_THREADS < 2:
            return 0
        if config.THREADING_LAYER == "default":  # (a layer the program or the environment chose is kept)
            config.THREADING_LAYER = "threadsafe"
        from ._jit_team import depthwise_on_threads

        # Two 1x1 channels (1 and 2) through a 3x3 window, padded, weights 1: a share each.
        x = np.array([[[1]], [[2]]], np.float32)
        out = np.empty((2, 1, 1), np.float32)
        fills = np.array([[1, 2, 1, 2, 0, 1, 0, 1]], np.int64)
        set_num_threads(2)
        depthwise_on_threads(x, np.ones((9, 2), np.float32), np.zeros(2, np.float32), True, out,
                             np.full((2, 12), np.nan, np.float32), fills, np.arange(9, dtype=np.int64), 3, 12, 3, 1,
                             CLAMP, np.float32(-np.inf), np.float32(np.inf), 2)
        _expect("depthwise on threads", tuple(out.ravel()), (1, 2))
        if threading_layer() not in ("omp", "tbb"):
            return 0
        return config.NUMBA_NUM_THREADS
    except Exception:  # noqa: BLE001 - plans for several threads then keep to the kernels' pool, as before
        return 0


def on_team(name, shares):
    """The compiled kernel `name` ("product", "gemm", "gemv", "phase_rows", "depthwise", "channels_last",
    "max_pool", "scatter_taps", "erf", "gelu": _jit_team's ..._on_threads) as a callable that runs
    it in `shares` at once on numba's team (team_shares gives how many), taking the kernel's
    arguments up to `parts` (the product's tail scratch made here)."""
    found = _team.get((name, shares))
    if found is None:
        with _lock:
            found = _team[name, shares] = _team_runner(name, shares)
    return found


def _team_runner(name, shares):
    from numba import set_num_threads

    if name == "product":
        from ._jit_gemm import TAIL_SCRATCH
        from ._jit_team import product_on_threads

        def run(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, n):
            set_num_threads(shares)  # numba's count is the calling thread's own
            product_on_threads(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, n, shares,
                               np.empty((shares, TAIL_SCRATCH), np.float32))
        return run
    from . import _jit_team

    kernel = getattr(_jit_team, f"{name}_on_threads")

    def run(*arguments):
        set_num_threads(shares)
        kernel(*arguments, shares)
    return run


@functools.lru_cache(maxsize=None)
def _vector_fma():
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True  # aarch64 and the others numba targets have fused multiply-add in their vectors
    features = target_features()
    return features is None or ("+avx2" in features and "+fma" in features)


def target_features():
    """The CPU features numba compiles for, as a set ("+avx2", ...): the host's, or what
    NUMBA_CPU_FEATURES says (numba's cache keeps code apart by them); None without numba."""
    try:
        from llvmlite import binding
        from numba.core import config

        if config.CPU_FEATURES is not None:
            return set(config.CPU_FEATURES.split(","))
        return set(binding.get_host_cpu_features().flatten().split(","))
    except Exception:  # noqa: BLE001 - no numba (_kernel reports it), or the host's features unknown
        return None


def scatter_taps_kernel(dtype):
    """The compiled scatter of a transposed convolution's taps that do not overlap
    (_jit_gemm.scatter_taps), as depthwise_kernel."""
    return _kernel("scatter_taps", dtype)


def elementwise_kernel(name):
    """A compiled float32 elementwise kernel of _jit_activation ("erf", "gelu"), as depthwise_kernel."""
    return _kernel(name, np.float32)


def _kernel(name, dtype):
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64) or not wanted():
        return None
    with _lock:
        if (name, dtype) not in _kernels:
            _kernels[name, dtype] = _compile(name, dtype)
        return _kernels[name, dtype]


def _compile(name, dtype):
    global _failed
    if _failed is not None:
        return None
    try:
        return _SELF_CHECKS[name](dtype)
    except ImportError as e:
        _failed = f"numba is not installed (pip install 'nnrun[jit]'): {e}"
    except Exception as e:  # noqa: BLE001 - a broken numba must not stop a model from running
        _failed = f"{type(e).__name__}: {e}"
    warnings.warn(f"nnrun: compiled kernels were asked for but are unavailable ({_failed}); using numpy's",
                  RuntimeWarning, stacklevel=4)
    return None


# Each kernel's first call: numba compiles it (or loads it) for the dtype, and the result is checked.

def _check_depthwise(dtype):
    from ._jit_depthwise import depthwise

    # A 1x1 image through a 3x3 window, padded.
    x = np.ones((1, 1, 1), dtype)
    out = np.empty((1, 1, 1), dtype)
    fills = np.array([[1, 2, 1, 2, 0, 1, 0, 1]], np.int64)
    lo, hi = dtype.type(-np.inf), dtype.type(np.inf)
    depthwise(x, np.ones((9, 1), dtype), np.zeros(1, dtype), True, out, np.full(12, np.nan, dtype),
              fills, np.arange(9, dtype=np.int64), 3, 12, 3, 1, CLAMP, lo, hi, 0, 1)
    _expect("depthwise", out[0, 0, 0], 1)
    # and through a 1x3 window (other than nine taps: a loop over them), weights 1, 2, 3
    fills = np.array([[0, 1, 1, 2, 0, 1, 0, 1]], np.int64)
    depthwise(x, np.arange(1, 4, dtype=dtype).reshape(3, 1), np.zeros(1, dtype), True, out,
              np.full(3, np.nan, dtype), fills, np.arange(3, dtype=np.int64), 3, 3, 3, 1, CLAMP, lo, hi, 0, 1)
    _expect("depthwise (a loop over the taps)", out[0, 0, 0], 2)
    return depthwise


def _check_depthwise_channels_last(dtype):
    from ._jit_depthwise import depthwise_channels_last

    # A 1x1 image of one channel through a 3x3 window, padded: only the centre tap reads it.
    out = np.empty((1, 1, 1), dtype)
    lo, hi = dtype.type(-np.inf), dtype.type(np.inf)
    depthwise_channels_last(np.full((1, 1, 1), 2, dtype), np.arange(9, dtype=dtype), np.zeros(1, dtype), True, out,
                            np.full(9, np.nan, dtype), np.empty(1, dtype), 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, CLAMP, lo, hi,
                            0, 1, False)
    _expect("depthwise (channels last)", out[0, 0, 0], 8)
    # and the image staged channels last in the result's room, the result left there
    result = np.full(1, 3, dtype)
    depthwise_channels_last(np.empty((1, 1, 1), dtype), np.arange(9, dtype=dtype), np.zeros(1, dtype), True, out,
                            np.full(9, np.nan, dtype), result, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, CLAMP, lo, hi, 0, 1, True)
    _expect("depthwise (channels last, staged)", result[0], 12)
    return depthwise_channels_last


def _check_depthwise_nhwc(dtype):
    from ._jit_depthwise import depthwise_nhwc, pad_channels_last

    # A 1x1 image of one channel through a 3x3 window, padded: only the centre tap reads it.
    padded = np.full(9, np.nan, dtype)
    pad_channels_last(np.full((1, 1, 1), 2, dtype), padded, 3, 3, 1, 1)
    out = np.empty((1, 1, 1), dtype)
    lo, hi = dtype.type(-np.inf), dtype.type(np.inf)
    depthwise_nhwc(padded, np.arange(9, dtype=dtype), np.zeros(1, dtype), True, out, 3, 3, 3, 1, 1, 1, 1,
                   CLAMP, lo, hi, 0, 1)
    _expect("depthwise (channels last image)", out[0, 0, 0], 8)
    return pad_channels_last, depthwise_nhwc


def _check_few_channels(dtype):
    from ._jit_depthwise import few_channels

    # Two 1x1 channels (1 and 2) through a 1x3 window, padded one column each side: only the centre
    # taps read them, weighted 3 and 5, plus a bias of 1: 1 + 1*3 + 2*5.
    out = np.empty((1, 1, 1), dtype)
    w2 = np.array([[0], [3], [0], [0], [5], [0]], dtype)
    fills = np.array([[0, 1, 1, 2, 0, 1, 0, 1]], np.int64)
    lo, hi = dtype.type(-np.inf), dtype.type(np.inf)
    few_channels(np.array([[[1]], [[2]]], dtype), w2, np.ones(1, dtype), True, out, np.full(6, np.nan, dtype),
                 np.empty(2, dtype), fills, np.array([0, 1, 2, 3, 4, 5], np.int64), 3, 3, 3, 3, True, CLAMP, lo, hi,
                 0, 1)
    _expect("convolution of few channels", out[0, 0, 0], 14)
    return few_channels


def _check_max_pool(dtype):
    from ._jit_depthwise import max_pool

    # A 1x3 image through a 1x3 window, padded one column each side.
    out = np.empty((1, 1, 3), dtype)
    fills = np.array([[0, 1, 1, 4, 0, 1, 0, 1]], np.int64)
    max_pool(np.array([[[5, 1, 3]]], dtype), out, np.full(5, np.nan, dtype), np.empty(3, dtype), fills,
             np.arange(3, dtype=np.int64), 5, 5, 5, 0, 1)
    _expect("max pooling", tuple(out[0, 0]), (5, 5, 3))
    return max_pool


def _check_epilogue(dtype):
    from ._jit_activation import bias_activation

    out = np.array([[-4, 1]], dtype)
    bias = np.array([1], dtype)
    bias_activation(out, bias, True, True, HARD_SWISH, dtype.type(1 / 6), dtype.type(0.5), 0, 1, out, False)
    _expect("bias and activation", out[0, 1], dtype.type(2) * (dtype.type(2) * dtype.type(1 / 6) + dtype.type(0.5)))
    _expect("bias and activation", out[0, 0], 0)
    out = np.array([[-4, 1]], dtype)
    bias_activation(out, bias, True, True, CLAMP, dtype.type(0), dtype.type(np.inf), 0, 1,
                    np.array([[2, 3]], dtype), True)
    _expect("bias, residual and activation", tuple(out[0]), (0, 5))
    return bias_activation


def _check_tiled_product(dtype):
    from . import _jit_gemm as kernel

    # 9 x 2 @ 2 x 9 (a full vector of columns and a tail of one) plus a bias, ReLU.
    w = np.arange(18, dtype=dtype).reshape(9, 2) - 4
    x = np.ones((2, 9), dtype)
    x[1] = 2
    out = np.empty((9, 9), dtype)
    lo, hi = dtype.type(0), dtype.type(np.inf)
    packed, bias = kernel.pack(w, 9, 2), np.ones(9, dtype)
    kernel.product(packed.ctypes.data, x.ctypes.data, 9, False, 2, bias.ctypes.data, out, out.ctypes.data, False, CLAMP,
                   lo, hi, 0, 3, 0, 9, np.empty(kernel.TAIL_SCRATCH, dtype))
    wanted = np.maximum(w @ x + 1, 0)
    _expect("product by a packed weight", tuple(out[:, 0]) + tuple(out[:, 8]),
            tuple(wanted[:, 0]) + tuple(wanted[:, 8]))
    return kernel


def _check_elementwise(name):
    def check(dtype):
        from . import _jit_activation

        kernel = getattr(_jit_activation, name)
        out = np.empty(3, dtype)
        kernel(np.array([0, 10, -10], dtype), out, 0, 3)
        _expect(name, tuple(out), {"erf": (0, 1, -1), "gelu": (0, 10, 0)}[name])
        return kernel
    return check


def _check_scatter_taps(dtype):
    from ._jit_gemm import scatter_taps

    # One channel, one input pixel, 2x2 taps 1..4 (plus a bias of 10) into a 2x2 output; and 1x3.
    out = np.empty((1, 2, 2), dtype)
    scatter_taps(np.arange(1, 5, dtype=dtype).reshape(1, 2, 2, 1, 1), np.full(1, 10, dtype), True, out, 0, 0, 1)
    _expect("scatter of taps", tuple(out.ravel()), (11, 12, 13, 14))
    out = np.empty((1, 1, 3), dtype)
    scatter_taps(np.arange(1, 4, dtype=dtype).reshape(1, 1, 3, 1, 1), np.zeros(1, dtype), False, out, 0, 0, 1)
    _expect("scatter of taps (a loop over them)", tuple(out.ravel()), (1, 2, 3))
    return scatter_taps


def _expect(what, got, wanted):
    if got != wanted:
        raise RuntimeError(f"the compiled {what} kernel's self-check gave {got}, not {wanted}")


_SELF_CHECKS = {"depthwise": _check_depthwise, "depthwise_channels_last": _check_depthwise_channels_last,
                "depthwise_nhwc": _check_depthwise_nhwc, "max_pool": _check_max_pool,
                "few_channels": _check_few_channels,
                "epilogue": _check_epilogue, "tiled_product": _check_tiled_product,
                "scatter_taps": _check_scatter_taps,
                "erf": _check_elementwise("erf"), "gelu": _check_elementwise("gelu")}


def unavailable_reason():
    """Why compiled kernels are not used in this process (None: they are, or none was asked for yet)."""
    return _failed
