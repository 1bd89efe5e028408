"""The TFLite loader: the ir.Graph it builds, its verification, and that it reads no weight byte.

Small models are written here with the flatbuffers Builder following TFLite's schema
(`tflite_model`); the real ones are mediapipe's, checked against the `tflite` package's
reader and LiteRT's interpreter.
"""

import random
import struct

import flatbuffers
import numpy as np
import pytest
import tflite

from nnrun import ModelError
from nnrun.loader import load_model
from nnrun.loader.mapped import ExternalData
from nnrun_tools.fetch_models import MODELS, require_real_model

F32 = tflite.TensorType.FLOAT32


def tflite_model(tensors, operators, inputs, outputs, opcodes=("ADD",), buffers=(),
                 version=3, identifier=b"TFL3", appended=b""):
    """The bytes of a one-subgraph TFLite model.

    tensors: dicts with name, shape, and optionally type, buffer, signature, scale/zero_point/axis,
    and dense_sizes: the tensor is sparse, stored in dense levels of these sizes.
    operators: (opcode index, inputs, outputs[, options class name, {field: value}][, custom bytes]).
    opcodes: builtin names, or ("CUSTOM", code). buffers: data bytes, or (offset, size) for data
    stored after the flatbuffer (`appended`); buffer 0 is the empty one, added here.
    """
    b = flatbuffers.Builder(1024)

    def table(name, **fields):
        getattr(tflite, f"{name}Start")(b)
        for key, value in fields.items():
            getattr(tflite, f"{name}Add{key}")(b, value)
        return getattr(tflite, f"{name}End")(b)

    def ints(values):
        return b.CreateNumpyVector(np.asarray(values, dtype=np.int32))

    def offsets(items):
        b.StartVector(4, len(items), 4)
        for item in reversed(items):
            b.PrependUOffsetTRelative(item)
        return b.EndVector()

    buffer_tables = [table("Buffer")]
    for data in buffers:
        if isinstance(data, tuple):
            buffer_tables.append(table("Buffer", Offset=data[0], Size=data[1]))
        else:
            buffer_tables.append(table("Buffer", Data=b.CreateByteVector(data)))
    tensor_tables = []
    for t in tensors:
        fields = {"Shape": ints(t["shape"]), "Type": t.get("type", F32),
                  "Buffer": t.get("buffer", 0)}
        if t.get("name") is not None:
            fields["Name"] = b.CreateString(t["name"])
        if "signature" in t:
            fields["ShapeSignature"] = ints(t["signature"])
        if "scale" in t:
            scale = b.CreateNumpyVector(np.asarray(t["scale"], dtype=np.float32))
            zero = b.CreateNumpyVector(np.asarray(t["zero_point"], dtype=np.int64))
            fields["Quantization"] = table("QuantizationParameters", Scale=scale, ZeroPoint=zero,
                                           QuantizedDimension=t.get("axis", 0))
        if "dense_sizes" in t:
            levels = [table("DimensionMetadata", Format=tflite.DimensionType.DENSE, DenseSize=n)
                      for n in t["dense_sizes"]]
            fields["Sparsity"] = table("SparsityParameters", TraversalOrder=ints(range(len(levels))),
                                       DimMetadata=offsets(levels))
        tensor_tables.append(table("Tensor", **fields))
    op_tables = []
    for op in operators:
        opcode, op_inputs, op_outputs, *rest = op
        fields = {"OpcodeIndex": opcode, "Inputs": ints(op_inputs), "Outputs": ints(op_outputs)}
        if rest and isinstance(rest[0], bytes):
            fields["CustomOptions"] = b.CreateByteVector(rest[0])
        elif rest:
            kind, values = rest
            fields["BuiltinOptionsType"] = getattr(tflite.BuiltinOptions, kind)
            fields["BuiltinOptions"] = table(kind, **values)
        op_tables.append(table("Operator", **fields))
    code_tables = []
    for code in opcodes:
        if isinstance(code, tuple):
            custom = b.CreateString(code[1])
            code_tables.append(table("OperatorCode", BuiltinCode=tflite.BuiltinOperator.CUSTOM,
                                     DeprecatedBuiltinCode=tflite.BuiltinOperator.CUSTOM,
                                     CustomCode=custom, Version=1))
        else:
            value = getattr(tflite.BuiltinOperator, code)
            code_tables.append(table("OperatorCode", BuiltinCode=value,
                                     DeprecatedBuiltinCode=min(value, 127), Version=2))
    graph = table("SubGraph", Tensors=offsets(tensor_tables), Inputs=ints(inputs),
                  Outputs=ints(outputs), Operators=offsets(op_tables))
    model = table("Model", Version=version, OperatorCodes=offsets(code_tables),
                  Subgraphs=offsets([graph]), Buffers=offsets(buffer_tables))
    b.Finish(model, file_identifier=identifier)
    return bytes(b.Output()) + appended


