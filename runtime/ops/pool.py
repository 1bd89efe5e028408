"""ONNX pooling: MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool (NCHW).

The windowed pools run `conv_core.pool`: one vectorised max or add per kernel tap
over the phase planes of a block of (batch, channel) planes at once, in bounded
scratch. An average divides by the count of taps the window covers (padding
counted or not, by `count_include_pad`).
"""

import math

import numpy as np

from . import bands, blas, conv_core, parallel
from .registry import REQUIRED, Inferred, Kernel, TensorInfo, register


class _WindowPool(Kernel):
    """The windowed pools' shared part: the shape rule works out the window geometry (`window`),
    prepare the pooling `plan` over it (LpPool pools with both too)."""

    attributes = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": REQUIRED,
                  "pads": None, "strides": None}
    kind = None
    count_include_pad = 0

    def decode(self):
        if self.auto_pad not in conv_core.AUTO_PADS:
            self.fail(f"auto_pad {self.auto_pad!r} is not one of {', '.join(conv_core.AUTO_PADS)}")

    def check_dtype(self, dtype):
        if dtype.kind != "f":
            self.fail(f"input X has type {dtype}; expected a floating type")

    def infer(self, x):
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, D1, ...)")
        self.check_dtype(x.dtype)
        if len(self.kernel_shape) != len(x.shape) - 2:
            self.fail(f"kernel_shape {list(self.kernel_shape)} does not fit input shape {list(x.shape)}")
        try:
            window = conv_core.make_window(x.shape[2:], self.kernel_shape, self.strides, self.dilations,
                                           self.pads, self.auto_pad, bool(self.ceil_mode))
        except ValueError as e:
            self.fail(str(e))
        return Inferred([TensorInfo((x.shape[0], x.shape[1], *window.out_spatial), x.dtype)], window=window)

    def prepare(self, x):
        self.channels = x.shape[1]
        self.plan = conv_core.pool_plan(self.window, self.kind, x.shape[1], x.dtype,
                                        count_include_pad=bool(self.count_include_pad), batch=x.shape[0])
        return self.plan.scratch()

    def run(self, x, *, outs, scratch=()):
        conv_core.pool(x, outs[0], self.plan, scratch[0] if scratch else None)

    def band_granule(self):
        # A ceil_mode window counting its padding would count the band's made-up end padding.
        if self.kind not in ("max", "average") or (self.count_include_pad and self.ceil_mode):
            return 0
        return 1 if bands.windowed(self.window) else 0

    def band(self, r0, r1, scratch_limit, plans=None):
        a, b, window = bands.window_band(self.window, r0, r1)
        plan = bands.cached(plans, (window, scratch_limit), lambda: conv_core.pool_plan(
            window, self.kind, self.channels, self.plan.dtype, count_include_pad=bool(self.count_include_pad),
            scratch_limit=scratch_limit))

        def run(args, out, scratch):
            conv_core.pool(args[0], out, plan, scratch)
        return bands.Band((r0, r1), ((a, b),), run, plan.scratch_elems)


@register("MaxPool", since=1)
class MaxPool(_WindowPool):
    """MaxPool; int8/uint8 since opset 12. With its optional output Indices (opset 8 on) it runs
    `max_with_indices` instead of the pooling plan."""
    attributes = {**_WindowPool.attributes, "storage_order": 0}
    kind = "max"

    def decode(self):
        super().decode()
        self.with_indices = len(self.node.outputs) > 1 and bool(self.node.outputs[1])
        if self.storage_order not in (0, 1):
            self.fail(f"storage_order must be 0 or 1, got {self.storage_order}")

    def check_dtype(self, dtype):
        if dtype.kind != "f" and dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            self.fail(f"input X has type {dtype}; expected a floating type, int8 or uint8")

    def infer(self, x):
        inferred = super().infer(x)
        if not self.with_indices:
            return inferred
        values = inferred[0]
        return Inferred([values, TensorInfo(values.shape, np.dtype(np.int64))], window=inferred.derived["window"])

    def prepare(self, x):
        return [] if self.with_indices else super().prepare(x)

    def run(self, x, *, outs, scratch=()):
        if not self.with_indices:
            return super().run(x, outs=outs, scratch=scratch)
        values, indices = max_with_indices(x, self.window, column_major=bool(self.storage_order))
        np.copyto(outs[0], values)
        np.copyto(outs[1], indices)

    def band_granule(self):
        return 0 if self.with_indices else super().band_granule()


