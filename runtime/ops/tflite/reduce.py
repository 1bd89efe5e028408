"""TFLite reductions over a constant axis tensor (MEAN, SUM, REDUCE_*) and ARG_MAX / ARG_MIN."""


import numpy as np

from ..registry import Inferred, Kernel, TensorInfo
from ..shape import int_list, normalize_axes
from .common import axis_of, tensor_type, tfl

# --------------------------------------------------------------------------- reductions


class Reduction(Kernel):
    """MEAN, SUM, REDUCE_*: over the axes of a constant axis tensor, keep_dims optional."""

    attributes = {"keep_dims": False}
    reducer = None

    def infer(self, x, axes):
        rank = len(x.shape)
        values = int_list(self.node, axes, "axis")
        reduced = tuple(sorted(set(normalize_axes(self.node, values, rank)))) if rank else ()
        kept = tuple(1 if i in reduced else d for i, d in enumerate(x.shape))
        shape = kept if self.keep_dims else tuple(d for i, d in enumerate(x.shape) if i not in reduced)
        if self.reducer in (np.maximum, np.minimum) and any(x.shape[a] == 0 for a in reduced):
            self.fail("cannot take the extremum of an empty axis")
        return Inferred([TensorInfo(shape, x.dtype)], axes=reduced, kept=kept)

    def run(self, x, axes, *, outs, scratch):
        out = outs[0].reshape(self.kept)
        if not self.axes:
            np.copyto(out, x)
        else:
            self.reduce(x, out)

    def reduce(self, x, out):
        self.reducer.reduce(x, axis=self.axes, keepdims=True, out=out)


@tfl("MEAN")
class TflMean(Reduction):
    def reduce(self, x, out):
        np.mean(x, axis=self.axes, keepdims=True, out=out)


for _op, _ufunc in {"SUM": np.add, "REDUCE_MAX": np.maximum, "REDUCE_MIN": np.minimum,
                    "REDUCE_PROD": np.multiply}.items():
    tfl(_op)(type(_op.title(), (Reduction,), {"reducer": _ufunc}))


class ArgExtremum(Kernel):
    attributes = {"output_type": "INT64"}
    pick = None

    def decode(self):
        self.dtype = tensor_type(self, self.output_type, "output_type")

    def infer(self, x, axis):
        (value,) = int_list(self.node, axis, "axis")
        n = axis_of(self, value, len(x.shape))
        return Inferred([TensorInfo(tuple(d for i, d in enumerate(x.shape) if i != n), self.dtype)], axis=n)

    def run(self, x, axis, *, outs, scratch):
        return self.pick(x, axis=self.axis)


@tfl("ARG_MAX")
class ArgMax(ArgExtremum):
    pick = staticmethod(np.argmax)


@tfl("ARG_MIN")
class ArgMin(ArgExtremum):
    pick = staticmethod(np.argmin)
