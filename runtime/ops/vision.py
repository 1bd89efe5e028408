"""Spatial sampling and detection ops: GridSample, AffineGrid, RoiAlign, NonMaxSuppression,
Col2Im, CenterCropPad and DeformConv.

Sampling ops are separable: along each spatial axis every output point gets a few taps
(index, weight); the N-D result is the sum over tap combinations of the gathered pixels
times the product of their weights, so the work is a handful of vectorised gathers
whatever the number of output points. Out-of-range taps follow the padding mode: weight 0
(zeros), clamped index (border) or reflected index (reflection), as in onnx's reference
and onnxruntime.
"""

import itertools
import math

import numpy as np

from .registry import Inferred, Kernel, TensorInfo, register
from .shape import normalize_axis


def _value(info, kernel, name):
    """An input's value known at PREPARE, or NeedsValueError (the node then runs eagerly)."""
    if info is None:
        return None
    if info.value is None:
        kernel.needs_value(name)
    return info.value


def _ints(kernel, attr, default, n):
    """A per-spatial-axis int attribute, defaulted when empty."""
    values = list(getattr(kernel, attr) or [default] * n)
    if len(values) != n:
        kernel.fail(f"attribute {attr!r} has {len(values)} values for {n} spatial axes")
    return values


def _reflect(x, low, high):
    """Reflect coordinates into [low, high] off the nearer border, repeatedly."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below = x < low
    dx = np.where(below, low - x, x - high)
    folds = np.trunc(dx / span)
    rest = dx - folds * span
    even = folds % 2 == 0
    inside_from_low = np.where(even, low + rest, high - rest)
    inside_from_high = np.where(even, high - rest, low + rest)
    return np.where(below, inside_from_low, np.where(x > high, inside_from_high, x))


def _cubic_weights(t, alpha=-0.75):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fraction t."""
    def near(x):
        return ((alpha + 2) * x - (alpha + 3)) * x * x + 1

    def far(x):
        return ((alpha * x - 5 * alpha) * x + 8 * alpha) * x - 4 * alpha

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


class GridSample(Kernel):
    attributes = {"align_corners": 0, "mode": "linear", "padding_mode": "zeros"}
    names = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
    max_spatial = None  # any number of spatial axes

    def decode(self):
        if self.mode not in self.names:
            self.fail(f"mode {self.mode!r} is not one of {sorted(self.names)}")
        self.kind = self.names[self.mode]
        if self.padding_mode not in ("zeros", "border", "reflection"):
            self.fail(f"padding_mode {self.padding_mode!r} is not zeros, border or reflection")

    def infer(self, x, grid):
        spatial = len(x.shape) - 2
        if spatial < 1 or (self.max_spatial and spatial != self.max_spatial):
            self.fail(f"X has shape {x.shape}; expected {self.max_spatial or 'N'} spatial axes")
        if len(grid.shape) != spatial + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != spatial:
            self.fail(f"grid has shape {grid.shape}; expected (N, *out_spatial, {spatial}) for X {x.shape}")
        if self.kind == "cubic" and spatial != 2:
            self.fail("cubic mode samples 2-D images only")
        return [TensorInfo((x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1]), x.dtype)]

    def taps(self, coord, size):
        """(indices, weights) lists along one axis for normalised coordinates `coord`."""
        if self.align_corners:
            x = (coord + 1) / 2 * (size - 1)
            low, high = 0.0, size - 1.0
        else:
            x = ((coord + 1) * size - 1) / 2
            low, high = -0.5, size - 0.5
        x = x.astype(np.float32).astype(np.float64)  # the reference rounds coordinates to float32
        if self.kind == "nearest":
            x = np.rint(x)
        outside = (x < low) | (x > high)
        # Cubic keeps its coordinate and clamps only the taps, as onnxruntime and PyTorch do
        # (onnx's reference clamps the coordinate too; no backend case tells them apart).
        if self.padding_mode == "border" and self.kind != "cubic":
            x = np.where(outside, np.clip(x, 0, size - 1), x)
        elif self.padding_mode == "reflection":
            x = np.where(outside, _reflect(x, low, high), x)
        if self.kind == "nearest":
            indices, weights = [np.trunc(x)], [np.ones_like(x)]
        else:
            base = np.floor(x)
            t = x - base
            if self.kind == "linear":
                indices, weights = [base, base + 1], [1 - t, t]
            else:
                indices, weights = [base - 1, base, base + 1, base + 2], _cubic_weights(t)
        fixed = []
        for i, w in zip(indices, weights):
            if self.padding_mode == "zeros":
                valid = (i >= 0) & (i < size)
                w = np.where(valid, w, 0)
                i = np.where(valid, i, 0)
            elif self.padding_mode == "border":
                i = np.clip(i, 0, size - 1)
            else:
                i = np.trunc(_reflect(i, low, high))
            fixed.append((i.astype(np.intp), w))
        return fixed

    def run(self, x, grid, *, outs, scratch):
        n, c = x.shape[:2]
        spatial = x.shape[2:]
        y = outs[0]
        if y.size == 0:
            return
        strides = [math.prod(spatial[a + 1:]) for a in range(len(spatial))]
        coords = grid.reshape(n, -1, len(spatial)).astype(np.float64)
        dtype = np.result_type(x.dtype, np.float32) if x.dtype.kind == "f" else np.float64
        for b in range(n):
            # grid's last axis lists coordinates innermost-first (x, y, z).
            per_axis = [self.taps(coords[b, :, len(spatial) - 1 - a], size)
                        for a, size in enumerate(spatial)]
            plane = x[b].reshape(c, -1)
            total = np.zeros((c, coords.shape[1]), dtype)
            for combo in itertools.product(*per_axis):
                flat = sum(i * s for (i, _), s in zip(combo, strides))
                weight = math.prod(w for _, w in combo)
                total += plane[:, flat] * weight.astype(dtype)
            if y.dtype.kind in "iub":
                total = np.rint(total)
            np.copyto(y[b].reshape(c, -1), total, casting="unsafe")


