"""Shape ops: what a tensor's shape is, and ops that only change it or make constants.

Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Identity, Constant,
ConstantOfShape, Expand, Range, EyeLike.

Shape and Size return their value from `infer`, so the shape arithmetic that
follows them folds at PREPARE. Reshape, Flatten, Squeeze, Unsqueeze and Identity
return `alias_of=0`: their output is the input's buffer under a new shape and the
executor makes the view itself; their `run` returns that view for folding.

Also home of the small helpers the other families share: `where` (how an error
names the node), `normalize_axis(es)`, `known_value`/`int_list` (inputs that must
be constant at PREPARE), `sane_shape` (refuse sizes beyond max_tensor_bytes, see
size_limit.py, before a rule makes anything of them) and `onnx_dtype`.
"""

import numpy as np
from onnx import helper as onnx_helper

from .. import size_limit
from ..errors import ModelError
from ..weights import weight_array
from .registry import REQUIRED, Inferred, Kernel, NeedsValueError, TensorInfo, register

INT64 = np.dtype(np.int64)

# ONNX data types nnrun computes with: 1..16, float32 to bfloat16 (string is 8). The float8,
# 4-bit and later types have no numpy arithmetic worth the name.
SUPPORTED_DTYPE_CODES = range(1, 17)


def onnx_dtype(node, code, attribute="to"):
    """The numpy dtype of an ONNX data type code, or ModelError."""
    try:
        if int(code) in SUPPORTED_DTYPE_CODES:
            return np.dtype(onnx_helper.tensor_dtype_to_np_dtype(int(code)))
    except (KeyError, TypeError, ValueError):
        pass
    raise ModelError(f"attribute {attribute!r} names data type {code!r}, "
                     "which nnrun does not support")


