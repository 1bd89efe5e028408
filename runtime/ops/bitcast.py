"""BitCast (opset 26): the same bits read as another type of the same width.

Bit widths are ONNX's, not numpy's: the 4- and 2-bit types and float6 are held one
element a byte (see exotic_types) with their code in the low bits and the rest zero,
so two types of one width reinterpret each other by a view of those bytes, and an
int4 never passes for an int8. bool is 8 bits wide, as ONNX stores it.
"""

import numpy as np

from . import exotic_types
from .registry import REQUIRED, Kernel, TensorInfo, register
from .shape import onnx_dtype

_NARROW_BITS = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2,
                "float6_e2m3fn": 6, "float6_e3m2fn": 6}


def bit_width(dtype):
    """The width of one element of `dtype` in ONNX's storage, in bits."""
    dtype = np.dtype(dtype)
    return _NARROW_BITS.get(dtype.name, dtype.itemsize * 8)


@register("BitCast", since=26)
class BitCast(Kernel):
    attributes = {"to": REQUIRED}

    def decode(self):
        self.dtype = exotic_types.numpy_dtype(self.to) or onnx_dtype(self.node, self.to)
        if self.dtype.kind in "OUS":
            self.fail("BitCast to a string type is not defined")

    def infer(self, x):
        if x.dtype.kind in "OUS":
            self.fail("BitCast of a string tensor is not defined")
        if bit_width(x.dtype) != bit_width(self.dtype):
            self.fail(f"BitCast from {x.dtype} ({bit_width(x.dtype)} bits) to {self.dtype} "
                      f"({bit_width(self.dtype)} bits): the widths must be equal")
        return [TensorInfo(x.shape, self.dtype)]

    def run(self, x, *, outs, scratch=()):
        # The view is of the bytes as they lie: numpy's own order, little-endian on every
        # platform nnrun runs on, as the spec asks.
        np.copyto(outs[0].view(x.dtype), x)
