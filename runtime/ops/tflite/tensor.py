"""TFLite ops that move or reshape data: reshapes (views of their input), concatenation,
pack/unpack, splits, transpose, slices, gather, pad, depth/space rearrangements, tile, and the
ops that make or retype tensors (CAST, SHAPE, FILL).
"""

import math

import numpy as np

from .. import activation as act
from ..registry import Inferred, Kernel, TensorInfo
from ..shape import int_list, known_value, normalize_axes, sane_shape
from ..tensor import Concat
from .common import axis_of, fused_activation, tensor_type, tfl

# --------------------------------------------------------------------------- shapes and copies


def _resolve_shape(kernel, size, shape):
    shape = [int(d) for d in shape]
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        kernel.fail(f"new shape {shape} is not valid")
    if unknown:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            kernel.fail(f"cannot reshape {size} elements to {shape}")
        shape[unknown[0]] = size // known
    if math.prod(shape) != size:
        kernel.fail(f"cannot reshape {size} elements to {shape}")
    return tuple(shape)


class Alias(Kernel):
    """Output is the input's buffer under another shape: the executor makes the view."""

    def run(self, x, *rest, outs, scratch):
        return x.reshape(outs[0].shape)


@tfl("RESHAPE")
class TflReshape(Alias):
    attributes = {"new_shape": None}

    def infer(self, x, shape=None):
        if shape is not None and shape.shape != (0,) and not (
                len(shape.shape) == 1 and self.new_shape is not None and shape.value is None):
            target = known_value(self.node, shape, "shape").reshape(-1)
        elif self.new_shape is not None:
            target = self.new_shape
        elif shape is not None:
            target = []
        else:
            self.fail("no new shape given")
        return [TensorInfo(_resolve_shape(self, x.size, target), x.dtype, alias_of=0)]


@tfl("SQUEEZE")
class TflSqueeze(Alias):
    attributes = {"squeeze_dims": None}

    def infer(self, x):
        rank = len(x.shape)
        if self.squeeze_dims:
            dims = set(normalize_axes(self.node, self.squeeze_dims, rank))
            if any(x.shape[d] != 1 for d in dims):
                self.fail(f"cannot squeeze dims {sorted(dims)} of shape {x.shape}")
        else:
            dims = {i for i, d in enumerate(x.shape) if d == 1}
        return [TensorInfo(tuple(d for i, d in enumerate(x.shape) if i not in dims), x.dtype, alias_of=0)]


@tfl("EXPAND_DIMS")
class TflExpandDims(Alias):
    def infer(self, x, axis):
        (value,) = int_list(self.node, axis, "axis")
        rank = len(x.shape) + 1
        position = axis_of(self, value, rank)
        shape = list(x.shape)
        shape.insert(position, 1)
        return [TensorInfo(tuple(shape), x.dtype, alias_of=0)]


@tfl("CONCATENATION")
class Concatenation(Concat):
    """ONNX's Concat, with TFLite's fused activation."""

    attributes = {"axis": 0, "fused_activation_function": "NONE"}

    def decode(self):
        self.activation = fused_activation(self, self.fused_activation_function)

    def run(self, *inputs, outs, scratch):
        super().run(*inputs, outs=outs, scratch=scratch)
        act.apply_activation(outs[0], self.activation)


@tfl("PACK")
class Pack(Kernel):
    attributes = {"values_count": 0, "axis": 0}

    def infer(self, *inputs):
        first = inputs[0]
        if any(tuple(i.shape) != tuple(first.shape) for i in inputs):
            self.fail(f"input shapes {[i.shape for i in inputs]} differ")
        stack_axis = axis_of(self, self.axis, len(first.shape) + 1)
        shape = list(first.shape)
        shape.insert(stack_axis, len(inputs))
        return Inferred([TensorInfo(tuple(shape), first.dtype)], stack_axis=stack_axis)

    def run(self, *inputs, outs, scratch):
        np.stack(inputs, axis=self.stack_axis, out=outs[0])


@tfl("UNPACK")
class Unpack(Kernel):
    attributes = {"num": 0, "axis": 0}

    def infer(self, x):
        split_axis = axis_of(self, self.axis, len(x.shape))
        n = x.shape[split_axis]
        if self.num and self.num != n:
            self.fail(f"num {self.num} differs from the axis size {n}")
        shape = tuple(d for i, d in enumerate(x.shape) if i != split_axis)
        return Inferred([TensorInfo(shape, x.dtype) for _ in range(n)], split_axis=split_axis)

    def run(self, x, *, outs, scratch):
        for i, out in enumerate(outs):
            np.copyto(out, np.take(x, i, axis=self.split_axis))


class SplitBase(Kernel):
    def split(self, x, sizes, axis):
        split_axis = axis_of(self, axis, len(x.shape))
        infos = []
        for s in sizes:
            shape = list(x.shape)
            shape[split_axis] = s
            infos.append(TensorInfo(tuple(shape), x.dtype))
        return Inferred(infos, split_axis=split_axis, bounds=np.cumsum([0] + list(sizes)).tolist())

    def copy_parts(self, x, outs):
        lead = (slice(None),) * self.split_axis
        for i, out in enumerate(outs):
            np.copyto(out, x[lead + (slice(self.bounds[i], self.bounds[i + 1]),)])


