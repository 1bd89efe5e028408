"""Tensor-manipulation ops: moving, selecting, converting and padding elements.

Transpose, Concat, Split, Slice, Gather, GatherElements, GatherND, Cast,
CastLike, Pad, Tile, Trilu, DepthToSpace, SpaceToDepth, ScatterND,
ScatterElements (and its deprecated name Scatter).

Everything that depends only on shapes and constant inputs (slices, pad plans,
masks, validated constant indices) is worked out once by `infer`, which returns
it with the output shapes (`Inferred`); the compiler keeps it on the kernel
before prepare, and before a node is folded. Kernels write into `outs[0]`;
indices fed at run time are checked then, and an out-of-range index raises
`ExecutionError` naming the node.
"""

import numpy as np

from ..errors import ExecutionError, ModelError
from . import exotic_types
from .bands import Band
from .registry import REQUIRED, Inferred, Kernel, TensorInfo, register
from .shape import int_list, known_value, normalize_axes, normalize_axis, onnx_dtype, sane_shape


def check_indices(node, indices, dim, what="indices"):
    """Raise ExecutionError unless every index lies in [-dim, dim)."""
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        bad = indices[(indices < -dim) | (indices >= dim)].reshape(-1)[0]
        raise ExecutionError(f"{what} value {int(bad)} is out of range "
                             f"for a dimension of size {dim}")


def nonnegative_indices(indices, dim):
    """`indices` with negative entries counted from the end (a new array only if needed)."""
    if indices.size and indices.min() < 0:
        return np.where(indices < 0, indices + dim, indices)
    return indices


def constant_indices(node, info, dim, what="indices"):
    """Validate indices known at PREPARE (ModelError) and return them as non-negative intp."""
    indices = np.asarray(info.value)
    if indices.dtype.kind not in "iu":
        raise ModelError(f"{what} must be integers, not {indices.dtype}")
    try:
        check_indices(node, indices, dim, what)
    except ExecutionError as e:
        raise ModelError(str(e)) from None
    return nonnegative_indices(indices, dim).astype(np.intp)


@register("Transpose", since=1)
class Transpose(Kernel):
    attributes = {"perm": None}

    def infer(self, x):
        rank = len(x.shape)
        if self.perm is None:
            axes = list(range(rank))[::-1]
        else:
            axes = normalize_axes(self.node, self.perm, rank, "perm")
            if len(axes) != rank:
                raise ModelError(f"perm {self.perm} does not permute {rank} axes")
        return Inferred([TensorInfo(tuple(x.shape[a] for a in axes), x.dtype)], axes=axes)

    def run(self, x, outs, scratch):
        np.copyto(outs[0], x.transpose(self.axes))


@register("Concat", since=4)
class Concat(Kernel):
    attributes = {"axis": REQUIRED}

    def infer(self, *inputs):
        if not inputs or any(i is None for i in inputs):
            raise ModelError("needs at least one input and no omitted ones")
        first = inputs[0]
        rank = len(first.shape)
        axis_ = normalize_axis(self.node, self.axis, rank)
        total = 0
        for info in inputs:
            if info.dtype != first.dtype or len(info.shape) != rank or any(
                    a != b for i, (a, b) in enumerate(zip(info.shape, first.shape)) if i != axis_):
                raise ModelError(f"cannot concatenate "
                                 f"{[(list(i.shape), str(i.dtype)) for i in inputs]} on axis {self.axis}")
            total += info.shape[axis_]
        shape = list(first.shape)
        shape[axis_] = total
        return Inferred([TensorInfo(tuple(shape), first.dtype)], axis_=axis_, rank_=rank)

    def run(self, *inputs, outs, scratch):
        np.concatenate(inputs, axis=self.axis_, out=outs[0])

    def band_granule(self):
        return 1 if self.rank_ == 4 and self.axis_ == 1 else 0  # channels of NCHW tensors

    def band(self, r0, r1, scratch_limit, plans=None):
        def run(args, out, scratch):
            np.concatenate(args, axis=1, out=out)
        return Band((r0, r1), ((r0, r1),) * len(self.node.inputs), run)


