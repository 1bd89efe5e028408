"""Elementwise operators: broadcasting binary and variadic arithmetic, logic and
comparisons, Where, and the unary math and activation functions.

Every kernel writes its result straight into `outs[0]` with numpy ufuncs; a
ufunc broadcasts the inputs to the output's shape, so no broadcast copy is ever
made. Formulas of several passes reuse the output as their working buffer; the
few that need another take block-sized scratch (activation.blockwise). Masked
ufuncs (`where=`) are avoided for speed: see activation.py. The shape rule
(`broadcast_shape`) and `check_same_dtype` are shared with the other
op families.
"""

import functools
import math

import numpy as np

from ..errors import ModelError
from . import activation, bands, jit, parallel
from .registry import FUSED, Inferred, Kernel, TensorInfo, lookup, register


def broadcast_shape(node, *shapes):
    """The numpy (multidirectional) broadcast of `shapes`, or ModelError naming the node."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = ", ".join(str(tuple(s)) for s in shapes)
        raise ModelError(f"input shapes {listed} do not broadcast") from None


def check_same_dtype(node, *infos):
    """ONNX ties these inputs to one type variable T; numpy would silently promote."""
    dtypes = {info.dtype for info in infos if info is not None}
    if len(dtypes) > 1:
        listed = ", ".join(str(info.dtype) for info in infos if info is not None)
        raise ModelError(f"inputs must share one dtype, got {listed}")


def _all(value, predicate):
    return value is not None and value.size > 0 and bool(np.all(predicate(value)))


# --------------------------------------------------------------------------- binary


class Binary(Kernel):
    """A broadcasting binary op computed by one ufunc into the output."""

    ufunc = None
    result_dtype = None  # None: the inputs' dtype
    activation = None

    def decode(self):
        # The compiler fuses an activation into Add (a residual sum and its Relu).
        self.activation = self.node.attrs.get("_activation")

    def infer(self, a, b):
        check_same_dtype(self.node, a, b)
        shape = broadcast_shape(self.node, a.shape, b.shape)
        return Inferred([TensorInfo(shape, np.dtype(self.result_dtype or a.dtype))],
                        shapes_=((tuple(a.shape), tuple(b.shape)), tuple(shape)))

    def run(self, a, b, *, outs, scratch):
        if outs[0].size >= parallel.SPLIT_FROM:
            parallel.elementwise(self.compute, outs[0], a, b)
        else:
            self.compute(outs[0], a, b)

    def compute(self, out, a, b):
        self.ufunc(a, b, out=out)
        if self.activation is not None:
            activation.apply_activation(out, self.activation)

    def band_granule(self):
        return bands.elementwise_granule(*self.shapes_)

    def band(self, r0, r1, scratch_limit, plans=None):
        return bands.elementwise_band(self, *self.shapes_, r0, r1)


_BINARY = {  # op type: (since, ufunc, result dtype)
    "Add": (7, np.add, None),
    "Sub": (7, np.subtract, None),
    "Mul": (7, np.multiply, None),
    "And": (7, np.logical_and, None),
    "Or": (7, np.logical_or, None),
    "Xor": (7, np.logical_xor, None),
    "BitwiseAnd": (18, np.bitwise_and, None),
    "BitwiseOr": (18, np.bitwise_or, None),
    "BitwiseXor": (18, np.bitwise_xor, None),
    "Equal": (7, np.equal, np.bool_),
    "Less": (7, np.less, np.bool_),
    "Greater": (7, np.greater, np.bool_),
    "LessOrEqual": (12, np.less_equal, np.bool_),
    "GreaterOrEqual": (12, np.greater_equal, np.bool_),
}

for _op, (_since, _ufunc, _dtype) in _BINARY.items():
    register(_op, _since)(type(_op, (Binary,), {"ufunc": _ufunc, "result_dtype": _dtype}))


@register("Div", since=7)
class Div(Binary):
    """Integer division truncates toward zero (C, ONNX); numpy's floor_divide rounds down."""

    def infer(self, a, b):
        kind, size = a.dtype.kind, a.dtype.itemsize
        if kind not in "iu":
            divide = self.divide
        elif size <= 4:
            divide = self.divide_in_double
        elif kind == "u":
            divide = self.floor_divide
        else:
            divide = self.truncate_divide
        return Inferred(super().infer(a, b), divide=divide)

    def compute(self, out, a, b):
        self.divide(a, b, out)
        if self.activation is not None:
            activation.apply_activation(out, self.activation)

    @staticmethod
    def divide(a, b, out):
        np.divide(a, b, out=out)

    @staticmethod
    def divide_in_double(a, b, out):
        # Exact for operands below 2**32: the double quotient q = a / b is off by at most
        # |q| * 2**-53 < 2**-21 / |b|, less than its distance 1 / |b| from the next integer
        # when it is not one; the unsafe cast back truncates toward zero. One pass, no temporary.
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(a, b, out=out, dtype=np.float64, casting="unsafe")

    @staticmethod
    def floor_divide(a, b, out):
        with np.errstate(divide="ignore"):
            np.floor_divide(a, b, out=out)

    @staticmethod
    def truncate_divide(a, b, out):
        with np.errstate(divide="ignore", invalid="ignore"):
            np.floor_divide(a, b, out=out)
            # Floor and truncation differ by one where the remainder is non-zero and the
            # operands' signs differ.
            remainder = np.fmod(a, b)
            np.add(out, (remainder != 0) & ((remainder < 0) != (b < 0)), out=out,
                   casting="unsafe")


