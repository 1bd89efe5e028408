"""Ops without a larger family: Dropout (inference), Swish, SwiGLU, Shrink, CumProd,
LpPool, GlobalLpPool, Compress, the spectral windows (Hann, Hamming, Blackman), Det,
MaxUnpool and MaxRoiPool.

- Dropout is inference only: Y is X and the mask all True. Training with a ratio
  above 0 would give random outputs, so it is refused with a ModelError.
- LpPool pools |X|^p with `conv_core`'s average pooling (padding not counted) and
  multiplies back by the count of taps, which is the sum over the window; then the
  p-th root. The window geometry is `pool._WindowPool`'s.
- Compress, the windows and MaxUnpool's output_shape decide output shapes from input
  values: when these are only known per run, infer raises NeedsValueError.
"""

import math

import numpy as np

from ..errors import ExecutionError
from . import conv_core
from .activation import sigmoid
from .pool import _WindowPool
from .registry import FUSED, REQUIRED, Inferred, Kernel, TensorInfo, register
from .select import CumSum
from .shape import int_list, known_value, normalize_axis, onnx_dtype, sane_shape

BOOL = np.dtype(np.bool_)


# Dropout

@register("Dropout", since=1)
class Dropout(Kernel):
    """Opsets 1 to 11: ratio is an attribute; the mask has X's type before opset 10.

    Before opset 7 `is_test=0` asked for training; nnrun runs inference only, so every
    Dropout runs as in test mode.
    """
    attributes = {"ratio": 0.5, "is_test": 0, "consumed_inputs": None}
    mask_dtype = None  # None: X's type

    def decode(self):
        self.with_mask = len(self.node.outputs) > 1 and bool(self.node.outputs[1])

    def infer(self, x, *rest):
        # An alias is never run, so only a node that cannot be asked to train may be one.
        if self.check_training(*rest) and not self.with_mask:
            return [TensorInfo(tuple(x.shape), x.dtype, alias_of=0)]
        mask = self.mask_dtype or x.dtype
        return [TensorInfo(tuple(x.shape), x.dtype), TensorInfo(tuple(x.shape), mask)]

    def check_training(self, *rest):
        """Fail when training is asked for; False when that is only known at run time."""
        return True

    def run(self, x, *rest, outs, scratch=()):
        self.check_training(*(None if r is None else TensorInfo.of(r) for r in rest))
        if not self.with_mask:
            return x
        np.copyto(outs[0], x)
        outs[1][...] = 1
        return None


@register("Dropout", since=10)
class Dropout10(Dropout):
    mask_dtype = BOOL


@register("Dropout", since=12)
class Dropout12(Dropout10):
    """ratio and training_mode are inputs; `seed` only matters in training."""
    attributes = {"seed": None}

    def check_training(self, ratio=None, training_mode=None):
        if training_mode is None:
            return True
        if training_mode.value is None:
            return False  # checked by run on the actual value
        if not bool(np.asarray(training_mode.value).reshape(-1)[0]):
            return True
        if ratio is None:
            value = 0.5
        elif ratio.value is None:
            return False
        else:
            value = float(np.asarray(ratio.value).reshape(-1)[0])
        if value > 0:
            self.fail(f"training_mode is true with ratio {value}: the outputs would be random, "
                      "and nnrun runs inference only")
        return True


# Activations

@register("Swish", since=1, domain=FUSED)
@register("Swish", since=24)
class Swish(Kernel):
    """Y = X * sigmoid(alpha * X)."""
    attributes = {"alpha": 1.0}

    def infer(self, x):
        if x.dtype.kind != "f":
            self.fail(f"input X has type {x.dtype}; expected a floating type")
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, *, outs, scratch=()):
        y = outs[0]
        np.multiply(x, y.dtype.type(self.alpha), out=y)
        sigmoid(y, y)
        np.multiply(y, x, out=y)


@register("SwiGLU", since=28)
class SwiGLU(Kernel):
    """Y = Swish_alpha(A) * B; A and B have the same shape, no broadcasting."""
    attributes = {"alpha": 1.0}

    def infer(self, a, b):
        if a.dtype.kind != "f" or a.dtype != b.dtype:
            self.fail(f"inputs have types {a.dtype} and {b.dtype}; expected one floating type")
        if tuple(a.shape) != tuple(b.shape):
            self.fail(f"inputs have shapes {list(a.shape)} and {list(b.shape)}; expected the same")
        return [TensorInfo(tuple(a.shape), a.dtype)]

    def run(self, a, b, *, outs, scratch=()):
        y = outs[0]
        np.multiply(a, y.dtype.type(self.alpha), out=y)
        sigmoid(y, y)
        np.multiply(y, a, out=y)
        np.multiply(y, b, out=y)


@register("Shrink", since=9)
class Shrink(Kernel):
    """Y = X + bias below -lambd, X - bias above lambd, 0 between."""
    attributes = {"bias": 0.0, "lambd": 0.5}

    def infer(self, x):
        if x.dtype.kind not in "fiu":
            self.fail(f"input has type {x.dtype}; expected a numeric type")
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, *, outs, scratch=()):
        y = outs[0]
        if self.bias == self.lambd and x.dtype.kind == "f":
            # Soft shrink: X minus X clipped to [-lambd, lambd], two passes.
            np.clip(x, -self.lambd, self.lambd, out=y)
            np.subtract(x, y, out=y)
        elif self.bias == 0:
            # Hard shrink: X where |X| > lambd.
            np.multiply(x, np.abs(x) > self.lambd, out=y, casting="unsafe")
        else:
            below = x < -self.lambd
            above = x > self.lambd
            y[...] = 0
            np.add(x, self.bias, out=y, where=below, casting="unsafe")
            np.subtract(x, self.bias, out=y, where=above, casting="unsafe")


# CumProd

@register("CumProd", since=26)
class CumProd(CumSum):
    """CumSum's axis handling with products; the exclusive product starts at 1."""

    accumulate = staticmethod(np.cumprod)
    identity = 1


# Lp pooling

@register("LpPool", since=1)
class LpPool(_WindowPool):
    """(sum of |X|^p over each window)^(1/p); p is a float in opset 1, an int from 2.

    auto_pad/pads/strides from opset 1, dilations and ceil_mode from 18.
    """
    attributes = {**_WindowPool.attributes, "p": 2}
    kind = "average"

    def decode(self):
        super().decode()
        self.p = float(self.p)
        if self.p <= 0:
            self.fail(f"p {self.p} must be positive")

    def prepare(self, x):
        spec = super().prepare(x)
        # |X|^p lives in scratch, before the pooling's own scratch.
        return [(tuple(x.shape), x.dtype)] + spec

    def run(self, x, *, outs, scratch=()):
        y = outs[0]
        powered = scratch[0]
        _abs_power(x, self.p, powered)
        conv_core.pool(powered, y, self.plan, scratch[1] if len(scratch) > 1 else None)
        # The average leaves out padding, which adds nothing to the sum: times the count is the sum.
        np.multiply(y, self.plan.divisor, out=y)
        _root(y, self.p)


def _abs_power(x, p, out):
    np.abs(x, out=out)
    if p == 2:
        np.square(out, out=out)
    elif p != 1:
        np.power(out, out.dtype.type(p), out=out)


def _root(y, p):
    if p == 2:
        np.sqrt(y, out=y)
    elif p != 1:
        np.power(y, y.dtype.type(1 / p), out=y)


@register("GlobalLpPool", since=1)
class GlobalLpPool(Kernel):
    """LpPool over each whole (n, c) plane; p is a float in opset 1, an int from 2."""
    attributes = {"p": 2}

    def decode(self):
        self.p = float(self.p)
        if self.p <= 0:
            self.fail(f"p {self.p} must be positive")

    def infer(self, x):
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, D1, ...)")
        if x.dtype.kind != "f":
            self.fail(f"input X has type {x.dtype}; expected a floating type")
        return [TensorInfo((*x.shape[:2], *(1,) * (len(x.shape) - 2)), x.dtype)]

    def run(self, x, *, outs, scratch=()):
        planes = x.reshape(x.shape[0], x.shape[1], -1)
        y = outs[0].reshape(planes.shape[:2])
        if self.p == 2:
            np.einsum("ncs,ncs->nc", planes, planes, out=y)
        elif self.p == 1:
            np.sum(np.abs(planes), axis=2, out=y)
        else:
            np.sum(np.power(np.abs(planes), x.dtype.type(self.p)), axis=2, out=y)
        _root(y, self.p)


# Compress