def _f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


FILTER = _f32(3, 1, 1, 2)
ADDEND = _f32(3, seed=1)


def small_model(**changes):
    """x -> CONV_2D (no bias, RELU6, SAME, stride 2) -> ADD const -> y, plus a custom op."""
    spec = dict(
        tensors=[
            {"name": "x", "shape": [1, 4, 4, 2], "signature": [-1, 4, 4, 2]},
            {"name": "w", "shape": [3, 1, 1, 2], "buffer": 1},
            {"name": "dup", "shape": [1, 2, 2, 3]},
            {"name": "dup", "shape": [3], "buffer": 2},
            {"name": "", "shape": [1, 2, 2, 3], "scale": [0.5], "zero_point": [3]},
            {"name": "y", "shape": [1, 2, 2, 3]},
        ],
        operators=[
            (0, [0, 1, -1], [2], "Conv2DOptions",
             {"Padding": tflite.Padding.SAME, "StrideW": 2, "StrideH": 2,
              "FusedActivationFunction": tflite.ActivationFunctionType.RELU6}),
            (1, [2, 3], [4], "AddOptions", {"PotScaleInt16": True}),
            (2, [4], [5], b"\x01\x02opts"),
        ],
        inputs=[0], outputs=[5],
        opcodes=("CONV_2D", "ADD", ("CUSTOM", "MyCustom")),
        buffers=[FILTER.tobytes(), ADDEND.tobytes()],
    )
    spec.update(changes)
    return tflite_model(**spec)


def test_small_model_graph():
    g = load_model(small_model())
    assert g.format == "tflite" and g.opsets == {"tflite": 1} and g.path is None
    assert [(v.name, v.dtype, v.dims) for v in g.inputs] == [("x", np.float32, (None, 4, 4, 2))]
    assert [(v.name, v.dims) for v in g.outputs] == [("y", (1, 2, 2, 3))]
    assert set(g.initializers) == {"w", "dup#3"}
    w = g.initializers["w"]
    assert isinstance(w, ExternalData) and w.source is g.source
    np.testing.assert_array_equal(w.array(), FILTER)
    np.testing.assert_array_equal(g.initializers["dup#3"].array(), ADDEND)
    conv, add, custom = g.nodes
    assert (conv.op_type, conv.domain, conv.inputs, conv.outputs) == \
        ("CONV_2D", "tflite", ["x", "w", ""], ["dup#2"])
    assert conv.attrs["padding"] == "SAME" and conv.attrs["fused_activation_function"] == "RELU6"
    assert (conv.attrs["stride_w"], conv.attrs["stride_h"], conv.attrs["dilation_w_factor"]) == (2, 2, 1)
    assert conv.attrs["tflite_opcode_version"] == 2
    assert (add.inputs, add.outputs, add.name) == (["dup#2", "dup#3"], ["t4"], "ADD_1")
    assert add.attrs["pot_scale_int16"] is True and add.attrs["fused_activation_function"] == "NONE"
    q = add.attrs["quantization"]["t4"]
    assert q["scale"].tolist() == [0.5] and q["zero_point"].tolist() == [3] and q["axis"] == 0
    assert (custom.domain, custom.op_type, custom.name) == ("tflite.custom", "MyCustom", "y")
    assert custom.attrs["custom_options"] == b"\x01\x02opts"