@register("Split", since=2)
class Split(Kernel):
    """Before opset 13 the split sizes are an attribute."""

    attributes = {"axis": 0, "split": None}

    def sizes(self, dim, split_input):
        return self.split

    def infer(self, x, split_input=None):
        axis = normalize_axis(self.node, self.axis, len(x.shape))
        dim = x.shape[axis]
        n = len(self.node.outputs)
        sizes = self.sizes(dim, split_input)
        if sizes is None:
            if dim % n:
                raise ModelError(f"dimension {dim} does not split evenly "
                                 f"into {n} outputs")
            sizes = [dim // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ModelError(f"split {sizes} does not cut dimension {dim} "
                             f"into {n} outputs")
        parts = []
        infos = []
        start = 0
        for s in sizes:
            index = [slice(None)] * len(x.shape)
            index[axis] = slice(start, start + s)
            parts.append(tuple(index))
            shape = list(x.shape)
            shape[axis] = s
            infos.append(TensorInfo(tuple(shape), x.dtype))
            start += s
        return Inferred(infos, parts=parts)

    def run(self, x, *rest, outs, scratch):
        for out, part in zip(outs, self.parts):
            if out is not None:  # an output the graph leaves unnamed
                np.copyto(out, x[part])


@register("Split", since=13)
class Split13(Split):
    attributes = {"axis": 0}

    def sizes(self, dim, split_input):
        return int_list(self.node, split_input, "split")


@register("Split", since=18)
class Split18(Split):
    attributes = {"axis": 0, "num_outputs": None}

    def sizes(self, dim, split_input):
        sizes = int_list(self.node, split_input, "split")
        if sizes is not None:
            if self.num_outputs is not None:
                raise ModelError("give either input 'split' or attribute "
                                 "'num_outputs', not both")
            return sizes
        if self.num_outputs is None:
            return None
        n = self.num_outputs
        if n != len(self.node.outputs) or n < 1:
            raise ModelError(f"num_outputs {n} but {len(self.node.outputs)} outputs")
        # Chunks of ceil(dim / n); the last one takes what is left.
        chunk = -(-dim // n)
        return [chunk] * (n - 1) + [dim - chunk * (n - 1)]


def slice_index(node, shape, starts, ends, axes, steps):
    """The numpy index and output shape of an ONNX Slice, with the spec's clamping."""
    rank = len(shape)
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ModelError(f"starts, ends, axes and steps differ in length "
                         f"({len(starts)}, {len(ends)}, {len(axes)}, {len(steps)})")
    axes = normalize_axes(node, axes, rank)
    index = [slice(None)] * rank
    out_shape = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis]
        if step == 0:
            raise ModelError(f"step 0 on axis {axis}")
        if start < 0:
            start += dim
        if end < 0:
            end += dim
        if step > 0:
            start = min(max(start, 0), dim)
            end = min(max(end, 0), dim)
        else:
            # -1 stands for "before the first element", which numpy spells None.
            start = min(max(start, 0), dim - 1)
            end = min(max(end, -1), dim - 1)
        count = len(range(start, end, step))
        index[axis] = slice(start, end if end >= 0 else None, step) if count else slice(0, 0)
        out_shape[axis] = count
    return tuple(index), tuple(out_shape)


@register("Slice", since=1)
class Slice(Kernel):
    attributes = {"starts": REQUIRED, "ends": REQUIRED, "axes": None}

    def bounds(self, starts, ends, axes, steps):
        return self.starts, self.ends, self.axes, None

    def infer(self, x, starts=None, ends=None, axes=None, steps=None):
        index, shape = slice_index(self.node, x.shape, *self.bounds(starts, ends, axes, steps))
        return Inferred([TensorInfo(shape, x.dtype)], index=index)

    def run(self, x, *rest, outs, scratch):
        np.copyto(outs[0], x[self.index])


@register("Slice", since=10)
class Slice10(Slice):
    attributes = {}

    def bounds(self, starts, ends, axes, steps):
        if starts is None or ends is None:
            raise ModelError("inputs 'starts' and 'ends' are required")
        return (int_list(self.node, starts, "starts"), int_list(self.node, ends, "ends"),
                int_list(self.node, axes, "axes"), int_list(self.node, steps, "steps"))


