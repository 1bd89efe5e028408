"""Resize (opsets 10, 11, 13, 18, 19) and the deprecated Upsample (7, 9) on one separable core.

Every mode of Resize is separable: an output element is a sum of input elements
weighted by a product of per-axis weights. So the plan, made once per input shape
in `infer` (it depends only on shapes and on the constant scales/sizes/roi), is
for every resized axis an index array per tap (which input row feeds output row
i) and a weight array per tap; a run applies the axes one after the other through
arena scratch buffers, shrinking axes first.

How an axis is applied, fastest first:
- nearest, every resized axis repeating each row k times (the usual 2x upsample):
  one broadcast copy, or one integer multiply that replicates k lanes of a word;
- nearest, small index table: one `np.take` over the flattened resized block;
- taps that repeat with a short period (integer and simple rational factors):
  strided slices times constants, no gathers;
- otherwise `np.take` per tap, multiply, add.

Coordinates are computed in float32 with onnxruntime's association, and its tie
rule for nearest rounding, so the same input rows are picked; as onnxruntime does,
an axis whose scale is exactly 1 is left alone. Antialiasing (opset 18) follows
onnx's reference implementation, which onnxruntime agrees with.
"""

import math

import numpy as np

from ..errors import ModelError
from .registry import Kernel, TensorInfo, register
from .shape import known_value, normalize_axes, sane_shape

F32 = np.float32

# onnxruntime counts a source coordinate within this distance of k + 0.5 as a tie.
TIE = 1e-6


def _round_half(x, prefer_ceil):
    fraction = x - np.floor(x)
    tie = np.abs(fraction - 0.5) <= TIE
    return np.where(tie, np.floor(x) + (1 if prefer_ceil else 0), np.floor(x + 0.5))


# Nearest modes: from a float32 source coordinate to an input index (before clamping).
NEAREST = {
    "round_prefer_floor": lambda x, down: _round_half(x, False),
    "round_prefer_ceil": lambda x, down: _round_half(x, True),
    "floor": lambda x, down: np.floor(x),
    "ceil": lambda x, down: np.ceil(x),
    # Resize-10 and Upsample had no nearest_mode; onnxruntime keeps their original rule.
    "simple": lambda x, down: np.ceil(x) if down else np.trunc(x),
}

COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize")