@register("Compress", since=9)
class Compress(Kernel):
    """The slices along `axis` (the flattened input without it) where condition is true.

    The condition may be shorter than the axis: the slices past its end are dropped.
    """
    attributes = {"axis": None}

    def infer(self, x, condition):
        if condition.dtype != BOOL or len(condition.shape) != 1:
            self.fail(f"condition must be a 1-D bool tensor, got {condition.dtype} of shape "
                      f"{list(condition.shape)}")
        if self.axis is None:
            length = math.prod(x.shape)
        else:
            axis_n = normalize_axis(self.node, self.axis, len(x.shape))
            length = x.shape[axis_n]
        if condition.shape[0] > length:
            self.fail(f"condition has {condition.shape[0]} values for {length} slices")
        kept = int(np.count_nonzero(known_value(self.node, condition, "condition")))
        if self.axis is None:
            shape = (kept,)
        else:
            shape = tuple(x.shape[:axis_n]) + (kept,) + tuple(x.shape[axis_n + 1:])
        return [TensorInfo(shape, x.dtype)]

    def run(self, x, condition, *, outs, scratch=()):
        if self.axis is None:
            np.compress(condition, x.reshape(-1), out=outs[0])
        else:
            axis = normalize_axis(self.node, self.axis, x.ndim)
            np.compress(condition, x, axis=axis, out=outs[0])


# Spectral windows

class _Window(Kernel):
    """A window of `size` samples; periodic windows are the first `size` of a `size + 1` one."""
    attributes = {"output_datatype": 1, "periodic": 1}

    def decode(self):
        self.dtype = onnx_dtype(self.node, self.output_datatype, "output_datatype")

    def infer(self, size):
        values = int_list(self.node, size, "size")
        if len(values) != 1:
            self.fail(f"size must be one integer, got {values}")
        n = sane_shape(self.node, values, self.dtype)[0]
        return [TensorInfo((n,), self.dtype)]

    def run(self, size, *, outs, scratch=()):
        n = int(np.asarray(size).reshape(-1)[0])
        span = n if self.periodic else n - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            phase = np.arange(n, dtype=np.float64) * (2 * np.pi / span)
        window = self.formula(phase)
        # The windows are never negative: 0.42 - 0.5 + 0.08 must not round to -1e-17.
        np.maximum(window, 0, out=window)
        np.copyto(outs[0], window, casting="unsafe")


@register("HannWindow", since=17)
class HannWindow(_Window):
    @staticmethod
    def formula(phase):
        return 0.5 - 0.5 * np.cos(phase)


@register("HammingWindow", since=17)
class HammingWindow(_Window):
    @staticmethod
    def formula(phase):
        alpha = 25 / 46
        return alpha - (1 - alpha) * np.cos(phase)


@register("BlackmanWindow", since=17)
class BlackmanWindow(_Window):
    @staticmethod
    def formula(phase):
        return 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2 * phase)


# Linear algebra

@register("Det", since=11)
class Det(Kernel):
    """Determinants of the trailing (M, M) matrices; 22 only adds types."""

    def infer(self, x):
        if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
            self.fail(f"input has shape {list(x.shape)}; expected (..., M, M)")
        if x.dtype.kind != "f":
            self.fail(f"input has type {x.dtype}; expected a floating type")
        return [TensorInfo(tuple(x.shape[:-2]), x.dtype)]

    def run(self, x, *, outs, scratch=()):
        # LAPACK has no half floats.
        work = x if x.dtype.itemsize >= 4 else x.astype(np.float32)
        np.copyto(outs[0], np.linalg.det(work), casting="unsafe")


# MaxUnpool

