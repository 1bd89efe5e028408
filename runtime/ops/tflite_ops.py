"""TFLite builtin operators other than convolution and pooling (domain "tflite").

Tensors are NHWC as the file has them; attributes are the fields of the op's
BuiltinOptions table (see the loader's interface). The numeric cores are the
ONNX families' ones: fused activations from activation.py, broadcasting from
elementwise.py, the separable resize plan of resize.py, the softmax kernels.

Weights that the file stores in another form are turned into float32 once, at
PREPARE, in the shape rule: DEQUANTIZE of a constant float16 tensor and DENSIFY
of a sparse one give a known value (a packed array), so no step runs for them
and the mapped source pages are released.
"""

import math

import numpy as np

from . import activation as act
from .elementwise import Binary, Div, PRelu, broadcast_shape
from .registry import Inferred, Kernel, TensorInfo, register
from .resize import ResizeCore
from .shape import int_list, known_value, normalize_axes, sane_shape
from .softmax import LogSoftmax, Softmax

DOMAIN = "tflite"

# TFLite fused activations as (op type, params) of activation.apply_activation. LiteRT's
# float kernels turn a fused activation into a clamp range (CalculateActivationRange), in
# which TANH and SIGN_BIT are no clamp at all: they do nothing there, and so here.
FUSED = {
    "NONE": None,
    "RELU": ("Relu", {}),
    "RELU6": ("Clip", {"min": 0, "max": 6}),
    "RELU_N1_TO_1": ("Clip", {"min": -1, "max": 1}),
    "TANH": None,
    "SIGN_BIT": None,
}

# TensorType enum, by name and by number.
TENSOR_TYPES = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "UINT8": np.uint8,
    "INT64": np.int64, "BOOL": np.bool_, "INT16": np.int16, "INT8": np.int8,
    "FLOAT64": np.float64, "UINT64": np.uint64, "UINT32": np.uint32, "UINT16": np.uint16,
    "COMPLEX64": np.complex64,
}
_TYPE_CODES = ["FLOAT32", "FLOAT16", "INT32", "UINT8", "INT64", "STRING", "BOOL", "INT16",
               "COMPLEX64", "INT8", "FLOAT64", "COMPLEX128", "UINT64", "RESOURCE", "VARIANT",
               "UINT32", "UINT16"]


def tensor_type(kernel, value, what):
    name = _TYPE_CODES[value] if isinstance(value, int) and 0 <= value < len(_TYPE_CODES) else value
    if name not in TENSOR_TYPES:
        kernel.fail(f"{what} {value!r} is not a supported tensor type")
    return np.dtype(TENSOR_TYPES[name])


def fused_activation(kernel, name):
    """The apply_activation pair of a TFLite fused_activation_function (None for NONE)."""
    if name not in FUSED:
        kernel.fail(f"fused_activation_function {name!r} is not supported")
    return FUSED[name]


def tfl(op_type):
    return register(op_type, since=1, domain=DOMAIN)


