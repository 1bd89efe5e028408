"""MODEL_LOAD: what onnxruntime refuses when it loads a model, nnrun refuses too, with words that say why.

The oracle is onnxruntime: each model here must be refused by it at session creation (the test
checks that first, so a case onnxruntime accepts cannot pass here), and by nnrun with a
ModelError whose message names the node and the rule. Models onnxruntime accepts that are
near the edge of a rule (an initializer also listed as a graph input; an empty optional input;
a variadic op with many inputs) must load in both.
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import nnrun
from nnrun import ModelError

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def model(nodes, inputs=(X,), outputs=(Y,), initializers=(), opset=17, ir_version=8):
    graph = helper.make_graph(nodes, "g", list(inputs), list(outputs), list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] if opset else [])
    m.ir_version = ir_version
    return m.SerializeToString()


def ones(name, shape, dtype=np.float32):
    return numpy_helper.from_array(np.ones(shape, dtype), name)


def batchnorm(**attrs):
    stats = [ones(n, (3,)) for n in ("s", "b", "m", "v")]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", **attrs)
    return model([node], initializers=stats)


REFUSED = {
    "node writes a graph input": (
        model([helper.make_node("Relu", ["x"], ["x"], name="r"), helper.make_node("Identity", ["x"], ["y"])]),
        ["node 'r' (Relu, #0)", "writes 'x', which is already a graph input"]),
    "node writes an initializer": (
        model([helper.make_node("Relu", ["x"], ["w"], name="r"), helper.make_node("Add", ["x", "w"], ["y"])],
              initializers=[ones("w", (1, 3, 4, 4))]),
        ["node 'r' (Relu, #0)", "writes 'w', which is already an initializer"]),
    "two nodes write one value": (
        model([helper.make_node("Relu", ["x"], ["y"], name="r"), helper.make_node("Sigmoid", ["x"], ["y"], name="s")]),
        ["node 's' (Sigmoid, #1)", "already node 'r' (Relu, #0)'s output"]),
    "a body writes its own value twice": (
        model([helper.make_node(
            "If", ["c"], ["y"], name="if",
            then_branch=helper.make_graph(
                [helper.make_node("Relu", ["x"], ["t"], name="a"), helper.make_node("Neg", ["x"], ["t"], name="b")],
                "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)]),
            else_branch=helper.make_graph(
                [helper.make_node("Relu", ["x"], ["e"])], "else", [],
                [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)]))],
              inputs=[helper.make_tensor_value_info("c", TensorProto.BOOL, []), X]),
        ["node 'b' (Neg, #1) in graph 'then'", "already node 'a' (Relu, #0)'s output"]),
    "opset newer than known": (
        model([helper.make_node("Relu", ["x"], ["y"])], opset=99999),
        ["opset 99999 of the default domain", "newer than nnrun supports"]),
    "IR version 2^62": (
        model([helper.make_node("Relu", ["x"], ["y"])], ir_version=1 << 62),
        [f"IR version {1 << 62} is newer than nnrun supports"]),
    "too many inputs": (
        model([helper.make_node("Relu", ["x", "x"], ["y"], name="r")]),
        ["node 'r' (Relu, #0)", "Relu takes 1 input, the node has 2"]),
    "too few inputs": (
        model([helper.make_node("Add", ["x"], ["y"], name="a")]),
        ["node 'a' (Add, #0)", "Add takes 2 inputs, the node has 1"]),
    "BatchNormalization with two of five inputs": (
        model([helper.make_node("BatchNormalization", ["x", "s"], ["y"], name="bn")], initializers=[ones("s", (3,))]),
        ["node 'bn' (BatchNormalization, #0)", "takes 5 inputs, the node has 2"]),
    "too many outputs": (
        model([helper.make_node("Relu", ["x"], ["y", "z"], name="r")]),
        ["Relu takes 1 output, the node has 2"]),
    "epsilon given as ints": (
        batchnorm(epsilon=[1, 2]),
        ["node 'bn' (BatchNormalization, #0)", "attribute 'epsilon' must be a float, got a list of ints"]),
    "epsilon given as a tensor": (
        batchnorm(epsilon=numpy_helper.from_array(np.array([1e-5], np.float32))),
        ["attribute 'epsilon' must be a float, got a tensor"]),
    "a graph input listed twice": (
        model([helper.make_node("Relu", ["x"], ["y"])], inputs=(X, X)),
        ["graph 'g' lists input 'x' twice"]),
    "two nodes of one name": (
        model([helper.make_node("Relu", ["x"], ["a"], name="n"), helper.make_node("Neg", ["a"], ["y"], name="n")]),
        ["node 'n' (Neg, #1) in graph 'g' has the name of node 'n' (Relu, #0)"]),
    "no opset of the default domain": (
        model([helper.make_node("Relu", ["x"], ["y"])], opset=None),
        ["imports no opset of the default domain"]),
    "an attribute the op does not have": (
        model([helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.5)]),
        ["node 'r' (Relu, #0)", "Relu (opset 17) has no attribute 'alpha'"]),
}


REFUSED["an output declared of another type than its node makes"] = (
    model([helper.make_node("Shape", ["x"], ["y"])],
          outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
    ["graph output 'y' is declared tensor(float), but the node that makes it gives tensor(int64)"])


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_at_load_as_onnxruntime_refuses(case):
    data, words = REFUSED[case]
    with pytest.raises(Exception):  # the oracle: onnxruntime refuses this model too
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.raises(ModelError) as raised:
        nnrun.InferenceSession(data)
    for word in words:
        assert word in str(raised.value)


def test_a_refused_model_is_one_onnxruntime_refuses_with_its_class():
    """Code that catches onnxruntime's classes catches nnrun's refusal too."""
    data, _ = REFUSED["node writes a graph input"]
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail):
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.raises(nnrun.capi.onnxruntime_pybind11_state.Fail):
        nnrun.InferenceSession(data)


ACCEPTED = {
    "an initializer listed among the inputs": model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        inputs=[X, helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 3, 4, 4])],
        initializers=[ones("w", (1, 3, 4, 4))]),
    "an omitted optional input": model(
        [helper.make_node("Clip", ["x", "", "hi"], ["y"])], initializers=[numpy_helper.from_array(
            np.array(0.5, np.float32), "hi")]),
    "a variadic op with many inputs": model([helper.make_node("Sum", ["x"] * 9, ["y"])]),
    "Constant nodes of one name": model(
        [helper.make_node("Constant", [], ["a"], name="k", value=numpy_helper.from_array(np.float32(2))),
         helper.make_node("Constant", [], ["b"], name="k", value=numpy_helper.from_array(np.float32(3))),
         helper.make_node("Mul", ["x", "a"], ["xa"]), helper.make_node("Add", ["xa", "b"], ["y"])]),
    "optional outputs left out": batchnorm(epsilon=1e-3),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_edges_of_the_rules_load_and_match_onnxruntime(case):
    data = ACCEPTED[case]
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = nnrun.InferenceSession(data).run(None, {"x": x})
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_external_data_without_a_length_is_the_tensor_own_size(tmp_path):
    """onnx's writer may leave `length` out; onnxruntime (and onnx's reader) then read the
    tensor's own size, from its dims, whatever the file holds after it."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    w = np.random.default_rng(3).standard_normal((1, 3, 4, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [X], [Y],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w * 2, "w2")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    for tensor in m.graph.initializer:
        kept = [e for e in tensor.external_data if e.key != "length"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path))
    x = np.random.default_rng(4).standard_normal((1, 3, 4, 4)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = nnrun.InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


def test_the_schema_table_is_what_the_installed_onnx_says():
    """runtime/loader/onnx_schema_table.py is written from onnx's registry by a tool; it must be
    that registry's content, or the tool must run again (`python -m nnrun_tools.onnx_schema_table`)."""
    import onnx

    from nnrun.loader import onnx_schema_table
    from nnrun_tools.onnx_schema_table import table

    schemas, newest = table()
    assert onnx_schema_table.IR_VERSION == onnx.IR_VERSION
    assert onnx_schema_table.NEWEST_OPSET == newest
    assert onnx_schema_table.SCHEMAS == schemas


def test_loading_a_model_builds_no_onnx_schema_registry():
    """onnx's registry costs 10 ms and 7.5 MB on first use: a subprocess loads a model and checks
    that the registry was never asked (its first get_schema call is what builds it)."""
    import os
    import subprocess
    import sys

    model = os.path.join(os.path.dirname(__file__), "..", "..", "models", "mobilenet_tiny.onnx")
    script = (
        "import onnx.defs, nnrun\n"
        "calls = []\n"
        "real = onnx.defs.get_schema\n"
        "onnx.defs.get_schema = lambda *a, **k: calls.append(a) or real(*a, **k)\n"
        f"nnrun.InferenceSession({model!r})\n"
        "assert not calls, calls\n")
    subprocess.run([sys.executable, "-c", script], check=True)