@register("Pow", since=7)
class Pow(Kernel):
    """The result has the base's dtype; the exponent may have another (opset 12+)."""

    def infer(self, base, exponent):
        shape = broadcast_shape(self.node, base.shape, exponent.shape)
        if base.dtype.kind == "f":
            loop = base.dtype
        elif exponent.dtype.kind == "f":
            # An integer base to a real power: computed in double, truncated like C's cast.
            loop = np.dtype(np.float64)
        else:
            loop = base.dtype
        return Inferred([TensorInfo(shape, base.dtype)], loop=loop)

    def run(self, base, exponent, *, outs, scratch):
        try:
            np.power(base, exponent, out=outs[0], dtype=self.loop, casting="unsafe")
        except ValueError:
            # numpy refuses integers to negative integer powers; C's pow() in double does not.
            np.power(base, exponent, out=outs[0], dtype=np.float64, casting="unsafe")


@register("Mod", since=10)
class Mod(Binary):
    """fmod=0: the remainder takes the divisor's sign (Python's %, numpy's mod); fmod=1: the
    dividend's (C's fmod). Floats with fmod=0 are allowed from opset 28, whose special cases are
    numpy's: x mod ±0, ±inf mod y and NaN anywhere give NaN; x mod ±inf is x when x has the
    divisor's sign, else the divisor; a zero remainder takes the divisor's sign."""

    attributes = {"fmod": 0}

    def decode(self):
        if self.fmod not in (0, 1):
            raise ModelError(f"fmod must be 0 or 1, got {self.fmod}")
        self.ufunc = np.fmod if self.fmod else np.mod

    def infer(self, a, b):
        if a.dtype.kind == "f" and not self.fmod and self.opset < 28:
            raise ModelError("fmod must be 1 for floating-point inputs before opset 28")
        return super().infer(a, b)

    def run(self, a, b, *, outs, scratch):
        with np.errstate(divide="ignore", invalid="ignore"):
            self.ufunc(a, b, out=outs[0])


@register("BitShift", since=11)
class BitShift(Binary):
    attributes = {"direction": ""}

    def decode(self):
        shifts = {"LEFT": np.left_shift, "RIGHT": np.right_shift}
        if self.direction not in shifts:
            raise ModelError(f"direction must be LEFT or RIGHT, "
                             f"got {self.direction!r}")
        self.ufunc = shifts[self.direction]


_BITS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}  # an integer view of each item size


