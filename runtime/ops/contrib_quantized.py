"""onnxruntime's quantized contrib ops (domain com.microsoft), as its quantizers and graph optimizer
write them: DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, DynamicQuantizeLSTM, the QLinear
elementwise ops (Add, Mul, Sigmoid, LeakyRelu), pools (GlobalAveragePool, AveragePool), QLinearConcat
and QLinearSoftmax, and com.microsoft's QuantizeLinear / DequantizeLinear.

The numerics are quantize.py's: integer products run through its `_IntegerMatMul` (exact, on
BLAS), activations are quantized as DynamicQuantizeLinear does (`dynamic_parameters`), and the
LSTM is recurrent.py's with its two products made quantized. Everything else is computed on the
dequantized values in float64 and quantized once (round half to even, saturate), which is the
spec's arithmetic exactly; onnxruntime computes these in float32 or through lookup tables and may
differ from it by one quantization step where a value falls near a rounding boundary. A unary op
of 8-bit values is a table of its 256 results, made at PREPARE when its scales are constants.
"""

import math

import numpy as np

from . import conv_core
from .pool import AveragePool
from .quantize import (DequantizeLinear, QuantizeLinear, _IntegerMatMul, accumulator_dtype, dynamic_parameters,
                       dynamic_quantize, value_range)
from .recurrent import LSTM7
from .elementwise import broadcast_shape
from .registry import Inferred, Kernel, TensorInfo, register

MS = "com.microsoft"
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)

register("QuantizeLinear", 1, MS)(QuantizeLinear)
register("DequantizeLinear", 1, MS)(DequantizeLinear)


def scalar(kernel, info, what):
    """Check that a scale or zero point is one value (the QLinear ops are per tensor)."""
    if info is not None and info.size != 1:
        kernel.fail(f"{what} must be a scalar, not of shape {list(info.shape)}")


def dequantized(q, scale, zero_point):
    """(q - zero_point) * scale in float64."""
    x = q.astype(F64)
    if zero_point is not None:
        x -= float(zero_point.reshape(()))
    x *= float(scale.reshape(()))
    return x


def quantize_into(out, y, scale, zero_point):
    """out = saturate(round_half_even(y / scale) + zero_point), y float64 (changed in place)."""
    y /= float(scale.reshape(()))
    np.rint(y, out=y)
    if zero_point is not None:
        y += float(zero_point.reshape(()))
    np.clip(y, *value_range(out.dtype), out=y)
    np.copyto(out, y, casting="unsafe")


def quantized_output(kernel, x, zero_point):
    """The output type of a QLinear op: its zero point's, else its input's; checked quantized."""
    dtype = zero_point.dtype if zero_point is not None else x.dtype
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        kernel.fail(f"quantized type {dtype} is not uint8 or int8")
    return dtype


# --------------------------------------------------------------------------- integer products


@register("DynamicQuantizeMatMul", since=1, domain=MS)
class DynamicQuantizeMatMul(_IntegerMatMul):
    """Y = a_scale * b_scale * (quantize(A) - a_zp) @ (B - b_zp) + bias; A is quantized to uint8 per
    run as DynamicQuantizeLinear does. b_scale (and b's zero point) is a scalar or one per column."""

    b_index = 1
    requantized = False

    def infer(self, a, b, b_scale, b_zero_point=None, bias=None):
        if a.dtype != F32:
            self.fail(f"A must be float32, not {a.dtype}")
        shape, layout = self.matmul_infer(TensorInfo(a.shape, np.dtype(np.uint8)), b, None, b_zero_point)
        self.zero_point_shape(b_scale, layout["b_shape"][-1], "b_scale", column=False)
        return Inferred([TensorInfo(shape, F32)], **layout)

    def prepare(self, a, b, b_scale, b_zero_point=None, bias=None):
        self.pack_b(b, b_zero_point)
        return self.matmul_scratch() + [((math.prod(a.shape),), F32)]

    def run(self, a, b, b_scale, b_zero_point=None, bias=None, *, outs, scratch=()):
        scale, zero_point = dynamic_parameters(a)
        q = dynamic_quantize(a, scale, zero_point, scratch[-1].reshape(a.shape))
        acc = self.accumulate(q, b, np.asarray(zero_point), b_zero_point, scratch)
        scale_out(acc, np.float32(scale) * b_scale.reshape(-1), bias, outs[0].reshape(acc.shape))


@register("MatMulIntegerToFloat", since=1, domain=MS)
class MatMulIntegerToFloat(_IntegerMatMul):
    """Y = a_scale * b_scale * (A - a_zp) @ (B - b_zp) + bias, in a_scale's float type."""

    b_index = 1
    requantized = False

    def infer(self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        shape, layout = self.matmul_infer(a, b, a_zero_point, b_zero_point)
        scalar(self, a_scale, "a_scale")
        self.zero_point_shape(b_scale, layout["b_shape"][-1], "b_scale", column=False)
        return Inferred([TensorInfo(shape, a_scale.dtype)], **layout)

    def prepare(self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        self.pack_b(b, b_zero_point)
        return self.matmul_scratch()

    def run(self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *, outs, scratch=()):
        acc = self.accumulate(a, b, a_zero_point, b_zero_point, scratch)
        scale_out(acc, a_scale.reshape(()) * b_scale.reshape(-1), bias, outs[0].reshape(acc.shape))


def scale_out(acc, multiplier, bias, out):
    """out = acc * multiplier (+ bias): an exact integer product to floats, one multiplier per column."""
    np.multiply(acc, multiplier, out=out, casting="unsafe")
    if bias is not None:
        np.add(out, bias, out=out)


@register("QGemm", since=1, domain=MS)
class QGemm(_IntegerMatMul):
    """Y = alpha * a_scale * b_scale * ((A' - a_zp) @ (B' - b_zp) + C), C an int32 bias on the scale
    a_scale * b_scale; quantized by y_scale and y_zero_point when y_zero_point is given, else
    divided by y_scale (when given) and left float32."""

    attributes = {"alpha": 1.0, "transA": 0, "transB": 0}
    b_index = 3
    requantized = False  # it requantizes in a float64 scratch of its own, C added

    def infer(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
        for what, info in (("A", a), ("B", b)):
            if len(info.shape) != 2:
                self.fail(f"{what} must be a matrix, not of shape {list(info.shape)}")
        a_t = TensorInfo(tuple(reversed(a.shape)) if self.transA else a.shape, a.dtype)
        b_t = TensorInfo(tuple(reversed(b.shape)) if self.transB else b.shape, b.dtype)
        shape, layout = self.matmul_infer(a_t, b_t, a_zero_point, b_zero_point)
        for what, info in (("a_scale", a_scale), ("a_zero_point", a_zero_point), ("y_scale", y_scale),
                           ("y_zero_point", y_zero_point)):
            scalar(self, info, what)
        self.zero_point_shape(b_scale, shape[1], "b_scale", column=False)
        if c is not None and broadcast_shape(self.node, c.shape, shape) != shape:
            self.fail(f"C of shape {list(c.shape)} does not broadcast to {list(shape)}")
        quantized = y_zero_point is not None
        dtype = quantized_output(self, a, y_zero_point) if quantized else F32
        return Inferred([TensorInfo(shape, dtype)], quantized=quantized,
                        range=value_range(dtype) if quantized else None, **layout)

    def prepare(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
        if self.transB and b.value is not None:
            b = TensorInfo(self.b_shape, b.dtype, np.ascontiguousarray(b.value.T), weight=b.weight)
        self.pack_b(b, b_zero_point)
        return self.matmul_scratch() + [((math.prod(self.acc_shape),), F64)]

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None,
            *, outs, scratch=()):
        acc = self.accumulate(a.T if self.transA else a, None if b is None else (b.T if self.transB else b),
                              a_zero_point, b_zero_point, scratch)
        work = scratch[-1].reshape(acc.shape)
        np.copyto(work, acc)
        if c is not None:
            np.add(work, c, out=work)
        # The scales combine in float32, as onnxruntime's output processors take them.
        multiplier = np.float32(self.alpha) * a_scale.reshape(()) * b_scale.reshape(-1)
        if y_scale is not None:
            multiplier = multiplier / y_scale.reshape(())
        if not self.quantized:
            np.multiply(work, multiplier, out=outs[0], casting="unsafe")
            return
        np.multiply(work, multiplier, out=work)
        np.rint(work, out=work)
        np.add(work, float(y_zero_point.reshape(())), out=work)
        np.clip(work, *self.range, out=work)
        np.copyto(outs[0], work, casting="unsafe")


# --------------------------------------------------------------------------- DynamicQuantizeLSTM


@register("DynamicQuantizeLSTM", since=1, domain=MS)
class DynamicQuantizeLSTM(LSTM7):
    """An LSTM whose W ([directions, input, 4 * hidden]) and R ([directions, hidden, 4 * hidden]) are
    8-bit integers with a scale and zero point per direction or per column. As in onnxruntime, each
    product quantizes its float operand as DynamicQuantizeLinear does (X once for the input
    projection, each direction's h at each step) and multiplies exactly in integers; the rest is
    recurrent.py's LSTM. W, R and their scales and zero points must be constants."""

    one_product = False  # each product quantizes its own float operand: x and h are not one

    def infer(self, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
              w_scale=None, w_zero_point=None, r_scale=None, r_zero_point=None):
        for what, info in (("W", w), ("R", r)):
            if len(info.shape) != 3 or value_range(info.dtype) is None:
                self.fail(f"{what} must be a 3-D integer tensor, not {info.dtype} {list(info.shape)}")
        for what, info in (("W_scale", w_scale), ("R_scale", r_scale)):
            if info is None:
                self.fail(f"input {what} is required")
        # The float LSTM's shape rule, on W and R as the float LSTM lays them out.
        as_float = [TensorInfo((i.shape[0], i.shape[2], i.shape[1]), x.dtype) for i in (w, r)]
        return super().infer(x, *as_float, b, sequence_lens, initial_h, initial_c, p)

    def prepare(self, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
                w_scale=None, w_zero_point=None, r_scale=None, r_zero_point=None):
        for what, info in (("W", w), ("R", r), ("W_scale", w_scale), ("R_scale", r_scale),
                           ("W_zero_point", w_zero_point), ("R_zero_point", r_zero_point)):
            if info is not None and info.value is None:
                self.fail(f"{what} must be a constant")
        self.halved = self.plain_sigmoid(initial_c, p)
        value = lambda info: None if info is None else info.value  # noqa: E731
        self.input_weight = self.pack({1, 8, 9}, lambda: self.quantized_weight(
            w.value, w_scale.value, value(w_zero_point), halve=False))
        self.recurrent_t = self.pack({2, 10, 11}, lambda: self.quantized_weight(
            r.value, r_scale.value, value(r_zero_point), halve=self.halved))
        self.bias = None
        if b is not None and b.value is not None:
            self.bias = self.pack({3}, lambda: self.input_bias(np.asarray(b.value)))
        projected = (self.seq, self.batch, len(self.reverse) * 4 * self.hidden)
        return [(projected, x.dtype)] + [(s, x.dtype) for s in self.buffers()]

    def quantized_weight(self, q, scale, zero_point, halve):
        """(q - zero point) per direction as exact floats, and the column scales [directions, 1, n]
        (the sigmoid gates' halved when `halve`: see recurrent.py)."""
        dirs, _, n = q.shape
        per_column = lambda v: np.broadcast_to(np.asarray(v).reshape(dirs, 1, -1), (dirs, 1, n))  # noqa: E731
        shifted = q.astype(F64)
        if zero_point is not None:
            shifted -= per_column(zero_point)
        bound = 255 * float(np.abs(shifted).sum(axis=1).max()) if shifted.size else 0.0
        scales = np.array(per_column(scale), F32)
        if halve:
            scales[..., :self.sigmoid_gates * self.hidden] *= np.float32(0.5)
        return shifted.astype(accumulator_dtype(bound)), scales

    def project(self, rows, w, out):
        shifted, scales = self.input_weight
        q = self.quantized_rows(rows)
        block = shifted.shape[2]
        for d in range(shifted.shape[0]):
            self.dequantized_product(q, shifted[d], scales[d], out[:, d * block:(d + 1) * block])

    def recurrent_product(self, h, recurrent_t, out):
        shifted, scales = recurrent_t
        for d in range(shifted.shape[0]):
            self.dequantized_product(self.quantized_rows(h[d]), shifted[d], scales[d], out[d])

    @staticmethod
    def quantized_rows(a):
        """(q - zero point, a's scale): `a` quantized as DynamicQuantizeLinear does."""
        scale, zero_point = dynamic_parameters(a)
        q = dynamic_quantize(a, scale, zero_point, np.empty(a.shape, F32))
        q -= zero_point
        return q, scale

    @staticmethod
    def dequantized_product(quantized, shifted, scales, out):
        q, scale = quantized
        np.matmul(q.astype(shifted.dtype, copy=False), shifted, out=out, casting="unsafe")
        np.multiply(out, scale * scales, out=out)


# --------------------------------------------------------------------------- elementwise


class _QLinearBinary(Kernel):
    """C = quantize(f(dequantize(A), dequantize(B))) by C's scale and zero point; A and B broadcast."""

    formula = None

    def infer(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
        for what, info in (("A_scale", a_scale), ("A_zero_point", a_zero_point), ("B_scale", b_scale),
                           ("B_zero_point", b_zero_point), ("C_scale", c_scale), ("C_zero_point", c_zero_point)):
            scalar(self, info, what)
        if a.dtype != b.dtype:
            self.fail(f"A ({a.dtype}) and B ({b.dtype}) must share one type")
        dtype = quantized_output(self, a, c_zero_point)
        return [TensorInfo(broadcast_shape(self.node, a.shape, b.shape), dtype)]

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None, *, outs, scratch):
        y = self.formula(dequantized(a, a_scale, a_zero_point), dequantized(b, b_scale, b_zero_point))
        quantize_into(outs[0], np.broadcast_to(y, outs[0].shape).copy() if y.shape != outs[0].shape else y,
                      c_scale, c_zero_point)


@register("QLinearAdd", since=1, domain=MS)
class QLinearAdd(_QLinearBinary):
    formula = staticmethod(np.add)


@register("QLinearMul", since=1, domain=MS)
class QLinearMul(_QLinearBinary):
    formula = staticmethod(np.multiply)


class _QLinearUnary(Kernel):
    """Y = quantize(f(dequantize(X))) as a table of f's 256 results, indexed by X's bytes."""

    def infer(self, x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        for what, info in (("X_scale", x_scale), ("X_zero_point", x_zero_point), ("Y_scale", y_scale),
                           ("Y_zero_point", y_zero_point)):
            scalar(self, info, what)
        if y_scale is None:
            self.fail("input Y_scale is required")
        quantized_output(self, x, None)
        return [TensorInfo(tuple(x.shape), quantized_output(self, x, y_zero_point))]

    def prepare(self, x, *params):
        self.table = None
        if all(p is None or p.value is not None for p in params):
            self.table = self.make_table(x.dtype, *(None if p is None else p.value for p in params))
        return []

    def make_table(self, x_dtype, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        """The 256 results, in the order of the input's bytes read as uint8."""
        values = np.arange(256, dtype=np.uint8).view(x_dtype)
        table = np.empty(256, y_zero_point.dtype if y_zero_point is not None else x_dtype)
        quantize_into(table, self.formula(dequantized(values, x_scale, x_zero_point)), y_scale, y_zero_point)
        return table

    def run(self, x, *params, outs, scratch):
        table = self.table if self.table is not None else self.make_table(x.dtype, *params)
        np.take(table, x.view(np.uint8), out=outs[0])


@register("QLinearSigmoid", since=1, domain=MS)
class QLinearSigmoid(_QLinearUnary):
    @staticmethod
    def formula(x):
        return 1 / (1 + np.exp(-x))


@register("QLinearLeakyRelu", since=1, domain=MS)
class QLinearLeakyRelu(_QLinearUnary):
    attributes = {"alpha": 0.01}

    def formula(self, x):
        return np.where(x >= 0, x, x * self.alpha)


# --------------------------------------------------------------------------- pools, concat, softmax


@register("QLinearGlobalAveragePool", since=1, domain=MS)
class QLinearGlobalAveragePool(Kernel):
    """The mean of each channel's plane, requantized; `channels_last` for (N, D1, ..., C) inputs."""

    attributes = {"channels_last": 0}

    def infer(self, x, x_scale, x_zero_point, y_scale, y_zero_point):
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected at least 3 dimensions")
        for what, info in (("x_scale", x_scale), ("x_zero_point", x_zero_point), ("y_scale", y_scale),
                           ("y_zero_point", y_zero_point)):
            scalar(self, info, what)
        quantized_output(self, x, None)
        ones = (1,) * (len(x.shape) - 2)
        shape = (x.shape[0], *ones, x.shape[-1]) if self.channels_last else (*x.shape[:2], *ones)
        return [TensorInfo(shape, quantized_output(self, x, y_zero_point))]

    def run(self, x, x_scale, x_zero_point, y_scale, y_zero_point, *, outs, scratch):
        axes = tuple(range(1, x.ndim - 1)) if self.channels_last else tuple(range(2, x.ndim))
        mean = x.sum(axis=axes, keepdims=True, dtype=F64) / math.prod(x.shape[a] for a in axes)
        quantize_into(outs[0], dequantized(mean, x_scale, x_zero_point), y_scale, y_zero_point)


@register("QLinearAveragePool", since=1, domain=MS)
class QLinearAveragePool(AveragePool):
    """AveragePool of the dequantized input (padding is 0 there), requantized; `channels_last`
    for (N, D1, ..., C) inputs."""

    attributes = {**AveragePool.attributes, "channels_last": 0}

    def check_dtype(self, dtype):
        if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
            self.fail(f"input X has type {dtype}; expected uint8 or int8")

    def infer(self, x, x_scale, x_zero_point, y_scale, y_zero_point=None):
        for what, info in (("x_scale", x_scale), ("x_zero_point", x_zero_point), ("y_scale", y_scale),
                           ("y_zero_point", y_zero_point)):
            scalar(self, info, what)
        dtype = quantized_output(self, x, y_zero_point)
        if not self.channels_last:
            pooled = super().infer(x)
            return Inferred([TensorInfo(pooled[0].shape, dtype)], layout=conv_core.CHANNELS_FIRST,
                            window=pooled.derived["window"])
        # The window over the spatial axes of (N, D1, ..., C).
        pooled = super().infer(TensorInfo((x.shape[0], x.shape[-1], *x.shape[1:-1]), x.dtype))
        shape = pooled[0].shape
        return Inferred([TensorInfo((shape[0], *shape[2:], shape[1]), dtype)], layout=conv_core.CHANNELS_LAST,
                        window=pooled.derived["window"])

    def prepare(self, x, *params):
        channels = x.shape[-1] if self.channels_last else x.shape[1]
        self.plan = conv_core.pool_plan(self.window, "average", channels, F64, layout=self.layout,
                                        count_include_pad=bool(self.count_include_pad), batch=x.shape[0])
        return self.plan.scratch()

    def run(self, x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, outs, scratch=()):
        pooled = np.empty(outs[0].shape, F64)
        conv_core.pool(dequantized(x, x_scale, x_zero_point), pooled, self.plan, scratch[0] if scratch else None)
        quantize_into(outs[0], pooled, y_scale, y_zero_point)

    def band_granule(self):
        return 0


@register("QLinearConcat", since=1, domain=MS)
class QLinearConcat(Kernel):
    """Concat of (X, X_scale, X_zero_point) triples along `axis`, each requantized to Y's scale and
    zero point (copied as it is when it has them already)."""

    attributes = {"axis": 0}

    def infer(self, y_scale, y_zero_point, *triples):
        if not triples or len(triples) % 3:
            self.fail(f"expected Y_scale, Y_zero_point and triples (X, X_scale, X_zero_point), "
                      f"got {2 + len(triples)} inputs")
        xs = triples[::3]
        rank = len(xs[0].shape)
        if not -rank <= self.axis < rank:
            self.fail(f"axis {self.axis} is out of range for rank {rank}")
        axis = self.axis % rank
        dtype = quantized_output(self, xs[0], y_zero_point)
        for x in xs:
            if len(x.shape) != rank or any(a != b for k, (a, b) in enumerate(zip(x.shape, xs[0].shape))
                                           if k != axis):
                self.fail(f"inputs of shapes {[list(x.shape) for x in xs]} do not concatenate on axis {axis}")
        for info in (y_scale, y_zero_point, *triples[1::3], *triples[2::3]):
            scalar(self, info, "every scale and zero point")
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        return Inferred([TensorInfo(tuple(shape), dtype)], split=axis)

    def run(self, y_scale, y_zero_point, *triples, outs, scratch):
        out = outs[0]
        start = 0
        for x, x_scale, x_zero_point in zip(triples[::3], triples[1::3], triples[2::3]):
            part = out[(slice(None),) * self.split + (slice(start, start + x.shape[self.split]),)]
            start += x.shape[self.split]
            same = (x.dtype == out.dtype and float(x_scale.reshape(())) == float(y_scale.reshape(()))
                    and (x_zero_point is None) == (y_zero_point is None)
                    and (x_zero_point is None or int(x_zero_point.reshape(())) == int(y_zero_point.reshape(()))))
            if same:
                np.copyto(part, x)
            else:
                quantize_into(part, dequantized(x, x_scale, x_zero_point), y_scale, y_zero_point)


@register("QLinearSoftmax", since=1, domain=MS)
class QLinearSoftmax(Kernel):
    """Softmax of the dequantized input, requantized. `opset` is the ONNX opset whose Softmax it
    is: before 13 the input is coerced to a matrix at `axis`, from 13 the softmax runs over `axis`."""

    attributes = {"axis": -1, "opset": 13}

    def infer(self, x, x_scale, x_zero_point, y_scale, y_zero_point):
        rank = len(x.shape)
        if not -rank <= self.axis < rank:
            self.fail(f"axis {self.axis} is out of range for rank {rank}")
        for what, info in (("X_scale", x_scale), ("x_zero_point", x_zero_point), ("y_scale", y_scale),
                           ("y_zero_point", y_zero_point)):
            scalar(self, info, what)
        axis = self.axis % rank
        outer = math.prod(x.shape[:axis])
        view = ((outer, math.prod(x.shape[axis:]), 1) if self.opset < 13
                else (outer, x.shape[axis], math.prod(x.shape[axis + 1:])))
        return Inferred([TensorInfo(tuple(x.shape), quantized_output(self, x, y_zero_point))], view=view)

    def run(self, x, x_scale, x_zero_point, y_scale, y_zero_point, *, outs, scratch):
        v = dequantized(x.reshape(self.view), x_scale, x_zero_point)
        v -= v.max(axis=1, keepdims=True)
        np.exp(v, out=v)
        v /= v.sum(axis=1, keepdims=True)
        quantize_into(outs[0].reshape(self.view), v, y_scale, y_zero_point)
