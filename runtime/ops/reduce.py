"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax, ArgMin.

The axes are settled at PREPARE: from the attribute (before opset 18, 13 for
ReduceSum) or from the `axes` input, which must then be a known constant. A
kernel reduces into a keepdims-shaped view of its output, so keepdims=0 costs
nothing. Reducing over an empty set gives the spec's identity (0 for sums, 1
for products, -inf for max and logs, +inf for min). noop_with_empty_axes reduces
over no axis at all, which leaves each element to the op's elementwise part
(ReduceSumSquare then squares, ReduceL1 takes |x|), as onnxruntime does.

ReduceSum and ReduceMean over trailing or leading axes of a float tensor are a
BLAS matrix-vector product with a constant vector (ones, or 1/n); sums of squares
are one einsum; neither makes an input-sized temporary.
"""

import math
import string

import numpy as np

from ..errors import ModelError
from . import parallel
from .registry import Inferred, Kernel, TensorInfo, register

_BLAS_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def normalize_axes(node, axes, rank):
    """Axes as a sorted tuple of non-negative ints; ModelError if out of range or repeated."""
    normal = []
    for axis in axes:
        axis = int(axis)
        if not -rank <= axis < rank:
            raise ModelError(f"axis {axis} is out of range for rank {rank}")
        normal.append(axis % rank)
    if len(set(normal)) != len(normal):
        raise ModelError(f"repeated axes {list(axes)}")
    return tuple(sorted(normal))


class Reduce(Kernel):
    """Axes from the attribute (opset < 18; < 13 for ReduceSum)."""

    attributes = {"axes": None, "keepdims": 1}
    noop_with_empty_axes = 0
    matvec_weight = None  # for a weighted sum: count -> the weight of each element
    empty_value = None  # what reducing zero elements gives; None: the ufunc's identity

    def axes_of(self, axes_input):
        return self.axes

    def infer(self, x, axes_input=None):
        axes = self.axes_of(axes_input)
        rank = len(x.shape)
        if axes is None or len(axes) == 0:
            axes = () if self.noop_with_empty_axes else range(rank)
        axes = normalize_axes(self.node, axes, rank)
        reduced = axes
        kept_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        shape = kept_shape if self.keepdims else tuple(
            d for i, d in enumerate(x.shape) if i not in axes)
        count = math.prod(x.shape[i] for i in axes)
        matvec = None
        if self.matvec_weight is not None and x.dtype in _BLAS_TYPES and axes and count:
            if axes == tuple(range(rank - len(axes), rank)):
                matvec = "rows"
            elif axes == tuple(range(len(axes))):
                matvec = "columns"
        return Inferred([TensorInfo(shape, x.dtype)], reduced=reduced, kept_shape=kept_shape, count=count,
                        matvec=matvec, kept=frozenset(range(rank)) - frozenset(axes))

    def prepare(self, x, axes_input=None):
        if axes_input is not None:
            self.pack({1}, ())  # the axes are settled: run does not read them
        if self.matvec is not None:
            self.weights = np.full(self.count, self.matvec_weight(self.count), x.dtype)
        if self.count == 0:
            return []
        return self.scratch(x)

    def scratch(self, x):
        return []

    def run(self, x, axes_input=None, *, outs, scratch):
        out = outs[0].reshape(self.kept_shape)
        if self.count == 0:
            out.fill(self.empty(out.dtype))
            return
        if self.matvec is not None:  # one BLAS matrix-vector product, on BLAS's threads
            self.reduce(x, out, scratch)
            return
        # a large one in ranges of a kept axis on the run's threads (input, output and scratch cut alike)
        parallel.over_leading(x.shape, lambda cut: self.reduce(x[cut], out[cut], tuple(s[cut] for s in scratch)),
                              kept=self.kept)

    def empty(self, dtype):
        if self.empty_value is None:
            return self.ufunc.identity
        if dtype.kind == "f":
            return self.empty_value
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        if info is None:  # bool
            return self.empty_value > 0
        return info.max if self.empty_value > 0 else info.min

    def reduce(self, x, out, scratch):
        self.ufunc.reduce(x, axis=self.reduced, keepdims=True, out=out)

    def reduce_linear(self, x, out):
        """A weighted sum over the axes: over trailing or leading axes, a BLAS matrix-vector
        product (4-10x faster than numpy's reduction along short contiguous rows)."""
        if self.matvec == "rows":
            np.dot(x.reshape(-1, self.count), self.weights, out=out.reshape(-1))
        elif self.matvec == "columns":
            np.dot(self.weights, x.reshape(self.count, -1), out=out.reshape(-1))
        else:
            np.add.reduce(x, axis=self.reduced, keepdims=True, out=out)
            if self.matvec_weight(self.count) != 1:
                np.divide(out, self.count, out=out, casting="unsafe")


class ReduceAxesInput(Reduce):
    """Axes from the optional second input (opset 18; 13 for ReduceSum), known at PREPARE."""

    attributes = {"keepdims": 1, "noop_with_empty_axes": 0}

    def axes_of(self, axes_input):
        if axes_input is None:
            return None
        if axes_input.value is None:
            self.needs_value("axes")
        return axes_input.value.reshape(-1).tolist()


class SumOfSquares:
    """sum(x * x) by einsum, which multiplies and accumulates without an input-sized temporary."""

    def infer(self, x, axes_input=None):
        infos = super().infer(x, axes_input)
        reduced = infos.derived["reduced"]
        letters = string.ascii_letters[:len(x.shape)]
        kept = "".join(c for i, c in enumerate(letters) if i not in reduced)
        subscripts = f"{letters},{letters}->{kept}"
        return Inferred(infos, subscripts=subscripts)

    def sum_of_squares(self, x, out):
        shape = tuple(d for i, d in enumerate(out.shape) if i not in self.reduced)  # of out, or of a cut of it
        np.einsum(self.subscripts, x, x, out=out.reshape(shape))


def _define(name, reduce=None, empty_value=None, ufunc=None, scratch=None, mixins=(),
            matvec_weight=None):
    """Register `name` twice: axes as attribute (opset 1) and as input (opset 18, 13 for Sum)."""
    body = {"empty_value": empty_value}
    if matvec_weight is not None:
        body["matvec_weight"] = staticmethod(matvec_weight)
    if ufunc is not None:
        body["ufunc"] = ufunc
    if reduce is not None:
        body["reduce"] = reduce
    if scratch is not None:
        body["scratch"] = scratch
    since_input = 13 if name == "ReduceSum" else 18
    for base, since in ((Reduce, 1), (ReduceAxesInput, since_input)):
        register(name, since)(type(name, (*mixins, base), dict(body)))


def _sum(self, x, out, scratch):
    self.reduce_linear(x, out)


def _mean(self, x, out, scratch):
    if self.matvec is not None or out.dtype.kind != "f":
        self.reduce_linear(x, out)
    else:
        # np.mean accumulates float16 in float32 and divides in place.
        np.mean(x, axis=self.reduced, keepdims=True, out=out)


def _l1(self, x, out, scratch):
    magnitude = np.abs(x, out=scratch[0])
    np.add.reduce(magnitude, axis=self.reduced, keepdims=True, out=out)


def _l2(self, x, out, scratch):
    self.sum_of_squares(x, out)
    np.sqrt(out, out=out, casting="unsafe")


def _sum_square(self, x, out, scratch):
    self.sum_of_squares(x, out)


def _log_sum(self, x, out, scratch):
    np.add.reduce(x, axis=self.reduced, keepdims=True, out=out)
    np.log(out, out=out, casting="unsafe")


def _log_sum_exp(self, x, out, scratch):
    # log(sum(exp(x - max))) + max, with the max of an all -inf slice taken as 0 so that
    # it gives -inf rather than nan.
    shifted, peak = scratch
    np.maximum.reduce(x, axis=self.reduced, keepdims=True, out=peak)
    np.copyto(peak, 0, where=~np.isfinite(peak))
    np.subtract(x, peak, out=shifted)
    np.exp(shifted, out=shifted)
    np.add.reduce(shifted, axis=self.reduced, keepdims=True, out=out)
    with np.errstate(divide="ignore"):
        np.log(out, out=out)
    np.add(out, peak, out=out)


def _input_sized(self, x):
    return [(tuple(x.shape), x.dtype)]


def _input_and_output_sized(self, x):
    return [(tuple(x.shape), x.dtype), (self.kept_shape, x.dtype)]


_define("ReduceSum", ufunc=np.add, reduce=_sum, matvec_weight=lambda count: 1)
_define("ReduceProd", ufunc=np.multiply)
_define("ReduceMax", ufunc=np.maximum, empty_value=-np.inf)
_define("ReduceMin", ufunc=np.minimum, empty_value=np.inf)
# onnxruntime gives 0 for the mean of nothing.
_define("ReduceMean", reduce=_mean, empty_value=0.0, matvec_weight=lambda count: 1 / count)
_define("ReduceL1", reduce=_l1, empty_value=0.0, scratch=_input_sized)
_define("ReduceL2", reduce=_l2, empty_value=0.0, mixins=(SumOfSquares,))
_define("ReduceSumSquare", reduce=_sum_square, empty_value=0.0, mixins=(SumOfSquares,))
_define("ReduceLogSum", reduce=_log_sum, empty_value=-np.inf)
_define("ReduceLogSumExp", reduce=_log_sum_exp, empty_value=-np.inf,
        scratch=_input_and_output_sized)


class ArgReduce(Kernel):
    """ArgMax/ArgMin: int64 indices along one axis; select_last_index from opset 12."""

    attributes = {"axis": 0, "keepdims": 1, "select_last_index": 0}
    function = None

    def infer(self, x):
        rank = len(x.shape)
        (normal_axis,) = normalize_axes(self.node, [self.axis], rank)
        if x.shape[normal_axis] == 0:
            raise ModelError(f"cannot take the index of an extremum "
                             f"over an empty axis {self.axis} of shape {x.shape}")
        kept_shape = tuple(1 if i == normal_axis else d for i, d in enumerate(x.shape))
        shape = kept_shape if self.keepdims else tuple(
            d for i, d in enumerate(x.shape) if i != normal_axis)
        last = x.shape[normal_axis] - 1
        return Inferred([TensorInfo(shape, np.dtype(np.int64))], normal_axis=normal_axis, kept_shape=kept_shape,
                        last=last)

    def run(self, x, *, outs, scratch):
        out = outs[0].reshape(self.kept_shape)
        if self.select_last_index:
            # The first extremum of the reversed axis is the last one of the original.
            self.function(np.flip(x, self.normal_axis), axis=self.normal_axis, out=out,
                          keepdims=True)
            np.subtract(self.last, out, out=out)
        else:
            self.function(x, axis=self.normal_axis, out=out, keepdims=True)


@register("ArgMax", since=1)
class ArgMax(ArgReduce):
    function = staticmethod(np.argmax)


@register("ArgMin", since=1)
class ArgMin(ArgReduce):
    function = staticmethod(np.argmin)