def max_with_indices(x, window, column_major=False):
    """MaxPool's values and Indices: for each window, its largest value and where it lies, as a flat
    index into X (N, C, D1, ...), the spatial part in row-major order, or column-major with
    `column_major` (storage_order 1). Of equal values the first in the window's row-major order
    counts; padding never does; a NaN is the largest."""
    rank = len(window.in_spatial)
    extents = [(k - 1) * d + 1 for k, d in zip(window.kernel, window.dilations)]
    # ceil_mode may let the last window run past the end padding.
    ends = [max(e, (o - 1) * s + ext - i - b) for e, o, s, ext, i, b in zip(
        window.pads_end, window.out_spatial, window.strides, extents, window.in_spatial, window.pads_begin)]
    pads = [(0, 0), (0, 0)] + list(zip(window.pads_begin, ends))
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    padded = np.pad(x, pads, constant_values=low)
    inside = np.pad(np.ones(x.shape[2:], bool), pads[2:], constant_values=False)
    axes = tuple(range(2, 2 + rank))
    picks = (tuple(slice(None, (o - 1) * s + 1, s) for o, s in zip(window.out_spatial, window.strides))
             + tuple(slice(None, None, d) for d in window.dilations))
    taps = math.prod(window.kernel)
    windows = np.lib.stride_tricks.sliding_window_view(padded, extents, axis=axes)[(Ellipsis,) + picks]
    windows = windows.reshape(x.shape[:2] + tuple(window.out_spatial) + (taps,))
    valid = np.lib.stride_tricks.sliding_window_view(inside, extents)[picks]
    valid = valid.reshape(tuple(window.out_spatial) + (taps,))
    nan = np.isnan(windows) if x.dtype.kind == "f" else np.zeros(windows.shape, bool)
    best = np.where(nan.any(axis=-1), np.nan, windows.max(axis=-1)) if x.dtype.kind == "f" else windows.max(axis=-1)
    is_best = ((windows == best[..., None]) | nan) & valid
    tap = np.argmax(is_best, axis=-1)
    # The input coordinates of each window's chosen tap.
    kernel_at = np.unravel_index(tap, window.kernel)
    grid = np.meshgrid(*(np.arange(o) for o in window.out_spatial), indexing="ij")
    coords = [g * s - b + k * d for g, s, b, k, d in zip(
        grid, window.strides, window.pads_begin, kernel_at, window.dilations)]
    spatial = np.ravel_multi_index(coords, window.in_spatial, order="F" if column_major else "C")
    n, c = x.shape[:2]
    planes = (np.arange(n)[:, None] * c + np.arange(c)[None, :]).reshape((n, c) + (1,) * rank)
    indices = planes * math.prod(window.in_spatial) + spatial
    return best.astype(x.dtype, copy=False), indices.astype(np.int64)


@register("AveragePool", since=1)
class AveragePool(_WindowPool):
    """AveragePool; count_include_pad since opset 7, ceil_mode since 10, dilations since 19."""
    attributes = {**_WindowPool.attributes, "count_include_pad": 0}
    kind = "average"


class _GlobalPool(Kernel):
    reduce = None
    averaging = None  # GlobalAveragePool: 1/size per element, the mean as one BLAS mat-vec

    def infer(self, x):
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, D1, ...)")
        return [TensorInfo((*x.shape[:2], *(1,) * (len(x.shape) - 2)), x.dtype)]

    def run(self, x, *, outs, scratch=()):
        out = outs[0]
        # One reduction over the flattened plane: faster than over several axes.
        planes = x.reshape(x.shape[0], x.shape[1], -1)
        target = out.reshape(out.shape[0], out.shape[1])
        averaging = self.averaging
        if averaging is not None and averaging.shape[0] == planes.shape[2] and averaging.dtype == x.dtype:
            blas.matmul(planes, averaging[:, None], target[..., None])  # BLAS's threads
        else:  # a large one in ranges of images or channels on the run's threads
            parallel.over_leading(planes.shape, lambda cut: self.reduce(planes[cut], axis=2, out=target[cut[:2]]),
                                  kept={0, 1})


@register("GlobalAveragePool", since=1)
class GlobalAveragePool(_GlobalPool):
    reduce = staticmethod(np.mean)

    def prepare(self, x):
        size = math.prod(x.shape[2:])
        # numpy's reduction over short rows is several times slower than BLAS's mat-vec;
        # half floats have no BLAS and keep the reduction (which accumulates in float32).
        if size and x.dtype in (np.dtype(np.float32), np.dtype(np.float64)):
            self.averaging = np.full(size, 1 / size, x.dtype)
        return []


@register("GlobalMaxPool", since=1)
class GlobalMaxPool(_GlobalPool):
    reduce = staticmethod(np.max)