@tfl("SPLIT")
class Split(SplitBase):
    attributes = {"num_splits": 1}

    def infer(self, axis, x):
        (value,) = int_list(self.node, axis, "axis")
        a = axis_of(self, value, len(x.shape))
        n = self.num_splits
        if n < 1 or x.shape[a] % n:
            self.fail(f"axis of size {x.shape[a]} does not split into {n} parts")
        return self.split(x, [x.shape[a] // n] * n, a)

    def run(self, axis, x, *, outs, scratch):
        self.copy_parts(x, outs)


@tfl("SPLIT_V")
class SplitV(SplitBase):
    attributes = {"num_splits": 1}

    def infer(self, x, size_splits, axis):
        (value,) = int_list(self.node, axis, "axis")
        a = axis_of(self, value, len(x.shape))
        sizes = int_list(self.node, size_splits, "size_splits")
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = x.shape[a] - (sum(sizes) + 1)
        if sum(sizes) != x.shape[a] or min(sizes) < 0:
            self.fail(f"size_splits {sizes} do not split an axis of {x.shape[a]}")
        return self.split(x, sizes, a)

    def run(self, x, size_splits, axis, *, outs, scratch):
        self.copy_parts(x, outs)


@tfl("TRANSPOSE")
class TflTranspose(Kernel):
    def infer(self, x, perm):
        axes = tuple(int_list(self.node, perm, "perm"))
        if sorted(axes) != list(range(len(x.shape))):
            self.fail(f"perm {list(axes)} is not a permutation of {len(x.shape)} axes")
        return Inferred([TensorInfo(tuple(x.shape[p] for p in axes), x.dtype)], perm=axes)

    def run(self, x, perm, *, outs, scratch):
        np.copyto(outs[0], x.transpose(self.perm))


@tfl("SLICE")
class TflSlice(Kernel):
    def infer(self, x, begin, size):
        begins = int_list(self.node, begin, "begin")
        sizes = int_list(self.node, size, "size")
        if len(begins) != len(x.shape) or len(sizes) != len(x.shape):
            self.fail(f"begin {begins} and size {sizes} do not fit shape {x.shape}")
        index = []
        for b, s, d in zip(begins, sizes, x.shape):
            e = d if s == -1 else b + s
            if not 0 <= b <= e <= d:
                self.fail(f"slice [{b}, {e}) is outside an axis of {d}")
            index.append(slice(b, e))
        return Inferred([TensorInfo(tuple(s.stop - s.start for s in index), x.dtype)], index=tuple(index))

    def run(self, x, begin, size, *, outs, scratch):
        np.copyto(outs[0], x[self.index])


@tfl("STRIDED_SLICE")
class StridedSlice(Kernel):
    """TensorFlow's strided slice as one numpy index: masks become None, Ellipsis, np.newaxis, ints."""

    attributes = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0,
                  "shrink_axis_mask": 0, "offset": False}

    def infer(self, x, begin, end, strides=None):
        begins = int_list(self.node, begin, "begin")
        ends = int_list(self.node, end, "end")
        steps = int_list(self.node, strides, "strides") if strides is not None else [1] * len(begins)
        if not len(begins) == len(ends) == len(steps):
            self.fail(f"begin {begins}, end {ends} and strides {steps} differ in length")
        index = []
        for i, (b, e, s) in enumerate(zip(begins, ends, steps)):
            bit = 1 << i
            if self.ellipsis_mask & bit:
                index.append(Ellipsis)
            elif self.new_axis_mask & bit:
                index.append(np.newaxis)
            elif self.shrink_axis_mask & bit:
                index.append(b)
            else:
                if s == 0:
                    self.fail("a stride is zero")
                if self.offset:
                    e = b + e
                index.append(slice(None if self.begin_mask & bit else b,
                                   None if self.end_mask & bit else e, s))
        index = tuple(index)
        # The index applied to a zero-stride stand-in of the input gives the output shape.
        stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.bool_), x.shape, (0,) * len(x.shape))
        try:
            shape = stand_in[index].shape
        except (IndexError, ValueError) as e:
            self.fail(f"cannot slice shape {x.shape}: {e}")
        return Inferred([TensorInfo(tuple(shape), x.dtype)], index=index)

    def run(self, x, begin, end, strides=None, *, outs, scratch):
        np.copyto(outs[0], x[self.index])


@tfl("GATHER")
class TflGather(Kernel):
    attributes = {"axis": 0, "batch_dims": 0}

    def infer(self, x, indices):
        if self.batch_dims:
            self.fail("batch_dims is not supported")
        a = axis_of(self, self.axis, len(x.shape))
        return Inferred([TensorInfo(tuple(x.shape[:a]) + tuple(indices.shape) + tuple(x.shape[a + 1:]), x.dtype)],
                        gather_axis=a)

    def run(self, x, indices, *, outs, scratch):
        np.take(x, indices, axis=self.gather_axis, out=outs[0], mode="clip")


