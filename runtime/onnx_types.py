"""ONNX's names and numbers for the numpy dtypes nnrun holds tensors in.

onnxruntime's API speaks of element types as `tensor(float)` strings (NodeArg.type,
OrtValue.data_type) and as TensorProto codes (OrtValue.element_type); these are the one
place nnrun turns a dtype into either, or a code back into a dtype.
"""

import functools

import numpy as np
from onnx import TensorProto, helper


@functools.lru_cache(maxsize=None)
def element_type(dtype):
    """The TensorProto code of a numpy dtype (an object or str array is a string tensor)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dtype.newbyteorder("="))  # big-endian floats are floats


@functools.lru_cache(maxsize=None)
def type_name(dtype):
    """`tensor(float)`, as onnxruntime names a tensor of `dtype`; `tensor(undefined)` for None."""
    if dtype is None:
        return "tensor(undefined)"
    return f"tensor({TensorProto.DataType.Name(element_type(dtype)).lower()})"


def numpy_dtype(element):
    """The numpy dtype of an element type given as a TensorProto code or as a numpy type."""
    if isinstance(element, (int, np.integer)) and not isinstance(element, bool):
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(element)))
    return np.dtype(element)