@register("Where", since=9)
class Where(Kernel):
    """Selects with bitwise operations on integer views: y ^ ((x ^ y) & mask).

    np.where and np.copyto(where=) branch per element and run ten times slower
    on conditions that change at random; the bitwise select costs the same on any.
    """

    def infer(self, condition, x, y):
        check_same_dtype(self.node, x, y)
        if condition.dtype != np.bool_:
            raise ModelError(f"the condition must be bool, "
                             f"got {condition.dtype}")
        shape = broadcast_shape(self.node, condition.shape, x.shape, y.shape)
        bits = _BITS.get(x.dtype.itemsize) if x.dtype.kind in "biuf" else None
        return Inferred([TensorInfo(shape, x.dtype)], bits=bits)

    def prepare(self, condition, x, y):
        # The mask: all ones where the condition holds, of the condition's own (unbroadcast) shape.
        return [] if self.bits is None else [(tuple(condition.shape), np.dtype(self.bits))]

    def run(self, condition, x, y, *, outs, scratch):
        out = outs[0]
        if self.bits is None:
            np.copyto(out, y)
            np.copyto(out, x, where=condition)
            return
        (mask,) = scratch
        np.negative(condition.view(np.int8), out=mask)
        x, y, out = x.view(self.bits), y.view(self.bits), out.view(self.bits)
        np.bitwise_xor(x, y, out=out)
        np.bitwise_and(out, mask, out=out)
        np.bitwise_xor(out, y, out=out)


class Variadic(Kernel):
    """Sum, Mean, Max, Min: one ufunc folded over any number of broadcasting inputs."""

    ufunc = None

    def infer(self, *inputs):
        if not inputs:
            raise ModelError("needs at least one input")
        check_same_dtype(self.node, *inputs)
        shape = broadcast_shape(self.node, *(i.shape for i in inputs))
        return [TensorInfo(shape, inputs[0].dtype)]

    def run(self, *inputs, outs, scratch):
        out = outs[0]
        if len(inputs) == 1:
            np.copyto(out, inputs[0])
            return
        self.ufunc(inputs[0], inputs[1], out=out)
        for x in inputs[2:]:
            self.ufunc(out, x, out=out)


# Version 6 lacks broadcasting, which version 8 adds; one kernel serves both.
register("Sum", 6)(type("Sum", (Variadic,), {"ufunc": np.add}))


class Extremum(Variadic):
    """Max, Min. Against one scalar (Max(x, 0)) it is a clip: numpy's clip loop is several
    times faster than maximum with a broadcast scalar, and propagates nan the same way."""

    def infer(self, *inputs):
        infos = super().infer(*inputs)
        scalar_bound = None  # the index of a scalar input, the other of the output's shape
        if len(inputs) == 2 and inputs[0].dtype.kind in "iuf":
            for i, (this, other) in enumerate((inputs, inputs[::-1])):
                if this.size == 1 and tuple(other.shape) == infos[0].shape:
                    scalar_bound = i
                    break
        return Inferred(infos, scalar_bound=scalar_bound)

    def run(self, *inputs, outs, scratch):
        if self.scalar_bound is None:
            super().run(*inputs, outs=outs, scratch=scratch)
            return
        bound = inputs[self.scalar_bound].reshape(())
        x = inputs[1 - self.scalar_bound]
        if self.ufunc is np.maximum:
            np.clip(x, bound, activation.upper_limit(x.dtype), out=outs[0])
        else:
            np.clip(x, activation.lower_limit(x.dtype), bound, out=outs[0])


register("Max", 6)(type("Max", (Extremum,), {"ufunc": np.maximum}))
register("Min", 6)(type("Min", (Extremum,), {"ufunc": np.minimum}))


@register("Mean", since=6)
class Mean(Variadic):
    ufunc = np.add

    def run(self, *inputs, outs, scratch):
        super().run(*inputs, outs=outs, scratch=scratch)
        if len(inputs) > 1:
            np.divide(outs[0], len(inputs), out=outs[0])


# --------------------------------------------------------------------------- unary