def test_path_and_bytes_agree(tmp_path):
    data = small_model()
    path = tmp_path / "m.bin"  # found by its identifier, not its name
    path.write_bytes(data)
    from_file, from_bytes = load_model(path), load_model(data)
    assert from_file.path == str(path)
    assert [n.inputs for n in from_file.nodes] == [n.inputs for n in from_bytes.nodes]
    assert {k: v.offset for k, v in from_file.initializers.items()} == \
        {k: v.offset for k, v in from_bytes.initializers.items()}


def test_buffer_stored_after_the_flatbuffer():
    weights = _f32(3, 1, 1, 2, seed=5).tobytes()
    base = len(small_model(buffers=[(1 << 20, len(weights)), ADDEND.tobytes()]))
    pad = b"\0" * (-base % 16)
    data = small_model(buffers=[(base + len(pad), len(weights)), ADDEND.tobytes()],
                       appended=pad + weights)
    w = load_model(data).initializers["w"]
    assert w.offset == base + len(pad)
    assert w.array().tobytes() == weights


def test_large_file_reads_no_weight(tmp_path):
    chunks = [_f32(1024, 1024, seed=i) for i in range(4)]  # 16 MB of weights
    tensors = [{"name": "x", "shape": [1024]}]
    operators = []
    for i in range(4):
        tensors += [{"name": f"w{i}", "shape": [1024, 1024], "buffer": i + 1},
                    {"name": f"y{i}", "shape": [1024]}]
        prev = 0 if i == 0 else 2 * i
        operators.append((0, [prev, 2 * i + 1, -1], [2 * i + 2]))
    path = tmp_path / "big.tflite"
    path.write_bytes(tflite_model(tensors, operators, [0], [8], opcodes=("FULLY_CONNECTED",),
                                  buffers=[c.tobytes() for c in chunks]))
    g = load_model(path)
    resident = g.source.resident_bytes()
    assert resident is not None and resident < g.source.size // 20, (resident, g.source.size)
    np.testing.assert_array_equal(g.initializers["w2"].array(), chunks[2])


# malformed files


def _bad(**changes):
    return small_model(**changes)


def _tensors(**per_index):
    tensors = [dict(t) for t in _SMALL_TENSORS]
    for index, fields in per_index.items():
        tensors[int(index[1:])].update(fields)
    return tensors


_SMALL_TENSORS = [
    {"name": "x", "shape": [1, 4, 4, 2]},
    {"name": "w", "shape": [3, 1, 1, 2], "buffer": 1},
    {"name": "c", "shape": [1, 2, 2, 3]},
    {"name": "a", "shape": [3], "buffer": 2},
    {"name": "q", "shape": [1, 2, 2, 3]},
    {"name": "y", "shape": [1, 2, 2, 3]},
]
_OPS = [(0, [0, 1, -1], [2]), (1, [2, 3], [4]), (2, [4], [5], b"")]

