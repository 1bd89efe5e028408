"""MODEL_LOAD: the ONNX loader against onnx.load, and against malformed and hostile files.

Every weight the loader hands out must equal onnx.numpy_helper.to_array bit for
bit; the graph structure must match what onnx.load parses; no weight byte may
be read at load; and every malformed file must raise ModelError, never
anything else.
"""

import os
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from nnrun import ModelError
from nnrun.ir import Graph
from nnrun.weights import weight_array
from nnrun.loader import load_model
from nnrun.loader import onnx as onnx_loader
from nnrun.loader.mapped import ExternalData, MappedFile

OPSET = 17
BIG = 4096  # elements: large enough that the loader maps the tensor instead of copying it


# ---------------------------------------------------------------- model builders


def make_model(nodes, inputs, outputs, initializers=(), opset=OPSET, **kwargs):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kwargs)
    model.ir_version = 9
    return model


def value(name, dtype=TensorProto.FLOAT, shape=("N", 4)):
    return helper.make_tensor_value_info(name, dtype, shape)


def random_array(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def chain_model(weights):
    """Identity-ish chain: one Add per weight, the weights as initializers."""
    nodes, prev = [], "x"
    for i, w in enumerate(weights):
        nodes.append(helper.make_node("Add", [prev, f"w{i}"], [f"y{i}"], name=f"add{i}"))
        prev = f"y{i}"
    inits = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]
    return make_model(nodes, [value("x", shape=list(weights[0].shape))],
                      [value(prev, shape=list(weights[0].shape))], inits)


def save(model, path, **kwargs):
    onnx.save_model(model, os.fspath(path), **kwargs)
    return path


# ---------------------------------------------------------------- comparison with onnx


def assert_same_array(ours, expected, what=""):
    actual = weight_array(ours)
    assert actual.dtype == expected.dtype, what
    assert actual.shape == expected.shape, what
    if expected.dtype == object:
        assert actual.tolist() == expected.tolist(), what
    else:  # bit for bit, NaN payloads included
        assert actual.tobytes() == expected.tobytes(), what


def assert_same_attribute(ours, attr, base_dir, what):
    expected = helper.get_attribute_value(attr)
    kind = attr.type
    if kind == onnx.AttributeProto.TENSOR:
        assert_same_array(ours, numpy_helper.to_array(expected, base_dir), what)
    elif kind == onnx.AttributeProto.TENSORS:
        assert len(ours) == len(expected)
        for o, e in zip(ours, expected):
            assert_same_array(o, numpy_helper.to_array(e, base_dir), what)
    elif kind == onnx.AttributeProto.GRAPH:
        assert_same_graph(ours, expected, base_dir)
    elif kind == onnx.AttributeProto.GRAPHS:
        assert len(ours) == len(expected)
        for o, e in zip(ours, expected):
            assert_same_graph(o, e, base_dir)
    elif kind == onnx.AttributeProto.STRING:
        assert ours == expected.decode(), what
    elif kind == onnx.AttributeProto.STRINGS:
        assert ours == [s.decode() for s in expected], what
    elif kind in (onnx.AttributeProto.FLOAT, onnx.AttributeProto.FLOATS):
        assert np.array_equal(np.float32(ours), np.float32(expected)), what
    else:
        assert ours == expected, what


def dims_of(value_info):
    if not value_info.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in value_info.type.tensor_type.shape.dim)


def assert_same_graph(graph, g, base_dir=None):
    """Structure and weights of an ir.Graph against the GraphProto onnx.load parsed."""
    assert isinstance(graph, Graph)
    assert graph.name == g.name
    assert len(graph.nodes) == len(g.node)
    for ours, theirs in zip(graph.nodes, g.node):
        what = f"node {theirs.name} ({theirs.op_type})"
        assert ours.op_type == theirs.op_type
        assert ours.name == theirs.name
        assert ours.domain == ("" if theirs.domain == "ai.onnx" else theirs.domain)
        assert ours.inputs == list(theirs.input), what
        assert ours.outputs == list(theirs.output), what
        assert set(ours.attrs) == {a.name for a in theirs.attribute}, what
        for attr in theirs.attribute:
            assert_same_attribute(ours.attrs[attr.name], attr, base_dir, f"{what}.{attr.name}")
    assert list(graph.initializers) == [t.name for t in g.initializer]
    for t in g.initializer:
        assert_same_array(graph.initializers[t.name], numpy_helper.to_array(t, base_dir), t.name)
    initializer_names = {t.name for t in g.initializer}
    expected_inputs = [v for v in g.input if v.name not in initializer_names]
    assert [v.name for v in graph.inputs] == [v.name for v in expected_inputs]
    for ours, theirs in zip(graph.inputs, expected_inputs):
        assert ours.dims == dims_of(theirs)
        assert ours.dtype == helper.tensor_dtype_to_np_dtype(theirs.type.tensor_type.elem_type)
    assert [v.name for v in graph.outputs] == [v.name for v in g.output]
    for ours, theirs in zip(graph.outputs, g.output):
        assert ours.dims == dims_of(theirs)
    assert set(graph.value_infos) == {v.name for v in g.value_info}