@tfl("PAD")
class Pad(Kernel):
    """Pads with a constant (zero, or PADV2's value): border fill, then the input into the interior."""

    def infer(self, x, paddings, value=None):
        pads = np.asarray(known_value(self.node, paddings, "paddings")).astype(np.int64)
        if pads.shape != (len(x.shape), 2) or (pads < 0).any():
            self.fail(f"paddings of shape {pads.shape} do not fit rank {len(x.shape)}")
        shape = sane_shape(self.node, [d + int(p.sum()) for d, p in zip(x.shape, pads)], x.dtype)
        interior = tuple(slice(int(b), int(b) + d) for (b, _), d in zip(pads, x.shape))
        # Border slabs: per axis, the begin and end pads over the full extent of the other axes.
        borders = []
        for axis, (b, e) in enumerate(pads):
            lead = tuple(interior[:axis])
            for part in ((slice(0, int(b)),) if b else ()) + ((slice(shape[axis] - int(e), None),) if e else ()):
                borders.append(lead + (part,))
        return Inferred([TensorInfo(shape, x.dtype)], interior=interior, borders=borders)

    def run(self, x, paddings, value=None, *, outs, scratch):
        out = outs[0]
        fill = 0 if value is None else value.reshape(-1)[0]
        for border in self.borders:
            out[border] = fill
        np.copyto(out[self.interior], x)


tfl("PADV2")(type("PadV2", (Pad,), {}))


@tfl("DEPTH_TO_SPACE")
class DepthToSpace(Kernel):
    attributes = {"block_size": 2}

    def infer(self, x):
        n, h, w, c = x.shape
        b = self.block_size
        if b < 1 or c % (b * b):
            self.fail(f"{c} channels do not split into blocks of {b}x{b}")
        view = (n, h, w, b, b, c // (b * b))
        out_view = (n, h, b, w, b, c // (b * b))
        return Inferred([TensorInfo((n, h * b, w * b, c // (b * b)), x.dtype)], view=view, out_view=out_view)

    def run(self, x, *, outs, scratch):
        np.copyto(outs[0].reshape(self.out_view), x.reshape(self.view).transpose(0, 1, 3, 2, 4, 5))


@tfl("SPACE_TO_DEPTH")
class SpaceToDepth(Kernel):
    attributes = {"block_size": 2}

    def infer(self, x):
        n, h, w, c = x.shape
        b = self.block_size
        if b < 1 or h % b or w % b:
            self.fail(f"spatial shape {h}x{w} does not split into blocks of {b}")
        view = (n, h // b, b, w // b, b, c)
        out_view = (n, h // b, w // b, b, b, c)
        return Inferred([TensorInfo((n, h // b, w // b, c * b * b), x.dtype)], view=view, out_view=out_view)

    def run(self, x, *, outs, scratch):
        np.copyto(outs[0].reshape(self.out_view), x.reshape(self.view).transpose(0, 1, 3, 2, 4, 5))


@tfl("TILE")
class TflTile(Kernel):
    def infer(self, x, multiples):
        reps = int_list(self.node, multiples, "multiples")
        if len(reps) != len(x.shape) or min(reps, default=1) < 0:
            self.fail(f"multiples {reps} do not fit shape {x.shape}")
        shape = sane_shape(self.node, [d * r for d, r in zip(x.shape, reps)], x.dtype)
        view = tuple(v for d, r in zip(x.shape, reps) for v in (r, d))
        source = tuple(v for d in x.shape for v in (1, d))
        return Inferred([TensorInfo(shape, x.dtype)], reps=reps, view=view, source=source)

    def run(self, x, multiples, *, outs, scratch):
        np.copyto(outs[0].reshape(self.view), x.reshape(self.source))


# --------------------------------------------------------------------------- types and constants


@tfl("CAST")
class TflCast(Kernel):
    attributes = {"in_data_type": None, "out_data_type": None}

    def infer(self, x):
        if self.out_data_type is None:
            self.fail("out_data_type is not given")
        dtype = tensor_type(self, self.out_data_type, "out_data_type")
        return Inferred([TensorInfo(tuple(x.shape), dtype)], dtype=dtype)

    def run(self, x, *, outs, scratch):
        np.copyto(outs[0], x, casting="unsafe")


@tfl("SHAPE")
class TflShape(Kernel):
    attributes = {"out_type": "INT32"}

    def infer(self, x):
        value = np.array(x.shape, tensor_type(self, self.out_type, "out_type"))
        return [TensorInfo.of(value)]

    def run(self, x, *, outs, scratch):
        outs[0][...] = x.shape


@tfl("FILL")
class TflFill(Kernel):
    def infer(self, dims, value):
        shape = sane_shape(self.node, int_list(self.node, dims, "dims"), value.dtype)
        return [TensorInfo(shape, value.dtype)]

    def run(self, dims, value, *, outs, scratch):
        outs[0][...] = value.reshape(-1)[0]