MALFORMED = {
    "tensor index out of range": (dict(operators=[(0, [0, 1, 9], [2])] + _OPS[1:]),
                                  "tensor index 9 is out of range"),
    "graph output out of range": (dict(outputs=[6]), "output tensor index 6"),
    "buffer size not matching dims": (dict(tensors=_tensors(t1={"shape": [3, 1, 1, 3]})),
                                      "tensor 1 'w'.*needs 36 bytes"),
    "negative dims": (dict(tensors=_tensors(t2={"shape": [1, -2, 2, 3]})), "negative dimension"),
    "huge dims": (dict(tensors=_tensors(t1={"shape": [1 << 30, 1 << 30, 1 << 30, 4]})),
                  "claims more bytes"),
    "used before produced": (dict(operators=[_OPS[1], _OPS[0], _OPS[2]]),
                             "operator 0 \\(ADD\\): input 0 tensor 2 'c' is used before"),
    "cycle": (dict(operators=[(0, [0, 1, -1], [2]), (1, [2, 5], [4]), (2, [4], [5], b"")]),
              "operator 1 \\(ADD\\): input 1 tensor 5 'y' is used before"),
    "produced twice": (dict(operators=_OPS + [(1, [2, 3], [4])]), "already defined"),
    "one output listed twice": (dict(operators=[(0, [0, 1, -1], [2, 2])] + _OPS[1:]),
                                "already defined"),
    "opcode index out of range": (dict(operators=_OPS[:2] + [(3, [4], [5])]),
                                  "operator 2: opcode index 3 is out of range"),
    "optional input the op does not allow": (dict(operators=[_OPS[0], (1, [2, -1], [4]), _OPS[2]]),
                                             "input 1 is omitted"),
    "buffer index out of range": (dict(tensors=_tensors(t3={"buffer": 7})), "buffer index 7"),
    "offset/size buffer past the end": (dict(buffers=[(4096, 24), ADDEND.tobytes()]),
                                        "runs past the end"),
    "unknown tensor type": (dict(tensors=_tensors(t2={"type": 99})), "unknown tensor type 99"),
    "unsupported tensor type": (dict(tensors=_tensors(t2={"type": tflite.TensorType.STRING})),
                                "STRING is not supported"),
    "bad identifier": (dict(identifier=b"TFL2"), "identifier"),
    "schema version": (dict(version=2), "schema version 2"),
    "per-channel scales not matching": (dict(tensors=_tensors(
        t4={"scale": [0.5, 0.5], "zero_point": [0, 0], "axis": 3})), "2 quantization scales"),
    "scales and zero points differ": (dict(tensors=_tensors(
        t4={"scale": [0.5], "zero_point": [0, 0]})), "1 scales and 2 zero points"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed(case, tmp_path):
    changes, message = MALFORMED[case]
    spec = dict(tensors=_SMALL_TENSORS, operators=_OPS)
    spec.update(changes)
    data = small_model(**spec)
    path = tmp_path / "m.tflite"
    path.write_bytes(data)
    # Bytes without the identifier are not taken for TFLite; a .tflite file is.
    models = [path] if case == "bad identifier" else [path, data]
    for model in models:
        with pytest.raises(ModelError, match=message):
            load_model(model)


def test_unknown_builtin_code():
    data = bytearray(small_model(opcodes=("CONV_2D", "ADD", "CONV_2D")))
    g = load_model(bytes(data))
    assert [n.op_type for n in g.nodes] == ["CONV_2D", "ADD", "CONV_2D"]
    # The last opcode's builtin_code becomes one no schema has.
    code = tflite.Model.GetRootAsModel(data, 0).OperatorCodes(2)
    slot = code._tab.Offset(10)
    struct.pack_into("<i", data, code._tab.Pos + slot, 4000)
    with pytest.raises(ModelError, match="unknown builtin operator 4000"):
        load_model(bytes(data))


def test_truncated_everywhere(tmp_path):
    data = small_model()
    path = tmp_path / "cut.tflite"
    for cut in range(0, len(data), 3):
        path.write_bytes(data[:cut])
        for model in (data[:cut], path):
            with pytest.raises(ModelError):
                load_model(model)


def test_corrupted_bytes_raise_model_error_only():
    data = small_model()
    rng = random.Random(7)
    loaded = 0
    for _ in range(1500):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(8, len(corrupt))] = rng.randrange(256)
        try:
            load_model(bytes(corrupt))
            loaded += 1
        except ModelError:
            pass
    assert loaded < 1500  # the corruption is seen, at least sometimes


@pytest.mark.parametrize("size", [8, 64, 4096])
def test_random_garbage(size):
    rng = np.random.default_rng(size)
    for _ in range(50):
        garbage = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        garbage = garbage[:4] + b"TFL3" + garbage[8:]
        with pytest.raises(ModelError):
            load_model(garbage)


def test_hostile_vector_length_is_not_allocated():
    data = bytearray(small_model())
    graph = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
    vector = graph._tab.Vector(graph._tab.Offset(4)) - 4  # the tensors vector's length field
    struct.pack_into("<I", data, vector, 0xFFFFFFF0)
    with pytest.raises(ModelError, match="claims 4294967280 elements"):
        load_model(bytes(data))


# mediapipe's models

MEDIAPIPE = sorted(name for name, (package, _) in MODELS.items() if package == "mediapipe")


@pytest.mark.parametrize("name", MEDIAPIPE)
def test_mediapipe(name):
    from ai_edge_litert.interpreter import Interpreter

    path = require_real_model(*MODELS[name])
    g = load_model(path)
    assert g.source.resident_bytes() < g.source.size // 20  # structure only, no weight page
    model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    subgraph = model.Subgraphs(0)
    names = {}
    for i in range(subgraph.TensorsLength()):
        names.setdefault(subgraph.Tensors(i).Name().decode(), []).append(i)
    checked = 0
    for key, weight in g.initializers.items():
        index = int(key.rsplit("#", 1)[1]) if "#" in key else names[key][0]
        tensor = subgraph.Tensors(index)
        expected = model.Buffers(tensor.Buffer()).DataAsNumpy()
        assert weight.array().tobytes() == expected.tobytes(), key
        if tensor.Sparsity() is None:
            assert weight.shape == tuple(tensor.ShapeAsNumpy())
        checked += 1
    assert checked == sum(1 for i in range(subgraph.TensorsLength())
                          if model.Buffers(subgraph.Tensors(i).Buffer()).DataLength())
    interpreter = Interpreter(model_path=str(path))
    for ours, theirs in ((g.inputs, interpreter.get_input_details()),
                         (g.outputs, interpreter.get_output_details())):
        assert [v.name for v in ours] == [d["name"] for d in theirs]
        assert [v.dtype for v in ours] == [np.dtype(d["dtype"]) for d in theirs]
        assert [v.dims for v in ours] == [
            tuple(None if s == -1 else int(s) for s in d["shape_signature"]) for d in theirs]
    produced = {o for n in g.nodes for o in n.outputs}
    assert {v.name for v in g.outputs} <= produced | set(g.initializers)
    print(name, sorted({f"{n.domain}:{n.op_type}" for n in g.nodes}))
    for node in g.nodes:
        if node.op_type == "DENSIFY":
            sparsity = node.attrs["sparsity"]
            assert sparsity is g.tflite_sparsity[node.inputs[0]]
            assert len(sparsity["dim_metadata"]) == len(sparsity["traversal_order"])


def test_sparse_tensor_of_huge_dense_dims_is_refused_before_densifying():
    """A sparse weight of 4 stored values whose dense levels say 2^20 x 2^20: DENSIFY (at PREPARE)
    refuses it before it builds anything of that size, naming the node and what the file lacks."""
    import time

    import nnrun

    model = tflite_model(
        tensors=[{"name": "w", "shape": [1 << 20, 1 << 20], "buffer": 1, "dense_sizes": [1 << 20, 1 << 20]},
                 {"name": "dense", "shape": [1 << 20, 1 << 20]}],
        operators=[(0, [0], [1])], inputs=[], outputs=[1], opcodes=("DENSIFY",),
        buffers=[np.ones(4, np.float32).tobytes()])
    options = nnrun.SessionOptions()
    options.max_tensor_bytes = 1 << 30
    started = time.perf_counter()
    with pytest.raises(nnrun.ModelError) as e:
        nnrun.InferenceSession(model, sess_options=options)
    assert time.perf_counter() - started < 1.0  # a hang check, not a speed measurement
    assert str(e.value).startswith("PREPARE/infer_shapes: node 'dense' (DENSIFY, #0): sparsity level 1: the dense "
                                   "levels make 1,099,511,627,776 entries, the file has 4 stored values")