def assert_loads_like_onnx(path_or_bytes, base_dir=None):
    graph = load_model(path_or_bytes, base_dir=base_dir)
    if isinstance(path_or_bytes, bytes):
        model = onnx.load_model_from_string(path_or_bytes)
        onnx_base = os.fspath(base_dir) if base_dir is not None else None
    else:
        model = onnx.load(os.fspath(path_or_bytes), load_external_data=False)
        onnx_base = os.path.dirname(os.fspath(path_or_bytes))
    assert_same_graph(graph, model.graph, onnx_base)
    assert graph.opsets == {("" if o.domain == "ai.onnx" else o.domain): o.version
                            for o in model.opset_import}
    assert graph.format == "onnx"
    assert isinstance(graph.source, MappedFile)
    return graph


# ---------------------------------------------------------------- weights equal to onnx's


DTYPES = [np.float32, np.float16, np.int64, np.int8, np.bool_, np.float64, np.uint8, np.int32,
          np.int16, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("size", [1, 7, BIG])
def test_embedded_initializers(tmp_path, dtype, size):
    weights = [random_array(dtype, (size,), seed) for seed in range(3)]
    path = save(chain_model(weights), tmp_path / "m.onnx")
    graph = assert_loads_like_onnx(path)
    if size == BIG:  # a view of the mapping, not a copy
        assert all(isinstance(w, ExternalData) for w in graph.initializers.values())
        assert all(w.source is graph.source for w in graph.initializers.values())
        assert not weight_array(graph.initializers["w0"]).flags.writeable


@pytest.mark.parametrize("dtype", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN,
                                   TensorProto.INT4, TensorProto.UINT4, TensorProto.COMPLEX64,
                                   TensorProto.STRING])
@pytest.mark.parametrize("size", [5, BIG])
def test_special_dtypes(tmp_path, dtype, size):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    if dtype == TensorProto.STRING:
        array = np.array([f"s{i}" for i in range(size)], dtype=object)
    elif dtype == TensorProto.COMPLEX64:
        array = (random_array(np.float32, (size,)) + 1j).astype(np.complex64)
    elif dtype in (TensorProto.INT4, TensorProto.UINT4):
        array = (np.arange(size) % 8).astype(np_dtype)
    else:
        array = random_array(np.float32, (size,)).astype(np_dtype)
    tensor = numpy_helper.from_array(array, "w")
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [],
                       [value("y", dtype, [size])],
                       [tensor])
    assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))


def test_empty_tensors(tmp_path):
    tensors = [numpy_helper.from_array(np.zeros((3, 0), np.float32), "a"),
               TensorProto(name="b", data_type=TensorProto.FLOAT, dims=[10 ** 15, 0], raw_data=b""),
               TensorProto(name="c", data_type=TensorProto.INT64, dims=[0, 10 ** 12]),
               helper.make_tensor("d", TensorProto.FLOAT, [0], [])]
    model = make_model([helper.make_node("Identity", ["a"], ["y"])], [], [value("y", shape=None)],
                       tensors)
    graph = assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))
    assert weight_array(graph.initializers["b"]).shape == (10 ** 15, 0)


@pytest.mark.parametrize("size", [3, BIG])
def test_constant_node_values(tmp_path, size):
    nodes = [
        helper.make_node("Constant", [], ["c0"], value=numpy_helper.from_array(
            random_array(np.float32, (size, 2)))),
        helper.make_node("Constant", [], ["c1"], value=numpy_helper.from_array(
            np.arange(size, dtype=np.int64), "named")),
        helper.make_node("Constant", [], ["c2"], value_ints=[1, 2, 3]),
        helper.make_node("Constant", [], ["c3"], value_float=1.5),
    ]
    model = make_model(nodes, [], [value(n, shape=None) for n in ("c0", "c1", "c2", "c3")])
    graph = assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))
    assert isinstance(graph.nodes[0].attrs["value"], ExternalData if size == BIG else np.ndarray)