@register("Gather", since=1)
class Gather(Kernel):
    attributes = {"axis": 0}

    def infer(self, x, indices):
        axis_ = normalize_axis(self.node, self.axis, len(x.shape))
        dim = x.shape[axis_]
        constant = None
        if indices.value is not None:
            constant = constant_indices(self.node, indices, dim)
        shape = x.shape[:axis_] + indices.shape + x.shape[axis_ + 1:]
        return Inferred([TensorInfo(shape, x.dtype)], axis_=axis_, dim=dim, constant=constant)

    def prepare(self, x, indices):
        if self.constant is not None:
            self.pack({1}, self.constant)
        return []

    def run(self, x, indices, outs, scratch):
        if indices is None:
            indices = self.constant
        else:
            check_indices(self.node, indices, self.dim)
        # The indices are checked, so 'wrap' only maps negatives; it also lets numpy skip
        # the buffered copy that out= costs in 'raise' mode.
        np.take(x, indices, axis=self.axis_, out=outs[0], mode="wrap")


@register("GatherElements", since=11)
class GatherElements(Kernel):
    attributes = {"axis": 0}

    def infer(self, x, indices):
        rank = len(x.shape)
        axis_ = normalize_axis(self.node, self.axis, rank)
        if len(indices.shape) != rank or any(
                i > d for a, (i, d) in enumerate(zip(indices.shape, x.shape)) if a != axis_):
            raise ModelError(f"indices of shape {list(indices.shape)} do not fit "
                             f"data of shape {list(x.shape)}")
        dim = x.shape[axis_]
        # Flat positions in x: each index times the axis stride plus where its row starts.
        strides = [int(np.prod(x.shape[a + 1:])) for a in range(rank)]
        stride = strides[axis_]
        grid = np.indices(indices.shape, dtype=np.int64, sparse=True)
        base = sum((g * strides[a] for a, g in enumerate(grid) if a != axis_), np.zeros((), np.int64))
        index_shape = indices.shape
        return Inferred([TensorInfo(indices.shape, x.dtype)], axis_=axis_, dim=dim, stride=stride, base=base,
                        index_shape=index_shape)

    def prepare(self, x, indices):
        return [(self.index_shape, np.int64)]

    def run(self, x, indices, outs, scratch):
        check_indices(self.node, indices, self.dim)
        flat = scratch[0] if scratch else np.empty(self.index_shape, np.int64)
        np.multiply(indices, self.stride, out=flat, casting="unsafe")
        np.add(flat, self.base, out=flat)
        if indices.size and indices.min() < 0:
            np.add(flat, self.dim * self.stride, out=flat, where=indices < 0)
        np.take(x.reshape(-1), flat, out=outs[0], mode="clip")


@register("GatherND", since=11)
class GatherND(Kernel):
    """Opset 12 adds batch_dims: the first b axes of data and indices are paired, not indexed."""

    attributes = {"batch_dims": 0}

    def infer(self, x, indices):
        b = self.batch_dims
        k = indices.shape[-1] if indices.shape else 0
        if (not indices.shape or b < 0 or b >= len(indices.shape) or k < 1 or b + k > len(x.shape)
                or tuple(x.shape[:b]) != tuple(indices.shape[:b])):
            raise ModelError(f"indices {list(indices.shape)} do not fit data "
                             f"{list(x.shape)} with batch_dims {b}")
        batch = int(np.prod(x.shape[:b]))
        return Inferred([TensorInfo(tuple(indices.shape[:-1]) + tuple(x.shape[b + k:]), x.dtype)],
                        dims=x.shape[b:b + k], data_view=(batch,) + tuple(x.shape[b:]),
                        index_view=(batch, -1, k), batch=np.arange(batch).reshape(-1, 1))

    def run(self, x, indices, outs, scratch):
        rows = indices.reshape(self.index_view)
        index = [self.batch]
        for axis, dim in enumerate(self.dims):
            column = rows[..., axis]
            check_indices(self.node, column, dim)
            index.append(nonnegative_indices(column, dim))
        picked = x.reshape(self.data_view)[tuple(index)]
        np.copyto(outs[0], picked.reshape(outs[0].shape))


def cast_into(out, x):
    """Convert `x` into `out`'s dtype: C semantics (truncation toward zero, nonzero -> True)."""
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(out, x, casting="unsafe")


def check_cast(node, source, target):
    if (source.kind in "OUS") != (target.kind in "OUS"):
        raise ModelError(f"casts between strings and numbers are unsupported "
                         f"({source} to {target})")


