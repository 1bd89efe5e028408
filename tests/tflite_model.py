"""One-operator .tflite models written with the flatbuffers Builder (the schema's generated builders
from the `tflite` package), and LiteRT's builtin kernels to run them: the oracle of TFLite tests."""

import flatbuffers
import numpy as np
from ai_edge_litert import interpreter as litert

TYPES = {np.dtype(np.float32): "FLOAT32", np.dtype(np.float16): "FLOAT16", np.dtype(np.int32): "INT32",
         np.dtype(np.int64): "INT64", np.dtype(np.uint8): "UINT8", np.dtype(np.int8): "INT8",
         np.dtype(np.bool_): "BOOL"}

# Op -> its BuiltinOptions table (None: no options).
OPTIONS = {
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "TRANSPOSE_CONV": "TransposeConvOptions", "MAX_POOL_2D": "Pool2DOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions", "FULLY_CONNECTED": "FullyConnectedOptions",
    "ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions",
    "CONCATENATION": "ConcatenationOptions", "RESHAPE": "ReshapeOptions", "SOFTMAX": "SoftmaxOptions",
    "RESIZE_BILINEAR": "ResizeBilinearOptions", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "DEPTH_TO_SPACE": "DepthToSpaceOptions", "SPACE_TO_DEPTH": "SpaceToDepthOptions",
    "STRIDED_SLICE": "StridedSliceOptions", "SQUEEZE": "SqueezeOptions", "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions", "GATHER": "GatherOptions",
    "SPLIT": "SplitOptions", "PACK": "PackOptions", "UNPACK": "UnpackOptions", "ARG_MAX": "ArgMaxOptions",
    "LEAKY_RELU": "LeakyReluOptions", "SHAPE": "ShapeOptions", "CAST": "CastOptions",
}
ENUMS = {"padding": "Padding", "fused_activation_function": "ActivationFunctionType",
         "output_type": "TensorType", "out_type": "TensorType", "in_data_type": "TensorType",
         "out_data_type": "TensorType"}


def _camel(name):
    return "".join(part.title() for part in name.split("_"))


def _module(name):
    return __import__(f"tflite.{name}", fromlist=[name])


def _enum_value(field, value):
    enum = getattr(_module(ENUMS[field]), ENUMS[field])
    return getattr(enum, value)


