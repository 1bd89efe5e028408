"""Weights whose subnormal values are flushed to zero: the `flush_denormals` pass.

A float32 product with a subnormal operand (|w| < 1.2e-38) takes a microcode assist on
x86, about a hundred times a normal one. Trained weights can hold many: weight decay
drives unused ones there (PP-OCRv6's detector has 1x1 convolutions whose weights are
23% and 63% subnormal; those two GEMMs took 47 of its 112 ms). Flushing them to zero
changes each product by less than 1.2e-38 times an activation: nothing a float32 sum of
normal values can show.

A weight is scanned whole when small. A large one is scanned in a sample, and flushed when
the sample finds a subnormal: the slowdown is in proportion to how many there are, and a
sample of `SAMPLE` elements finds a fraction of 0.1% or more with probability above 98%
(spread evenly; 1% of whole rows, as a dead filter leaves, above 92%). The sample is `RUNS`
evenly spaced runs of contiguous elements. Both are read from the file with pread when the
weight is mapped: touching the mapping would make its pages resident, and with the kernel's
read-around (or a file cached in large folios) one touch every 100 KB is a read of the whole
weight. So a model without subnormals pays one read per small weight and `RUNS` small reads
per large one at PREPARE, and a weight used where it lies is not resident before it is run.
A weight that has them is replaced by a packed copy (made through the weight cache when
there is one); the mapped original is released.
"""

import numpy as np

from ..weights import ExternalData, weight_array
from .rewrite import weight_identity

SAMPLE = 4096  # elements looked at in a large weight
RUNS = 256  # the sample's runs of contiguous elements (16 each: one cache line of float32)
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


def _has_subnormal(weight):
    """Whether a small weight has a subnormal value, or a large one's sample has."""
    size = int(np.prod(weight.shape, dtype=np.int64))
    if size <= 4 * SAMPLE:
        return count_subnormal(_runs(weight, np.zeros(1, np.int64), size)) > 0
    run = SAMPLE // RUNS
    return count_subnormal(_runs(weight, np.linspace(0, size - run, RUNS).astype(np.int64), run)) > 0


def _runs(weight, starts, run):
    """The elements [s, s + run) of the flat weight for each s of `starts`, one after another; read
    from the file with pread when the weight is mapped from one, so its pages stay untouched."""
    if isinstance(weight, ExternalData) and weight.source.file is not None:
        item = weight.dtype.itemsize
        raw = b"".join(weight.source.read(int(a), int(a) + run * item) for a in weight.offset + starts * item)
        return np.frombuffer(raw, weight.dtype.newbyteorder("<")).astype(weight.dtype.newbyteorder("="))
    return weight_array(weight).reshape(-1)[(starts[:, None] + np.arange(run)).reshape(-1)]


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
        if 0 in weight.shape or not _has_subnormal(weight):
            continue
        array = weight_array(weight)
        weights[name] = keep(f"flush_denormals/{array.dtype.str}{array.shape}/{weight_identity(weight)}",
                             lambda array=array: flushed(array))
        copied(weight)
        replaced.append(name)
    return replaced