def test_subgraph_initializers(tmp_path):
    big = random_array(np.float32, (BIG,), 1)
    small = random_array(np.int64, (3,), 2)

    def branch(tag, array):
        return helper.make_graph(
            [helper.make_node("Add", ["x", f"{tag}_w"], [f"{tag}_y"]),
             helper.make_node("Constant", [], [f"{tag}_c"],
                              value=numpy_helper.from_array(array * 2))],
            f"{tag}_graph", [], [value(f"{tag}_y", shape=None)],
            [numpy_helper.from_array(array, f"{tag}_w")])

    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "loop_w"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), value("v_in", shape=None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         value("v_out", shape=None)],
        [numpy_helper.from_array(big[::-1].copy(), "loop_w")])
    nodes = [
        helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", big),
                         else_branch=branch("else", small.astype(np.float32))),
        helper.make_node("Loop", ["trip", "cond", "y"], ["z"], body=loop_body),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("trip", TensorProto.INT64, []),
                               value("x", shape=[BIG])], [value("z", shape=None)])
    graph = assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))
    then_graph = graph.nodes[0].attrs["then_branch"]
    assert isinstance(then_graph.initializers["then_w"], ExternalData)
    assert then_graph.source is graph.source
    assert isinstance(graph.nodes[1].attrs["body"].initializers["loop_w"], ExternalData)


def test_typed_fields_not_raw(tmp_path):
    tensors = [
        helper.make_tensor("f", TensorProto.FLOAT, [2, 3], [1, 2, 3, 4, 5, 6.5]),
        helper.make_tensor("i", TensorProto.INT64, [4], [1, -2, 3, 1 << 40]),
        helper.make_tensor("d", TensorProto.DOUBLE, [2], [0.1, 0.2]),
        helper.make_tensor("h", TensorProto.FLOAT16, [3], np.array([1, 2.5, -3], np.float16)),
        helper.make_tensor("b", TensorProto.BOOL, [3], [True, False, True]),
        helper.make_tensor("q", TensorProto.INT8, [3], [-1, 0, 127]),
        helper.make_tensor("u", TensorProto.UINT64, [2], [1, 1 << 63]),
        helper.make_tensor("big", TensorProto.FLOAT, [BIG], np.arange(BIG, dtype=np.float32)),
    ]
    assert not any(t.HasField("raw_data") for t in tensors)
    model = make_model([helper.make_node("Identity", ["f"], ["y"])], [], [value("y", shape=None)],
                       tensors)
    graph = assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))
    assert all(isinstance(w, np.ndarray) for w in graph.initializers.values())


@pytest.mark.parametrize("one_file", [True, False])
def test_external_data(tmp_path, one_file):
    weights = [random_array(np.float32, (BIG,), seed) for seed in range(3)]
    weights.append(random_array(np.int64, (16,), 9))  # under onnx's threshold: stays embedded
    model = chain_model(weights[:3])
    model.graph.initializer.append(numpy_helper.from_array(weights[3], "extra"))
    path = save(model, tmp_path / "m.onnx", save_as_external_data=True,
                all_tensors_to_one_file=one_file, location="weights.bin" if one_file else None,
                size_threshold=1024)
    graph = assert_loads_like_onnx(path)
    sources = {w.source for w in graph.initializers.values() if isinstance(w, ExternalData)}
    assert len(sources) == (1 if one_file else 3)
    assert graph.source not in sources


def test_external_data_offset_and_length_keys(tmp_path):
    a = random_array(np.float32, (100,), 1)
    b = random_array(np.int64, (10, 3), 2)
    with open(tmp_path / "data.bin", "wb") as f:
        f.write(b"\xff" * 13 + a.tobytes() + b"\xee" * 5 + b.tobytes() + b"tail")
    tensors = []
    for name, array, offset in (("a", a, 13), ("b", b, 13 + a.nbytes + 5)):
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                        dims=array.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, val in (("location", "data.bin"), ("offset", str(offset)),
                         ("length", str(array.nbytes))):
            t.external_data.add(key=key, value=val)
        tensors.append(t)
    model = make_model([helper.make_node("Identity", ["a"], ["y"])], [], [value("y", shape=None)],
                       tensors)
    path = save(model, tmp_path / "m.onnx")
    graph = assert_loads_like_onnx(path)
    assert_same_array(graph.initializers["a"], a)
    assert_same_array(graph.initializers["b"], b)
    assert graph.initializers["a"].source is graph.initializers["b"].source  # one map per file