class Unary(Kernel):
    """An op of one input whose output has the input's shape.

    Subclasses set `ufunc`, or override `apply(x, out, temps)`; `temporaries` is
    how many block-sized buffers (activation.BLOCK) `apply` wants from the arena.
    """

    ufunc = None
    result_dtype = None
    temporaries = 0

    def infer(self, x):
        return Inferred([TensorInfo(x.shape, np.dtype(self.result_dtype or x.dtype))],
                        shapes_=((tuple(x.shape),), tuple(x.shape)))

    def prepare(self, x):
        return [((min(x.size, activation.BLOCK),), x.dtype)] * self.temporaries

    def run(self, x, *, outs, scratch):
        if self.temporaries or outs[0].size < parallel.SPLIT_FROM:  # (one set of temporaries: no shares)
            self.apply(x, outs[0], scratch)
        else:
            parallel.elementwise(self.share, outs[0], x)

    def share(self, out, x):
        self.apply(x, out, ())

    def band_granule(self):
        shapes = getattr(self, "shapes_", None)  # subclasses with shape rules of their own: no bands
        return bands.elementwise_granule(*shapes) if shapes is not None and not self.temporaries else 0

    def band(self, r0, r1, scratch_limit, plans=None):
        return bands.elementwise_band(self, *self.shapes_, r0, r1)

    def apply(self, x, out, temps):
        self.ufunc(x, out=out)


_MATH = {  # op type: (since, ufunc, result dtype)
    "Abs": (6, np.abs, None),
    "Neg": (6, np.negative, None),
    "Exp": (6, np.exp, None),
    "Log": (6, np.log, None),
    "Sqrt": (6, np.sqrt, None),
    "Reciprocal": (6, np.reciprocal, None),
    "Floor": (6, np.floor, None),
    "Ceil": (6, np.ceil, None),
    "Round": (11, np.rint, None),  # rint rounds half to even, as the spec asks
    "Sign": (9, np.sign, None),
    "Sin": (7, np.sin, None),
    "Cos": (7, np.cos, None),
    "Tan": (7, np.tan, None),
    "Asin": (7, np.arcsin, None),
    "Acos": (7, np.arccos, None),
    "Atan": (7, np.arctan, None),
    "Sinh": (9, np.sinh, None),
    "Cosh": (9, np.cosh, None),
    "Asinh": (9, np.arcsinh, None),
    "Acosh": (9, np.arccosh, None),
    "Atanh": (9, np.arctanh, None),
    "Not": (1, np.logical_not, None),
    "BitwiseNot": (18, np.invert, None),
    "IsNaN": (9, np.isnan, np.bool_),
}

for _op, (_since, _ufunc, _dtype) in _MATH.items():
    register(_op, _since)(type(_op, (Unary,), {"ufunc": _ufunc, "result_dtype": _dtype}))


class Activation(Unary):
    """A unary op whose formula lives in activation.py, shared with the fused path."""

    def params(self):
        return {}

    def decode(self):
        self.formula = functools.partial(activation.FORMULAS[self.node.op_type], **self.params())

    def apply(self, x, out, temps):
        self.formula(x, out)


# Activations without attributes: the formula is all there is to them.
for _op, _since in (("Relu", 6), ("Sigmoid", 6), ("Tanh", 6), ("HardSwish", 14)):
    register(_op, _since)(type(_op, (Activation,), {}))
register("HardSwish", 1, FUSED)(lookup("", "HardSwish", 14))


@register("LeakyRelu", since=6)
class LeakyRelu(Activation):
    attributes = {"alpha": 0.01}

    def params(self):
        return {"alpha": self.alpha}


@register("HardSigmoid", since=6)
class HardSigmoid(Activation):
    attributes = {"alpha": 0.2, "beta": 0.5}

    def params(self):
        return {"alpha": self.alpha, "beta": self.beta}


register("HardSigmoid", 1, FUSED)(HardSigmoid)


_FLT_MAX = float(np.finfo(np.float32).max)


@register("Clip", since=6)
class Clip6(Activation):
    attributes = {"min": -_FLT_MAX, "max": _FLT_MAX}

    def params(self):
        # The defaults are float32's range; left out, they become the input type's own range.
        return {"min": None if self.min == -_FLT_MAX else self.min,
                "max": None if self.max == _FLT_MAX else self.max}


