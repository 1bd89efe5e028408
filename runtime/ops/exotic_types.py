"""The exotic element types: float8, float4, 4- and 2-bit integers, and conversions into them.

numpy has no arithmetic worth the name for these types; `ml_dtypes` (a dependency of onnx)
gives them a numpy dtype of one byte per element, which is how nnrun holds them. This module
owns the mapping from ONNX data type codes to those dtypes, and the conversions into them
that the ONNX spec defines beyond what a plain numpy cast does:

- float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ) with `saturate`: out-of-range values and
  infinities clamp to the largest finite value instead of becoming NaN or infinity;
- FLOAT8E8M0 (a bare power of two) with `round_mode` up / down / nearest and `saturate`.

Everything else (into int4/uint4/int2/uint2/float4, out of any of these types) is the
round-to-nearest-even (floats) or truncate-and-wrap (integers) cast ml_dtypes already does,
which is what the spec and onnx's reference evaluator expect.
"""

import ml_dtypes
import numpy as np
from onnx import TensorProto

# ONNX data type code -> numpy dtype, for the types past bfloat16 (code 16).
DTYPES = {getattr(TensorProto, name): np.dtype(getattr(ml_dtypes, dtype)) for name, dtype in (
    ("FLOAT8E4M3FN", "float8_e4m3fn"), ("FLOAT8E4M3FNUZ", "float8_e4m3fnuz"),
    ("FLOAT8E5M2", "float8_e5m2"), ("FLOAT8E5M2FNUZ", "float8_e5m2fnuz"),
    ("UINT4", "uint4"), ("INT4", "int4"), ("FLOAT4E2M1", "float4_e2m1fn"),
    ("FLOAT8E8M0", "float8_e8m0fnu"), ("UINT2", "uint2"), ("INT2", "int2"),
    ("FLOAT6E2M3", "float6_e2m3fn"), ("FLOAT6E3M2", "float6_e3m2fn"))
    if hasattr(TensorProto, name) and hasattr(ml_dtypes, dtype)}
CODES = {dtype: code for code, dtype in DTYPES.items()}

FLOAT8 = frozenset(DTYPES[getattr(TensorProto, n)] for n in (
    "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"))
FLOAT8E8M0 = DTYPES.get(getattr(TensorProto, "FLOAT8E8M0", None))
SMALL_INTEGERS = frozenset(DTYPES[c] for c in DTYPES if DTYPES[c].name in ("int4", "uint4", "int2", "uint2"))
SMALL_FLOATS = frozenset(DTYPES.values()) - SMALL_INTEGERS
ROUND_MODES = ("up", "down", "nearest")


def numpy_dtype(code):
    """The dtype of an exotic ONNX data type code, or None if `code` is not one."""
    return DTYPES.get(int(code))


def is_exotic(dtype):
    return np.dtype(dtype) in CODES


def integer_range(dtype):
    """(min, max) of an integer dtype, the 4- and 2-bit ones included."""
    dtype = np.dtype(dtype)
    info = ml_dtypes.iinfo(dtype) if dtype in SMALL_INTEGERS else np.iinfo(dtype)
    return int(info.min), int(info.max)


def largest_finite(dtype):
    return float(ml_dtypes.finfo(np.dtype(dtype)).max)


def needs_conversion(target, saturate=True):
    """True when a cast into `target` must go through `convert_into` rather than a numpy copy."""
    target = np.dtype(target)
    return (saturate and target in FLOAT8) or target == FLOAT8E8M0


def convert_into(out, x, saturate=True, round_mode="up"):
    """Cast `x` into `out` (whose dtype is the target) as ONNX's Cast defines it.

    `saturate` matters for the float8 types and FLOAT8E8M0 only; `round_mode` for
    FLOAT8E8M0 only. Any other pair of types is a plain element-wise numpy cast.
    """
    target = out.dtype
    if target == FLOAT8E8M0:
        np.copyto(out.view(np.uint8), e8m0_codes(x, saturate, round_mode))
        return out
    if saturate and target in FLOAT8:
        # Clamp before the cast: ml_dtypes turns what overflows into NaN or infinity.
        # NaN passes through the clip unchanged, as the spec wants.
        if x.dtype not in (np.float16, np.float32, np.float64):
            x = x.astype(np.float32)
        limit = largest_finite(target)
        x = np.clip(x, -limit, limit)
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(out, x, casting="unsafe")
    return out


def e8m0_codes(x, saturate=True, round_mode="up"):
    """The FLOAT8E8M0 byte of each element of `x`: the biased exponent of a power of two.

    The exponent is float32's own (bias 127, the same as E8M0's); rounding picks the power of
    two above (`up`), below (`down`) or nearest, ties up (`nearest`). The sign is ignored
    (negative inputs are undefined by the spec). 0xFF is NaN; with `saturate` what would
    round past the largest power (2**127) stays there, infinity included.
    """
    if round_mode not in ROUND_MODES:
        raise ValueError(f"round_mode {round_mode!r} is not one of {ROUND_MODES}")
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int32)
    fraction = bits & 0x7FFFFF
    special = exponent == 0xFF
    if round_mode == "up":
        exponent += fraction != 0
    elif round_mode == "nearest":
        exponent += fraction >= 0x400000
    if saturate:
        np.minimum(exponent, 0xFE, out=exponent)
    else:
        exponent[exponent > 0xFE] = 0xFF
    codes = exponent.astype(np.uint8)
    nan = np.isnan(x) if np.asarray(x).dtype.kind == "f" else special
    if saturate:
        codes[special] = 0xFE
    codes[special & nan] = 0xFF
    if not saturate:
        codes[special] = 0xFF
    return codes