def _axis(kernel, axis, rank):
    if not -rank <= axis < rank:
        kernel.fail(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# --------------------------------------------------------------------------- fully connected


@tfl("FULLY_CONNECTED")
class FullyConnected(Kernel):
    """y = x W^T + b over the last axis; W [O, I] is used as it lies (its transpose is a view)."""

    attributes = {"fused_activation_function": "NONE", "weights_format": "DEFAULT",
                  "keep_num_dims": False, "asymmetric_quantize_inputs": False}

    def decode(self):
        self.activation = fused_activation(self, self.fused_activation_function)
        if self.weights_format != "DEFAULT":
            self.fail(f"weights_format {self.weights_format!r} is not supported")

    def infer(self, x, w, bias=None):
        if len(w.shape) != 2:
            self.fail(f"weights of shape {w.shape} are not [O, I]")
        units, depth = w.shape
        if depth == 0 or x.size % depth:
            self.fail(f"input of shape {x.shape} does not split into rows of {depth}")
        if bias is not None and bias.size != units:
            self.fail(f"bias of {bias.size} values for {units} units")
        if self.keep_num_dims:
            if x.shape[-1] != depth:
                self.fail(f"input of shape {x.shape} does not end in {depth}")
            shape = tuple(x.shape[:-1]) + (units,)
        else:
            shape = (x.size // depth, units)
        rows = (x.size // depth, depth)
        return Inferred([TensorInfo(shape, x.dtype)], rows=rows)

    def run(self, x, w, bias=None, *, outs, scratch):
        out = outs[0].reshape(-1, w.shape[0])
        np.matmul(x.reshape(self.rows), w.T, out=out)
        if bias is not None:
            np.add(out, bias.reshape(-1), out=out)
        act.apply_activation(out, self.activation)


# --------------------------------------------------------------------------- elementwise


class FusedActivation:
    """TFLite's fused_activation_function as the activation ONNX's binary kernels apply."""

    attributes = {"fused_activation_function": "NONE"}

    def decode(self):
        self.activation = fused_activation(self, self.fused_activation_function)


_FUSED = dict(FusedActivation.attributes, pot_scale_int16=True)
for _op, _ufunc in {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}.items():
    tfl(_op)(type(_op.title(), (FusedActivation, Binary), {"ufunc": _ufunc, "attributes": _FUSED}))
# Integer DIV truncates toward zero in LiteRT as in ONNX: Div's exact integer paths.
tfl("DIV")(type("Div", (FusedActivation, Div), {"attributes": FusedActivation.attributes}))


class PlainBinary(Binary):
    """A broadcasting binary op without a fused activation: ONNX's Binary kernel."""

    def decode(self):
        self.activation = None


for _op, _ufunc in {"MAXIMUM": np.maximum, "MINIMUM": np.minimum, "POW": np.power,
                    "FLOOR_DIV": np.floor_divide, "FLOOR_MOD": np.mod}.items():
    tfl(_op)(type(_op.title(), (PlainBinary,), {"ufunc": _ufunc}))


class Comparison(PlainBinary):
    result_dtype = np.bool_


for _op, _ufunc in {"LESS": np.less, "GREATER": np.greater, "EQUAL": np.equal, "NOT_EQUAL": np.not_equal,
                    "LESS_EQUAL": np.less_equal, "GREATER_EQUAL": np.greater_equal,
                    "LOGICAL_AND": np.logical_and, "LOGICAL_OR": np.logical_or}.items():
    tfl(_op)(type(_op.title(), (Comparison,), {"ufunc": _ufunc}))


@tfl("SQUARED_DIFFERENCE")
class SquaredDifference(PlainBinary):
    def run(self, a, b, *, outs, scratch):
        np.subtract(a, b, out=outs[0])
        np.square(outs[0], out=outs[0])


@tfl("PRELU")
class TflPRelu(PRelu):
    """alpha broadcasts to the input (usually [1, 1, C] against NHWC): ONNX PRelu's kernel."""

    def infer(self, x, slope):
        shape = broadcast_shape(self.node, x.shape, slope.shape)
        if shape != tuple(x.shape):
            self.fail(f"alpha of shape {slope.shape} does not broadcast to the input's {x.shape}")
        return [TensorInfo(shape, x.dtype)]


class Unary(Kernel):
    """y = f(x) by one of activation.py's formulas, or a ufunc."""

    formula = None

    def infer(self, x):
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, *, outs, scratch):
        self.formula(x, outs[0])


_UNARY = {
    "RELU": act.relu,
    "RELU6": lambda x, out: act.clip(x, out, 0, 6),
    "RELU_N1_TO_1": lambda x, out: act.clip(x, out, -1, 1),
    "RELU_0_TO_1": lambda x, out: act.clip(x, out, 0, 1),
    "LOGISTIC": act.sigmoid,
    "TANH": act.tanh,
    "HARD_SWISH": act.hard_swish,
    "ABS": lambda x, out: np.abs(x, out=out),
    "NEG": lambda x, out: np.negative(x, out=out),
    "EXP": lambda x, out: np.exp(x, out=out),
    "LOG": lambda x, out: np.log(x, out=out),
    "SQRT": lambda x, out: np.sqrt(x, out=out),
    "SQUARE": lambda x, out: np.square(x, out=out),
    "SIN": lambda x, out: np.sin(x, out=out),
    "COS": lambda x, out: np.cos(x, out=out),
    "FLOOR": lambda x, out: np.floor(x, out=out),
    "CEIL": lambda x, out: np.ceil(x, out=out),
    "ROUND": lambda x, out: np.rint(x, out=out),  # TFLite rounds half to even
    "SIGN": lambda x, out: np.sign(x, out=out),
    "LOGICAL_NOT": lambda x, out: np.logical_not(x, out=out),
}


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.reciprocal(out, out=out)


_UNARY["RSQRT"] = _rsqrt

for _op, _formula in _UNARY.items():
    tfl(_op)(type(_op.title(), (Unary,), {"formula": staticmethod(_formula)}))


@tfl("LEAKY_RELU")
class TflLeakyRelu(Unary):
    attributes = {"alpha": 0.2}

    def run(self, x, *, outs, scratch):
        act.leaky_relu(x, outs[0], self.alpha)


# --------------------------------------------------------------------------- softmax


@tfl("SOFTMAX")
class TflSoftmax(Softmax):
    """Softmax over the last axis of exp(beta * x)."""

    attributes = {"beta": 1.0}
    coerce_2d = False

    def decode(self):
        self.axis = -1

    def run(self, x, *, outs, scratch):
        if outs[0].size == 0:
            return
        if self.beta != 1.0:
            np.multiply(x, x.dtype.type(self.beta), out=outs[0])
            x = outs[0]
        self.compute(x.reshape(self.view), outs[0].reshape(self.view), scratch)


@tfl("LOG_SOFTMAX")
class TflLogSoftmax(LogSoftmax):
    attributes = {}
    coerce_2d = False

    def decode(self):
        self.axis = -1


# --------------------------------------------------------------------------- reductions


class Reduction(Kernel):
    """MEAN, SUM, REDUCE_*: over the axes of a constant axis tensor, keep_dims optional."""

    attributes = {"keep_dims": False}
    reducer = None

    def infer(self, x, axes):
        rank = len(x.shape)
        values = int_list(self.node, axes, "axis")
        reduced = tuple(sorted(set(normalize_axes(self.node, values, rank)))) if rank else ()
        kept = tuple(1 if i in reduced else d for i, d in enumerate(x.shape))
        shape = kept if self.keep_dims else tuple(d for i, d in enumerate(x.shape) if i not in reduced)
        if self.reducer in (np.maximum, np.minimum) and any(x.shape[a] == 0 for a in reduced):
            self.fail("cannot take the extremum of an empty axis")
        return Inferred([TensorInfo(shape, x.dtype)], axes=reduced, kept=kept)

    def run(self, x, axes, *, outs, scratch):
        out = outs[0].reshape(self.kept)
        if not self.axes:
            np.copyto(out, x)
        else:
            self.reduce(x, out)

    def reduce(self, x, out):
        self.reducer.reduce(x, axis=self.axes, keepdims=True, out=out)


@tfl("MEAN")
class TflMean(Reduction):
    def reduce(self, x, out):
        np.mean(x, axis=self.axes, keepdims=True, out=out)


for _op, _ufunc in {"SUM": np.add, "REDUCE_MAX": np.maximum, "REDUCE_MIN": np.minimum,
                    "REDUCE_PROD": np.multiply}.items():
    tfl(_op)(type(_op.title(), (Reduction,), {"reducer": _ufunc}))


class ArgExtremum(Kernel):
    attributes = {"output_type": "INT64"}
    pick = None

    def decode(self):
        self.dtype = tensor_type(self, self.output_type, "output_type")

    def infer(self, x, axis):
        (value,) = int_list(self.node, axis, "axis")
        n = _axis(self, value, len(x.shape))
        return Inferred([TensorInfo(tuple(d for i, d in enumerate(x.shape) if i != n), self.dtype)], axis=n)

    def run(self, x, axis, *, outs, scratch):
        return self.pick(x, axis=self.axis)


@tfl("ARG_MAX")
class ArgMax(ArgExtremum):
    pick = staticmethod(np.argmax)


@tfl("ARG_MIN")
class ArgMin(ArgExtremum):
    pick = staticmethod(np.argmin)


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
        position = _axis(self, value, rank)
        shape = list(x.shape)
        shape.insert(position, 1)
        return [TensorInfo(tuple(shape), x.dtype, alias_of=0)]


@tfl("CONCATENATION")
class Concatenation(Kernel):
    attributes = {"axis": 0, "fused_activation_function": "NONE"}

    def decode(self):
        self.activation = fused_activation(self, self.fused_activation_function)

    def infer(self, *inputs):
        first = inputs[0]
        rank = len(first.shape)
        concat_axis = _axis(self, self.axis, rank)
        total = 0
        for info in inputs:
            if len(info.shape) != rank or any(a != b for i, (a, b) in enumerate(zip(info.shape, first.shape))
                                              if i != concat_axis):
                self.fail(f"input shapes {[i.shape for i in inputs]} do not concatenate on axis {self.axis}")
            total += info.shape[concat_axis]
        shape = list(first.shape)
        shape[concat_axis] = total
        return Inferred([TensorInfo(tuple(shape), first.dtype)], concat_axis=concat_axis)

    def run(self, *inputs, outs, scratch):
        np.concatenate(inputs, axis=self.concat_axis, out=outs[0])
        act.apply_activation(outs[0], self.activation)


@tfl("PACK")
class Pack(Kernel):
    attributes = {"values_count": 0, "axis": 0}

    def infer(self, *inputs):
        first = inputs[0]
        if any(tuple(i.shape) != tuple(first.shape) for i in inputs):
            self.fail(f"input shapes {[i.shape for i in inputs]} differ")
        stack_axis = _axis(self, self.axis, len(first.shape) + 1)
        shape = list(first.shape)
        shape.insert(stack_axis, len(inputs))
        return Inferred([TensorInfo(tuple(shape), first.dtype)], stack_axis=stack_axis)

    def run(self, *inputs, outs, scratch):
        np.stack(inputs, axis=self.stack_axis, out=outs[0])


@tfl("UNPACK")
class Unpack(Kernel):
    attributes = {"num": 0, "axis": 0}

    def infer(self, x):
        split_axis = _axis(self, self.axis, len(x.shape))
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
        split_axis = _axis(self, axis, len(x.shape))
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
        a = _axis(self, value, len(x.shape))
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
        a = _axis(self, value, len(x.shape))
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
        a = _axis(self, self.axis, len(x.shape))
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


# --------------------------------------------------------------------------- resize


class TflResize(ResizeCore):
    """RESIZE_* on NHWC with a constant [height, width] size, on Resize's separable plan."""

    attributes = {"align_corners": False, "half_pixel_centers": False}

    def decode(self):
        super().decode()

    def geometry(self, x, size):
        if len(x.shape) != 4:
            self.fail(f"input of shape {x.shape} is not NHWC")
        height, width = int_list(self.node, size, "size")
        n, h, w, c = x.shape
        scales = [np.float32(1), np.float32(height) / np.float32(h) if h else np.float32(1),
                  np.float32(width) / np.float32(w) if w else np.float32(1), np.float32(1)]
        return [n, height, width, c], scales, None


@tfl("RESIZE_BILINEAR")
class ResizeBilinear(TflResize):
    mode = "linear"

    def decode(self):
        # TFLite's bilinear clamps the source coordinate into the input, as ONNX's linear does.
        self.coordinate_transformation_mode = ("align_corners" if self.align_corners else
                                               "half_pixel" if self.half_pixel_centers else "asymmetric")
        super().decode()


@tfl("RESIZE_NEAREST_NEIGHBOR")
class ResizeNearest(TflResize):
    """floor(x * in/out), or floor((x + 0.5) * in/out) with half pixel centers; align_corners rounds."""

    mode = "nearest"
    coordinate_modes = ResizeCore.coordinate_modes + ("tf_half_pixel_for_nn",)

    def decode(self):
        if self.align_corners and self.half_pixel_centers:
            self.fail("align_corners with half_pixel_centers is not supported")
        if self.align_corners:
            self.coordinate_transformation_mode, self.nearest_mode = "align_corners", "round_prefer_ceil"
        elif self.half_pixel_centers:
            self.coordinate_transformation_mode, self.nearest_mode = "tf_half_pixel_for_nn", "floor"
        else:
            self.coordinate_transformation_mode, self.nearest_mode = "asymmetric", "floor"
        super().decode()


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


@tfl("DEQUANTIZE")
class Dequantize(Kernel):
    """float16 (or quantized int8/uint8) to float32. A constant input is converted once, here."""

    attributes = {"quantization": None}

    def infer(self, x):
        scale = zero_point = None
        if x.dtype != np.float16:
            q = (self.quantization or {}).get(self.node.inputs[0])
            if q is None:
                self.fail(f"a {x.dtype} input has no quantization parameters")
            shape = [1] * len(x.shape)
            scale, zero = np.asarray(q["scale"], np.float32), np.asarray(q["zero_point"], np.float32)
            if scale.size > 1:
                shape[q.get("axis", 0)] = -1
            scale, zero_point = scale.reshape(shape), zero.reshape(shape)
        if x.value is not None:  # converted now: no step runs for it
            out = np.empty(x.shape, np.float32)
            self.convert(x.value, out, scale, zero_point)
            return [TensorInfo(tuple(x.shape), np.dtype(np.float32), out)]
        return Inferred([TensorInfo(tuple(x.shape), np.dtype(np.float32))], scale=scale, zero_point=zero_point)

    @staticmethod
    def convert(x, out, scale, zero_point):
        np.copyto(out, x, casting="unsafe")
        if scale is not None:
            np.subtract(out, zero_point, out=out)
            np.multiply(out, scale, out=out)

    def run(self, x, *, outs, scratch):
        self.convert(x, outs[0], self.scale, self.zero_point)


@tfl("DENSIFY")
class Densify(Kernel):
    """A sparse constant (TFLite's sparsity parameters) made dense once, here."""

    attributes = {"sparsity": None}

    def infer(self, x):
        if x.value is None or self.sparsity is None:
            self.fail("DENSIFY needs a constant input and its sparsity parameters")
        dense = densify(self, np.asarray(x.value), self.sparsity, x.shape)
        return [TensorInfo(tuple(dense.shape), dense.dtype, dense)]  # made now: no step runs for it

    def run(self, x, *, outs, scratch):
        self.fail("DENSIFY runs at PREPARE only")


def densify(kernel, values, sparsity, dense_shape=None):
    """TFLite's FormatConverter::SparseToDense, level by level in traversal order, vectorised."""
    order = list(sparsity["traversal_order"])
    block_map = list(sparsity.get("block_map") or [])
    metadata = sparsity["dim_metadata"]
    if len(metadata) != len(order):
        kernel.fail("sparsity dim_metadata does not match traversal_order")
    rank = len(order) - len(block_map)
    # The size of every expanded dim: dense dims say it; a sparse dim's size is found from the
    # dense shape, which is the product of a dim and its block.
    sizes = [None] * len(order)
    for level, dim in enumerate(order):
        if metadata[level]["format"] == "DENSE":
            sizes[dim] = int(metadata[level]["dense_size"])
    # Walk the levels: `positions` is each stored element's flat position in the level's
    # parent list, `coords` its coordinate per expanded dim.
    positions = np.zeros(1, np.int64)
    coords = np.zeros((len(order), 1), np.int64)
    for level, dim in enumerate(order):
        meta = metadata[level]
        if meta["format"] == "DENSE":
            n = int(meta["dense_size"])
            new_pos = (positions[:, None] * n + np.arange(n)[None, :]).reshape(-1)
            coords = np.repeat(coords, n, axis=1)
            coords[dim] = np.tile(np.arange(n), positions.size)
            positions = new_pos
        else:
            segments = np.asarray(meta["array_segments"], np.int64)
            indices = np.asarray(meta["array_indices"], np.int64)
            starts, stops = segments[positions], segments[positions + 1]
            counts = stops - starts
            coords = np.repeat(coords, counts, axis=1)
            new_pos = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)]) if counts.size \
                else np.zeros(0, np.int64)
            coords[dim] = indices[new_pos]
            positions = new_pos.astype(np.int64)
            if sizes[dim] is None:
                sizes[dim] = int(indices.max()) + 1 if indices.size else 0
    block_sizes = {block_map[k]: sizes[rank + k] for k in range(len(block_map))}
    if dense_shape is not None and len(dense_shape) == rank:
        # The file's tensor shape is the dense shape: it fixes sparse dims' sizes.
        for d in range(rank):
            sizes[d] = -(-int(dense_shape[d]) // block_sizes.get(d, 1))
    # A sparse dim's true extent is unknown to the format; blocks scale it.
    shape = []
    dense_coords = []
    for d in range(rank):
        b = block_sizes.get(d, 1)
        c = coords[d] * b
        if d in block_sizes:
            c = c + coords[rank + block_map.index(d)]
        dense_coords.append(c)
        shape.append(sizes[d] * b)
    dense = np.zeros(shape, values.dtype)
    if values.size < positions.size:
        kernel.fail("sparse values are fewer than the sparsity parameters index")
    dense[tuple(dense_coords)] = values.reshape(-1)[positions]
    return dense