@register("Cast", since=6)
class Cast(Kernel):
    attributes = {"to": REQUIRED, "saturate": 1, "round_mode": "up"}  # saturate: 19, round_mode: 24

    def decode(self):
        self.dtype = exotic_types.numpy_dtype(self.to) or onnx_dtype(self.node, self.to)
        # float8 with saturation and e8m0 need the spec's rounding; the rest is a numpy cast.
        self.convert = exotic_types.needs_conversion(self.dtype, self.saturate)

    def infer(self, x):
        check_cast(self.node, x.dtype, self.dtype)
        if x.dtype == self.dtype:  # a cast to the type it has: the input itself, as an alias
            return Inferred([TensorInfo(x.shape, self.dtype, alias_of=0)], same=True)
        return Inferred([TensorInfo(x.shape, self.dtype)], same=False)

    def run(self, x, outs, scratch):
        if self.same:
            return x
        if self.convert:
            exotic_types.convert_into(outs[0], x, bool(self.saturate), self.round_mode)
        else:
            cast_into(outs[0], x)


@register("CastLike", since=15)
class CastLike(Cast):
    attributes = {"saturate": 1}

    def decode(self):
        self.round_mode = "up"

    def infer(self, x, like):
        check_cast(self.node, x.dtype, like.dtype)
        convert = exotic_types.needs_conversion(like.dtype, self.saturate)
        same = x.dtype == like.dtype
        return Inferred([TensorInfo(x.shape, like.dtype, alias_of=0 if same else None)], convert=convert, same=same)

    def run(self, x, like, outs, scratch):
        return super().run(x, outs, scratch)


def border_sources(mode, positions, n):
    """For border positions counted from the interior's first element, the interior index they copy."""
    if mode == "edge":
        return np.clip(positions, 0, n - 1)
    if mode == "wrap":
        return np.mod(positions, n)
    if n == 1:  # reflect
        return np.zeros_like(positions)
    period = 2 * (n - 1)
    k = np.mod(positions, period)
    return np.where(k < n, k, period - k)


@register("Pad", since=2)
class Pad(Kernel):
    """Opset 2: pads and value are attributes."""

    attributes = {"mode": "constant", "pads": REQUIRED, "value": 0.0}
    modes = ("constant", "reflect", "edge")

    def decode(self):
        if self.mode not in self.modes:
            raise ModelError(f"mode {self.mode!r} is not one of {self.modes}")

    def pads_and_fill(self, x, pads, constant_value, axes):
        return list(self.pads), self.value

    def infer(self, x, pads=None, constant_value=None, axes=None):
        rank = len(x.shape)
        pads, fill = self.pads_and_fill(x, pads, constant_value, axes)
        if len(pads) != 2 * rank:
            raise ModelError(f"{len(pads)} pads for rank {rank}")
        begins, ends = pads[:rank], pads[rank:]
        out_shape, crop, interior = [], [], []
        for dim, b, e in zip(x.shape, begins, ends):
            # Negative pads crop the input.
            kept = dim + min(b, 0) + min(e, 0)
            if kept < 0:
                raise ModelError(f"pads {pads} crop more than shape {list(x.shape)}")
            crop.append(slice(-min(b, 0), -min(b, 0) + kept))
            b, e = max(b, 0), max(e, 0)
            if self.mode != "constant" and kept == 0 and b + e:
                raise ModelError(f"cannot pad an empty axis in mode {self.mode!r}")
            interior.append(slice(b, b + kept))
            out_shape.append(b + kept + e)
        out_shape = sane_shape(self.node, out_shape, x.dtype)
        crop, interior = tuple(crop), tuple(interior)
        # The borders, axis by axis: along axis a, the axes before it are complete by then and
        # the axes after it are filled only inside the interior, so the regions tile the
        # output's complement of the interior. Non-constant modes copy from the interior,
        # by a slice when the sources run in order (one copy, no index array).
        borders = []
        for axis, (dim, inner) in enumerate(zip(out_shape, interior)):
            n = inner.stop - inner.start
            head = (slice(None),) * axis
            tail = interior[axis + 1:]
            for lo, hi in ((0, inner.start), (inner.stop, dim)):
                if hi <= lo:
                    continue
                source = None
                if self.mode != "constant":
                    source = inner.start + border_sources(
                        self.mode, np.arange(lo - inner.start, hi - inner.start), n)
                    source = head + (as_slice(source),) + tail
                borders.append((head + (slice(lo, hi),) + tail, source))
        return Inferred([TensorInfo(tuple(out_shape), x.dtype)], fill=fill, crop=crop, interior=interior,
                        borders=borders)

    def run(self, x, pads=None, constant_value=None, axes=None, *, outs, scratch):
        out = outs[0]
        out[self.interior] = x[self.crop]
        if self.mode == "constant":
            fill = self.fill
            if constant_value is not None and constant_value.size:
                fill = constant_value.reshape(-1)[0]
            for region, _ in self.borders:
                out[region] = fill
        else:
            for region, source in self.borders:
                out[region] = out[source]