def build_tflite(op, inputs, n_outputs, attrs=None, custom_options=None):
    """A one-operator model: `inputs` are (name, array, constant?); outputs get no shape (LiteRT sizes them)."""
    attrs = attrs or {}
    b = flatbuffers.Builder(1024)
    m = {name: _module(name) for name in ("Model", "SubGraph", "Tensor", "Buffer", "Operator",
                                          "OperatorCode", "BuiltinOperator", "BuiltinOptions")}

    def int_vector(start, values):
        start(b, len(values))
        for v in reversed(values):
            b.PrependInt32(int(v))
        return b.EndVector()

    # Buffers: 0 is the empty sentinel.
    buffers, tensors = [None], []
    for name, array, constant in inputs:
        buffers.append(np.ascontiguousarray(array).tobytes() if constant else None)
        tensors.append((name, array.shape, np.dtype(array.dtype), len(buffers) - 1))
    for i in range(n_outputs):
        tensors.append((f"out{i}", None, None, 0))
    buffer_offsets = []
    for data in buffers:
        vec = None
        if data is not None:
            b.StartVector(1, len(data), 16)
            b.head = b.head - len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            vec = b.EndVector()
        m["Buffer"].BufferStart(b)
        if vec is not None:
            m["Buffer"].BufferAddData(b, vec)
        buffer_offsets.append(m["Buffer"].BufferEnd(b))
    tensor_offsets = []
    out_dtype = attrs.pop("_out_dtype", None)
    for name, shape, dtype, buf in tensors:
        name_off = b.CreateString(name)
        shape_off = int_vector(m["Tensor"].TensorStartShapeVector, list(shape)) if shape is not None else None
        m["Tensor"].TensorStart(b)
        m["Tensor"].TensorAddName(b, name_off)
        if shape_off is not None:
            m["Tensor"].TensorAddShape(b, shape_off)
        tname = TYPES[dtype] if dtype is not None else (out_dtype or "FLOAT32")
        m["Tensor"].TensorAddType(b, _enum_value("out_type", tname))
        m["Tensor"].TensorAddBuffer(b, buf)
        tensor_offsets.append(m["Tensor"].TensorEnd(b))
    # Options
    options_off, options_type = None, 0
    table = OPTIONS.get(op)
    if table is not None and custom_options is None:
        mod = _module(table)
        vectors = {}
        for field, value in attrs.items():
            if isinstance(value, (list, tuple)):
                vectors[field] = int_vector(getattr(mod, f"{table}Start{_camel(field)}Vector"), value)
        getattr(mod, f"{table}Start")(b)
        for field, value in attrs.items():
            add = getattr(mod, f"{table}Add{_camel(field)}")
            if field in vectors:
                add(b, vectors[field])
            elif field in ENUMS:
                add(b, _enum_value(field, value))
            else:
                add(b, value)
        options_off = getattr(mod, f"{table}End")(b)
        options_type = getattr(m["BuiltinOptions"].BuiltinOptions, table)
    custom_off = None
    if custom_options is not None:
        custom_off = b.CreateByteVector(custom_options)
    n_in = len(inputs)
    op_inputs = int_vector(m["Operator"].OperatorStartInputsVector, list(range(n_in)))
    op_outputs = int_vector(m["Operator"].OperatorStartOutputsVector, list(range(n_in, n_in + n_outputs)))
    m["Operator"].OperatorStart(b)
    m["Operator"].OperatorAddOpcodeIndex(b, 0)
    m["Operator"].OperatorAddInputs(b, op_inputs)
    m["Operator"].OperatorAddOutputs(b, op_outputs)
    if options_off is not None:
        m["Operator"].OperatorAddBuiltinOptionsType(b, options_type)
        m["Operator"].OperatorAddBuiltinOptions(b, options_off)
    if custom_off is not None:
        m["Operator"].OperatorAddCustomOptions(b, custom_off)
    operator = m["Operator"].OperatorEnd(b)

    graph_inputs = [i for i, (_, _, constant) in enumerate(inputs) if not constant]
    sg = m["SubGraph"]
    tensors_vec = _offset_vector(b, sg.SubGraphStartTensorsVector, tensor_offsets)
    inputs_vec = int_vector(sg.SubGraphStartInputsVector, graph_inputs)
    outputs_vec = int_vector(sg.SubGraphStartOutputsVector, list(range(n_in, n_in + n_outputs)))
    ops_vec = _offset_vector(b, sg.SubGraphStartOperatorsVector, [operator])
    sg.SubGraphStart(b)
    sg.SubGraphAddTensors(b, tensors_vec)
    sg.SubGraphAddInputs(b, inputs_vec)
    sg.SubGraphAddOutputs(b, outputs_vec)
    sg.SubGraphAddOperators(b, ops_vec)
    subgraph = sg.SubGraphEnd(b)

    oc = m["OperatorCode"]
    custom_name = b.CreateString(op) if custom_options is not None else None
    code = 32 if custom_options is not None else getattr(m["BuiltinOperator"].BuiltinOperator, op)
    oc.OperatorCodeStart(b)
    oc.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
    oc.OperatorCodeAddBuiltinCode(b, code)
    oc.OperatorCodeAddVersion(b, 1)
    if custom_name is not None:
        oc.OperatorCodeAddCustomCode(b, custom_name)
    opcode = oc.OperatorCodeEnd(b)

    md = m["Model"]
    codes_vec = _offset_vector(b, md.ModelStartOperatorCodesVector, [opcode])
    subgraphs_vec = _offset_vector(b, md.ModelStartSubgraphsVector, [subgraph])
    buffers_vec = _offset_vector(b, md.ModelStartBuffersVector, buffer_offsets)
    md.ModelStart(b)
    md.ModelAddVersion(b, 3)
    md.ModelAddOperatorCodes(b, codes_vec)
    md.ModelAddSubgraphs(b, subgraphs_vec)
    md.ModelAddBuffers(b, buffers_vec)
    b.Finish(md.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _offset_vector(b, start, offsets):
    start(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def run_litert(model, feeds):
    # Without XNNPACK: LiteRT's own builtin kernels are the oracle (XNNPACK rejects some tiny graphs).
    interp = litert.Interpreter(model_content=model, experimental_op_resolver_type=(
        litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