def test_external_data_without_length_runs_to_end_of_file(tmp_path):
    a = random_array(np.float32, (64,))
    (tmp_path / "d.bin").write_bytes(b"\0" * 8 + a.tobytes())
    t = TensorProto(name="a", data_type=TensorProto.FLOAT, dims=[64])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="d.bin")
    t.external_data.add(key="offset", value="8")
    model = make_model([helper.make_node("Identity", ["a"], ["y"])], [], [value("y", shape=None)],
                       [t])
    graph = load_model(save(model, tmp_path / "m.onnx"))
    assert_same_array(graph.initializers["a"], a)


def test_load_from_bytes(tmp_path):
    weights = [random_array(np.float32, (BIG,), s) for s in range(2)]
    data = chain_model(weights).SerializeToString()
    graph = assert_loads_like_onnx(data)
    assert graph.path is None
    assert isinstance(graph.initializers["w0"], ExternalData)
    from_bytearray = load_model(bytearray(data))
    assert_same_array(from_bytearray.initializers["w1"], weights[1])


def test_load_from_bytes_with_external_data_needs_base_dir(tmp_path):
    model = chain_model([random_array(np.float32, (BIG,))])
    path = save(model, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin")
    data = path.read_bytes()
    with pytest.raises(ModelError, match="base_dir"):
        load_model(data)
    assert_loads_like_onnx(data, base_dir=tmp_path)


def test_structure_matches_onnx(tmp_path):
    inner = helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "inner",
                              [value("a", shape=None)], [value("b", shape=None)])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[2, 2], group=1, auto_pad="NOTSET"),
        helper.make_node("LeakyRelu", ["c"], ["l"], alpha=0.125),
        helper.make_node("Custom", ["l"], ["m", ""], domain="my.domain", floats=[1.5, -2.0],
                         strings=["a", "bc"], graphs=[inner, inner], graph=inner,
                         tensors=[numpy_helper.from_array(np.arange(3, dtype=np.int32))]),
        helper.make_node("Add", ["m", ""], ["out"], domain="ai.onnx"),
    ]
    w = random_array(np.float32, (8, 3, 3, 3))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["batch", 3, None, 32]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 3, 3, 3])],
                       [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(w, "w")])
    model.graph.value_info.append(value("c", shape=[1, 8, 16, 16]))
    model.opset_import.append(helper.make_opsetid("my.domain", 3))
    graph = assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))
    # "w" is listed among the inputs (old style): it keeps its initializer, it is not a feed
    assert [v.name for v in graph.inputs] == ["x"]
    assert graph.inputs[0].dims == ("batch", 3, None, 32)
    assert graph.outputs[0].dims is None
    assert graph.nodes[3].domain == ""
    assert graph.nodes[2].attrs["strings"] == ["a", "bc"]
    assert graph.nodes[0].attrs["auto_pad"] == "NOTSET"
    assert graph.opsets == {"": OPSET, "my.domain": 3}
    assert graph.value_infos["c"].dims == (1, 8, 16, 16)
    assert graph.path == os.fspath(tmp_path / "m.onnx")


def test_sequence_and_optional_types(tmp_path):
    tensor = helper.make_tensor_type_proto(TensorProto.INT64, [None, 3])
    seq = helper.make_value_info("s", helper.make_sequence_type_proto(tensor))
    opt = helper.make_value_info("o", helper.make_optional_type_proto(tensor))
    opt_seq = helper.make_value_info("os", helper.make_optional_type_proto(helper.make_sequence_type_proto(tensor)))
    model = make_model([helper.make_node("Identity", ["s"], ["y"])], [seq, opt, opt_seq],
                       [helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, None)])
    graph = load_model(save(model, tmp_path / "m.onnx"))
    s, o, os_ = graph.inputs
    assert (s.containers, o.containers, os_.containers) == (("sequence",), ("optional",), ("optional", "sequence"))
    assert all(v.dtype == np.int64 and v.dims == (None, 3) and not v.is_static for v in graph.inputs)
    assert graph.outputs[0].containers == ("sequence",) and graph.outputs[0].dims is None