def as_slice(indices):
    """`indices` as a slice when they run by -1, 0 (a broadcast row) or +1; else unchanged."""
    first, last = int(indices[0]), int(indices[-1])
    if (indices == first).all():
        return slice(first, first + 1)
    step = np.diff(indices)
    if (step == 1).all():
        return slice(first, last + 1)
    if (step == -1).all():
        return slice(first, last - 1 if last > 0 else None, -1)
    return indices.astype(np.intp)


@register("Pad", since=11)
class Pad11(Pad):
    """Opset 11: pads and constant_value are inputs; opset 18 adds axes, 19 adds wrap."""

    attributes = {"mode": "constant"}

    def pads_and_fill(self, x, pads, constant_value, axes):
        rank = len(x.shape)
        given = int_list(self.node, pads, "pads")
        if given is None:
            raise ModelError("input 'pads' is required")
        fill = 0
        if constant_value is not None and constant_value.value is not None and constant_value.size:
            fill = constant_value.value.reshape(-1)[0]
        axes = int_list(self.node, axes, "axes")
        if axes is None:
            return given, fill
        axes = normalize_axes(self.node, axes, rank)
        if len(given) != 2 * len(axes):
            raise ModelError(f"{len(given)} pads for {len(axes)} axes")
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[rank + a] = given[i], given[len(axes) + i]
        return full, fill


@register("Pad", since=19)
class Pad19(Pad11):
    modes = ("constant", "reflect", "edge", "wrap")


@register("Tile", since=6)
class Tile(Kernel):
    def infer(self, x, repeats):
        reps = int_list(self.node, repeats, "repeats")
        if len(reps) != len(x.shape) or any(r < 0 for r in reps):
            raise ModelError(f"repeats {reps} do not fit shape {list(x.shape)}")
        # The output seen as (r0, d0, r1, d1, ...) receives the input broadcast over the r axes.
        tiled = tuple(v for r, d in zip(reps, x.shape) for v in (r, d))
        spread = tuple(v for d in x.shape for v in (1, d))
        shape = sane_shape(self.node, [r * d for r, d in zip(reps, x.shape)], x.dtype)
        return Inferred([TensorInfo(shape, x.dtype)], tiled=tiled, spread=spread)

    def run(self, x, repeats, outs, scratch):
        np.copyto(outs[0].reshape(self.tiled), x.reshape(self.spread))


@register("Trilu", since=14)
class Trilu(Kernel):
    attributes = {"upper": 1}

    def infer(self, x, k=None):
        if len(x.shape) < 2:
            raise ModelError(f"input must have rank >= 2, got {list(x.shape)}")
        diagonal = 0
        if k is not None:
            value = known_value(self.node, k, "k")
            if value.size != 1:
                raise ModelError("k must be a scalar")
            diagonal = int(value.reshape(-1)[0])
        rows, cols = x.shape[-2:]
        offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
        keep = offset >= diagonal if self.upper else offset <= diagonal
        return Inferred([TensorInfo(x.shape, x.dtype)], keep=keep)

    def run(self, x, k=None, *, outs, scratch):
        out = outs[0]
        out.fill(0)
        np.copyto(out, x, where=self.keep)


@register("DepthToSpace", since=1)
class DepthToSpace(Kernel):
    attributes = {"blocksize": REQUIRED, "mode": "DCR"}

    def decode(self):
        if self.mode not in ("DCR", "CRD") or self.blocksize < 1:
            raise ModelError(f"mode {self.mode!r}, blocksize {self.blocksize}")

    def infer(self, x):
        if len(x.shape) != 4 or x.shape[1] % (self.blocksize ** 2):
            raise ModelError(f"input shape {list(x.shape)} does not fit "
                             f"blocksize {self.blocksize}")
        n, c, h, w = x.shape
        b = self.blocksize
        depth = c // (b * b)
        if self.mode == "DCR":
            split, order = (n, b, b, depth, h, w), (0, 3, 4, 1, 5, 2)
        else:
            split, order = (n, depth, b, b, h, w), (0, 1, 4, 2, 5, 3)
        blocks = (n, depth, h, b, w, b)
        return Inferred([TensorInfo((n, depth, h * b, w * b), x.dtype)], blocks=blocks, split=split,
                        order=order)

    def run(self, x, outs, scratch):
        np.copyto(outs[0].reshape(self.blocks), x.reshape(self.split).transpose(self.order))


