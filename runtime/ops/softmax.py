"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to a matrix around `axis` (default 1): the
function runs over all the dimensions from `axis` on. From opset 13 it runs over
the one dimension `axis` (default -1). Both become a reduction over axis 1 of a
view of shape (outer, n) or (outer, n, inner), so one kernel serves both. The
results go into the output; the per-slice max and sum live in arena scratch of
the reduced size. The max is subtracted first, so exp never overflows.
"""

import math

import numpy as np

from ..errors import ModelError
from . import parallel
from .registry import FUSED, Inferred, Kernel, TensorInfo, register


def softmax_view(shape, axis, coerce_2d):
    """(view, reduced): the (outer, n) or (outer, n, inner) view a softmax over `axis` of `shape`
    reduces along its axis 1 (before opset 13, `coerce_2d`: over every dimension from `axis` on),
    and the shape of its per-slice max and sum."""
    rank = len(shape)
    if not -rank <= axis < rank:
        raise ModelError(f"axis {axis} is out of range for rank {rank}")
    axis = axis % rank
    outer = math.prod(shape[:axis])
    if coerce_2d:
        view = (outer, math.prod(shape[axis:]))
    else:
        inner = math.prod(shape[axis + 1:])
        view = (outer, shape[axis]) + ((inner,) if inner != 1 else ())
    return view, (outer, 1) + view[2:]


def softmax_into(x, y, total, ones=None):
    """y = softmax of x (views from `softmax_view`) along axis 1; `total` of the reduced shape.
    y may be x. `ones`: for a 2-D view of float32/64, a vector of ones as long as its rows, with
    which BLAS sums them (several times faster than numpy's reduction along short rows)."""
    np.maximum.reduce(x, axis=1, keepdims=True, out=total)
    np.subtract(x, total, out=y)
    np.exp(y, out=y)
    _sum_rows(y, total, ones)
    np.divide(y, total, out=y)


def sum_ones(view, dtype):
    """The `ones` of `softmax_into` for a view of `dtype`, or None where BLAS does not serve."""
    return np.ones(view[1], dtype) if len(view) == 2 and dtype in (np.float32, np.float64) else None


def _sum_rows(y, total, ones):
    if ones is not None:
        np.dot(y, ones, out=total.reshape(-1))
    else:
        np.add.reduce(y, axis=1, keepdims=True, out=total)


class SoftmaxFamily(Kernel):
    attributes = {"axis": 1}
    coerce_2d = True  # opset < 13
    n_scratch = 1

    def infer(self, x):
        view, reduced = softmax_view(x.shape, self.axis, self.coerce_2d)
        return Inferred([TensorInfo(tuple(x.shape), x.dtype)], reduced=reduced, view=view)

    def prepare(self, x):
        self.ones = sum_ones(self.view, x.dtype)
        return [(self.reduced, x.dtype)] * self.n_scratch

    def run(self, x, *, outs, scratch):
        if outs[0].size == 0:
            return
        x, y = x.reshape(self.view), outs[0].reshape(self.view)
        # a large one in ranges of its slices on the run's threads (the view's axis 0)
        parallel.over_leading(self.view, lambda cut: self.compute(x[cut], y[cut], tuple(s[cut] for s in scratch)),
                              kept={0})



class Softmax(SoftmaxFamily):
    def compute(self, x, y, scratch):
        softmax_into(x, y, scratch[0], self.ones)


class LogSoftmax(SoftmaxFamily):
    n_scratch = 2

    def compute(self, x, y, scratch):
        # x - (max + log(sum(exp(x - max)))): y holds exp(x - max) only until the sum is taken.
        peak, total = scratch
        np.maximum.reduce(x, axis=1, keepdims=True, out=peak)
        np.subtract(x, peak, out=y)
        np.exp(y, out=y)
        _sum_rows(y, total, self.ones)
        np.log(total, out=total)
        np.add(total, peak, out=total)
        np.subtract(x, total, out=y)


class Hardmax(SoftmaxFamily):
    """1 at the first maximum of each slice, 0 elsewhere."""

    n_scratch = 0

    def compute(self, x, y, scratch):
        y.fill(0)
        np.put_along_axis(y, np.argmax(x, axis=1, keepdims=True), 1, axis=1)


for _family in (Softmax, LogSoftmax, Hardmax):
    _name = _family.__name__
    register(_name, since=1)(_family)
    register(_name, since=13)(type(_name, (_family,), {"attributes": {"axis": -1},
                                                        "coerce_2d": False}))


@register("ScaledDotProductAttention", since=1, domain=FUSED)
class ScaledDotProductAttention(Kernel):
    """softmax(q @ k_t * scale + mask) @ v, as exporters write attention op by op (MatMul, Div or
    Mul, Add, Softmax, MatMul; recognised by the compiler's fuse_patterns): the scores live in one
    scratch buffer, scaled, masked and normalised in place, instead of three or four values.

    `scale` multiplies the scores, or divides them (`divide`: the pattern's Div, the same rounding);
    `axis` and `coerce_2d` are the pattern's Softmax's (coerce_2d: the model's opset is below 13).
    """

    attributes = {"scale": 1.0, "divide": 0, "axis": -1, "coerce_2d": 0}

    def infer(self, q, k_t, v, mask=None):
        dtype = q.dtype
        if dtype.kind != "f" or any(t is not None and t.dtype != dtype for t in (k_t, v, mask)):
            raise ModelError(f"q, k, v and mask must be of one floating type, got "
                             f"{[str(t.dtype) for t in (q, k_t, v, mask) if t is not None]}")
        scores = _matmul_shape(q.shape, k_t.shape, "q @ k")
        full = scores
        if mask is not None:
            try:
                full = np.broadcast_shapes(scores, tuple(mask.shape))
            except ValueError:
                raise ModelError(f"the mask {list(mask.shape)} does not broadcast to the scores "
                                 f"{list(scores)}") from None
        view, reduced = softmax_view(full, self.axis, self.coerce_2d)
        out = _matmul_shape(full, v.shape, "scores @ v")
        return Inferred([TensorInfo(out, dtype)], scores=scores, full=full, view=view, reduced=reduced)

    def prepare(self, q, k_t, v, mask=None):
        self.ones = sum_ones(self.view, q.dtype)
        separate = [(self.scores, q.dtype)] if self.full != self.scores else []  # a mask that widens them
        return [(self.full, q.dtype), (self.reduced, q.dtype)] + separate

    def run(self, q, k_t, v, mask=None, *, outs, scratch):
        full = scratch[0]
        scores = scratch[2] if len(scratch) > 2 else full
        np.matmul(q, k_t, out=scores)
        if self.divide:
            np.divide(scores, scores.dtype.type(self.scale), out=scores)
        elif self.scale != 1:
            np.multiply(scores, scores.dtype.type(self.scale), out=scores)
        if mask is not None:
            np.add(scores, mask, out=full)
        if full.size:
            view = full.reshape(self.view)
            softmax_into(view, view, scratch[1], self.ones)
        np.matmul(full, v, out=outs[0])


def _matmul_shape(a, b, what):
    """numpy's matmul shape of (..., n, k) @ (..., k, m), or a ModelError naming `what`."""
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ModelError(f"{what}: shapes {list(a)} and {list(b)} do not multiply")
    try:
        lead = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    except ValueError:
        raise ModelError(f"{what}: the batch dimensions of {list(a)} and {list(b)} do not broadcast") from None
    return tuple(lead) + (a[-2], b[-1])
