"""What every TFLite front end shares: the domain, registration, tensor types and fused activations.

Tensors are NHWC as the file has them; attributes are the fields of the op's
BuiltinOptions table (see the loader's interface).
"""

import numpy as np

from ..registry import register

DOMAIN = "tflite"

# TFLite fused activations as (op type, params) of activation.apply_activation. LiteRT's
# float kernels turn a fused activation into a clamp range (CalculateActivationRange), in
# which TANH and SIGN_BIT are no clamp at all: they do nothing there, and so here.
FUSED = {
    "NONE": None,
    "RELU": ("Relu", {}),
    "RELU6": ("Clip", {"min": 0, "max": 6}),
    "RELU_N1_TO_1": ("Clip", {"min": -1, "max": 1}),
    "TANH": None,
    "SIGN_BIT": None,
}

# TensorType enum, by name and by number.
TENSOR_TYPES = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "UINT8": np.uint8,
    "INT64": np.int64, "BOOL": np.bool_, "INT16": np.int16, "INT8": np.int8,
    "FLOAT64": np.float64, "UINT64": np.uint64, "UINT32": np.uint32, "UINT16": np.uint16,
    "COMPLEX64": np.complex64,
}
_TYPE_CODES = ["FLOAT32", "FLOAT16", "INT32", "UINT8", "INT64", "STRING", "BOOL", "INT16",
               "COMPLEX64", "INT8", "FLOAT64", "COMPLEX128", "UINT64", "RESOURCE", "VARIANT",
               "UINT32", "UINT16"]


def tensor_type(kernel, value, what):
    name = _TYPE_CODES[value] if isinstance(value, int) and 0 <= value < len(_TYPE_CODES) else value
    if name not in TENSOR_TYPES:
        kernel.fail(f"{what} {value!r} is not a supported tensor type")
    return np.dtype(TENSOR_TYPES[name])


def fused_activation(kernel, name):
    """The apply_activation pair of a TFLite fused_activation_function (None for NONE)."""
    if name not in FUSED:
        kernel.fail(f"fused_activation_function {name!r} is not supported")
    return FUSED[name]


def tfl(op_type):
    return register(op_type, since=1, domain=DOMAIN)


def axis_of(kernel, axis, rank):
    if not -rank <= axis < rank:
        kernel.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank
