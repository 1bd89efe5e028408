"""The seeds the fuzzer mutates: small valid ONNX and TFLite models, built in code.

Each seed is small (kilobytes) and runs on nnrun as it stands, so a mutant that fails fails
because of its mutation. Together they reach many ops and loader paths:

- ONNX: convolutions with pads, strides, dilations and groups, pooling, Gemm, BatchNormalization,
  fusable Clip/Relu; shape ops (Reshape, Transpose, Concat, Gather, Slice, ConstantOfShape,
  Expand, Tile, Range, Pad, Cast, Constant nodes); Resize, TopK, ArgMax, Softmax on a symbolic
  batch; If and Loop bodies and sequence ops; initializers in raw_data and in typed fields; a
  model whose weights lie in an external data file; and two nets of `build_models` (the shipped
  tiny CNN, a one-layer BERT).
- TFLite: CONV_2D, DEPTHWISE_CONV_2D, pooling, RESHAPE, FULLY_CONNECTED, SOFTMAX; int8 and float16
  weights through DEQUANTIZE with per-tensor and per-channel quantization; a sparse (CSR) weight
  through DENSIFY; tensor ops (CONCATENATION, TRANSPOSE, STRIDED_SLICE, PAD, MEAN, GATHER,
  RESIZE_BILINEAR). The files are written with the `tflite` package's generated builders.
"""

from dataclasses import dataclass

import flatbuffers
import numpy as np
import onnx
import tflite
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from . import build_models

F, F16, I64, B = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL
OPSET = 17


@dataclass(frozen=True)
class Seed:
    """A valid model the fuzzer starts from: its bytes, and files that must lie beside it."""

    name: str
    format: str  # "onnx" or "tflite"
    data: bytes
    # (file name, bytes) written into the model's directory: the external data of an ONNX model.
    # A seed with files is always loaded from a path.
    files: tuple = ()

    @property
    def suffix(self):
        return ".tflite" if self.format == "tflite" else ".onnx"


def _rng(seed):
    return np.random.default_rng(seed)


def _model(nodes, inputs, outputs, initializers=(), opset=OPSET, name="seed"):
    """A ModelProto; outputs given by name take their types from ONNX shape inference."""
    declared = [o for o in outputs if not isinstance(o, str)]
    graph = helper.make_graph(nodes, name, inputs, declared, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                              producer_name="nnrun_tools.fuzz")
    if len(declared) < len(outputs):
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
        del model.graph.output[:]
        model.graph.output.extend(inferred[o] if isinstance(o, str) else o for o in outputs)
    return model


def _typed(name, array):
    """An initializer kept in its typed field (float_data, int64_data, ...), not in raw_data."""
    array = np.asarray(array)
    kind = helper.np_dtype_to_tensor_dtype(array.dtype)
    return helper.make_tensor(name, kind, array.shape, array.flatten().tolist(), raw=False)


def _value(name, kind, shape):
    return helper.make_tensor_value_info(name, kind, shape)


# -- ONNX -------------------------------------------------------------------------------------------

def onnx_conv():
    """Conv (pads, dilations, groups, strides) + BatchNormalization + Relu, pooling, Clip, Gemm."""
    r = _rng(1)
    inits = [
        numpy_helper.from_array(r.standard_normal((8, 2, 3, 3)).astype(np.float32) * 0.3, "w1"),
        _typed("b1", r.standard_normal(8).astype(np.float32)),
        numpy_helper.from_array(r.uniform(0.5, 1.5, 8).astype(np.float32), "scale"),
        numpy_helper.from_array(r.standard_normal(8).astype(np.float32), "bias"),
        _typed("mean", r.standard_normal(8).astype(np.float32) * 0.1),
        numpy_helper.from_array(r.uniform(0.5, 1.5, 8).astype(np.float32), "var"),
        numpy_helper.from_array(r.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3, "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        _typed("hi", np.array(6.0, np.float32)),
        numpy_helper.from_array(r.standard_normal((5, 8)).astype(np.float32) * 0.3, "fc"),
        _typed("fc_bias", r.standard_normal(5).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[2, 1, 2, 1],
                         dilations=[2, 1], group=2, kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["bn"], name="bn",
                         epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], name="dwconv", group=8, strides=[2, 2],
                         auto_pad="SAME_UPPER"),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip"),
        helper.make_node("AveragePool", ["r2"], ["p2"], name="avgpool", kernel_shape=[2, 2],
                         pads=[0, 0, 1, 1], count_include_pad=1),
        helper.make_node("GlobalAveragePool", ["p2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc", "fc_bias"], ["logits"], name="fc", transB=1, alpha=0.5),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    return _model(nodes, [_value("x", F, [1, 4, 12, 12])], [_value("y", F, [1, 5])], inits, name="conv")


def onnx_shapes():
    """MatMul, then shape plumbing: Reshape, Transpose, Slice, Concat, Pad, Cast, Gather,
    Shape -> ConstantOfShape, Expand, Tile, Range from Constant nodes."""
    r = _rng(2)
    inits = [
        numpy_helper.from_array(r.standard_normal((4, 6)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([2, 3, 2, 3], np.int64), "shape4"),
        _typed("starts", np.array([0, 1], np.int64)),
        _typed("ends", np.array([2, 3], np.int64)),
        _typed("axes", np.array([1, 3], np.int64)),
        _typed("steps", np.array([1, 2], np.int64)),
        numpy_helper.from_array(np.array([0, 1, 0, 0, 0, 1, 0, 0], np.int64), "pads"),
        _typed("indices", np.array([[0, 2], [1, 1]], np.int64)),
        numpy_helper.from_array(np.array([2, 1, 4], np.int64), "expand_to"),
        numpy_helper.from_array(np.array([1, 2, 1], np.int64), "repeats"),
        numpy_helper.from_array(np.array([1], np.int64), "reduce_axes"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Reshape", ["mm", "shape4"], ["rs"], name="reshape"),
        helper.make_node("Transpose", ["rs"], ["tr"], name="transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Slice", ["tr", "starts", "ends", "axes", "steps"], ["sl"], name="slice"),
        helper.make_node("Concat", ["sl", "sl"], ["cat"], name="concat", axis=1),
        helper.make_node("Pad", ["cat", "pads"], ["pad"], name="pad", mode="constant"),
        helper.make_node("Cast", ["pad"], ["half"], name="to_half", to=F16),
        helper.make_node("Cast", ["half"], ["y"], name="to_float", to=F),
        helper.make_node("Gather", ["x", "indices"], ["ga"], name="gather", axis=1),
        helper.make_node("Shape", ["x"], ["sh"], name="shape"),
        helper.make_node("ConstantOfShape", ["sh"], ["ones"], name="fill",
                         value=numpy_helper.from_array(np.array([1.5], np.float32))),
        helper.make_node("Add", ["x", "ones"], ["x1"], name="add_ones"),
        helper.make_node("ReduceSum", ["x1", "reduce_axes"], ["row"], name="reduce", keepdims=1),
        helper.make_node("Expand", ["row", "expand_to"], ["ex"], name="expand"),
        helper.make_node("Tile", ["ex", "repeats"], ["z"], name="tile"),
        helper.make_node("Constant", [], ["start"], name="start", value_int=1),
        helper.make_node("Constant", [], ["limit"], name="limit",
                         value=numpy_helper.from_array(np.array(9, np.int64))),
        helper.make_node("Constant", [], ["delta"], name="delta", value_ints=[2]),
        helper.make_node("Squeeze", ["delta"], ["delta0"], name="squeeze"),
        helper.make_node("Range", ["start", "limit", "delta0"], ["rng"], name="range"),
        helper.make_node("Cast", ["rng"], ["rngf"], name="range_float", to=F),
        helper.make_node("Mul", ["ga", "rngf"], ["g"], name="scale"),
    ]
    outputs = ["y", "z", "g"]
    return _model(nodes, [_value("x", F, [2, 3, 4])], outputs, inits, name="shapes")


def onnx_select():
    """Resize, TopK, ArgMax, Softmax and a reduction on an input with a symbolic batch."""
    inits = [
        numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales"),
        numpy_helper.from_array(np.array([3], np.int64), "k"),
    ]
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["up"], name="resize", mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("Resize", ["x", "", "scales"], ["near"], name="resize_nearest", mode="nearest",
                         nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
        helper.make_node("Add", ["up", "near"], ["both"], name="add"),
        helper.make_node("TopK", ["both", "k"], ["top", "top_i"], name="topk", axis=-1, largest=1),
        helper.make_node("ArgMax", ["both"], ["am"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Softmax", ["top"], ["sm"], name="softmax", axis=1),
        helper.make_node("ReduceMean", ["sm"], ["y"], name="mean", axes=[2, 3], keepdims=1),
    ]
    outputs = ["y", "top_i", "am"]
    return _model(nodes, [_value("x", F, ["N", 3, 4, 4])], outputs, inits, name="select")


def onnx_control():
    """If with two branch bodies reading an outer value, Loop with a carried value and a scan
    output, and sequence ops (SplitToSequence, SequenceAt, SequenceConstruct, ConcatFromSequence)."""
    then_body = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["then_out"], name="then_add")], "then", [],
        [_value("then_out", F, [2, 3])])
    else_body = helper.make_graph(
        [helper.make_node("Mul", ["x", "c"], ["else_out"], name="else_mul"),
         helper.make_node("Neg", ["else_out"], ["else_neg"], name="else_neg")], "else", [],
        [_value("else_neg", F, [2, 3])])
    loop_body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"], name="body_add"),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], name="body_sum", keepdims=0),
         helper.make_node("Less", ["total", "ten"], ["cond_out"], name="body_less"),
         helper.make_node("Identity", ["acc_out"], ["scan_out"], name="body_scan")],
        "body", [_value("i", I64, []), _value("cond_in", B, []), _value("acc_in", F, [2, 3])],
        [_value("cond_out", B, []), _value("acc_out", F, [2, 3]), _value("scan_out", F, [2, 3])],
        [numpy_helper.from_array(np.array(100, np.float32), "ten")])
    inits = [
        numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "c"),
        numpy_helper.from_array(np.array(4, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "go"),
        _typed("acc0", np.zeros((2, 3), np.float32)),
        numpy_helper.from_array(np.array(1, np.int64), "at"),
    ]
    nodes = [
        helper.make_node("If", ["flag"], ["branch"], name="if", then_branch=then_body, else_branch=else_body),
        helper.make_node("Loop", ["trips", "go", "acc0"], ["acc", "scans"], name="loop", body=loop_body),
        helper.make_node("SplitToSequence", ["branch"], ["rows"], name="split", axis=0),
        helper.make_node("SequenceAt", ["rows", "at"], ["row"], name="at"),
        helper.make_node("SequenceConstruct", ["row", "row", "acc"], ["seq"], name="construct"),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], name="concat", axis=0),
    ]
    outputs = [_value("y", F, [4, 3]), "scans"]
    return _model(nodes, [_value("x", F, [2, 3]), _value("flag", B, [])], outputs, inits, opset=16,
                  name="control")


def onnx_external():
    """MatMul + Add + Relu whose weights lie in `weights.bin` beside the model."""
    r = _rng(3)
    inits = [numpy_helper.from_array(r.standard_normal((8, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(r.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array(r.standard_normal((16, 4)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
             helper.make_node("Add", ["mm", "b"], ["add"], name="add"),
             helper.make_node("Relu", ["add"], ["act"], name="relu"),
             helper.make_node("MatMul", ["act", "w2"], ["y"], name="matmul2")]
    model = _model(nodes, [_value("x", F, [2, 8])], [_value("y", F, [2, 4])], inits, name="external")
    data = bytearray()
    for tensor in model.graph.initializer:
        raw = tensor.raw_data
        data += b"\0" * (-len(data) % 64)
        external_data_helper.set_external_data(tensor, "weights.bin", offset=len(data), length=len(raw))
        data += raw
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
    return model, (("weights.bin", bytes(data)),)


def onnx_seeds():
    seeds = [Seed(name, "onnx", make().SerializeToString()) for name, make in (
        ("onnx_conv", onnx_conv), ("onnx_shapes", onnx_shapes), ("onnx_select", onnx_select),
        ("onnx_control", onnx_control))]
    model, files = onnx_external()
    seeds.append(Seed("onnx_external", "onnx", model.SerializeToString(), files))
    seeds.append(Seed("tiny_cnn", "onnx", build_models.make("tiny_cnn").SerializeToString()))
    bert = build_models.make("bert", hidden=16, heads=2, layers=1, vocab=40, seq=8)
    seeds.append(Seed("bert_small", "onnx", bert.SerializeToString()))
    return seeds


# -- TFLite -----------------------------------------------------------------------------------------

_TFLITE_TYPES = {np.dtype(np.float32): tflite.TensorType.FLOAT32, np.dtype(np.float16): tflite.TensorType.FLOAT16,
                 np.dtype(np.int32): tflite.TensorType.INT32, np.dtype(np.int64): tflite.TensorType.INT64,
                 np.dtype(np.int8): tflite.TensorType.INT8, np.dtype(np.uint8): tflite.TensorType.UINT8}


class TfliteWriter:
    """One subgraph of a .tflite model, written with the schema's generated builders.

    Tensors and operators are described first and serialized by `finish`, because a flatbuffer
    is built leaves first: buffers, then tensors, then the operators that name them.
    """

    def __init__(self):
        self.buffers = [b""]  # buffer 0 is the empty one every schema-conformant file starts with
        self.tensors = []
        self.operators = []
        self.opcodes = []

    def tensor(self, name, shape, dtype=np.float32, data=None, quantization=None, sparsity=None):
        """Add a tensor and return its index; `data` (bytes or an array) makes it a constant.

        quantization: {"scale": [...], "zero_point": [...], "axis": k}. sparsity: {"traversal_order",
        "block_map", "dim_metadata": [{"format": "DENSE", "dense_size": n} or {"format":
        "SPARSE_CSR", "segments": [...], "indices": [...]}]}.
        """
        buffer = 0
        if data is not None:
            self.buffers.append(data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes())
            buffer = len(self.buffers) - 1
        self.tensors.append(dict(name=name, shape=list(shape), type=_TFLITE_TYPES[np.dtype(dtype)],
                                 buffer=buffer, quantization=quantization, sparsity=sparsity))
        return len(self.tensors) - 1

    def constant(self, name, array, **kw):
        array = np.asarray(array)
        return self.tensor(name, array.shape, array.dtype, array, **kw)

    def operator(self, op, inputs, outputs, options=None, **fields):
        """Add an operator: `options` names its BuiltinOptions table, `fields` its values."""
        if op not in self.opcodes:
            self.opcodes.append(op)
        self.operators.append((self.opcodes.index(op), list(inputs), list(outputs), options, fields))

    def finish(self, inputs, outputs):
        b = flatbuffers.Builder(4096)

        def table(name, **fields):
            getattr(tflite, f"{name}Start")(b)
            for key, value in fields.items():
                if value is not None:
                    getattr(tflite, f"{name}Add{key}")(b, value)
            return getattr(tflite, f"{name}End")(b)

        def ints(values, dtype=np.int32):
            return b.CreateNumpyVector(np.asarray(values, dtype=dtype))

        def offsets(items):
            b.StartVector(4, len(items), 4)
            for item in reversed(items):
                b.PrependUOffsetTRelative(item)
            return b.EndVector()

        buffer_tables = []
        for data in self.buffers:
            vector = None
            if data:
                b.StartVector(1, len(data), 16)  # 16-byte aligned, as TFLite's converter writes them
                b.head -= len(data)
                b.Bytes[b.head:b.head + len(data)] = data
                vector = b.EndVector()
            buffer_tables.append(table("Buffer", Data=vector))
        tensor_tables = []
        for t in self.tensors:
            quantization = sparsity = None
            if t["quantization"]:
                q = t["quantization"]
                quantization = table("QuantizationParameters",
                                     Scale=b.CreateNumpyVector(np.asarray(q["scale"], np.float32)),
                                     ZeroPoint=ints(q["zero_point"], np.int64),
                                     QuantizedDimension=q.get("axis", 0))
            if t["sparsity"]:
                sparsity = self._sparsity(b, table, ints, offsets, t["sparsity"])
            tensor_tables.append(table("Tensor", Shape=ints(t["shape"]), Type=t["type"], Buffer=t["buffer"],
                                       Name=b.CreateString(t["name"]), Quantization=quantization,
                                       Sparsity=sparsity))
        operator_tables = []
        for opcode, op_inputs, op_outputs, options, fields in self.operators:
            options_table = table(options, **fields) if options else None
            operator_tables.append(table(
                "Operator", OpcodeIndex=opcode, Inputs=ints(op_inputs), Outputs=ints(op_outputs),
                BuiltinOptionsType=getattr(tflite.BuiltinOptions, options) if options else None,
                BuiltinOptions=options_table))
        code_tables = []
        for op in self.opcodes:
            code = getattr(tflite.BuiltinOperator, op)
            code_tables.append(table("OperatorCode", DeprecatedBuiltinCode=min(code, 127), BuiltinCode=code,
                                     Version=1))
        graph = table("SubGraph", Tensors=offsets(tensor_tables), Inputs=ints(inputs), Outputs=ints(outputs),
                      Operators=offsets(operator_tables), Name=b.CreateString("main"))
        model = table("Model", Version=3, OperatorCodes=offsets(code_tables), Subgraphs=offsets([graph]),
                      Buffers=offsets(buffer_tables), Description=b.CreateString("nnrun_tools.fuzz seed"))
        b.Finish(model, file_identifier=b"TFL3")
        return bytes(b.Output())

    @staticmethod
    def _sparsity(b, table, ints, offsets, sparsity):
        dims = []
        for d in sparsity["dim_metadata"]:
            if d["format"] == "DENSE":
                dims.append(table("DimensionMetadata", Format=tflite.DimensionType.DENSE, DenseSize=d["dense_size"]))
                continue
            segments = table("Int32Vector", Values=ints(d["segments"]))
            indices = table("Int32Vector", Values=ints(d["indices"]))
            dims.append(table("DimensionMetadata", Format=tflite.DimensionType.SPARSE_CSR,
                              ArraySegmentsType=tflite.SparseIndexVector.Int32Vector, ArraySegments=segments,
                              ArrayIndicesType=tflite.SparseIndexVector.Int32Vector, ArrayIndices=indices))
        return table("SparsityParameters", TraversalOrder=ints(sparsity["traversal_order"]),
                     BlockMap=ints(sparsity.get("block_map", [])), DimMetadata=offsets(dims))


def _f32(r, *shape, scale=0.3):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def tflite_conv():
    """CONV_2D (SAME, stride 2, RELU6) -> DEPTHWISE_CONV_2D (VALID, dilation 2) -> AVERAGE_POOL_2D
    -> RESHAPE -> FULLY_CONNECTED -> SOFTMAX."""
    r = _rng(4)
    w = TfliteWriter()
    x = w.tensor("x", [1, 12, 12, 3])
    c1 = w.tensor("conv", [1, 6, 6, 4])
    w.operator("CONV_2D", [x, w.constant("conv_w", _f32(r, 4, 3, 3, 3)), w.constant("conv_b", _f32(r, 4))],
               [c1], "Conv2DOptions", Padding=tflite.Padding.SAME, StrideW=2, StrideH=2,
               FusedActivationFunction=tflite.ActivationFunctionType.RELU6)
    c2 = w.tensor("dwconv", [1, 2, 2, 8])
    w.operator("DEPTHWISE_CONV_2D", [c1, w.constant("dw_w", _f32(r, 1, 3, 3, 8)), w.constant("dw_b", _f32(r, 8))],
               [c2], "DepthwiseConv2DOptions", Padding=tflite.Padding.VALID, StrideW=1, StrideH=1,
               DepthMultiplier=2, DilationWFactor=2, DilationHFactor=2)
    p = w.tensor("pool", [1, 1, 1, 8])
    w.operator("AVERAGE_POOL_2D", [c2], [p], "Pool2DOptions", Padding=tflite.Padding.VALID, StrideW=2,
               StrideH=2, FilterWidth=2, FilterHeight=2)
    flat = w.tensor("flat", [1, 8])
    w.operator("RESHAPE", [p, w.constant("new_shape", np.array([1, -1], np.int32))], [flat])
    fc = w.tensor("fc", [1, 5])
    w.operator("FULLY_CONNECTED", [flat, w.constant("fc_w", _f32(r, 5, 8)), w.constant("fc_b", _f32(r, 5))],
               [fc], "FullyConnectedOptions")
    y = w.tensor("y", [1, 5])
    w.operator("SOFTMAX", [fc], [y], "SoftmaxOptions", Beta=1.0)
    return w.finish([x], [y])


def tflite_quantized():
    """An int8 input and int8 (per-channel) and float16 weights, made float by DEQUANTIZE,
    into CONV_2D and ADD."""
    r = _rng(5)
    w = TfliteWriter()
    xq = w.tensor("x", [1, 5, 5, 2], np.int8, quantization={"scale": [0.05], "zero_point": [-3]})
    xf = w.tensor("x_float", [1, 5, 5, 2])
    w.operator("DEQUANTIZE", [xq], [xf])
    wq = w.constant("w_int8", r.integers(-127, 128, (3, 1, 1, 2)).astype(np.int8),
                    quantization={"scale": [0.01, 0.02, 0.03], "zero_point": [0, 0, 0], "axis": 0})
    wf = w.tensor("w_float", [3, 1, 1, 2])
    w.operator("DEQUANTIZE", [wq], [wf])
    conv = w.tensor("conv", [1, 5, 5, 3])
    w.operator("CONV_2D", [xf, wf, w.constant("conv_b", _f32(r, 3))], [conv], "Conv2DOptions",
               Padding=tflite.Padding.SAME, StrideW=1, StrideH=1)
    hq = w.constant("bias_half", r.standard_normal(3).astype(np.float16))
    hf = w.tensor("bias_float", [3])
    w.operator("DEQUANTIZE", [hq], [hf])
    y = w.tensor("y", [1, 5, 5, 3])
    w.operator("ADD", [conv, hf], [y], "AddOptions", FusedActivationFunction=tflite.ActivationFunctionType.RELU)
    return w.finish([xq], [y])


def tflite_sparse():
    """A 4x6 weight stored sparse (dim 0 dense, dim 1 CSR), DENSIFY, then FULLY_CONNECTED."""
    w = TfliteWriter()
    segments, indices, values = [0, 2, 3, 3, 6], [0, 4, 1, 2, 3, 5], np.arange(1, 7, dtype=np.float32) / 4
    sparse = w.constant("w_sparse", values)
    w.tensors[sparse]["shape"] = [4, 6]
    w.tensors[sparse]["sparsity"] = {"traversal_order": [0, 1], "block_map": [], "dim_metadata": [
        {"format": "DENSE", "dense_size": 4}, {"format": "SPARSE_CSR", "segments": segments, "indices": indices}]}
    dense = w.tensor("w_dense", [4, 6])
    w.operator("DENSIFY", [sparse], [dense])
    x = w.tensor("x", [2, 6])
    y = w.tensor("y", [2, 4])
    w.operator("FULLY_CONNECTED", [x, dense, -1], [y], "FullyConnectedOptions",
               FusedActivationFunction=tflite.ActivationFunctionType.RELU_N1_TO_1)
    return w.finish([x], [y])


def tflite_tensor_ops():
    """MAX_POOL_2D, RESIZE_BILINEAR, CONCATENATION, TRANSPOSE, STRIDED_SLICE, PAD, GATHER, MEAN."""
    w = TfliteWriter()
    x = w.tensor("x", [1, 4, 4, 2])
    pool = w.tensor("pool", [1, 2, 2, 2])
    w.operator("MAX_POOL_2D", [x], [pool], "Pool2DOptions", Padding=tflite.Padding.VALID, StrideW=2, StrideH=2,
               FilterWidth=2, FilterHeight=2)
    up = w.tensor("up", [1, 4, 4, 2])
    w.operator("RESIZE_BILINEAR", [pool, w.constant("size", np.array([4, 4], np.int32))], [up],
               "ResizeBilinearOptions", HalfPixelCenters=True)
    cat = w.tensor("cat", [1, 4, 4, 4])
    w.operator("CONCATENATION", [x, up], [cat], "ConcatenationOptions", Axis=3)
    tr = w.tensor("transposed", [1, 4, 4, 4])
    w.operator("TRANSPOSE", [cat, w.constant("perm", np.array([0, 2, 1, 3], np.int32))], [tr])
    sl = w.tensor("sliced", [1, 2, 4, 2])
    w.operator("STRIDED_SLICE", [tr, w.constant("begin", np.array([0, 1, 0, 0], np.int32)),
                                 w.constant("end", np.array([1, 4, 4, 4], np.int32)),
                                 w.constant("strides", np.array([1, 2, 1, 2], np.int32))], [sl],
               "StridedSliceOptions")
    pad = w.tensor("padded", [1, 3, 6, 2])
    w.operator("PAD", [sl, w.constant("paddings", np.array([[0, 0], [1, 0], [1, 1], [0, 0]], np.int32))],
               [pad])
    ga = w.tensor("gathered", [1, 3, 3, 2])
    w.operator("GATHER", [pad, w.constant("indices", np.array([0, 5, 2], np.int32))], [ga], "GatherOptions",
               Axis=2)
    y = w.tensor("y", [1, 1, 1, 2])
    w.operator("MEAN", [ga, w.constant("axes", np.array([1, 2], np.int32))], [y], "ReducerOptions", KeepDims=True)
    return w.finish([x], [y])


def tflite_seeds():
    return [Seed(name, "tflite", make()) for name, make in (
        ("tflite_conv", tflite_conv), ("tflite_quantized", tflite_quantized), ("tflite_sparse", tflite_sparse),
        ("tflite_tensor_ops", tflite_tensor_ops))]


def all_seeds():
    """Every seed, ONNX first, in a fixed order: a case picks its seed by position in this list."""
    return onnx_seeds() + tflite_seeds()
