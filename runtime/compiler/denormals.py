"""Weights whose subnormal values are flushed to zero: the `flush_denormals` pass.

A float32 product with a subnormal operand (|w| < 1.2e-38) takes a microcode assist on
x86, about a hundred times a normal one. Trained weights can hold many: weight decay
drives unused ones there (PP-OCRv6's detector has 1x1 convolutions whose weights are
23% and 63% subnormal; those two GEMMs took 47 of its 112 ms). Flushing them to zero
changes each product by less than 1.2e-38 times an activation: nothing a float32 sum of
normal values can show.

A weight is scanned whole when small. A large one is scanned in a sample of evenly spaced
elements first, and whole only when the sample finds a subnormal: the slowdown is in
proportion to how many there are, and a sample of `SAMPLE` elements finds a fraction of
0.1% or more with probability above 98%. So a model without them pays a few pages per
weight at PREPARE, not a read of every weight. A weight that has them is replaced by a
packed copy (made through the weight cache when there is one); the mapped original is
released.
"""

import numpy as np

from ..weights import weight_array
from .rewrite import weight_identity

SAMPLE = 4096  # elements looked at in a large weight before it is scanned whole
_CHUNK = 1 << 18  # elements per step of a whole scan or flush: no temporary of a weight's size

# float dtype -> (its bits as an unsigned integer dtype, the exponent's bits, the sign bit)
_BITS = {np.dtype(np.float32): (np.dtype(np.uint32), np.uint32(0x7F800000), np.uint32(1 << 31)),
         np.dtype(np.float64): (np.dtype(np.uint64), np.uint64(0x7FF << 52), np.uint64(1 << 63))}


def count_subnormal(array):
    """How many elements of a float32 or float64 array are subnormal (zero exponent, not zero)."""
    bits, exponent, sign = _BITS[array.dtype]
    flat = np.ascontiguousarray(array).reshape(-1).view(bits)
    magnitude = ~sign
    count = 0
    scratch = np.empty(min(flat.size, _CHUNK), bits)
    for start in range(0, flat.size, _CHUNK):
        part = flat[start:start + _CHUNK]
        kept = scratch[:part.size]
        np.bitwise_and(part, exponent, out=kept)
        no_exponent = part.size - np.count_nonzero(kept)
        if no_exponent:
            np.bitwise_and(part, magnitude, out=kept)
            count += no_exponent - (part.size - np.count_nonzero(kept))
    return count


def _sample_has_subnormal(array):
    flat = array.reshape(-1)
    if flat.size <= 4 * SAMPLE:
        return True  # small: scanned whole anyway
    picked = flat[np.linspace(0, flat.size - 1, SAMPLE).astype(np.int64)]
    return count_subnormal(picked) > 0


def flushed(array):
    """A copy of `array` with its subnormal values set to zero (sign kept: -0.0 stays -0.0)."""
    bits, exponent, sign = _BITS[array.dtype]
    out = np.array(array, copy=True, order="C")
    flat = out.reshape(-1).view(bits)
    for start in range(0, flat.size, _CHUNK):
        part = flat[start:start + _CHUNK]
        subnormal = (part & exponent) == 0
        np.bitwise_and(part, sign, out=part, where=subnormal)
    return out


def flush_denormal_weights(weights, used, keep=None, copied=lambda weight: None):
    """Replace in `weights` (name -> ExternalData | array) each float32/float64 weight of `used`
    holding subnormal values by a flushed copy. `keep(name, make)` makes the copy (a weight
    cache may hold it already); `copied` is told of each original, whose pages may go.
    Returns the names replaced."""
    keep = keep or (lambda name, make: make())
    replaced = []
    for name in used:
        weight = weights.get(name)
        if weight is None or np.dtype(weight.dtype) not in _BITS:
            continue
        array = weight_array(weight)
        if array.size == 0 or not _sample_has_subnormal(array) or count_subnormal(array) == 0:
            continue
        weights[name] = keep(f"flush_denormals/{array.dtype.str}{array.shape}/{weight_identity(weight)}",
                             lambda array=array: flushed(array))
        copied(weight)
        replaced.append(name)
    return replaced
