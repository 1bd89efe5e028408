"""Activations that the compiler may fuse into a producer (Conv, Gemm, MatMul).

Each activation has one formula, `f(x, out, **params)`, writing into `out`
(which may be `x` itself). The standalone operators in elementwise.py call the
same formulas with a separate `out`; a fused activation is a (op_type, params)
pair stored on the producing node as the attribute `_activation`, and the
producer's kernel calls `apply_activation` on its output in place, saving one
pass over memory and one arena slot.

The formulas avoid masked ufuncs (`where=`): on data whose sign changes at
random they branch per element and run ten times slower than a plain pass.
Two-branch activations merge their branches with max/min instead; when that
needs a second buffer in place, they work through `blockwise` with a small one.
"""

import threading

import numpy as np

# The clip ufunc itself: np.clip's Python wrapper costs 1.5 us a call, a tiny step's whole budget.
from numpy._core.umath import clip as clip_ufunc

FUSABLE = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh"}

BLOCK = 1 << 16  # elements per block of `blockwise`: a block and its temporaries stay in L2


def blockwise(core, x, out, temps):
    """core(x_block, out_block, *temp_blocks) over matching flat blocks of x and out.

    `temps` are 1-D buffers of equal length, the block size. Lets a formula that
    needs temporaries run with a few small ones instead of output-sized ones.
    A view that is not contiguous (a share of a batched output: out[:, c0:c1]) is
    taken one leading index at a time: flattening it would copy, and the writes be lost.
    """
    if not (out.flags.c_contiguous and x.flags.c_contiguous):
        for i in range(out.shape[0]):
            blockwise(core, x[i], out[i], temps)
        return
    xf, of = x.reshape(-1), out.reshape(-1)
    n = of.size
    step = len(temps[0])
    if n <= step:
        core(xf, of, *(t[:n] for t in temps))
        return
    for start in range(0, n, step):
        stop = min(start + step, n)
        core(xf[start:stop], of[start:stop], *(t[:stop - start] for t in temps))


def in_place(x, out):
    return out is x or np.may_share_memory(x, out)


def upper_limit(dtype):
    # np.clip with both bounds has a fast loop; with one bound it falls back to max/min, which
    # numpy runs several times slower when the other operand is a scalar.
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def lower_limit(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


_RELU_BOUNDS = {}  # dtype -> (0, its upper limit) as that type: made once, not per call


def relu(x, out):
    bounds = _RELU_BOUNDS.get(out.dtype)
    if bounds is None:
        kind = out.dtype.type
        bounds = _RELU_BOUNDS[out.dtype] = (kind(0), kind(upper_limit(out.dtype)))
    clip_ufunc(x, *bounds, out=out)


def leaky_relu(x, out, alpha=0.01):
    if alpha == 0:
        relu(x, out)
        return
    alpha = out.dtype.type(alpha)
    # leaky_relu(x) is max(x, alpha * x) for alpha <= 1 and min(x, alpha * x) for alpha >= 1.
    merge = np.maximum if alpha <= 1 else np.minimum

    def core(x, out, scaled):
        np.multiply(x, alpha, out=scaled)
        merge(x, scaled, out=out)

    _with_temporary(core, x, out)


_FLOAT_LIMITS = {}  # dtype -> (its lowest, its max) as that type: made once, not per call


def clip(x, out, min=None, max=None):  # noqa: A002 - the spec's names
    if out.dtype.kind == "f":
        # A bound left out is the type's lowest or max, not infinity: onnxruntime clamps +-inf.
        limits = _FLOAT_LIMITS.get(out.dtype)
        if limits is None:
            finfo = np.finfo(out.dtype)
            limits = _FLOAT_LIMITS[out.dtype] = (finfo.min, finfo.max)
        clip_ufunc(x, limits[0] if min is None else min, limits[1] if max is None else max, out=out)
        return
    if min is None and max is None:
        np.copyto(out, x)
    else:
        np.clip(x, lower_limit(out.dtype) if min is None else min,
                upper_limit(out.dtype) if max is None else max, out=out)


def sigmoid(x, out):
    # 1 / (1 + exp(-x)): exp overflows to inf for x < -88 (float32), which gives the right 0. No
    # errstate block of its own (it costs as much as the arithmetic on a small output): the executor
    # runs, and constant folding folds, with numpy's errors ignored.
    np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, 1, out=out)
    np.divide(1, out, out=out)


def tanh(x, out):
    np.tanh(x, out=out)


def hard_sigmoid(x, out, alpha=0.2, beta=0.5):
    t = out.dtype.type
    np.multiply(x, t(alpha), out=out)
    np.add(out, t(beta), out=out)
    clip_ufunc(out, t(0), t(1), out=out)


def _hard_swish(x, out, factor):
    # x * clip(x / 6 + 1/2, 0, 1)
    t = out.dtype.type
    np.multiply(x, t(1 / 6), out=factor)
    np.add(factor, t(0.5), out=factor)
    clip_ufunc(factor, t(0), t(1), out=factor)
    np.multiply(x, factor, out=out)


def hard_swish(x, out):
    _with_temporary(_hard_swish, x, out)


def _with_temporary(core, x, out):
    """core(x, out, temp) where temp may be out but not x: out itself, or blocks in place through
    this thread's `temporary`."""
    if in_place(x, out):
        blockwise(core, x, out, [temporary(min(out.size, BLOCK), out.dtype)])
    else:
        core(x, out, out)


_temporaries = threading.local()


def temporary(n, dtype):
    """A buffer of `n` elements of `dtype` (n <= BLOCK), this thread's own and reused from call to
    call (the kernels' pool threads run shares of one convolution's activation at once): a formula
    in place allocates nothing per call. A thread keeps the largest it was asked for, at most a
    block (256 KB in float32). A new block-sized array on each call was an mmap and its page
    faults: HardSwish in place over 200 x 192 elements took 27 us, 17 with the buffer kept."""
    nbytes = n * np.dtype(dtype).itemsize
    buffer = getattr(_temporaries, "buffer", None)
    if buffer is None or buffer.size < nbytes:
        buffer = _temporaries.buffer = np.empty(nbytes, np.uint8)
    return buffer[:nbytes].view(dtype)


FORMULAS = {
    "Relu": relu,
    "LeakyRelu": leaky_relu,
    "Clip": clip,
    "Sigmoid": sigmoid,
    "Tanh": tanh,
    "HardSigmoid": hard_sigmoid,
    "HardSwish": hard_swish,
}

# The parameters each formula takes, so that a fused node's extra attributes are ignored.
_PARAMS = {
    "Relu": (), "Sigmoid": (), "Tanh": (), "HardSwish": (),
    "LeakyRelu": ("alpha",), "Clip": ("min", "max"), "HardSigmoid": ("alpha", "beta"),
}


def apply_activation(y, activation):
    """Apply a fused activation to `y` in place. `activation` is None or (op_type, params)."""
    if activation is None:
        return y
    kind, params = activation
    formula = FORMULAS.get(kind)
    if formula is None:
        raise ValueError(f"activation {kind} cannot be fused")
    if not params:
        formula(y, y)
        return y
    names = _PARAMS[kind]
    formula(y, y, **{k: v for k, v in params.items() if k in names and v is not None})
    return y