@register("MaxUnpool", since=9)
class MaxUnpool(Kernel):
    """Scatters X to the flat positions I of the unpooled tensor, zeros elsewhere.

    With output_shape larger than the inferred shape, the unpooled tensor fills its
    leading corner, as onnx's reference places it. 11 and 22 only add types.
    """
    attributes = {"kernel_shape": REQUIRED, "pads": None, "strides": None}

    def infer(self, x, indices, output_shape=None):
        rank = len(x.shape) - 2
        if rank < 1 or len(self.kernel_shape) != rank:
            self.fail(f"kernel_shape {list(self.kernel_shape)} does not fit X of shape {list(x.shape)}")
        if tuple(indices.shape) != tuple(x.shape) or indices.dtype.kind not in "iu":
            self.fail(f"I has shape {list(indices.shape)} {indices.dtype}; expected X's shape, int64")
        strides = self.strides or (1,) * rank
        pads = self.pads or (0,) * (2 * rank)
        if len(strides) != rank or len(pads) != 2 * rank:
            self.fail(f"strides {list(strides)} and pads {list(pads)} do not fit {rank} spatial dims")
        inferred = tuple(x.shape[:2]) + tuple(
            (i - 1) * s - (pads[d] + pads[rank + d]) + k
            for d, (i, s, k) in enumerate(zip(x.shape[2:], strides, self.kernel_shape)))
        shape = inferred
        if output_shape is not None:
            shape = tuple(int_list(self.node, output_shape, "output_shape"))
            if len(shape) != len(x.shape) or any(o < i for o, i in zip(shape, inferred)):
                self.fail(f"output_shape {list(shape)} is smaller than the unpooled shape "
                          f"{list(inferred)}")
        shape = sane_shape(self.node, shape, x.dtype)
        return Inferred([TensorInfo(shape, x.dtype)], unpooled_shape=inferred)

    def run(self, x, indices, output_shape=None, *, outs, scratch=()):
        y = outs[0]
        y[...] = 0
        corner = y[tuple(slice(0, n) for n in self.unpooled_shape)]
        flat = indices.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= math.prod(self.unpooled_shape)):
            raise ExecutionError(f"an index in I is outside the unpooled shape "
                                 f"{list(self.unpooled_shape)}")
        if corner.flags.c_contiguous:
            corner.reshape(-1)[flat] = x.reshape(-1)
        else:
            unpooled = np.zeros(self.unpooled_shape, y.dtype)
            unpooled.reshape(-1)[flat] = x.reshape(-1)
            corner[...] = unpooled


# MaxRoiPool

@register("MaxRoiPool", since=1)
class MaxRoiPool(Kernel):
    """Max over each of pooled_shape bins of each region (batch index, x1, y1, x2, y2), as Caffe's
    ROIPooling: corners scaled and rounded half away from zero, bins of the rounded region with
    floor/ceil bounds, empty bins 0. One max over all channels per bin. 22 only adds types.
    """
    attributes = {"pooled_shape": REQUIRED, "spatial_scale": 1.0}

    def decode(self):
        if len(self.pooled_shape) != 2 or min(self.pooled_shape) < 1:
            self.fail(f"pooled_shape {list(self.pooled_shape)} must be two positive sizes")

    def infer(self, x, rois):
        if len(x.shape) != 4 or x.dtype.kind != "f":
            self.fail(f"input X is {x.dtype} of shape {list(x.shape)}; expected floating (N, C, H, W)")
        if len(rois.shape) != 2 or rois.shape[1] != 5 or rois.dtype != x.dtype:
            self.fail(f"rois are {rois.dtype} of shape {list(rois.shape)}; expected {x.dtype} (num_rois, 5)")
        return [TensorInfo((rois.shape[0], x.shape[1], *self.pooled_shape), x.dtype)]

    def run(self, x, rois, *, outs, scratch=()):
        y = outs[0]
        height, width = x.shape[2:]
        pooled_h, pooled_w = self.pooled_shape
        corners = rois[:, 1:].astype(np.float64) * self.spatial_scale
        corners = (np.sign(corners) * np.floor(np.abs(corners) + 0.5)).astype(np.int64)
        for r, (batch, (x1, y1, x2, y2)) in enumerate(zip(rois[:, 0].astype(np.int64), corners)):
            if not 0 <= batch < x.shape[0]:
                self.fail(f"roi {r} names batch {batch} of {x.shape[0]}")
            rows = _bins(y1, y2, pooled_h, height)
            cols = _bins(x1, x2, pooled_w, width)
            for ph, (h0, h1) in enumerate(rows):
                for pw, (w0, w1) in enumerate(cols):
                    if h1 <= h0 or w1 <= w0:
                        y[r, :, ph, pw] = 0
                    else:
                        np.max(x[batch, :, h0:h1, w0:w1], axis=(1, 2), out=y[r, :, ph, pw])


def _bins(start, end, bins, size):
    """[begin, end) of each of `bins` bins over the rounded region [start, end], clipped to [0, size]."""
    length = max(end - start + 1, 1)
    step = length / bins
    def clip(v):
        return min(max(v + start, 0), size)

    return [(clip(math.floor(i * step)), clip(math.ceil((i + 1) * step))) for i in range(bins)]
