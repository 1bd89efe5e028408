"""TFLite reductions over a constant axis tensor (MEAN, SUM, REDUCE_*) and ARG_MAX / ARG_MIN."""


import numpy as np

from .. import reduce  # noqa: F401 - ONNX's reduction kernels, registered before they are looked up
from ..registry import Inferred, Kernel, TensorInfo, lookup
from ..shape import int_list, normalize_axis
from .common import axis_of, tensor_type, tfl

# --------------------------------------------------------------------------- reductions


class AxesTensor:
    """TFLite's front end on ONNX's reduction kernels (reduce.py): `keep_dims`, and the axes of a
    constant tensor, repeats allowed; an empty axes tensor reduces nothing, as in LiteRT."""

    attributes = {"keep_dims": False}
    noop_with_empty_axes = 1
    extremum = False  # REDUCE_MAX and REDUCE_MIN: an empty axis has no answer

    def decode(self):
        self.keepdims = int(bool(self.keep_dims))

    def infer(self, x, axes):
        rank = len(x.shape)
        values = int_list(self.node, axes, "axis")
        unique = sorted({normalize_axis(self.node, v, rank) for v in values}) if rank else []
        if self.extremum and any(x.shape[a] == 0 for a in unique):
            self.fail("cannot take the extremum of an empty axis")
        return super().infer(x, TensorInfo.of(np.array(unique, np.int64)))


for _op, _onnx in {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax",
                   "REDUCE_MIN": "ReduceMin", "REDUCE_PROD": "ReduceProd"}.items():
    tfl(_op)(type(_op.title(), (AxesTensor, lookup("", _onnx, 18)),
                  {"attributes": AxesTensor.attributes, "extremum": _op in ("REDUCE_MAX", "REDUCE_MIN")}))


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