def source_coordinates(mode, out_len, in_len, scale, roi):
    """x_original for every output index along one axis, in float32 (onnxruntime's arithmetic)."""
    x = np.arange(out_len, dtype=F32)
    scale = F32(scale)
    half = F32(0.5)
    if mode == "half_pixel":
        return (x + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if out_len > 1 else np.zeros(out_len, F32)
    if mode == "half_pixel_symmetric":
        adjustment = F32(out_len) / (scale * F32(in_len))
        offset = F32(in_len) / F32(2) * (F32(1) - adjustment)
        # onnxruntime finishes this one in double precision
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(F32)
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(out_len, F32)
        return x * F32(in_len - 1) / F32(out_len - 1)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    # tf_crop_and_resize
    start, end = F32(roi[0]), F32(roi[1])
    if out_len > 1:
        return start * F32(in_len - 1) + (x * (end - start) * F32(in_len - 1)) / F32(out_len - 1)
    return np.full(out_len, F32(0.5 * (float(start) + float(end)) * (in_len - 1)), F32)


def cubic_weights(s, a):
    """The four cubic convolution weights for fractional offsets `s` (float32), taps -1..2."""
    a = F32(a)
    one, two = F32(1), F32(2)
    return [((a * (s + one) - 5 * a) * (s + one) + 8 * a) * (s + one) - 4 * a,
            ((a + two) * s - (a + 3)) * s * s + one,
            ((a + two) * (one - s) - (a + 3)) * (one - s) * (one - s) + one,
            ((a * (two - s) - 5 * a) * (two - s) + 8 * a) * (two - s) - 4 * a]


def axis_taps(mode, coords, in_len, scale, nearest_mode, cubic_a, exclude_outside):
    """Source indices (list of intp arrays) and weights (list of float32 arrays, or None) per tap."""
    last = in_len - 1
    if mode == "nearest":
        index = NEAREST[nearest_mode](coords.astype(np.float64), scale < 1)
        return [np.clip(index, 0, last).astype(np.intp)], None
    if mode == "linear":
        c = np.clip(coords, F32(0), F32(last))
        lo = np.minimum(c.astype(np.intp), last)
        hi = np.minimum(lo + 1, last)
        w_lo = np.abs(c - hi.astype(F32))
        w_hi = np.abs(c - lo.astype(F32))
        same = lo == hi
        w_lo[same] = w_hi[same] = F32(0.5)
        return [lo, hi], [w_lo, w_hi]
    # cubic
    base = np.floor(coords)
    weights = cubic_weights((coords - base).astype(F32), cubic_a)
    base = base.astype(np.intp)
    raw = [base + k for k in (-1, 0, 1, 2)]
    if exclude_outside:
        weights = [np.where((r < 0) | (r > last), F32(0), w) for r, w in zip(raw, weights)]
        total = weights[0] + weights[1] + weights[2] + weights[3]
        weights = [w / total for w in weights]
    return [np.clip(r, 0, last) for r in raw], weights


def cubic_kernel(x, a):
    """Keys' cubic convolution kernel at distances `x`."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def antialias_taps(mode, coords, in_len, scale, cubic_a, exclude_outside):
    """Taps of the antialiased filters (opset 18): the kernel stretched by 1/scale when shrinking.

    The footprint grows to cover every input row within the stretched kernel; the rows
    are the footprint's nearest to the source coordinate (the left one on a tie) and the
    weights are normalised to sum to one, as onnx's reference implementation does.
    """
    shrink = min(float(scale), 1.0)
    x = coords.astype(np.float64)
    left = np.floor(x)
    ratio = np.where(x == left, 1.0, x - left)  # in (0, 1]: the row left of x leads
    # Offsets from floor(x) of the rows under the stretched kernel (radius 1 linear, 2 cubic).
    radius = 1 if mode == "linear" else 2
    first = int(np.floor(-radius / shrink)) + 1
    offsets = np.arange(first, 2 - first)
    distance = (offsets[None, :] - ratio[:, None]) * shrink
    if mode == "linear":
        weights = np.clip(1 - np.abs(distance), 0, 1)
    else:
        weights = cubic_kernel(distance, cubic_a)
    weights = weights / weights.sum(axis=1, keepdims=True)
    n = len(offsets)
    # The n rows nearest to x, ties to the smaller: the window starts this far from floor(x).
    half = -(-n // 2)
    shifted = x + half
    base = np.floor(shifted)
    fraction = shifted - base
    if n % 2 == 0:
        start = base + np.where(fraction == 0, -(n // 2), 1 - n // 2)
    else:
        start = base + np.where(fraction <= 0.5, -((n - 1) // 2), 1 - (n - 1) // 2)
    rows = (start - half).astype(np.intp)[:, None] + np.arange(n)[None, :]
    if exclude_outside:
        weights = np.where((rows < 0) | (rows >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    rows = np.clip(rows, 0, in_len - 1)
    return [rows[:, t] for t in range(n)], [weights[:, t].astype(F32) for t in range(n)]


class ResizeCore(Kernel):
    """The shared plan and kernel; subclasses say how attributes and inputs give the geometry."""

    mode = "nearest"
    coordinate_transformation_mode = "asymmetric"
    nearest_mode = "simple"
    cubic_coeff_a = -0.75
    exclude_outside = 0
    extrapolation_value = 0.0
    modes = ("nearest", "linear")
    coordinate_modes = COORDINATE_MODES

    def decode(self):
        if self.mode not in self.modes:
            raise ModelError(f"mode {self.mode!r} is not one of {self.modes}")
        if self.coordinate_transformation_mode not in self.coordinate_modes:
            raise ModelError(f"coordinate_transformation_mode "
                             f"{self.coordinate_transformation_mode!r} is not one of "
                             f"{self.coordinate_modes}")
        if self.nearest_mode not in NEAREST:
            raise ModelError(f"nearest_mode {self.nearest_mode!r} is unknown")

    def geometry(self, x, *inputs):
        """(output shape, float32 scale per axis, roi (start, end) per axis or None)."""
        raise NotImplementedError

    def infer(self, x, *inputs):
        shape, _, _ = self.geometry(x, *inputs)
        return [TensorInfo(tuple(sane_shape(self.node, shape, x.dtype)), x.dtype)]

    def plan(self, in_shape, out_shape, dtype, scales, roi):
        rank = len(in_shape)
        crop = self.coordinate_transformation_mode == "tf_crop_and_resize"
        if dtype.kind == "f" and dtype.itemsize >= 4:
            self.compute = dtype
        elif self.mode == "nearest":
            self.compute = dtype
        else:
            self.compute = np.dtype(F32)
        self.passes, self.extrapolated = [], []
        repeats = {}
        for axis in range(rank):
            in_len, out_len, scale = in_shape[axis], out_shape[axis], scales[axis]
            # onnxruntime leaves an axis alone when its scale is exactly 1.
            if scale == F32(1) and in_len == out_len:
                continue
            if out_len and not in_len:
                raise ModelError(f"cannot resize an empty axis {axis} to {out_len}")
            if not out_len:
                continue  # an empty output: nothing to plan
            coords = source_coordinates(self.coordinate_transformation_mode, out_len, in_len,
                                        scale, roi[axis] if roi else None)
            if crop:
                outside = np.flatnonzero((coords < 0) | (coords > F32(in_len - 1)))
                if outside.size:
                    self.extrapolated.append((axis, outside))
            if getattr(self, "antialias", 0) and self.mode != "nearest":
                indices, weights = antialias_taps(self.mode, coords, in_len, scale,
                                                  self.cubic_coeff_a, self.exclude_outside)
            else:
                indices, weights = axis_taps(self.mode, coords, in_len, scale, self.nearest_mode,
                                             self.cubic_coeff_a, self.exclude_outside)
            if weights is None and out_len % in_len == 0 and np.array_equal(
                    indices[0], np.arange(out_len) // (out_len // in_len)):
                repeats[axis] = out_len // in_len
            self.passes.append((axis, indices, weights, out_len, in_len))
        # Shrinking axes first: every later pass then works on less data.
        self.passes.sort(key=lambda p: p[3] / max(p[4], 1))
        self.scratch_sizes = []
        if not np.prod(out_shape):
            self.kind = "empty"
        elif not self.passes:
            self.kind = "copy"
        elif self.mode == "nearest" and self.plan_nearest(in_shape, out_shape, dtype, repeats):
            pass
        else:
            self.kind = "separable"
            self.plan_separable(in_shape, dtype)

    def plan_separable(self, in_shape, dtype):
        """One step per resized axis, writing scratch buffer 0 or 1 (None: the output).

        Each step sees its input as (outer, rows, inner) around the resized axis. It is a
        gather of rows, or, when the taps repeat with a short period, strided runs:
        "interleave" (several phases with weights) scales the input once per distinct
        weight and then writes each phase with a single add; "rows" (one phase, or
        nearest) computes each run in place. Gathers and interleaves go block by block
        over the outer rows so that their temporaries stay in cache.
        """
        rank = len(in_shape)
        shape = list(in_shape)
        direct = self.compute == dtype
        # Scratch: 0 and 1 for intermediate results, 2 for a weighted tap, 3 for the input
        # converted to the compute type, 4 for the scaled copies of an interleave step.
        self.steps, sizes = [], [0, 0, 0, 0 if direct else int(np.prod(in_shape)), 0]
        for i, (axis, indices, weights, out_len, in_len) in enumerate(self.passes):
            source_size = int(np.prod(shape))
            shape[axis] = out_len
            n = int(np.prod(shape))
            target = None if (i == len(self.passes) - 1 and direct) else i % 2
            if target is not None:
                sizes[target] = max(sizes[target], n)
            lead = (slice(None),) * axis
            # Integer outputs truncate, so there every row keeps its own float32 weights.
            tolerance = 1e-6 if dtype.kind == "f" else 0.0
            phases = periodic_taps(indices, weights, in_len, out_len, tolerance)
            inner = int(np.prod(shape[axis + 1:]))
            outer = source_size // max(in_len * inner, 1)
            itemsize = self.compute.itemsize
            if phases is None:
                block = rows_per_block(outer, out_len * inner * itemsize)
                if weights is not None:
                    weights = [w.astype(self.compute).reshape(-1, 1) for w in weights]
                    sizes[2] = max(sizes[2], block * out_len * inner)
                layout = (outer, in_len, out_len, inner, block)
                self.steps.append(("gather", axis, (indices, weights, layout), tuple(shape), target))
                continue
            plan, edges = phases
            edge = None
            if edges.size:
                edge = (lead + (edges,), [rows[edges] for rows in indices],
                        None if weights is None else [self.weights_for(w[edges], axis, rank)
                                                      for w in weights])
            if weights is not None and len(plan) > 1:
                block = rows_per_block(outer, in_len * inner * itemsize)  # bounds the scaled copies
                scales = sorted({w for _, _, ws in plan for w in ws if w not in (0.0, 1.0)})
                runs = [((slice(None), dst), [(scales.index(w) if w != 1.0 else -1, (slice(None), src))
                                              for src, w in zip(sources, ws) if w != 0.0])
                        for dst, sources, ws in plan]
                if any(len(terms) > 2 for _, terms in runs):
                    sizes[2] = max(sizes[2], block * out_len * inner)
                sizes[4] = max(sizes[4], len(scales) * block * in_len * inner)
                scales = [self.compute.type(w) for w in scales]
                layout = (outer, in_len, out_len, inner, block)
                self.steps.append(("interleave", axis, (scales, runs, edge, layout), tuple(shape),
                                   target))
            else:
                runs = [(lead + (dst,), [lead + (src,) for src in sources],
                         None if ws is None else [self.compute.type(w) for w in ws])
                        for dst, sources, ws in plan]
                if weights is not None and len(weights) > 1:
                    sizes[2] = max(sizes[2], n)
                self.steps.append(("rows", axis, (runs, edge), tuple(shape), target))
        self.scratch_sizes = sizes

    def weights_for(self, w, axis, rank):
        """Per-row weights shaped to broadcast along `axis`, in the compute type."""
        return w.astype(self.compute).reshape((-1,) + (1,) * (rank - axis - 1))

    def plan_nearest(self, in_shape, out_shape, dtype, repeats):
        resized = sorted(p[0] for p in self.passes)
        if all(a in repeats for a in resized):
            self.kind = "repeat"
            self.plan_repeat(in_shape, dtype, repeats)
            return True
        first = resized[0]
        block = int(np.prod(out_shape[first:]))
        prefix = int(np.prod(in_shape[:first]))
        itemsize = np.dtype(self.compute).itemsize
        if block * 8 > max(prefix * block * itemsize // 8, 1 << 18):
            return False  # the table would be too large next to the output: go axis by axis
        maps = {p[0]: p[1][0] for p in self.passes}
        flat = np.zeros((), dtype=np.intp)
        stride = 1
        for axis in range(len(in_shape) - 1, first - 1, -1):
            rows = maps.get(axis, np.arange(in_shape[axis], dtype=np.intp))
            shape = [1] * (len(in_shape) - first)
            shape[axis - first] = -1
            flat = flat + rows.reshape(shape) * stride
            stride *= in_shape[axis]
        self.kind = "flat"
        self.flat = (flat.reshape(-1), (prefix, int(np.prod(in_shape[first:]))), (prefix, block))
        return True

    def plan_repeat(self, in_shape, dtype, repeats):
        """Each input row repeats k times: the output seen as (..., d, k, ...) is a broadcast copy.

        When the last axis repeats k times and k elements fit a machine word, every output
        word is one input element times 0x0101.. (k lanes): one multiply per input element
        instead of k narrow copies.
        """
        target = [v for a, d in enumerate(in_shape) for v in ((d, repeats[a]) if a in repeats else (d,))]
        source = [v for a, d in enumerate(in_shape) for v in ((d, 1) if a in repeats else (d,))]
        last = len(in_shape) - 1
        k = repeats.get(last, 1)
        self.lanes = None
        if k > 1 and dtype.kind in "biufc" and dtype.itemsize * k in (2, 4, 8):
            bits = 8 * dtype.itemsize
            word = np.dtype(f"u{dtype.itemsize * k}")
            self.lanes = (np.dtype(f"u{dtype.itemsize}"), word,
                          word.type(sum(1 << (bits * j) for j in range(k))))
            target, source = target[:-1], source[:-1]
        self.repeat = (tuple(target), tuple(source))

    def prepare(self, x, *inputs):
        shape, scales, roi = self.geometry(x, *inputs)
        self.plan(x.shape, sane_shape(self.node, shape, x.dtype), x.dtype, scales, roi)
        return [((n,), self.compute) for n in self.scratch_sizes]

    def run(self, x, *inputs, outs, scratch):
        out = outs[0]
        if self.kind == "empty":
            return
        if self.kind == "copy":
            np.copyto(out, x)
        elif self.kind == "repeat":
            target, source = self.repeat
            if self.lanes is None:
                np.copyto(out.reshape(target), x.reshape(source))
            else:
                unit, word, replicate = self.lanes
                words = out.reshape(target[:-1] + (-1,)).view(word)
                np.multiply(x.view(unit).reshape(source), replicate, out=words, dtype=word)
        elif self.kind == "flat":
            flat, source, target = self.flat
            np.take(x.reshape(source), flat, axis=1, out=out.reshape(target), mode="clip")
        else:
            self.separable(x, out, scratch)
        for axis, positions in self.extrapolated:
            out[(slice(None),) * axis + (positions,)] = self.extrapolation_value

    def separable(self, x, out, scratch):
        if not scratch:  # folded at PREPARE: no arena yet
            scratch = [np.empty(n, self.compute) for n in self.scratch_sizes]
        current = x
        if x.dtype != self.compute:
            current = scratch[3].reshape(x.shape)
            np.copyto(current, x, casting="unsafe")
        for kind, axis, taps, shape, target in self.steps:
            n = int(np.prod(shape))
            dst = out if target is None else scratch[target][:n].reshape(shape)
            if kind == "gather":
                gather(current, dst, *taps, scratch[2])
                current = dst
                continue
            if kind == "rows":
                runs, edge = taps
                for dst_index, src_indices, ws in runs:
                    part = dst[dst_index]
                    if ws is None:
                        np.copyto(part, current[src_indices[0]])
                    else:
                        tmp = scratch[2][:part.size].reshape(part.shape)
                        weighted_sum(current, src_indices, ws, part, tmp)
            else:
                scales, runs, edge, layout = taps
                interleave(current, dst, scales, runs, layout, scratch[4], scratch[2])
            if edge is not None:
                dst_index, rows, weights = edge
                dst[dst_index] = weighted_rows(current, axis, rows, weights)
            current = dst
        if current is not out:
            if out.dtype.kind in "iu":  # onnxruntime truncates; keep overshoots in range
                np.clip(current, *_limits(out.dtype), out=current)
            np.copyto(out, current, casting="unsafe")


def gather(source, dst, indices, weights, layout, spare):
    """dst = sum over taps of source rows `indices[t]` times `weights[t]`, block by block."""
    outer, in_len, out_len, inner, block = layout
    source = source.reshape(outer, in_len, inner)
    dst = dst.reshape(outer, out_len, inner)
    for start in range(0, outer, block):
        rows = source[start:start + block]
        target = dst[start:start + block]
        np.take(rows, indices[0], axis=1, out=target, mode="clip")
        if weights is None:
            continue
        np.multiply(target, weights[0], out=target)
        tmp = spare[:target.size].reshape(target.shape)
        for taps, w in zip(indices[1:], weights[1:]):
            np.take(rows, taps, axis=1, out=tmp, mode="clip")
            np.multiply(tmp, w, out=tmp)
            np.add(target, tmp, out=target)


def weighted_sum(source, src_indices, ws, total, tmp):
    """total = sum over taps of source[src_indices[t]] * ws[t]; zero weights skipped."""
    np.multiply(source[src_indices[0]], ws[0], out=total)
    for src, w in zip(src_indices[1:], ws[1:]):
        if w:
            np.multiply(source[src], w, out=tmp)
            np.add(total, tmp, out=total)


def rows_per_block(outer, row_bytes):
    return max(1, min(outer, BLOCK_BYTES // max(row_bytes, 1)))


def interleave(source, dst, scales, runs, layout, copies, spare):
    """Periodic taps along an axis: scale the input once per weight, then one add per phase.

    Works block by block over the axes before the resized one, so the scaled copies of
    a block are still in cache when the phases read them.
    """
    outer, in_len, out_len, inner, block = layout
    source = source.reshape(outer, in_len, inner)
    dst = dst.reshape(outer, out_len, inner)
    for start in range(0, outer, block):
        rows = source[start:start + block]
        target = dst[start:start + block]
        size = rows.size
        scaled = [rows] * (len(scales) + 1)  # index -1: the input itself, weight 1
        for k, w in enumerate(scales):
            scaled[k] = copies[k * size:(k + 1) * size].reshape(rows.shape)
            np.multiply(rows, w, out=scaled[k])
        for dst_index, terms in runs:
            add_terms(target[dst_index], [scaled[k][src] for k, src in terms], spare)


def add_terms(part, terms, spare):
    """part = sum of terms, writing `part` (a strided view) only once."""
    if len(terms) == 1:
        np.copyto(part, terms[0])
    elif len(terms) == 2:
        np.add(terms[0], terms[1], out=part)
    else:
        total = spare[:part.size].reshape(part.shape)
        np.add(terms[0], terms[1], out=total)
        for term in terms[2:-1]:
            np.add(total, term, out=total)
        np.add(total, terms[-1], out=part)


def weighted_rows(source, axis, indices, weights):
    """The few output rows that break an axis' periodic pattern (near the edges)."""
    if weights is None:
        return np.take(source, indices[0], axis=axis)
    total = np.take(source, indices[0], axis=axis) * weights[0]
    for rows, w in zip(indices[1:], weights[1:]):
        total += np.take(source, rows, axis=axis) * w
    return total


MAX_PHASES = 8
BLOCK_BYTES = 1 << 18  # the output of one block of rows, and each temporary of it


def periodic_taps(indices, weights, in_len, out_len, tolerance):
    """Split an axis into strided runs when its taps repeat with a short period.

    With out_len/in_len = p/q in lowest terms, output rows r, r+p, r+2p, ... read input
    rows advancing by q with the same weights, except near the edges where clamping
    breaks the pattern. Each phase r then becomes a strided slice of the input times a
    constant, which numpy does far faster than a gather along the last axis. Returns
    ([(output slice, [input slice per tap], [weight per tap] or None)], edge rows) or None.
    """
    g = math.gcd(in_len, out_len)
    p, q = out_len // g, in_len // g
    if p > MAX_PHASES or g < 4:
        return None
    j = np.arange(g)
    mid = g // 2
    runs, edges = [], []
    for r in range(p):
        rows = r + p * j
        good = np.ones(g, dtype=bool)
        starts = []
        for taps in indices:
            start = int(taps[rows[mid]]) - q * mid
            good &= taps[rows] == start + q * j
            starts.append(start)
        ws = None
        if weights is not None:
            ws = [float(w[rows[mid]]) for w in weights]
            for w, value in zip(weights, ws):
                # float32 coordinates wobble in the last bits from row to row
                good &= np.abs(w[rows] - value) <= tolerance
        bad = np.flatnonzero(~good)
        lo = int(bad[bad < mid].max()) + 1 if (bad < mid).any() else 0
        hi = int(bad[bad > mid].min()) if (bad > mid).any() else g
        runs.append((slice(r + p * lo, r + p * (hi - 1) + 1, p),
                     [slice(s + q * lo, s + q * (hi - 1) + 1, q) for s in starts], ws))
        edges.extend(rows[:lo])
        edges.extend(rows[hi:])
    if len(edges) > max(4 * p, out_len // 8):
        return None  # no real period (e.g. align_corners): a gather is cheaper
    return runs, np.array(sorted(edges), dtype=np.intp)


def _limits(dtype):
    info = np.iinfo(dtype)
    return info.min, info.max


def float_list(node, info, what):
    value = known_value(node, info, what)
    if value is None:
        return None
    return [F32(v) for v in np.asarray(value, dtype=F32).reshape(-1)]


def output_from_scales(node, in_shape, scales):
    if len(scales) != len(in_shape):
        raise ModelError(f"{len(scales)} scales for rank {len(in_shape)}")
    if any(not 0 < s < np.inf for s in scales):
        raise ModelError(f"scales {[float(s) for s in scales]} must be positive and finite")
    # onnxruntime: floor(float(scale) * float(dim)), in float32.
    return [int(F32(s) * F32(d)) for s, d in zip(scales, in_shape)]


@register("Upsample", since=7)
class Upsample(ResizeCore):
    """Opset 7: scales are an attribute. Asymmetric coordinates, onnxruntime's simple nearest."""

    attributes = {"mode": "nearest", "scales": None}

    def decode(self):
        if self.mode == "bilinear":  # the spelling some exporters used
            self.mode = "linear"
        super().decode()

    def scale_values(self, scales_input):
        if self.scales is None:
            raise ModelError("attribute 'scales' is required")
        return [F32(s) for s in self.scales]

    def geometry(self, x, scales_input=None):
        scales = self.scale_values(scales_input)
        return output_from_scales(self.node, x.shape, scales), scales, None


@register("Upsample", since=9)
class Upsample9(Upsample):
    attributes = {"mode": "nearest"}

    def scale_values(self, scales_input):
        if scales_input is None:
            raise ModelError("input 'scales' is required")
        return float_list(self.node, scales_input, "scales")


@register("Resize", since=10)
class Resize(Upsample9):
    pass


@register("Resize", since=11)
class Resize11(ResizeCore):
    attributes = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                  "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                  "exclude_outside": 0, "extrapolation_value": 0.0}
    modes = ("nearest", "linear", "cubic")
    coordinate_modes = COORDINATE_MODES + ("tf_half_pixel_for_nn",)
    axes = None
    keep_aspect_ratio_policy = "stretch"

    def geometry(self, x, roi=None, scales=None, sizes=None):
        rank = len(x.shape)
        axes = list(range(rank)) if self.axes is None else normalize_axes(self.node, self.axes, rank)
        scale_values = float_list(self.node, scales, "scales") if scales is not None else None
        size_values = None
        if sizes is not None:
            size_values = [int(v) for v in np.asarray(known_value(self.node, sizes, "sizes")).reshape(-1)]
        if scale_values and size_values:
            raise ModelError("give either scales or sizes, not both")
        shape, per_axis = list(x.shape), [F32(1)] * rank
        if scale_values:
            if len(scale_values) != len(axes):
                raise ModelError(f"{len(scale_values)} scales for {len(axes)} axes")
            picked = [x.shape[a] for a in axes]
            for a, d, s in zip(axes, output_from_scales(self.node, picked, scale_values), scale_values):
                shape[a], per_axis[a] = d, s
        elif size_values:
            if len(size_values) != len(axes) or any(s < 0 for s in size_values):
                raise ModelError(f"sizes {size_values} do not fit axes {axes}")
            ratios = [F32(s) / F32(x.shape[a]) if x.shape[a] else F32(1)
                      for a, s in zip(axes, size_values)]
            if self.keep_aspect_ratio_policy == "stretch":
                for a, s, r in zip(axes, size_values, ratios):
                    shape[a], per_axis[a] = s, r
            else:
                r = min(ratios) if self.keep_aspect_ratio_policy == "not_larger" else max(ratios)
                for a in axes:
                    # round half up, as the spec's round_int
                    shape[a], per_axis[a] = int(np.floor(r * F32(x.shape[a]) + F32(0.5))), r
        else:
            raise ModelError("one of scales and sizes must be given")
        box = None
        if self.coordinate_transformation_mode == "tf_crop_and_resize":
            values = float_list(self.node, roi, "roi") if roi is not None else None
            if not values or len(values) != 2 * len(axes):
                raise ModelError(f"tf_crop_and_resize needs a roi of "
                                 f"{2 * len(axes)} values")
            box = [(F32(0), F32(1))] * rank
            for i, a in enumerate(axes):
                box[a] = (values[i], values[len(axes) + i])
        return shape, per_axis, box


@register("Resize", since=13)
class Resize13(Resize11):
    coordinate_modes = COORDINATE_MODES


@register("Resize", since=18)
class Resize18(Resize13):
    attributes = dict(Resize13.attributes, antialias=0, axes=None, keep_aspect_ratio_policy="stretch")

    def decode(self):
        if self.keep_aspect_ratio_policy not in ("stretch", "not_larger", "not_smaller"):
            raise ModelError(f"keep_aspect_ratio_policy "
                             f"{self.keep_aspect_ratio_policy!r} is unknown")
        super().decode()


@register("Resize", since=19)
class Resize19(Resize18):
    coordinate_modes = COORDINATE_MODES + ("half_pixel_symmetric",)