@register("Clip", since=11)
class Clip(Kernel):
    """Bounds are optional inputs: omitted, known at PREPARE (used as scalars), or fed per run."""

    def infer(self, x, lo=None, hi=None):
        check_same_dtype(self.node, x, lo, hi)
        for bound in (lo, hi):
            if bound is not None and bound.size != 1:
                raise ModelError(f"min and max must be scalars, "
                                 f"got shape {bound.shape}")
        return [TensorInfo(x.shape, x.dtype)]

    def prepare(self, x, lo=None, hi=None):
        self.lo = self.hi = None
        for index, bound in ((1, lo), (2, hi)):
            if bound is not None and bound.value is not None:
                setattr(self, "lo" if index == 1 else "hi", bound.value.reshape(()).item())
                self.pack({index}, ())  # a Python scalar now
        return []

    def run(self, x, lo=None, hi=None, *, outs, scratch):
        activation.clip(x, outs[0], self.lo if lo is None else lo.reshape(()),
                        self.hi if hi is None else hi.reshape(()))


# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (beyond, erf is +-1 in float32): the rational
# approximation of Eigen's generic_fast_erf_float, within 4 float32 ulps. scipy's erf computes
# each element in double, scalar code, ~20x slower. With compiled kernels (jit.py), numba runs
# the same operations in one pass (_jit_activation.erf).
ERF_P = tuple(np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02))
ERF_Q = tuple(np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02))


def _horner(coefficients, x2, out):
    np.multiply(x2, coefficients[0], out=out)
    np.add(out, coefficients[1], out=out)
    for c in coefficients[2:]:
        np.multiply(out, x2, out=out)
        np.add(out, c, out=out)


def erf_float32(z, out, x2, q):
    """erf of float32 `z` into `out` (which may be z), with two temporaries of its size."""
    np.clip(z, np.float32(-4), np.float32(4), out=out)
    np.multiply(out, out, out=x2)
    _horner(ERF_P, x2, q)
    np.multiply(out, q, out=out)
    _horner(ERF_Q, x2, q)
    np.divide(out, q, out=out)


# A compiled elementwise kernel splits into flat ranges on the run's threads from this many
# elements a share.
COMPILED_SHARE = 1 << 17
# ... and on numba's team, whose threads spin between launches (a launch ~4 us), from this many
# (GELU ~1 ns an element on a Xeon).
TEAM_SHARE = 1 << 15