def test_model_local_functions(tmp_path):
    body = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                random_array(np.float32, (BIG,)))),
            helper.make_node("Add", ["a", "k"], ["s"]),
            helper.make_node("LeakyRelu", ["s"], ["b"])]
    ref = onnx.AttributeProto(name="alpha", ref_attr_name="slope", type=onnx.AttributeProto.FLOAT)
    body[2].attribute.append(ref)
    function = helper.make_function("my.fn", "AddLeaky", ["a"], ["b"], body,
                                    [helper.make_opsetid("", OPSET)], attributes=["slope"])
    model = make_model([helper.make_node("AddLeaky", ["x"], ["y"], domain="my.fn", slope=0.5)],
                       [value("x", shape=[BIG])], [value("y", shape=[BIG])],
                       functions=[function])
    model.opset_import.append(helper.make_opsetid("my.fn", 1))
    graph = assert_loads_like_onnx(save(model, tmp_path / "m.onnx"))
    decoded = graph.functions[("my.fn", "AddLeaky")]
    assert decoded.inputs == ["a"] and decoded.outputs == ["b"] and decoded.attributes == ["slope"]
    assert [n.op_type for n in decoded.nodes] == ["Constant", "Add", "LeakyRelu"]
    assert_same_array(decoded.nodes[0].attrs["value"],
                      numpy_helper.to_array(body[0].attribute[0].t))
    assert decoded.nodes[2].attrs["alpha"] == onnx_loader.AttributeRef("slope",
                                                                       onnx.AttributeProto.FLOAT)
    assert decoded.opsets == {"": OPSET}


def test_sparse_initializer_is_densified(tmp_path):
    values = numpy_helper.from_array(np.arange(1, 2001, dtype=np.float32), "sp")
    indices = numpy_helper.from_array(np.arange(0, 8000, 4, dtype=np.int64), "sp_idx")
    model = make_model([helper.make_node("Identity", ["sp"], ["y"])], [],
                       [value("y", shape=None)])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [80, 100]))
    graph = load_model(save(model, tmp_path / "m.onnx"))
    expected = np.zeros(8000, np.float32)
    expected[::4] = np.arange(1, 2001)
    assert_same_array(graph.initializers["sp"], expected.reshape(80, 100))


@pytest.mark.parametrize("nnz", [4, 600])
def test_sparse_tensor_attribute_is_kept_whole(tmp_path, nnz):
    values = numpy_helper.from_array(np.arange(1, nnz + 1, dtype=np.float32), "v")
    indices = numpy_helper.from_array(np.stack([np.arange(nnz) // 30, np.arange(nnz) % 30], 1)
                                      .astype(np.int64), "i")
    sparse = helper.make_sparse_tensor(values, indices, [20, 30])
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse)
    model = make_model([node], [], [value("y", shape=None)])
    graph = load_model(save(model, tmp_path / "m.onnx"))
    kept = graph.nodes[0].attrs["sparse_value"]
    assert isinstance(kept, onnx.SparseTensorProto)
    assert kept == sparse  # raw bytes put back, no marker left


# ---------------------------------------------------------------- no weight byte read


def test_no_weight_byte_read_at_load(tmp_path):
    weights = [random_array(np.float32, (1 << 20,), s) for s in range(16)]  # 64 MB
    path = save(chain_model(weights), tmp_path / "m.onnx")
    size = path.stat().st_size
    del weights
    tracemalloc.start()
    try:
        graph = load_model(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"load allocated {peak} bytes for a {size}-byte model"
    resident = graph.source.resident_bytes()
    assert resident is not None and resident < 0.05 * size
    assert all(isinstance(w, ExternalData) for w in graph.initializers.values())
    # the weights are still there, read on demand
    assert weight_array(graph.initializers["w3"]).shape == (1 << 20,)


def test_walk_reads_headers_not_weights(tmp_path, monkeypatch):
    path = save(chain_model([random_array(np.float32, (1 << 18,), s) for s in range(8)]),
                tmp_path / "m.onnx")  # 8 MB
    read = []
    original = MappedFile.read

    def counting_read(self, start, end):
        read.append(end - start)
        return original(self, start, end)

    monkeypatch.setattr(MappedFile, "read", counting_read)
    source = MappedFile.open(path)
    stripper = onnx_loader._Stripper(source)
    structure = stripper.strip(source.size)
    assert len(structure) < 4096
    assert len(stripper.raw_extents) == 8
    assert sum(read) < 64 << 10  # of 8 MB
    assert source.resident_bytes() == 0


@pytest.mark.parametrize("window", [(20, 20), (21, 50), (64, 64), (512, 65536)])
def test_windowed_walk_matches_whole(tmp_path, monkeypatch, window):
    """The walk through pread windows cuts exactly what the walk over a buffer cuts."""
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"y{i}"], name=f"conv{i}",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1], doc_string="d" * (i * 37))
             for i in range(40)]
    inits = [numpy_helper.from_array(random_array(np.float32, (4 + 97 * i,), i), f"w{i}")
             for i in range(40)]
    path = save(make_model(nodes, [value("x")], [value("y39")], inits), tmp_path / "m.onnx")
    monkeypatch.setattr(onnx_loader, "WALK_WINDOW_MIN", window[0])
    monkeypatch.setattr(onnx_loader, "WALK_WINDOW_MAX", window[1])
    mapped = MappedFile.open(path)
    in_memory = MappedFile.from_bytes(path.read_bytes())
    windowed = onnx_loader._Stripper(mapped)
    whole = onnx_loader._Stripper(in_memory)
    assert windowed.strip(mapped.size) == whole.strip(in_memory.size)
    assert windowed.raw_extents == whole.raw_extents
    for end in range(0, mapped.size, mapped.size // 40 + 1):  # truncated: the same verdict
        (tmp_path / "t.onnx").write_bytes(path.read_bytes()[:end])
        outcomes = []
        for load in (lambda: load_model(tmp_path / "t.onnx"),
                     lambda: load_model(path.read_bytes()[:end])):
            try:
                outcomes.append(len(load().initializers))
            except ModelError as e:
                outcomes.append(str(e).replace(os.fspath(tmp_path / "t.onnx"), "the model bytes"))
        assert outcomes[0] == outcomes[1]


# ---------------------------------------------------------------- malformed and hostile files


def small_model_bytes():
    big = numpy_helper.from_array(random_array(np.float32, (600,)), "w")
    small = numpy_helper.from_array(np.array([1, 2], np.int64), "s")
    node = helper.make_node("Constant", [], ["c"],
                            value=numpy_helper.from_array(random_array(np.float32, (300,))))
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"]), node],
                       [value("x", shape=[600])], [value("y", shape=[600])], [big, small])
    return model.SerializeToString()


