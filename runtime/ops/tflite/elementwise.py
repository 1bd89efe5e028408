"""TFLite elementwise ops: ONNX's Binary and Div kernels with TFLite's fused activation, the
comparisons, PRELU, and the unary ops on activation.py's formulas.
"""


import numpy as np

from .. import activation as act
from ..elementwise import Binary, Div, PRelu, broadcast_shape
from ..registry import Kernel, TensorInfo
from .common import fused_activation, tfl

# --------------------------------------------------------------------------- elementwise


class FusedActivation:
    """TFLite's fused_activation_function as the activation ONNX's binary kernels apply."""

    attributes = {"fused_activation_function": "NONE"}

    def decode(self):
        self.activation = fused_activation(self, self.fused_activation_function)


_FUSED = dict(FusedActivation.attributes, pot_scale_int16=True)
for _op, _ufunc in {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}.items():
    tfl(_op)(type(_op.title(), (FusedActivation, Binary), {"ufunc": _ufunc, "attributes": _FUSED}))
# Integer DIV truncates toward zero in LiteRT as in ONNX: Div's exact integer paths.
tfl("DIV")(type("Div", (FusedActivation, Div), {"attributes": FusedActivation.attributes}))


class PlainBinary(Binary):
    """A broadcasting binary op without a fused activation: ONNX's Binary kernel."""

    def decode(self):
        self.activation = None


for _op, _ufunc in {"MAXIMUM": np.maximum, "MINIMUM": np.minimum, "POW": np.power,
                    "FLOOR_DIV": np.floor_divide, "FLOOR_MOD": np.mod}.items():
    tfl(_op)(type(_op.title(), (PlainBinary,), {"ufunc": _ufunc}))


class Comparison(PlainBinary):
    result_dtype = np.bool_


for _op, _ufunc in {"LESS": np.less, "GREATER": np.greater, "EQUAL": np.equal, "NOT_EQUAL": np.not_equal,
                    "LESS_EQUAL": np.less_equal, "GREATER_EQUAL": np.greater_equal,
                    "LOGICAL_AND": np.logical_and, "LOGICAL_OR": np.logical_or}.items():
    tfl(_op)(type(_op.title(), (Comparison,), {"ufunc": _ufunc}))


@tfl("SQUARED_DIFFERENCE")
class SquaredDifference(PlainBinary):
    def run(self, a, b, *, outs, scratch):
        np.subtract(a, b, out=outs[0])
        np.square(outs[0], out=outs[0])


@tfl("PRELU")
class TflPRelu(PRelu):
    """alpha broadcasts to the input (usually [1, 1, C] against NHWC): ONNX PRelu's kernel."""

    def infer(self, x, slope):
        shape = broadcast_shape(self.node, x.shape, slope.shape)
        if shape != tuple(x.shape):
            self.fail(f"alpha of shape {slope.shape} does not broadcast to the input's {x.shape}")
        return [TensorInfo(shape, x.dtype)]


class Unary(Kernel):
    """y = f(x) by one of activation.py's formulas, or a ufunc."""

    formula = None

    def infer(self, x):
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, *, outs, scratch):
        self.formula(x, outs[0])


_UNARY = {
    "RELU": act.relu,
    "RELU6": lambda x, out: act.clip(x, out, 0, 6),
    "RELU_N1_TO_1": lambda x, out: act.clip(x, out, -1, 1),
    "RELU_0_TO_1": lambda x, out: act.clip(x, out, 0, 1),
    "LOGISTIC": act.sigmoid,
    "TANH": act.tanh,
    "HARD_SWISH": act.hard_swish,
    "ABS": lambda x, out: np.abs(x, out=out),
    "NEG": lambda x, out: np.negative(x, out=out),
    "EXP": lambda x, out: np.exp(x, out=out),
    "LOG": lambda x, out: np.log(x, out=out),
    "SQRT": lambda x, out: np.sqrt(x, out=out),
    "SQUARE": lambda x, out: np.square(x, out=out),
    "SIN": lambda x, out: np.sin(x, out=out),
    "COS": lambda x, out: np.cos(x, out=out),
    "FLOOR": lambda x, out: np.floor(x, out=out),
    "CEIL": lambda x, out: np.ceil(x, out=out),
    "ROUND": lambda x, out: np.rint(x, out=out),  # TFLite rounds half to even
    "SIGN": lambda x, out: np.sign(x, out=out),
    "LOGICAL_NOT": lambda x, out: np.logical_not(x, out=out),
}


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.reciprocal(out, out=out)


_UNARY["RSQRT"] = _rsqrt

for _op, _formula in _UNARY.items():
    tfl(_op)(type(_op.title(), (Unary,), {"formula": staticmethod(_formula)}))


@tfl("LEAKY_RELU")
class TflLeakyRelu(Unary):
    attributes = {"alpha": 0.2}

    def run(self, x, *, outs, scratch):
        act.leaky_relu(x, outs[0], self.alpha)
