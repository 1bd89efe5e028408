"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
QLinearMatMul, ConvInteger and QLinearConv.

Scales and zero points apply per tensor (a scalar), per axis (a 1-D tensor along `axis`) or
per block (`block_size` consecutive elements along `axis` share one). A `Granularity`, made
once in `infer`, cuts the input into at most two pieces whose parameters broadcast without
being repeated: the whole blocks, with the blocked axis split in (blocks, block_size), and
the short tail block. Every kernel then does plain broadcasting numpy over the pieces.

Integer matrix products and convolutions run on BLAS in floating point: the operands minus
their zero points are small integers, so float32 sums are exact while they stay below 2**24
and float64 ones far beyond any real model; the result is then exact before it is converted
to int32 or requantized (in float64, as the reference evaluator does). Constant weights are
shifted and converted once at PREPARE, where their actual magnitudes bound every partial sum
(largest |activation| times the largest L1 norm of a weight column or filter): real weights
almost always allow float32, twice as fast as float64.
"""

import math

import numpy as np

from . import blas, conv_core, exotic_types
from .conv import _ConvBase
from .elementwise import broadcast_shape
from .registry import Inferred, Kernel, TensorInfo, register
from .shape import onnx_dtype

# Largest |integer sum| float32 accumulates exactly.
FLOAT32_EXACT = 1 << 24
NATIVE_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def element_dtype(node, code, attribute):
    """The dtype of an ONNX type code, the exotic types included."""
    return exotic_types.numpy_dtype(code) or onnx_dtype(node, code, attribute)


def value_range(dtype):
    """(min, max) of a quantized integer type; None for the float ones."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu" or dtype in exotic_types.SMALL_INTEGERS:
        return exotic_types.integer_range(dtype)
    return None


def compute_dtype(*dtypes):
    """The floating type arithmetic between these dtypes runs in (float32 for the exotic ones)."""
    native = [d for d in map(np.dtype, dtypes) if d in NATIVE_FLOATS or d.kind in "iu"]
    if len(native) != len(dtypes):
        return np.dtype(np.float32)
    result = np.result_type(*native)
    return result if result in NATIVE_FLOATS else np.dtype(np.float64)


def as_float(array, dtype):
    """A quantized array as `dtype` floats (ml_dtypes types have no mixed arithmetic)."""
    return array.astype(dtype) if array.dtype != dtype else array