@register("SpaceToDepth", since=1)
class SpaceToDepth(Kernel):
    """DepthToSpace's inverse. Opset 28 adds its `mode`: DCR (the default, and the only order
    before) puts the offset within the block before the channel, CRD the channel first."""
    attributes = {"blocksize": REQUIRED, "mode": "DCR"}

    def decode(self):
        if self.mode not in ("DCR", "CRD"):
            raise ModelError(f"mode {self.mode!r} is not DCR or CRD")

    def infer(self, x):
        b = self.blocksize
        if b < 1 or len(x.shape) != 4 or x.shape[2] % b or x.shape[3] % b:
            raise ModelError(f"input shape {list(x.shape)} does not fit "
                             f"blocksize {b}")
        n, c, h, w = x.shape
        split = (n, c, h // b, b, w // b, b)
        if self.mode == "DCR":
            blocks, order = (n, b, b, c, h // b, w // b), (0, 3, 5, 1, 2, 4)
        else:
            blocks, order = (n, c, b, b, h // b, w // b), (0, 1, 3, 5, 2, 4)
        return Inferred([TensorInfo((n, c * b * b, h // b, w // b), x.dtype)], split=split, blocks=blocks,
                        order=order)

    def run(self, x, outs, scratch):
        np.copyto(outs[0].reshape(self.blocks), x.reshape(self.split).transpose(self.order))


REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


class Scatter(Kernel):
    """Shared by ScatterND and ScatterElements: the reductions each opset allows."""

    attributes = {"reduction": "none"}

    def decode(self):
        allowed = ("none",) if self.opset < 16 else ("none", "add", "mul") if self.opset < 18 \
            else ("none", "add", "mul", "max", "min")
        if self.reduction not in allowed:
            raise ModelError(f"reduction {self.reduction!r} is not one of {allowed}")

    def scatter(self, out, index, updates):
        if self.reduction == "none":
            out[index] = updates
        else:
            REDUCTIONS[self.reduction].at(out, index, updates)


@register("ScatterND", since=11)
class ScatterND(Scatter):
    def infer(self, data, indices, updates):
        k = indices.shape[-1] if indices.shape else None
        if k is None or k > len(data.shape) or \
                tuple(updates.shape) != tuple(indices.shape[:-1]) + tuple(data.shape[k:]):
            raise ModelError(f"data {list(data.shape)}, indices "
                             f"{list(indices.shape)} and updates {list(updates.shape)} do not fit")
        dims = data.shape[:k]
        return Inferred([TensorInfo(data.shape, data.dtype)], dims=dims)

    def run(self, data, indices, updates, outs, scratch):
        out = outs[0]
        np.copyto(out, data)
        index = []
        for axis, dim in enumerate(self.dims):
            column = indices[..., axis]
            check_indices(self.node, column, dim)
            index.append(column)
        self.scatter(out, tuple(index), updates)


@register("Scatter", since=9)  # the deprecated name of ScatterElements
@register("ScatterElements", since=11)
class ScatterElements(Scatter):
    attributes = {"axis": 0, "reduction": "none"}

    def infer(self, data, indices, updates):
        rank = len(data.shape)
        axis_ = normalize_axis(self.node, self.axis, rank)
        if tuple(indices.shape) != tuple(updates.shape) or len(indices.shape) != rank or any(
                i > d for a, (i, d) in enumerate(zip(indices.shape, data.shape)) if a != axis_):
            raise ModelError(f"data {list(data.shape)}, indices "
                             f"{list(indices.shape)} and updates {list(updates.shape)} do not fit")
        dim = data.shape[axis_]
        # The position of every update along the axes other than `axis`.
        grid = [np.arange(n).reshape([-1 if a == b else 1 for b in range(rank)])
                for a, n in enumerate(indices.shape)]
        return Inferred([TensorInfo(data.shape, data.dtype)], axis_=axis_, dim=dim, grid=grid)

    def run(self, data, indices, updates, outs, scratch):
        out = outs[0]
        np.copyto(out, data)
        check_indices(self.node, indices, self.dim)
        index = list(self.grid)
        index[self.axis_] = indices
        self.scatter(out, tuple(index), updates)