def compiled_unary(kernel, x, out):
    """kernel(x, out, start, end) (numba's "erf" or "gelu", flat and contiguous) over all of x into
    out, in ranges on the run's team (parallel.team) or threads when large; a view that is not
    contiguous goes through a copy."""
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        result = np.empty(out.shape, out.dtype)
        compiled_unary(kernel, np.ascontiguousarray(x), result)
        np.copyto(out, result)
        return
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    if flat_out.size == 0:
        return
    team = min(parallel.team(), flat_out.size // TEAM_SHARE)
    if team > 1:
        jit.on_team(kernel.__name__, team)(flat_x, flat_out)
        return
    spans = parallel.ranges(flat_out.size, parallel.parts(flat_out.size, COMPILED_SHARE))
    parallel.current().run(lambda i: kernel(flat_x, flat_out, *spans[i]), len(spans))  # inline when one


def scipy_erf():
    # scipy.special costs ~20 MB and 0.2 s to import: only models that need it pay.
    from scipy.special import erf
    return erf


@register("Erf", since=9)
class Erf(Unary):
    compiled = None  # jit.elementwise_kernel("erf") when compiled kernels are on

    def infer(self, x):
        fast = x.dtype == np.float32
        if fast:
            compiled = jit.elementwise_kernel("erf")
            return Inferred(super().infer(x), fast=True, temporaries=0 if compiled else 2, compiled=compiled)
        return Inferred(super().infer(x), fast=False, temporaries=0, ufunc=scipy_erf())

    def apply(self, x, out, temps):
        if self.compiled is not None:
            compiled_unary(self.compiled, x, out)
        elif self.fast:
            activation.blockwise(erf_float32, x, out, temps)
        else:
            self.ufunc(x, out=out)


@register("Gelu", since=1, domain=FUSED)
@register("Gelu", since=20)
class Gelu(Unary):
    attributes = {"approximate": "none"}
    compiled = None  # jit.elementwise_kernel("gelu") when compiled kernels are on (the erf form)

    def decode(self):
        if self.approximate not in ("none", "tanh"):
            raise ModelError(f"approximate must be 'none' or 'tanh', "
                             f"got {self.approximate!r}")

    def infer(self, x):
        fast = x.dtype == np.float32
        if self.approximate != "none":
            return Inferred(super().infer(x), fast=fast)
        if fast:
            compiled = jit.elementwise_kernel("gelu")
            return Inferred(super().infer(x), fast=True, temporaries=0 if compiled else 2, compiled=compiled)
        return Inferred(super().infer(x), fast=False, temporaries=0, erf=scipy_erf())

    def apply(self, x, out, temps):
        if self.approximate == "tanh":
            self.tanh_form(x, out)
        elif self.compiled is not None:
            compiled_unary(self.compiled, x, out)
        elif self.fast:
            activation.blockwise(self.erf_form, x, out, temps)
        else:
            self.erf_form(x, out, None, None)

    def erf_form(self, x, out, x2, q):
        # x/2 * (1 + erf(x / sqrt(2)))
        np.multiply(x, out.dtype.type(1 / math.sqrt(2)), out=out)
        if x2 is None:
            self.erf(out, out=out)
        else:
            erf_float32(out, out, x2, q)
        self.finish(x, out)

    def tanh_form(self, x, out):
        # x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        t = out.dtype.type
        np.multiply(x, x, out=out)
        np.multiply(out, t(0.044715), out=out)
        np.add(out, 1, out=out)
        np.multiply(out, x, out=out)
        np.multiply(out, t(math.sqrt(2 / math.pi)), out=out)
        np.tanh(out, out=out)
        self.finish(x, out)

    @staticmethod
    def finish(x, out):
        np.add(out, 1, out=out)
        np.multiply(out, x, out=out)
        np.multiply(out, out.dtype.type(0.5), out=out)


@register("IsInf", since=10)
class IsInf(Unary):
    attributes = {"detect_negative": 1, "detect_positive": 1}
    result_dtype = np.bool_

    def decode(self):
        self.ufunc = {(1, 1): np.isinf, (1, 0): np.isneginf, (0, 1): np.isposinf}.get(
            (int(self.detect_negative), int(self.detect_positive)))

    def apply(self, x, out, temps):
        if self.ufunc is None:
            out.fill(False)
        else:
            self.ufunc(x, out=out)


def softplus(x, out):
    """log(1 + exp(x)). Past log(max) - 2, exp would overflow and log(1 + exp(x)) is x to
    working precision, so x is clipped there and max(., x) restores it; below, the
    result exceeds x and max keeps it. (np.logaddexp is exact but 50x slower.)"""
    limit = out.dtype.type(np.log(np.finfo(out.dtype).max) - 2)
    np.clip(x, -np.inf, limit, out=out)
    np.exp(out, out=out)
    np.log1p(out, out=out)
    np.maximum(out, x, out=out)


@register("Softplus", since=1)
class Softplus(Unary):
    def apply(self, x, out, temps):
        softplus(x, out)


@register("Softsign", since=1)
class Softsign(Unary):
    def apply(self, x, out, temps):
        np.abs(x, out=out)
        np.add(out, 1, out=out)
        np.divide(x, out, out=out)


@register("Mish", since=1, domain=FUSED)
@register("Mish", since=18)
class Mish(Unary):
    def apply(self, x, out, temps):
        softplus(x, out)
        np.tanh(out, out=out)
        np.multiply(out, x, out=out)


class ExponentialLinear(Unary):
    """max(x, 0) + alpha * (exp(min(x, 0) / divisor) - 1), times scale: Elu, Selu, Celu.

    Where the negative branch is >= x for x <= 0 (it is 0 for x > 0), one maximum
    merges the branches; otherwise the positive part is added from a block temporary.
    """

    alpha = 1.0
    scale = 1.0

    def divisor(self):
        return 1.0

    def merges(self):
        return 0 <= self.alpha <= 1

    def decode(self):
        self.temporaries = 0 if self.merges() else 1

    def apply(self, x, out, temps):
        if temps:
            activation.blockwise(self.add_positive_part, x, out, temps)
        else:
            self.negative_branch(x, out)
            np.maximum(out, x, out=out)
        if self.scale != 1:
            np.multiply(out, out.dtype.type(self.scale), out=out)

    def negative_branch(self, x, out):
        t = out.dtype.type
        np.clip(x, -np.inf, 0, out=out)
        if self.divisor() != 1:
            np.divide(out, t(self.divisor()), out=out)
        np.expm1(out, out=out)
        np.multiply(out, t(self.alpha), out=out)

    def add_positive_part(self, x, out, positive):
        self.negative_branch(x, out)
        np.clip(x, 0, np.inf, out=positive)
        np.add(out, positive, out=out)


@register("Elu", since=6)
class Elu(ExponentialLinear):
    attributes = {"alpha": 1.0}


@register("Selu", since=6)
class Selu(ExponentialLinear):
    attributes = {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}

    def decode(self):
        self.scale = self.gamma
        super().decode()


@register("Celu", since=12)
class Celu(ExponentialLinear):
    attributes = {"alpha": 1.0}

    def decode(self):
        if self.alpha == 0:
            raise ModelError("alpha must not be 0")
        super().decode()

    def divisor(self):
        return self.alpha

    def merges(self):
        # alpha * (exp(x / alpha) - 1) >= x for x <= 0 whenever alpha > 0
        return self.alpha > 0


@register("ThresholdedRelu", since=10)
class ThresholdedRelu(Unary):
    """x where x > alpha, else 0: x's bits masked by the comparison (no branching)."""

    attributes = {"alpha": 1.0}
    temporaries = 1

    def prepare(self, x):
        self.bits = _BITS[x.dtype.itemsize]
        return [((min(x.size, activation.BLOCK),), np.dtype(self.bits))]

    def apply(self, x, out, temps):
        activation.blockwise(self.mask, x, out, temps)

    def mask(self, x, out, mask):
        np.greater(x, x.dtype.type(self.alpha), out=mask, casting="unsafe")
        np.negative(mask, out=mask)
        np.bitwise_and(x.view(self.bits), mask, out=out.view(self.bits))


@register("PRelu", since=6)
class PRelu(Kernel):
    """slope broadcasts to X one way only (opset 7+): the output has X's shape."""

    def infer(self, x, slope):
        check_same_dtype(self.node, x, slope)
        if broadcast_shape(self.node, x.shape, slope.shape) != tuple(x.shape):
            raise ModelError(f"slope of shape {slope.shape} does not "
                             f"broadcast to the input's shape {x.shape}")
        return [TensorInfo(x.shape, x.dtype)]

    def prepare(self, x, slope):
        # A constant slope <= 1 (the usual case) makes prelu(x) = max(x, slope * x), and one
        # >= 1 makes it the min. A zero slope would turn +inf into nan. Otherwise the
        # negative and positive parts are added, the latter from scratch.
        self.merge = None
        if _all(slope.value, lambda s: (s <= 1) & (s != 0)):
            self.merge = np.maximum
        elif _all(slope.value, lambda s: s >= 1):
            self.merge = np.minimum
        return [] if self.merge is not None else [(tuple(x.shape), x.dtype)]

    def run(self, x, slope, *, outs, scratch):
        out = outs[0]
        if self.merge is not None:
            np.multiply(x, slope, out=out)
            self.merge(out, x, out=out)
            return
        (positive,) = scratch
        np.clip(x, activation.lower_limit(x.dtype), 0, out=out)
        np.multiply(out, slope, out=out)
        np.clip(x, 0, activation.upper_limit(x.dtype), out=positive)
        np.add(out, positive, out=out)
