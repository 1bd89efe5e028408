"""Bands: a step that makes its output's rows (axis 2 of an NCHW tensor) a band at a time.

Under a memory budget an activation may be too large to hold beside the others; then it lives in
the spill file and the steps that write or read it run in bands of rows, so only a band of it is
in memory at a time (the compiler's banding, compiler/band.py). A kernel that can work that way
says so with `band_granule()` (the multiple of rows its bands come in) and makes the Band of
output rows [r0, r1): which rows of each input that band reads (a window's halo included), and
how to compute it from those rows alone, with its own plan (a window cut to the band, its padding
only where the band meets the tensor's edge).

Bands of one step mostly share their geometry (all but the first and the last read the same
number of rows with no padding), so `band` takes a dict in which it keeps the plans it made, by
window: one plan serves every band alike.

A band runs on contiguous arrays of one image: `run(args, out, scratch)` where args[i] is input
i's rows `reads[i]` as (1, C, rows, W), or the whole input where `reads[i]` is None (a weight),
`out` is (1, C', r1 - r0, W') and `scratch` holds `scratch_elems` of the dtype.
"""

from dataclasses import dataclass

from . import conv_core


@dataclass(frozen=True)
class Band:
    rows: tuple  # (r0, r1): the output rows it makes
    reads: tuple  # per input: (start, end) of its rows the band reads, or None (read whole)
    run: object  # run(args, out, scratch)
    scratch_elems: int = 0


def cached(plans, key, make):
    """plans[key], made by make() the first time (`plans` None: no keeping)."""
    if plans is None:
        return make()
    if key not in plans:
        plans[key] = make()
    return plans[key]


def window_band(window, r0, r1):
    """(start, end, window of the band): the input rows output rows [r0, r1) of `window` read,
    and the window over just those rows, padded only where the band meets the input's edge."""
    e = (window.kernel[0] - 1) * window.dilations[0] + 1
    s, pad, size = window.strides[0], window.pads_begin[0], window.in_spatial[0]
    start, end = r0 * s - pad, (r1 - 1) * s + e - pad
    a, b = max(0, start), min(size, end)
    band = conv_core.Window((b - a,) + window.in_spatial[1:], (r1 - r0,) + window.out_spatial[1:],
                            window.kernel, window.strides, window.dilations,
                            (a - start,) + window.pads_begin[1:], (end - b,) + window.pads_end[1:])
    return a, b, band


def windowed(window):
    """Whether a windowed kernel can run in bands: two spatial dims, every band reading at least
    one input row (padding narrower than the window)."""
    extent = (window.kernel[0] - 1) * window.dilations[0] + 1
    return (len(window.in_spatial) == 2 and window.in_spatial[0] > 0 and window.out_spatial[0] > 0
            and window.pads_begin[0] < extent and window.pads_end[0] < extent)


def elementwise_granule(in_shapes, out_shape):
    """1 when an elementwise op over NCHW tensors can run in bands: each input is read in bands
    (the output's shape) or whole (a size-1 image and row axis: a per-channel constant)."""
    if out_shape is None or len(out_shape) != 4:
        return 0
    for shape in in_shapes:
        shape = (1,) * (4 - len(shape)) + tuple(shape)
        if shape != tuple(out_shape) and (shape[0] != 1 or shape[2] != 1):
            return 0
    return 1


def elementwise_band(kernel, in_shapes, out_shape, r0, r1):
    """The band of an elementwise kernel, run by its own `run` on the band's arrays."""
    reads = tuple((r0, r1) if tuple(shape) == tuple(out_shape) else None for shape in in_shapes)

    def run(args, out, scratch):
        kernel.run(*args, outs=(out,), scratch=())
    return Band((r0, r1), reads, run)