def assert_model_error_or_loads(data, **kwargs):
    try:
        graph = load_model(data, **kwargs)
    except ModelError:
        return None
    for w in graph.initializers.values():  # what loaded is consistent
        weight_array(w)
    return graph


def test_truncated_files():
    data = small_model_bytes()
    assert load_model(data)
    for end in list(range(0, len(data), 7)) + [len(data) - 1]:
        assert_model_error_or_loads(data[:end])


def test_mutated_files():
    data = small_model_bytes()
    rng = np.random.default_rng(0)
    for _ in range(400):
        mutated = bytearray(data)
        for pos in rng.integers(0, len(data), rng.integers(1, 4)):
            mutated[pos] = rng.integers(0, 256)
        assert_model_error_or_loads(bytes(mutated))


@pytest.mark.parametrize("seed", range(20))
def test_random_garbage(seed):
    data = np.random.default_rng(seed).integers(0, 256, 1 + seed * 97, dtype=np.uint8).tobytes()
    assert_model_error_or_loads(data)


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"\x08\x07", "no graph"),
    (b"hello, this is not an onnx model at all", "protobuf|ONNX|graph"),
    (b"\x3a\xff\xff\xff\xff\x0f", "runs past the end"),  # graph field claiming 4 GB
    (b"\x0b\x00", "group"),
])
def test_not_a_model(data, message):
    with pytest.raises(ModelError, match=message):
        load_model(data)


def test_empty_file_and_missing_file(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(tmp_path / "e.onnx")
    with pytest.raises(ModelError, match="cannot map"):
        load_model(tmp_path / "missing.onnx")


def test_tflite_is_recognised(tmp_path):
    with pytest.raises(ModelError, match="TFLite"):
        load_model(b"\x1c\x00\x00\x00TFL3" + b"\0" * 32)
    (tmp_path / "m.tflite").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError, match="TFLite"):
        load_model(tmp_path / "m.tflite")


def test_raw_data_past_end_of_file():
    data = small_model_bytes()
    # The 2400-byte raw_data of "w" (tag 0x4a, varint length e0 12) made to claim 64 KB.
    at = data.index(b"\x4a\xe0\x12")
    forged = data[:at] + b"\x4a\x80\x80\x04" + data[at + 3:]
    with pytest.raises(ModelError, match="byte offset"):
        load_model(forged)


def tensor_model(tensor, tmp_path=None):
    model = make_model([helper.make_node("Identity", [tensor.name], ["y"])], [],
                       [value("y", shape=None)], [tensor])
    return model.SerializeToString()