class Granularity:
    """How a scale (and its zero point) spreads over an input of shape `shape`.

    `pieces` is a list of (x index, x shape, parameter index, parameter shape): index the
    input (and the output) with the first and reshape (a view: it only splits an axis), index
    the parameter with the third and reshape: the two then broadcast.
    """

    def __init__(self, kernel, shape, scale_shape, axis, block_size):
        rank = len(shape)
        size = math.prod(scale_shape)
        if block_size and block_size < 0:
            kernel.fail(f"block_size {block_size} must not be negative")
        if not block_size and (len(scale_shape) == 0 or (len(scale_shape) == 1 and size == 1)):
            self.pieces = [((), tuple(shape), (), ())]
            self.param_shape = tuple(scale_shape)
            return
        if not -rank <= axis < rank:
            kernel.fail(f"axis {axis} is out of range for an input of rank {rank}")
        axis %= rank
        if not block_size:
            if len(scale_shape) != 1 or scale_shape[0] != shape[axis]:
                kernel.fail(f"scale of shape {list(scale_shape)} is neither a scalar nor one value "
                            f"per index of axis {axis} of an input of shape {list(shape)}")
            per_axis = [1] * rank
            per_axis[axis] = shape[axis]
            self.pieces = [((), tuple(shape), (), tuple(per_axis))]
            return
        blocks = -(-shape[axis] // block_size)
        expected = tuple(shape[:axis]) + (blocks,) + tuple(shape[axis + 1:])
        if tuple(scale_shape) != expected:
            kernel.fail(f"scale of shape {list(scale_shape)} does not block input {list(shape)} "
                        f"by {block_size} along axis {axis}: expected {list(expected)}")
        lead, pre, post = (slice(None),) * axis, tuple(shape[:axis]), tuple(shape[axis + 1:])
        whole, tail = divmod(shape[axis], block_size)
        self.pieces = []
        if whole:
            self.pieces.append((lead + (slice(0, whole * block_size),), pre + (whole, block_size) + post,
                                lead + (slice(0, whole),), pre + (whole, 1) + post))
        if tail:
            self.pieces.append((lead + (slice(whole * block_size, None),), pre + (tail,) + post,
                                lead + (slice(whole, whole + 1),), pre + (1,) + post))

    def views(self, x, out, *params):
        """Per piece: (x view, out view, *parameter views); None parameters stay None."""
        for x_index, x_shape, p_index, p_shape in self.pieces:
            yield (x[x_index].reshape(x_shape, copy=False), out[x_index].reshape(x_shape, copy=False),
                   *(None if p is None else p[p_index].reshape(p_shape) for p in params))


def check_zero_point(kernel, scale, zero_point):
    if zero_point is None or (zero_point.size == 1 and scale.size == 1):
        return
    if tuple(zero_point.shape) != tuple(scale.shape):
        kernel.fail(f"zero point of shape {list(zero_point.shape)} differs from the scale's "
                    f"{list(scale.shape)}")


@register("QuantizeLinear", since=10)
class QuantizeLinear(Kernel):
    """y = saturate(round_half_even(x / scale) + zero_point), in the zero point's type.

    One class for every version: the attributes each version adds (axis 13, saturate 19,
    block_size and output_dtype 21, precision 23) default to the behaviour of the versions
    without them.
    """

    attributes = {"axis": 1, "saturate": 1, "block_size": 0, "output_dtype": 0, "precision": 0}

    def decode(self):
        self.out_dtype = (element_dtype(self.node, self.output_dtype, "output_dtype")
                          if self.output_dtype else None)
        self.precision_dtype = (element_dtype(self.node, self.precision, "precision")
                                if self.precision else None)

    def infer(self, x, scale, zero_point=None):
        check_zero_point(self, scale, zero_point)
        dtype = zero_point.dtype if zero_point is not None else self.out_dtype or np.dtype(np.uint8)
        if self.out_dtype is not None and dtype != self.out_dtype:
            self.fail(f"output_dtype {self.out_dtype} differs from the zero point's type {dtype}")
        limits = value_range(dtype)
        if limits is None and dtype not in exotic_types.SMALL_FLOATS:
            self.fail(f"{dtype} is not a quantized type")
        granularity = Granularity(self, x.shape, scale.shape, self.axis, self.block_size)
        work_dtype = self.precision_dtype or compute_dtype(x.dtype, scale.dtype)
        if work_dtype not in NATIVE_FLOATS:
            work_dtype = np.dtype(np.float32)
        return Inferred([TensorInfo(x.shape, dtype)], range=limits, granularity=granularity,
                        work_dtype=work_dtype)

    def prepare(self, x, scale, zero_point=None):
        return [((x.size,), self.work_dtype)]

    def run(self, x, scale, zero_point=None, *, outs, scratch=()):
        work = scratch[0]
        if zero_point is not None:
            zero_point = as_float(zero_point, self.work_dtype)
            if self.range is None and not zero_point.any():
                zero_point = None  # float8/float4 zero points are zero in practice
        scale = as_float(scale, self.work_dtype) if scale.dtype not in NATIVE_FLOATS else scale
        x = as_float(x, self.work_dtype) if x.dtype not in NATIVE_FLOATS else x
        for xv, out, s, z in self.granularity.views(x, outs[0], scale, zero_point):
            t = work[:xv.size].reshape(xv.shape)
            np.divide(xv, s, out=t, casting="unsafe")
            if self.range is not None:
                np.rint(t, out=t)
                if z is not None:
                    np.add(t, z, out=t)
                np.clip(t, *self.range, out=t)
                with np.errstate(invalid="ignore"):
                    np.copyto(out, t, casting="unsafe")
            else:
                if z is not None:
                    np.add(t, z, out=t)
                exotic_types.convert_into(out, t, saturate=bool(self.saturate))


@register("DequantizeLinear", since=10)
class DequantizeLinear(Kernel):
    """y = (x - zero_point) * scale, in the scale's type (or `output_dtype`, opset 23).

    The float8 and float4 types ignore their zero point (the spec wants it zero).
    """

    attributes = {"axis": 1, "block_size": 0, "output_dtype": 0}

    def decode(self):
        self.out_dtype = (element_dtype(self.node, self.output_dtype, "output_dtype")
                          if self.output_dtype else None)

    def infer(self, x, scale, zero_point=None):
        check_zero_point(self, scale, zero_point)
        if zero_point is not None and zero_point.dtype != x.dtype:
            self.fail(f"zero point type {zero_point.dtype} differs from the input's {x.dtype}")
        dtype = self.out_dtype or scale.dtype
        if dtype not in NATIVE_FLOATS and dtype != np.dtype("bfloat16"):
            self.fail(f"output type {dtype} is not a floating type")
        use_zero_point = zero_point is not None and value_range(x.dtype) is not None
        granularity = Granularity(self, x.shape, scale.shape, self.axis, self.block_size)
        # float32 arithmetic unless the output is float64; a float32 output is its own scratch.
        work_dtype = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        direct = dtype == work_dtype
        return Inferred([TensorInfo(x.shape, dtype)], use_zero_point=use_zero_point, granularity=granularity,
                        work_dtype=work_dtype, direct=direct)

    def prepare(self, x, scale, zero_point=None):
        return [] if self.direct else [((x.size,), self.work_dtype)]

    def run(self, x, scale, zero_point=None, *, outs, scratch=()):
        work_dtype = self.work_dtype
        if not self.direct:
            work = scratch[0]
        zero_point = as_float(zero_point, work_dtype) if self.use_zero_point else None
        scale = as_float(scale, work_dtype)
        native = x.dtype.kind in "iuf" and x.dtype != np.dtype("bfloat16")
        for xv, out, s, z in self.granularity.views(x, outs[0], scale, zero_point):
            t = out if self.direct else work[:xv.size].reshape(xv.shape)
            if not native:
                np.copyto(t, xv, casting="unsafe")
                xv = t
            if z is not None:
                np.subtract(xv, z, out=t, casting="unsafe")
                np.multiply(t, s, out=t)
            else:
                np.multiply(xv, s, out=t, casting="unsafe")
            if t is not out:
                np.copyto(out, t, casting="unsafe")


@register("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Kernel):
    """uint8 quantization with a scale and zero point chosen from x's range (which holds 0)."""

    def infer(self, x):
        if x.dtype.kind != "f":
            self.fail(f"input must be floating, not {x.dtype}")
        return [TensorInfo(x.shape, np.dtype(np.uint8)), TensorInfo((), x.dtype),
                TensorInfo((), np.dtype(np.uint8))]

    def prepare(self, x):
        return [((x.size,), np.dtype(np.float32))]

    def run(self, x, *, outs, scratch=()):
        y, y_scale, y_zero_point = outs
        scale, zero_point = dynamic_parameters(x)
        dynamic_quantize(x, scale, zero_point, scratch[0].reshape(x.shape))
        np.copyto(y, scratch[0].reshape(x.shape), casting="unsafe")
        y_scale[...] = scale
        y_zero_point[...] = zero_point


def dynamic_parameters(x):
    """The uint8 (scale, zero point) DynamicQuantizeLinear picks for x: its range widened to hold 0
    over 255 steps, in float32; the zero point a float holding an integer."""
    low = min(float(x.min()), 0.0) if x.size else 0.0
    high = max(float(x.max()), 0.0) if x.size else 0.0
    # A constant input gets scale 1, as onnxruntime does (the reference takes 1/255).
    scale = np.float32((high - low) / 255 if high != low else 1.0)
    zero_point = np.rint(np.clip(np.float32(0) - np.float32(low) / scale, 0, 255))
    return scale, zero_point


def dynamic_quantize(x, scale, zero_point, out):
    """x quantized to uint8 by (scale, zero point), as float32 integers in `out` (x's shape)."""
    np.divide(x, scale, out=out, casting="unsafe")
    np.rint(out, out=out)
    np.add(out, zero_point, out=out)
    np.clip(out, 0, 255, out=out)
    return out


def integer_span(dtype):
    """The largest |a - zero_point| of a quantized integer type."""
    low, high = value_range(dtype)
    return high - low


def accumulator_dtype(bound):
    """float32 when no partial sum can reach 2**24 (then it is exact), else float64."""
    return np.dtype(np.float32 if bound < FLOAT32_EXACT else np.float64)


def shifted(array, zero_point, shape, out):
    """(array - zero_point) as floats, in `out`; the zero point reshaped to `shape`."""
    if zero_point is None:
        np.copyto(out, array, casting="unsafe")
    else:
        np.subtract(array, as_float(zero_point, out.dtype).reshape(shape), out=out, casting="unsafe")
    return out


def requantize(acc, multiplier, zero_point, value_range, out, work):
    """out = saturate(round_half_even(acc * multiplier) + zero_point); `work` is float64 scratch
    of acc's shape (or acc itself when it is float64)."""
    np.multiply(acc, multiplier, out=work, casting="unsafe")
    np.rint(work, out=work)
    if zero_point is not None:
        np.add(work, zero_point, out=work, casting="unsafe")
    np.clip(work, *value_range, out=work)
    np.copyto(out, work, casting="unsafe")


class _IntegerMatMul(Kernel):
    """The shared part of MatMulInteger and QLinearMatMul: (a - a_zp) @ (b - b_zp), exactly.

    a's zero point is a scalar or one per row of a (M,); b's a scalar or one per column (N,).
    """

    def matmul_infer(self, a, b, a_zero_point, b_zero_point):
        """(the output shape, what run needs of the operands' layout), for Inferred."""
        for name, info in (("A", a), ("B", b)):
            if value_range(info.dtype) is None:
                self.fail(f"{name} must be an integer type, not {info.dtype}")
            if not info.shape:
                self.fail(f"{name} must have rank >= 1")
        a_shape = (1,) + tuple(a.shape) if len(a.shape) == 1 else tuple(a.shape)
        b_shape = tuple(b.shape) + (1,) if len(b.shape) == 1 else tuple(b.shape)
        if a_shape[-1] != b_shape[-2]:
            self.fail(f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
        batch = broadcast_shape(self.node, a_shape[:-2], b_shape[:-2])
        shape = batch + (a_shape[-2],) * (len(a.shape) > 1) + (b_shape[-1],) * (len(b.shape) > 1)
        a_span = integer_span(a.dtype)
        layout = dict(a_span=a_span, a_shape=a_shape, b_shape=b_shape,
                      acc_dtype=accumulator_dtype(a_shape[-1] * a_span * integer_span(b.dtype)),
                      acc_shape=batch + a_shape[-2:-1] + b_shape[-1:],
                      a_zp_shape=self.zero_point_shape(a_zero_point, a_shape[-2], "a", column=True),
                      b_zp_shape=self.zero_point_shape(b_zero_point, b_shape[-1], "b", column=False))
        return shape, layout

    def zero_point_shape(self, zp, n, name, column):
        if zp is None or zp.size == 1:
            return ()
        if len(zp.shape) != 1 or zp.shape[0] != n:
            self.fail(f"{name}'s zero point of shape {list(zp.shape)} is neither a scalar nor "
                      f"one value per {'row' if column else 'column'} ({n})")
        return (n, 1) if column else (n,)

    def pack_b(self, b, b_zero_point):
        """Shift a constant B once; its actual magnitudes may then allow a float32 accumulator."""
        self.b_packed = None
        if b.value is not None and (b_zero_point is None or b_zero_point.value is not None):
            zp = None if b_zero_point is None else b_zero_point.value
            b_f = shifted(b.value.reshape(self.b_shape), zp, self.b_zp_shape,
                          np.empty(self.b_shape, np.float64))
            column_norm = float(np.abs(b_f).sum(axis=-2).max()) if b_f.size else 0.0
            self.acc_dtype = accumulator_dtype(self.a_span * column_norm)
            self.b_packed = self.pack({self.b_index}, b_f.astype(self.acc_dtype, copy=False))

    def matmul_scratch(self):
        size = math.prod(self.a_shape) + math.prod(self.acc_shape)
        if self.b_packed is None:
            size += math.prod(self.b_shape)
        scratch = [((size,), self.acc_dtype)]
        if self.requantized and self.acc_dtype != np.float64:
            scratch.append(((math.prod(self.acc_shape),), np.dtype(np.float64)))
        return scratch

    def accumulate(self, a, b, a_zero_point, b_zero_point, scratch):
        """The exact (a - a_zp) @ (b - b_zp), as an `acc_dtype` array in scratch."""
        buf = scratch[0]
        n_a, n_acc = math.prod(self.a_shape), math.prod(self.acc_shape)
        a_f = shifted(a.reshape(self.a_shape), a_zero_point, self.a_zp_shape,
                      buf[:n_a].reshape(self.a_shape))
        acc = buf[n_a:n_a + n_acc].reshape(self.acc_shape)
        b_f = self.b_packed
        if b_f is None:
            b_f = shifted(b.reshape(self.b_shape), b_zero_point, self.b_zp_shape,
                          buf[n_a + n_acc:].reshape(self.b_shape))
        blas.matmul(a_f, b_f, acc)
        return acc


@register("MatMulInteger", since=10)
class MatMulInteger(_IntegerMatMul):
    b_index = 1
    requantized = False

    def infer(self, a, b, a_zero_point=None, b_zero_point=None):
        shape, layout = self.matmul_infer(a, b, a_zero_point, b_zero_point)
        return Inferred([TensorInfo(shape, np.dtype(np.int32))], **layout)

    def prepare(self, a, b, a_zero_point=None, b_zero_point=None):
        self.pack_b(b, b_zero_point)
        return self.matmul_scratch()

    def run(self, a, b, a_zero_point=None, b_zero_point=None, *, outs, scratch=()):
        acc = self.accumulate(a, b, a_zero_point, b_zero_point, scratch)
        np.copyto(outs[0].reshape(acc.shape), acc, casting="unsafe")


@register("QLinearMatMul", since=10)
class QLinearMatMul(_IntegerMatMul):
    """Quantized matmul: requantize(a_scale * b_scale / y_scale * (a - a_zp) @ (b - b_zp)).

    Version 21 only widens the scale types; the requantization runs in float64, as the
    reference evaluator does, so results agree to the last integer.
    """

    b_index = 3
    requantized = True

    def infer(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
        shape, layout = self.matmul_infer(a, b, a_zero_point, b_zero_point)
        dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
        limits = value_range(dtype)
        if limits is None:
            self.fail(f"output type {dtype} is not a quantized integer type")
        a_scale_shape = self.zero_point_shape(a_scale, layout["a_shape"][-2], "a_scale", column=True)
        b_scale_shape = self.zero_point_shape(b_scale, layout["b_shape"][-1], "b_scale", column=False)
        if y_scale.size != 1:
            self.fail("y_scale must be a scalar")
        return Inferred([TensorInfo(shape, dtype)], range=limits, a_scale_shape=a_scale_shape,
                        b_scale_shape=b_scale_shape, **layout)

    def prepare(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
        self.pack_b(b, b_zero_point)
        return self.matmul_scratch()

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None,
            *, outs, scratch=()):
        acc = self.accumulate(a, b, a_zero_point, b_zero_point, scratch)
        # The scales combine in their own type (float16 ones round there), as the reference does.
        multiplier = (a_scale.reshape(self.a_scale_shape) * b_scale.reshape(self.b_scale_shape)
                      / y_scale.reshape(()))
        zp = None if y_zero_point is None else y_zero_point.reshape(())
        work = acc if acc.dtype == np.float64 else scratch[1].reshape(acc.shape)
        requantize(acc, multiplier, zp, self.range, outs[0].reshape(acc.shape), work)


class _IntegerConv(_ConvBase):
    """The shared part of ConvInteger and QLinearConv: conv(x - x_zp, w - w_zp), exactly.

    x's zero point is a scalar; w's a scalar or one per output channel. The shifted weight
    is made once at PREPARE when it is constant.
    """

    def conv_infer(self, x, w, x_zero_point, w_zero_point):
        if x is None or w is None:
            self.fail("inputs X and W are required")
        if len(x.shape) < 3 or len(w.shape) != len(x.shape):
            self.fail(f"X {list(x.shape)} and W {list(w.shape)} must be (N, C, D1, ...) and "
                      f"(M, C/group, k1, ...)")
        for name, info in (("X", x), ("W", w)):
            if value_range(info.dtype) is None:
                self.fail(f"{name} must be an integer type, not {info.dtype}")
        c_in, c_out = x.shape[1], w.shape[0]
        if w.shape[1] * self.group != c_in or c_out % self.group:
            self.fail(f"X has {c_in} channels; W {list(w.shape)} with group {self.group} does not fit")
        if self.kernel_shape is not None and tuple(self.kernel_shape) != tuple(w.shape[2:]):
            self.fail(f"kernel_shape {list(self.kernel_shape)} does not match W {list(w.shape)}")
        if x_zero_point is not None and x_zero_point.size != 1:
            self.fail("x's zero point must be a scalar")
        w_zp_shape = self.channel_shape(w_zero_point, c_out, len(w.shape) - 1, "w's zero point")
        try:
            window = conv_core.make_window(x.shape[2:], w.shape[2:], self.strides, self.dilations,
                                           self.pads, self.auto_pad)
        except ValueError as e:
            self.fail(str(e))
        x_span = integer_span(x.dtype)
        out_shape = (x.shape[0], c_out, *window.out_spatial)
        layout = dict(w_zp_shape=w_zp_shape, window=window, x_span=x_span,
                      acc_dtype=accumulator_dtype(w.shape[1] * window.taps * x_span * integer_span(w.dtype)),
                      x_shape=tuple(x.shape), w_shape=tuple(w.shape), out_shape=out_shape)
        return out_shape, layout

    def channel_shape(self, param, c_out, trailing, what):
        if param is None or param.size == 1:
            return ()
        if len(param.shape) != 1 or param.shape[0] != c_out:
            self.fail(f"{what} of shape {list(param.shape)} is neither a scalar nor one value per "
                      f"output channel ({c_out})")
        return (c_out,) + (1,) * trailing

    def conv_prepare(self, w, w_zero_point):
        """Shift a constant W once (its actual magnitudes may then allow a float32 accumulator),
        then plan the convolution in the accumulator's type; the scratch spec."""
        self.w_packed = None
        w_f = None
        if w.value is not None and (w_zero_point is None or w_zero_point.value is not None):
            zp = None if w_zero_point is None else w_zero_point.value
            w_f = shifted(w.value, zp, self.w_zp_shape, np.empty(self.w_shape, np.float64))
            filter_norm = float(np.abs(w_f).reshape(len(w_f), -1).sum(axis=1).max()) if w_f.size else 0.0
            self.acc_dtype = accumulator_dtype(self.x_span * filter_norm)
        self.plan = conv_core.conv_plan(self.window, self.x_shape[1], self.w_shape[0], self.group,
                                        self.acc_dtype)
        if w_f is not None:
            w_f = w_f.astype(self.acc_dtype, copy=False)
            # Shifted GEMMs take their weight tap-major: packed so once, not on every run.
            self.w_packed = self.pack({self.w_index}, conv_core.shifted_taps(w_f, self.plan)
                                      if self.plan.method == "gemm-shifted" else w_f)
        # One scratch buffer: shifted x, the accumulator, the plan's columns, a fed W shifted.
        self.sizes = (math.prod(self.x_shape), math.prod(self.out_shape), self.plan.scratch_elems,
                      0 if self.w_packed is not None else math.prod(self.w_shape))
        scratch = [((sum(self.sizes),), self.acc_dtype)]
        if self.requantized and self.acc_dtype != np.float64:
            scratch.append(((math.prod(self.out_shape),), np.dtype(np.float64)))
        return scratch

    def accumulate(self, x, w, x_zero_point, w_zero_point, scratch):
        """The exact conv(x - x_zp, w - w_zp), as an `acc_dtype` array in scratch."""
        buf, (n_x, n_out, n_cols, _) = scratch[0], self.sizes
        x_f = shifted(x, None if x_zero_point is None else x_zero_point.reshape(()), (),
                      buf[:n_x].reshape(self.x_shape))
        acc = buf[n_x:n_x + n_out].reshape(self.out_shape)
        cols = buf[n_x + n_out:n_x + n_out + n_cols]
        w_f = self.w_packed
        if w_f is None:
            w_f = shifted(w, w_zero_point, self.w_zp_shape,
                          buf[n_x + n_out + n_cols:].reshape(self.w_shape))
        conv_core.conv(x_f, w_f, None, acc, self.plan, cols if n_cols else None)
        return acc


@register("ConvInteger", since=10)
class ConvInteger(_IntegerConv):
    w_index = 1
    requantized = False

    def infer(self, x, w, x_zero_point=None, w_zero_point=None):
        shape, layout = self.conv_infer(x, w, x_zero_point, w_zero_point)
        return Inferred([TensorInfo(shape, np.dtype(np.int32))], **layout)

    def prepare(self, x, w, x_zero_point=None, w_zero_point=None):
        return self.conv_prepare(w, w_zero_point)

    def run(self, x, w, x_zero_point=None, w_zero_point=None, *, outs, scratch=()):
        acc = self.accumulate(x, w, x_zero_point, w_zero_point, scratch)
        np.copyto(outs[0], acc, casting="unsafe")


@register("QLinearConv", since=10)
class QLinearConv(_IntegerConv):
    """Quantized conv: requantize(x_scale * w_scale / y_scale * (conv(x - x_zp, w - w_zp) + B))."""

    w_index = 3
    requantized = True

    def infer(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
        shape, layout = self.conv_infer(x, w, x_zero_point, w_zero_point)
        dtype = y_zero_point.dtype if y_zero_point is not None else x.dtype
        limits = value_range(dtype)
        if limits is None:
            self.fail(f"output type {dtype} is not a quantized integer type")
        w_scale_shape = self.channel_shape(w_scale, w.shape[0], len(shape) - 2, "w_scale")
        if b is not None and tuple(b.shape) != (w.shape[0],):
            self.fail(f"bias B of shape {list(b.shape)} must be ({w.shape[0]},)")
        return Inferred([TensorInfo(shape, dtype)], range=limits, w_scale_shape=w_scale_shape, **layout)

    def prepare(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
        return self.conv_prepare(w, w_zero_point)

    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None,
            *, outs, scratch=()):
        acc = self.accumulate(x, w, x_zero_point, w_zero_point, scratch)
        work = acc if acc.dtype == np.float64 else scratch[1].reshape(acc.shape)
        if b is not None:
            # The bias joins in float64: an int32 bias may not be exact in float32.
            np.add(acc, b.reshape(-1, *(1,) * (acc.ndim - 2)), out=work, dtype=np.float64)
            acc = work
        multiplier = (as_float(x_scale, np.float64).reshape(())
                      * as_float(w_scale, np.float64).reshape(self.w_scale_shape)
                      / as_float(y_scale, np.float64).reshape(()))
        zp = None if y_zero_point is None else y_zero_point.reshape(())
        requantize(acc, multiplier, zp, self.range, outs[0], work)