def normalize_axis(node, axis, rank, what="axis"):
    """`axis` in [-rank, rank) as a non-negative int, or ModelError."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ModelError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(node, axes, rank, what="axes"):
    """A list of distinct non-negative axes, or ModelError."""
    out = [normalize_axis(node, a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise ModelError(f"{what} {list(axes)} repeat an axis")
    return out


def known_value(node, info, what):
    """The value of an input that decides a shape, or NeedsValueError when it is known only per run."""
    if info is None:
        return None
    if info.value is None:
        raise NeedsValueError(f"input {what!r} decides a shape and is only known "
                              f"at run time")
    return info.value


def int_list(node, info, what):
    """A known 1-D (or scalar) integer input as a list of Python ints."""
    value = known_value(node, info, what)
    if value is None:
        return None
    value = np.asarray(value)
    if value.dtype.kind not in "iu":
        raise ModelError(f"input {what!r} must be an integer tensor, not {value.dtype}")
    return [int(v) for v in value.reshape(-1)]


def sane_shape(node, shape, dtype):
    """`shape` (of the node's first output) as a tuple of Python ints; ModelError when a dim is
    negative, SizeLimitError when the tensor would be larger than max_tensor_bytes (the limit in
    force, size_limit.py)."""
    shape = tuple(int(d) for d in shape)
    size_limit.tensor_bytes(shape, dtype, f"output {node.outputs[0]!r}" if node.outputs else "the output")
    return shape


def size_of(shape):
    n = 1
    for d in shape:
        n *= d
    return n


@register("Shape", since=1)
class Shape(Kernel):
    attributes = {}

    def span(self, rank):
        return 0, rank

    def infer(self, x):
        start, end = self.span(len(x.shape))
        return [TensorInfo.of(np.array(x.shape[start:end], dtype=INT64))]

    def run(self, x, outs, scratch):
        start, end = self.span(x.ndim)
        outs[0][...] = x.shape[start:end]


@register("Shape", since=15)
class Shape15(Shape):
    attributes = {"start": 0, "end": None}

    def span(self, rank):
        # Out-of-range start and end are clamped, as the spec says.
        start = self.start + rank if self.start < 0 else self.start
        end = rank if self.end is None else (self.end + rank if self.end < 0 else self.end)
        start = min(max(start, 0), rank)
        end = min(max(end, 0), rank)
        return start, max(start, end)


@register("Size", since=1)
class Size(Kernel):
    def infer(self, x):
        return [TensorInfo.of(np.array(x.size, dtype=INT64))]

    def run(self, x, outs, scratch):
        outs[0][...] = x.size


class Alias(Kernel):
    """An op whose output is its input under another shape."""

    def out_shape(self, *inputs):
        raise NotImplementedError

    def infer(self, *inputs):
        shape = self.out_shape(*inputs)
        return Inferred([TensorInfo(shape, inputs[0].dtype, alias_of=0)], shape=shape)

    def run(self, x, *rest, outs, scratch):
        return x.reshape(self.shape)


@register("Identity", since=1)
class Identity(Alias):
    """Its input as it is: a tensor (a view of its buffer), a sequence or an optional."""

    def out_shape(self, x):
        return x.shape

    def infer(self, x):
        if not isinstance(x, TensorInfo):  # a sequence, an empty optional: never in the arena
            return Inferred([TensorInfo(None, None) if x is None else x], shape=None)
        return super().infer(x)

    def run(self, x, outs, scratch):
        return (x,) if self.shape is None else x.reshape(self.shape)


@register("Reshape", since=5)
class Reshape(Alias):
    attributes = {"allowzero": 0}

    def out_shape(self, x, shape):
        dims = int_list(self.node, shape, "shape")
        if shape is not None and len(shape.shape) != 1:
            raise ModelError(f"input 'shape' must be 1-D, got shape {shape.shape}")
        out = []
        unknown = None
        for i, d in enumerate(dims):
            if d == -1:
                if unknown is not None:
                    raise ModelError(f"shape {dims} has more than one -1")
                unknown = i
                out.append(1)
            elif d == 0 and not self.allowzero:
                if i >= len(x.shape):
                    raise ModelError(f"shape {dims} copies dimension {i} (0) "
                                     f"of an input of rank {len(x.shape)}")
                out.append(x.shape[i])
            elif d < 0:
                raise ModelError(f"shape {dims} has a negative dimension {d}")
            else:
                out.append(d)
        total = x.size
        if unknown is not None:
            known = size_of(out)
            if known == 0 or total % known:
                raise ModelError(f"cannot reshape {list(x.shape)} into {dims}")
            out[unknown] = total // known
        if size_of(out) != total:
            raise ModelError(f"cannot reshape {list(x.shape)} ({total} elements) "
                             f"into {out}")
        return tuple(out)


@register("Reshape", since=14)
class Reshape14(Reshape):
    def decode(self):
        if self.allowzero not in (0, 1):
            raise ModelError(f"allowzero must be 0 or 1, got {self.allowzero}")


@register("Flatten", since=1)
class Flatten(Alias):
    attributes = {"axis": 1}

    def out_shape(self, x):
        rank = len(x.shape)
        # axis == rank is allowed: everything goes into the first dimension.
        if not -rank <= self.axis <= rank:
            raise ModelError(f"axis {self.axis} is out of range for rank {rank}")
        axis = self.axis + rank if self.axis < 0 else self.axis
        return (size_of(x.shape[:axis]), size_of(x.shape[axis:]))


@register("Squeeze", since=1)
class Squeeze(Alias):
    attributes = {"axes": None}

    def axes_of(self, axes_input):
        return self.axes

    def out_shape(self, x, axes_input=None):
        axes = self.axes_of(axes_input)
        rank = len(x.shape)
        if axes is None:
            return tuple(d for d in x.shape if d != 1)
        axes = set(normalize_axes(self.node, axes, rank))
        for a in axes:
            if x.shape[a] != 1:
                raise ModelError(f"cannot squeeze axis {a} of shape {list(x.shape)}")
        return tuple(d for i, d in enumerate(x.shape) if i not in axes)


@register("Squeeze", since=13)
class Squeeze13(Squeeze):
    attributes = {}

    def axes_of(self, axes_input):
        return int_list(self.node, axes_input, "axes")


@register("Unsqueeze", since=1)
class Unsqueeze(Alias):
    attributes = {"axes": REQUIRED}

    def axes_of(self, axes_input):
        return self.axes

    def out_shape(self, x, axes_input=None):
        axes = self.axes_of(axes_input)
        if axes is None:
            raise ModelError("input 'axes' is required")
        rank = len(x.shape) + len(axes)
        inserted = set(normalize_axes(self.node, axes, rank))
        dims = iter(x.shape)
        return tuple(1 if i in inserted else next(dims) for i in range(rank))


@register("Unsqueeze", since=13)
class Unsqueeze13(Unsqueeze):
    attributes = {}

    def axes_of(self, axes_input):
        return int_list(self.node, axes_input, "axes")


@register("Constant", since=1)
class Constant(Kernel):
    """A value from one of the attributes value, value_float(s), value_int(s), value_string(s)."""

    attributes = {"value": None, "value_float": None, "value_floats": None, "value_int": None,
                  "value_ints": None, "value_string": None, "value_strings": None,
                  "sparse_value": None}

    def decode(self):
        given = [name for name in self.attributes if getattr(self, name) is not None]
        if len(given) != 1:
            raise ModelError(f"exactly one value attribute must be set, "
                             f"found {given or 'none'}")
        name = given[0]
        raw = getattr(self, name)
        if name == "sparse_value":
            raise ModelError("sparse_value is unsupported")
        if name == "value":
            self.array = weight_array(raw)
        elif name == "value_float":
            self.array = np.array(raw, dtype=np.float32)
        elif name == "value_floats":
            self.array = np.array(raw, dtype=np.float32).reshape(-1)
        elif name == "value_int":
            self.array = np.array(raw, dtype=INT64)
        elif name == "value_ints":
            self.array = np.array(raw, dtype=INT64).reshape(-1)
        elif name == "value_string":
            self.array = np.array(_text(raw), dtype=object)
        else:
            self.array = np.array([_text(s) for s in raw], dtype=object).reshape(-1)

    def infer(self):
        return [TensorInfo.of(self.array)]

    def run(self, outs, scratch):
        np.copyto(outs[0], self.array)


def _text(s):
    return s.decode() if isinstance(s, bytes) else s


@register("ConstantOfShape", since=9)
class ConstantOfShape(Kernel):
    attributes = {"value": None}

    def decode(self):
        if self.value is None:
            self.fill = np.zeros((), dtype=np.float32)
        else:
            value = weight_array(self.value)
            if value.size != 1:
                raise ModelError(f"value must hold one element, got {value.size}")
            self.fill = value.reshape(())

    def infer(self, shape):
        dims = int_list(self.node, shape, "input")
        return [TensorInfo(sane_shape(self.node, dims, self.fill.dtype), self.fill.dtype)]

    def run(self, shape, outs, scratch):
        outs[0].fill(self.fill)


def broadcast_shapes(node, *shapes):
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


@register("Expand", since=8)
class Expand(Kernel):
    def infer(self, x, shape):
        dims = sane_shape(self.node, int_list(self.node, shape, "shape"), x.dtype)
        return [TensorInfo(sane_shape(self.node, broadcast_shapes(self.node, x.shape, dims), x.dtype),
                           x.dtype)]

    def run(self, x, shape, outs, scratch):
        np.copyto(outs[0], x)


@register("Range", since=11)
class Range(Kernel):
    def infer(self, start, limit, delta):
        values = [known_value(self.node, info, what)
                  for info, what in ((start, "start"), (limit, "limit"), (delta, "delta"))]
        dtype = start.dtype
        if any(np.asarray(v).size != 1 for v in values) or limit.dtype != dtype or delta.dtype != dtype:
            raise ModelError("start, limit and delta must be scalars of one type")
        first, limit_v, step = (np.asarray(v, dtype=dtype).reshape(()) for v in values)
        if step == 0 or not np.isfinite(float(step)):
            raise ModelError(f"delta is {step}")
        # ceil((limit - start) / delta), the difference taken in the input type as the spec does.
        with np.errstate(over="ignore", invalid="ignore"):
            span = float(limit_v - first) if dtype.kind == "f" else float(int(limit_v) - int(first))
            count = span / float(step)
        if not np.isfinite(count):
            raise ModelError(f"start {first}, limit {limit_v}, delta {step}")
        shape = (max(int(np.ceil(count)), 0),)
        return [TensorInfo(sane_shape(self.node, shape, dtype), dtype)]

    def run(self, start, limit, delta, outs, scratch):
        out = outs[0]
        if out.size == 0:
            return
        if out.dtype.kind == "f":
            # Successive additions of delta, as onnxruntime computes it.
            out[0] = start
            out[1:] = delta
            np.cumsum(out, out=out)
        else:
            np.multiply(np.arange(out.size, dtype=out.dtype), delta, out=out)
            np.add(out, start, out=out)


@register("EyeLike", since=9)
class EyeLike(Kernel):
    attributes = {"dtype": None, "k": 0}

    def infer(self, x):
        if len(x.shape) != 2:
            raise ModelError(f"input must be 2-D, got shape {list(x.shape)}")
        dtype = x.dtype if self.dtype is None else onnx_dtype(self.node, self.dtype, "dtype")
        rows, cols = x.shape
        i = np.arange(max(0, -self.k), min(rows, cols - self.k), dtype=np.intp)
        diagonal = i * cols + i + self.k  # flat positions of the ones
        return Inferred([TensorInfo(x.shape, dtype)], diagonal=diagonal)

    def run(self, x, outs, scratch):
        out = outs[0]
        out.fill(0)
        out.reshape(-1)[self.diagonal] = 1