def big_raw_tensor(dims=(BIG,), data_type=TensorProto.FLOAT, nbytes=BIG * 4):
    t = TensorProto(name="t", data_type=data_type, dims=dims)
    t.raw_data = b"\x01" * nbytes
    return t


@pytest.mark.parametrize("make, message", [
    (lambda: big_raw_tensor(dims=(-1, BIG)), "negative"),
    (lambda: big_raw_tensor(dims=(2, -3), nbytes=24), "negative"),  # small: stays inline
    (lambda: big_raw_tensor(dims=(10 ** 15,)), "bytes|shape"),
    (lambda: big_raw_tensor(dims=(10 ** 15,), nbytes=8), "shape"),
    (lambda: big_raw_tensor(dims=(10 ** 9, 10 ** 9, 10 ** 9, 0, 10 ** 9), nbytes=8), "shape"),
    (lambda: big_raw_tensor(dims=(BIG + 1,)), "bytes"),
    (lambda: big_raw_tensor(dims=(3,), nbytes=13), "shape"),
    (lambda: big_raw_tensor(data_type=99), "unknown data_type"),
    (lambda: big_raw_tensor(data_type=TensorProto.UNDEFINED), "UNDEFINED"),
    (lambda: big_raw_tensor(data_type=TensorProto.STRING), "string"),
    (lambda: big_raw_tensor(dims=(1,) * 65, nbytes=4), "rank"),
    (lambda: TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[10 ** 12],
                         float_data=[1.0, 2.0]), "shape"),
    (lambda: TensorProto(name="t", data_type=TensorProto.INT64, dims=[10 ** 15, 10 ** 15],
                         int64_data=[1]), "shape"),
    (lambda: TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0, 2.0]),
     "shape"),
    (lambda: TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[3]), "shape"),
    (lambda: TensorProto(name="t", data_type=TensorProto.INT4, dims=[10 ** 12], int32_data=[1]),
     "shape"),
])
def test_bad_tensors(make, message):
    with pytest.raises(ModelError, match=message) as error:
        load_model(tensor_model(make()))
    assert "'t'" in str(error.value)


def test_raw_data_and_external_both(tmp_path):
    (tmp_path / "d.bin").write_bytes(b"\0" * BIG * 4)
    for nbytes in (8, BIG * 4):  # inline and stripped raw_data
        t = big_raw_tensor(dims=(nbytes // 4,), nbytes=nbytes)
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="d.bin")
        with pytest.raises(ModelError, match="both raw_data and external"):
            load_model(tensor_model(t), base_dir=tmp_path)


def test_forged_marker_is_rejected():
    t = TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[2])
    t.external_data.add(key=onnx_loader.RAW_DATA_KEY, value="0:8")
    with pytest.raises(ModelError, match="reserved"):
        load_model(tensor_model(t))


def external_model(tmp_path, location, offset=None, length=None, dims=(16,)):
    t = TensorProto(name="t", data_type=TensorProto.FLOAT, dims=dims)
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    if offset is not None:
        t.external_data.add(key="offset", value=str(offset))
    if length is not None:
        t.external_data.add(key="length", value=str(length))
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / "model" / "m.onnx"
    path.write_bytes(tensor_model(t))
    return path


def test_external_location_escaping_the_model_dir(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ModelError, match="outside"):
        load_model(external_model(tmp_path, "../secret.bin"))
    with pytest.raises(ModelError, match="outside"):
        load_model(external_model(tmp_path, "sub/../../secret.bin"))
    with pytest.raises(ModelError, match="relative"):
        load_model(external_model(tmp_path, os.fspath(tmp_path / "secret.bin")))
    with pytest.raises(ModelError, match="relative"):
        load_model(external_model(tmp_path, "a\0b"))
    with pytest.raises(ModelError, match="outside"):
        load_model(external_model(tmp_path, "."))