register("GridSample", since=16)(type("GridSample", (GridSample,), {
    "attributes": {"align_corners": 0, "mode": "bilinear", "padding_mode": "zeros"},
    "names": {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"},
    "max_spatial": 2}))
register("GridSample", since=20)(GridSample)
register("GridSample", since=22)(type("GridSample", (GridSample,), {}))


@register("AffineGrid", since=20)
class AffineGrid(Kernel):
    """Sampling grid (N, *spatial, r) of the affine maps theta (N, r, r + 1) over a unit box."""

    attributes = {"align_corners": 0}

    def infer(self, theta, size):
        size = [int(s) for s in _value(size, self, "size")]
        if len(size) not in (4, 5):
            self.fail(f"size {size} must be (N, C, H, W) or (N, C, D, H, W)")
        spatial = size[2:]
        r = len(spatial)
        if tuple(theta.shape) != (size[0], r, r + 1):
            self.fail(f"theta has shape {theta.shape}; expected {(size[0], r, r + 1)}")
        if min(size) < 0:
            self.fail(f"size {size} has a negative dimension")
        return Inferred([TensorInfo((size[0], *spatial, r), theta.dtype)], spatial=spatial)

    def prepare(self, theta, size):
        # Homogeneous base coordinates (prod(spatial), r + 1), innermost axis first: (x, y, [z,] 1).
        axes = []
        for s in reversed(self.spatial):
            if self.align_corners:
                axes.append(np.linspace(-1, 1, s))
            else:
                axes.append((2 * np.arange(s) + 1) / s - 1)
        mesh = np.meshgrid(*axes[::-1], indexing="ij")[::-1]
        base = np.stack([m.reshape(-1) for m in mesh] + [np.ones(mesh[0].size)], axis=1)
        self.base = base.astype(theta.dtype)
        return []

    def run(self, theta, size, *, outs, scratch):
        n = theta.shape[0]
        np.matmul(self.base, theta.swapaxes(1, 2), out=outs[0].reshape(n, self.base.shape[0], -1))


class RoiAlign(Kernel):
    attributes = {"coordinate_transformation_mode": "half_pixel", "mode": "avg", "output_height": 1,
                  "output_width": 1, "sampling_ratio": 0, "spatial_scale": 1.0}

    def decode(self):
        if self.mode not in ("avg", "max"):
            self.fail(f"mode {self.mode!r} is not avg or max")
        if self.coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
            self.fail(f"coordinate_transformation_mode {self.coordinate_transformation_mode!r} "
                      "is not half_pixel or output_half_pixel")
        if self.output_height <= 0 or self.output_width <= 0 or self.sampling_ratio < 0:
            self.fail("output_height and output_width must be positive, sampling_ratio non-negative")

    def infer(self, x, rois, batch_indices):
        if len(x.shape) != 4 or len(rois.shape) != 2 or rois.shape[1] != 4:
            self.fail(f"X {x.shape} must be 4-D and rois {rois.shape} (num_rois, 4)")
        if tuple(batch_indices.shape) != (rois.shape[0],):
            self.fail(f"batch_indices {batch_indices.shape} must be ({rois.shape[0]},)")
        return [TensorInfo((rois.shape[0], x.shape[1], self.output_height, self.output_width),
                           x.dtype)]

    def axis_samples(self, start, length, pooled, size):
        """Bilinear taps along one axis: (low, high, w_low, w_high) of shape (pooled, grid)."""
        grid = max(self.sampling_ratio or int(math.ceil(length / pooled)), 0)
        bin_size = length / pooled
        pos = start + np.arange(pooled)[:, None] * bin_size + (np.arange(grid) + 0.5) * bin_size / grid
        outside = (pos < -1.0) | (pos > size)
        pos = np.maximum(pos, 0)
        low = np.floor(pos).astype(np.intp)
        edge = low >= size - 1
        low = np.where(edge, size - 1, low)
        high = np.where(edge, size - 1, low + 1)
        pos = np.where(edge, low, pos)
        frac = pos - low
        # Samples beyond the image contribute zero.
        return (np.where(outside, 0, low), np.where(outside, 0, high),
                np.where(outside, 0.0, 1 - frac), np.where(outside, 0.0, frac), grid)

    def run(self, x, rois, batch_indices, *, outs, scratch):
        _, c, height, width = x.shape
        ph, pw = self.output_height, self.output_width
        half_pixel = self.opset >= 16 and self.coordinate_transformation_mode == "half_pixel"
        offset = 0.5 if half_pixel else 0.0
        boxes = rois.astype(np.float64) * self.spatial_scale - offset
        y = outs[0]
        for r in range(rois.shape[0]):
            b = int(batch_indices[r])
            if not 0 <= b < x.shape[0]:
                self.fail(f"batch index {b} out of range [0, {x.shape[0]})")
            x0, y0, x1, y1 = boxes[r]
            roi_w, roi_h = x1 - x0, y1 - y0
            if not half_pixel:
                roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
            ylo, yhi, wylo, wyhi, gy = self.axis_samples(y0, roi_h, ph, height)
            xlo, xhi, wxlo, wxhi, gx = self.axis_samples(x0, roi_w, pw, width)
            if gy * gx == 0:
                y[r] = 0
                continue
            plane = x[b].reshape(c, -1)
            # Each (ph, gy, pw, gx) sample: four corner products.
            corners = []
            for iy, wy in ((ylo, wylo), (yhi, wyhi)):
                for ix, wx in ((xlo, wxlo), (xhi, wxhi)):
                    flat = iy[:, :, None, None] * width + ix[None, None]
                    w = wy[:, :, None, None] * wx[None, None]
                    corners.append(plane[:, flat] * w.astype(x.dtype))
            if self.mode == "avg":
                sampled = sum(corners)
                np.copyto(y[r], sampled.sum(axis=(2, 4)) / (gy * gx), casting="unsafe")
            else:
                # onnxruntime's max mode: the largest weighted corner of each sample.
                sampled = np.maximum(np.maximum(corners[0], corners[1]),
                                     np.maximum(corners[2], corners[3]))
                np.copyto(y[r], sampled.max(axis=(2, 4)), casting="unsafe")


register("RoiAlign", since=10)(type("RoiAlign", (RoiAlign,), {
    "attributes": {k: v for k, v in RoiAlign.attributes.items()
                   if k != "coordinate_transformation_mode"},
    "coordinate_transformation_mode": "output_half_pixel"}))
register("RoiAlign", since=16)(RoiAlign)
register("RoiAlign", since=22)(type("RoiAlign", (RoiAlign,), {}))


class NonMaxSuppression(Kernel):
    """Greedy per-(batch, class) selection; the number of selected boxes is data-dependent."""

    attributes = {"center_point_box": 0}

    def infer(self, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
        if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(scores.shape) != 3:
            self.fail(f"boxes {boxes.shape} must be (batch, boxes, 4) and scores {scores.shape} "
                      "(batch, classes, boxes)")
        if scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            self.fail(f"scores {scores.shape} do not match boxes {boxes.shape}")
        names = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")
        infos = (boxes, scores, max_output, iou_threshold, score_threshold)
        values = tuple(_value(info, self, name) for name, info in zip(names, infos))
        selected = self.select(*values)
        # Run with these very arrays (an eager step) returns this selection, not a second one.
        return Inferred([TensorInfo(selected.shape, np.dtype(np.int64), selected)],
                        selected=(values, selected))

    def corners(self, boxes):
        """(y_min, x_min, y_max, x_max) of every box, whichever way its corners were given."""
        boxes = boxes.astype(np.float64)
        if self.center_point_box:
            cx, cy, w, h = (boxes[..., i] for i in range(4))
            return cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2
        y0, x0, y1, x1 = (boxes[..., i] for i in range(4))
        return np.minimum(y0, y1), np.minimum(x0, x1), np.maximum(y0, y1), np.maximum(x0, x1)

    def select(self, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
        def scalar(a, default):
            return a.reshape(-1)[0] if a is not None and a.size else default

        limit = int(scalar(max_output, 0))
        iou_limit = float(scalar(iou_threshold, 0.0))
        floor = scalar(score_threshold, None)
        floor = None if floor is None else float(floor)
        picked = []
        if limit <= 0:
            return np.zeros((0, 3), np.int64)
        for b in range(boxes.shape[0]):
            ymin, xmin, ymax, xmax = self.corners(boxes[b])
            inter_h = np.minimum(ymax[:, None], ymax) - np.maximum(ymin[:, None], ymin)
            inter_w = np.minimum(xmax[:, None], xmax) - np.maximum(xmin[:, None], xmin)
            area = (ymax - ymin) * (xmax - xmin)
            inter = inter_h * inter_w
            union = area[:, None] + area - inter
            with np.errstate(divide="ignore", invalid="ignore"):
                suppresses = ((inter_h > 0) & (inter_w > 0) & (inter > 0) & (area[:, None] > 0)
                              & (area > 0) & (union > 0) & (inter / union > iou_limit))
            for c in range(scores.shape[1]):
                s = scores[b, c]
                candidates = np.arange(s.shape[0]) if floor is None else np.flatnonzero(s > floor)
                # Highest score first; ties keep the lower box index first.
                order = candidates[np.lexsort((candidates, -s[candidates].astype(np.float64)))]
                kept = []
                blocked = np.zeros(s.shape[0], bool)
                for i in order:
                    if blocked[i]:
                        continue
                    kept.append(i)
                    picked.append((b, c, i))
                    if len(kept) >= limit:
                        break
                    blocked |= suppresses[i]
        return np.array(picked, np.int64).reshape(-1, 3)

    def run(self, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None, *,
            outs, scratch):
        inputs = (boxes, scores, max_output, iou_threshold, score_threshold)
        known, selected = self.selected
        if len(known) == len(inputs) and all(a is b for a, b in zip(known, inputs)):
            return selected
        return self.select(*inputs)


register("NonMaxSuppression", since=10)(NonMaxSuppression)
register("NonMaxSuppression", since=11)(type("NonMaxSuppression", (NonMaxSuppression,), {}))


@register("Col2Im", since=18)
class Col2Im(Kernel):
    """Sums column blocks (N, C * prod(block), L) back into images (N, C, *image_shape)."""

    attributes = {"dilations": [], "pads": [], "strides": []}

    def infer(self, cols, image_shape, block_shape):
        image = [int(v) for v in _value(image_shape, self, "image_shape")]
        block = [int(v) for v in _value(block_shape, self, "block_shape")]
        r = len(image)
        if len(block) != r or r == 0 or min(image + block) <= 0:
            self.fail(f"image_shape {image} and block_shape {block} must be positive and of one length")
        dilations = _ints(self, "dilations", 1, r)
        strides = _ints(self, "strides", 1, r)
        pads = _ints(self, "pads", 0, 2 * r)
        blocks = math.prod(block)
        if len(cols.shape) != 3 or cols.shape[1] % blocks:
            self.fail(f"input {cols.shape} must be (N, C * {blocks}, L)")
        counts = []
        for a in range(r):
            span = dilations[a] * (block[a] - 1) + 1
            padded = image[a] + pads[a] + pads[a + r]
            counts.append((padded - span) // strides[a] + 1)
        if math.prod(counts) != cols.shape[2] or min(counts) <= 0:
            self.fail(f"input has {cols.shape[2]} blocks; image {image}, block {block}, pads, "
                      f"strides and dilations give {counts}")
        return Inferred([TensorInfo((cols.shape[0], cols.shape[1] // blocks, *image), cols.dtype)],
                        image=image, block=block, counts=counts, dilations=dilations, strides=strides,
                        pads=pads)

    def run(self, cols, image_shape, block_shape, *, outs, scratch):
        r = len(self.image)
        n, c = outs[0].shape[:2]
        padded = np.zeros((n, c) + tuple(self.image[a] + self.pads[a] + self.pads[a + r]
                                         for a in range(r)), outs[0].dtype)
        blocks = cols.reshape(n, c, math.prod(self.block), *self.counts)
        for k, offsets in enumerate(itertools.product(*[range(b) for b in self.block])):
            window = tuple(slice(o * d, o * d + s * (m - 1) + 1, s) for o, d, s, m in
                           zip(offsets, self.dilations, self.strides, self.counts))
            padded[(slice(None), slice(None)) + window] += blocks[:, :, k]
        inner = tuple(slice(self.pads[a], self.pads[a] + self.image[a]) for a in range(r))
        np.copyto(outs[0], padded[(slice(None), slice(None)) + inner])


@register("CenterCropPad", since=18)
class CenterCropPad(Kernel):
    """Crops or zero-pads the given axes to `shape`, keeping the centre (extra goes to the end)."""

    attributes = {"axes": []}

    def infer(self, x, shape):
        target = [int(v) for v in _value(shape, self, "shape")]
        rank = len(x.shape)
        axes = [normalize_axis(self.node, a, rank, "axes") for a in self.axes] or list(range(rank))
        if len(target) != len(axes) or len(set(axes)) != len(axes) or min(target, default=0) < 0:
            self.fail(f"shape {target} does not fit axes {axes}")
        out_shape = list(x.shape)
        source, dest = [slice(None)] * rank, [slice(None)] * rank
        for a, t in zip(axes, target):
            size = x.shape[a]
            out_shape[a] = t
            if t < size:
                start = (size - t) // 2
                source[a] = slice(start, start + t)
            elif t > size:
                start = (t - size) // 2
                dest[a] = slice(start, start + size)
        pads = tuple(out_shape) != tuple(min(s, o) for s, o in zip(x.shape, out_shape))
        return Inferred([TensorInfo(tuple(out_shape), x.dtype)], source=source, dest=dest, pads=pads)

    def run(self, x, shape, *, outs, scratch):
        if self.pads:
            outs[0].fill(0)
        outs[0][tuple(self.dest)] = x[tuple(self.source)]


class DeformConv(Kernel):
    """Convolution whose every kernel tap samples X (bilinearly, zeros outside) at a learned offset.

    The sampled taps of one batch item form im2col columns (C * prod(kernel), prod(out)),
    scaled by the optional mask; each group is then one GEMM with its weights.
    """

    attributes = {"dilations": [], "group": 1, "kernel_shape": [], "offset_group": 1, "pads": [],
                  "strides": []}

    def infer(self, x, w, offset, b=None, mask=None):
        r = len(x.shape) - 2
        if r < 1 or len(w.shape) != r + 2:
            self.fail(f"X {x.shape} and W {w.shape} must have the same rank, at least 3")
        n, c = x.shape[:2]
        oc = w.shape[0]
        kernel = list(self.kernel_shape or w.shape[2:])
        if tuple(kernel) != tuple(w.shape[2:]):
            self.fail(f"kernel_shape {kernel} does not match W {w.shape}")
        dilations = _ints(self, "dilations", 1, r)
        strides = _ints(self, "strides", 1, r)
        pads = _ints(self, "pads", 0, 2 * r)
        g, og = self.group, self.offset_group
        if g <= 0 or og <= 0 or c != w.shape[1] * g or oc % g or c % og:
            self.fail(f"channels of X {x.shape} and W {w.shape} do not fit group {g} and "
                      f"offset_group {og}")
        out = [(x.shape[2 + a] + pads[a] + pads[a + r]
                - dilations[a] * (kernel[a] - 1) - 1) // strides[a] + 1 for a in range(r)]
        taps = math.prod(kernel)
        if tuple(offset.shape) != (n, og * taps * r, *out):
            self.fail(f"offset has shape {offset.shape}; expected {(n, og * taps * r, *out)}")
        if mask is not None and tuple(mask.shape) != (n, og * taps, *out):
            self.fail(f"mask has shape {mask.shape}; expected {(n, og * taps, *out)}")
        if b is not None and tuple(b.shape) != (oc,):
            self.fail(f"B has shape {b.shape}; expected ({oc},)")
        return Inferred([TensorInfo((n, oc, *out), x.dtype)], kernel=kernel, out=out, dilations=dilations,
                        strides=strides, pads=pads)

    def prepare(self, x, w, *rest):
        r = len(self.kernel)
        # Undeformed sampling position of each (kernel tap, output point) along each axis.
        self.base = []
        for a in range(r):
            k = np.arange(self.kernel[a]) * self.dilations[a]
            o = np.arange(self.out[a]) * self.strides[a] - self.pads[a]
            shape_k = [1] * (2 * r)
            shape_k[a] = self.kernel[a]
            shape_o = [1] * (2 * r)
            shape_o[r + a] = self.out[a]
            self.base.append(k.reshape(shape_k) + o.reshape(shape_o))
        return []

    def run(self, x, w, offset, b=None, mask=None, *, outs, scratch):
        n, c = x.shape[:2]
        r = len(self.kernel)
        spatial = x.shape[2:]
        g, og = self.group, self.offset_group
        taps, points = math.prod(self.kernel), math.prod(self.out)
        strides = [math.prod(spatial[a + 1:]) for a in range(r)]
        offsets = offset.reshape(n, og, *self.kernel, r, *self.out)
        masks = None if mask is None else mask.reshape(n, og, *self.kernel, *self.out)
        weights = w.reshape(g, w.shape[0] // g, -1)
        y = outs[0].reshape(n, g, w.shape[0] // g, points)
        cols = np.empty((c, taps * points), x.dtype)
        per_group = c // og
        for i in range(n):
            for j in range(og):
                per_axis = []
                for a in range(r):
                    pos = self.base[a] + offsets[i, j][(slice(None),) * r + (a,)]
                    low = np.floor(pos)
                    frac = pos - low
                    axis_taps = []
                    for idx, wt in ((low, 1 - frac), (low + 1, frac)):
                        valid = (idx >= 0) & (idx < spatial[a])
                        axis_taps.append((np.where(valid, idx, 0).astype(np.intp),
                                          np.where(valid, wt, 0)))
                    per_axis.append(axis_taps)
                plane = x[i, j * per_group:(j + 1) * per_group].reshape(per_group, -1)
                block = cols[j * per_group:(j + 1) * per_group]
                block.fill(0)
                for combo in itertools.product(*per_axis):
                    flat = sum(t * s for (t, _), s in zip(combo, strides)).reshape(-1)
                    weight = math.prod(wt for _, wt in combo)
                    if masks is not None:
                        weight = weight * masks[i, j]
                    block += plane[:, flat] * weight.reshape(-1).astype(x.dtype)
            grouped = cols.reshape(g, (c // g) * taps, points)
            np.matmul(weights, grouped, out=y[i])
        if b is not None:
            outs[0].reshape(n, -1, points)[:] += b.reshape(1, -1, 1)


register("DeformConv", since=19)(DeformConv)
register("DeformConv", since=22)(type("DeformConv", (DeformConv,), {}))