def test_external_symlink_pointing_outside(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    path = external_model(tmp_path, "link.bin")
    os.symlink(tmp_path / "secret.bin", tmp_path / "model" / "link.bin")
    with pytest.raises(ModelError, match="outside"):
        load_model(path)
    # a symlink that stays inside the model directory is fine
    (tmp_path / "model" / "real.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
    os.symlink("real.bin", tmp_path / "model" / "inside.bin")
    graph = load_model(external_model(tmp_path, "inside.bin"))
    assert_same_array(graph.initializers["t"], np.arange(16, dtype=np.float32))


@pytest.mark.parametrize("offset, length, message", [
    (0, 128, "past the end"),
    (60, 8, "past the end"),
    (65, None, "past the end"),
    (8, None, "bytes"),
    (-4, 64, "negative"),
    ("x", 64, "not an integer"),
    (0, 60, "bytes"),
])
def test_external_extent_checks(tmp_path, offset, length, message):
    path = external_model(tmp_path, "d.bin", offset, length)
    (tmp_path / "model" / "d.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ModelError, match=message):
        load_model(path)


def test_external_file_problems(tmp_path):
    with pytest.raises(ModelError, match="missing.bin"):
        load_model(external_model(tmp_path, "missing.bin"))
    os.mkfifo(tmp_path / "model" / "fifo.bin")
    with pytest.raises(ModelError, match="regular file"):
        load_model(external_model(tmp_path, "fifo.bin"))
    (tmp_path / "model" / "dir.bin").mkdir()
    with pytest.raises(ModelError, match="regular file"):
        load_model(external_model(tmp_path, "dir.bin"))
    with pytest.raises(ModelError, match="location"):
        load_model(external_model(tmp_path, ""))


def test_node_problems():
    def model_with(node):
        return make_model([node], [value("x")], [value("y")]).SerializeToString()

    with pytest.raises(ModelError, match="empty op_type"):
        load_model(model_with(helper.make_node("", ["x"], ["y"])))
    twice = helper.make_node("Relu", ["x"], ["y"], alpha=1)
    twice.attribute.append(helper.make_attribute("alpha", 2))
    with pytest.raises(ModelError, match="twice"):
        load_model(model_with(twice))
    untyped = helper.make_node("Relu", ["x"], ["y"])
    untyped.attribute.append(onnx.AttributeProto(name="alpha", i=3))
    with pytest.raises(ModelError, match="attribute type"):
        load_model(model_with(untyped))
    bad_name = model_with(helper.make_node("Relu", ["x"], ["y"], name="zz")).replace(
        b"\x1a\x02zz", b"\x1a\x02\xff\xfe")
    with pytest.raises(ModelError, match="UTF-8"):
        load_model(bad_name)


def test_duplicate_initializer():
    a = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [value("y")], [a, a])
    with pytest.raises(ModelError, match="twice"):
        load_model(model.SerializeToString())


def nested_if_model(depth, leaf_initializer):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y0"])], "leaf", [],
                              [value("y0", shape=None)],
                              [numpy_helper.from_array(random_array(np.float32, (BIG,)), "deep")]
                              if leaf_initializer else [])
    for level in range(depth):
        other = helper.make_graph([helper.make_node("Identity", ["x"], [f"e{level}"])], "e", [],
                                  [value(f"e{level}", shape=None)])
        node = helper.make_node("If", ["c"], [f"y{level + 1}"], then_branch=graph,
                                else_branch=other)
        graph = helper.make_graph([node], f"level{level}", [], [value(f"y{level + 1}", shape=None)])
    return make_model(graph.node, [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                      list(graph.output))


def test_moderate_nesting_loads():
    graph = load_model(nested_if_model(8, True).SerializeToString())
    for _ in range(8):
        graph = graph.nodes[0].attrs["then_branch"]
    assert isinstance(graph.initializers["deep"], ExternalData)


@pytest.mark.parametrize("leaf_initializer", [True, False])
def test_nesting_as_deep_as_protobuf_parses_loads(leaf_initializer):
    # 32 levels of graphs whose values have no shape are as deep as onnx's helper can build (and
    # protobuf parse: 100 messages); a large leaf is met by the walk, a small one left to protobuf.
    graph = load_model(nested_if_model(32, leaf_initializer).SerializeToString())
    for _ in range(32):
        graph = graph.nodes[0].attrs["then_branch"]
    assert graph.name == "leaf" and ("deep" in graph.initializers) == leaf_initializer


@pytest.mark.parametrize("levels", [40, 200])
def test_deep_nesting_in_raw_bytes(levels):
    # graph -> node -> attribute -> graph ..., built byte by byte: 40 levels are small
    # enough to be left to protobuf's own limit, 200 are caught by the walk.
    from nnrun.loader.protowire import length_delimited
    node = b""
    for _ in range(levels):
        graph = length_delimited(1, node)
        attribute = length_delimited(6, graph) + b"\x0a\x01g" + b"\xa0\x01\x05"
        node = length_delimited(5, attribute) + b"\x22\x02If"
    data = b"\x08\x07" + length_delimited(7, length_delimited(1, node))
    with pytest.raises(ModelError, match="nested deeper than 100"):
        load_model(data)
