"""Feeds and graphs a hostile or careless caller gives: every failure a typed error naming what is
wrong, every accepted case the answer onnxruntime gives.

Oracles: onnxruntime's outputs for what both accept; for what nnrun refuses, onnxruntime refusing
it too (at load or at its first run), checked first so a case onnxruntime accepts cannot pass.
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import nnrun
from oracle import assert_close

rng = np.random.default_rng(5)


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def tensor(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def weight(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def onnxruntime(data):
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


RELU = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["N", 3])], [tensor("y", None)])


# --- feeds


def test_a_big_endian_feed_is_converted_and_matches_onnxruntime():
    """Converted to native order first (onnxruntime reads its bytes as if native: fed the values
    in native order, it is the oracle)."""
    x = rng.standard_normal((2, 3)).astype(">f4")
    expected = onnxruntime(RELU).run(None, {"x": x.astype(np.float32)})[0]
    got = nnrun.InferenceSession(RELU).run(None, {"x": x})[0]
    assert got.dtype == np.float32 and got.dtype.isnative
    assert_close(got, expected)


@pytest.mark.parametrize("feed,words", [
    (None, "expected tensor(float), got None"),
    (object(), "expected tensor(float) as a numpy array, got builtins.object"),
    (np.array([[1, 2, 3]], dtype=object), "expected tensor(float), got an array of Python objects"),
    (np.ones((2, 3), np.float64), "expected tensor(float), got tensor(double)"),
    (np.ones((2, 3), ">f8"), "expected tensor(float), got tensor(double)"),
    ([[1.0, 2.0], [3.0]], "cannot make a tensor of the list given"),
])
def test_a_wrong_feed_is_named_as_given(feed, words):
    with pytest.raises(Exception):  # the oracle refuses it too
        onnxruntime(RELU).run(None, {"x": feed})
    with pytest.raises(nnrun.InputError) as raised:
        nnrun.InferenceSession(RELU).run(None, {"x": feed})
    assert f"input 'x': {words}" in str(raised.value)


def test_a_list_feed_is_converted_as_onnxruntime_converts_it():
    feed = [[1.0, -2.0, 3.0]]
    expected = onnxruntime(RELU).run(None, {"x": feed})[0]
    assert_close(nnrun.InferenceSession(RELU).run(None, {"x": feed})[0], expected)


def test_outputs_asked_twice_are_arrays_of_their_own():
    """A graph output listed twice: two arrays, equal, one not changed through the other."""
    data = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2]), tensor("y", [2])])
    x = np.array([1.0, -2.0], np.float32)
    expected = onnxruntime(data).run(None, {"x": x})
    first, second = nnrun.InferenceSession(data).run(None, {"x": x})
    assert_close(first, expected[0])
    assert_close(second, expected[1])
    assert not np.shares_memory(first, second)


# --- an empty batch


EMPTY_BATCH = {
    "MaxPool": ([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], []),
    "MaxPool with indices": ([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])], []),
    "AveragePool": ([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1])], []),
    "GlobalAveragePool": ([helper.make_node("GlobalAveragePool", ["x"], ["y"])], []),
    "InstanceNormalization": ([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])],
                              [weight("s", np.ones(3, np.float32)), weight("b", np.zeros(3, np.float32))]),
    "Conv and Relu": ([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                      [weight("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))]),
}


@pytest.mark.parametrize("case", list(EMPTY_BATCH))
def test_an_empty_batch_gives_empty_outputs_as_onnxruntime(case):
    nodes, inits = EMPTY_BATCH[case]
    outputs = [tensor(name, None, TensorProto.INT64 if name == "i" else TensorProto.FLOAT)
               for name in nodes[-1].output]
    data = model(nodes, [tensor("x", ["N", 3, 8, 8])], outputs, inits)
    x = np.ones((0, 3, 8, 8), np.float32)
    expected = onnxruntime(data).run(None, {"x": x})
    got = nnrun.InferenceSession(data).run(None, {"x": x})
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype


# --- graphs PREPARE refuses by name


def conv_then(node, inits):
    w = weight("w", rng.standard_normal((3, 3, 1, 1)).astype(np.float32))
    return model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), node],
                 [tensor("x", [1, 3, 4, 4])], [tensor("y", None)], [w, *inits])


REFUSED = {
    "Clip bounds that are not scalars": (
        conv_then(helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip"),
                  [weight("lo", np.zeros(2, np.float32)), weight("hi", np.ones(2, np.float32))]),
        ["node 'clip' (Clip, #1)", "min and max must be scalars"]),
    "BatchNormalization of int statistics": (
        conv_then(helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"),
                  [weight(n, np.ones(3, np.int64)) for n in ("s", "b", "m", "v")]),
        ["node 'bn' (BatchNormalization, #1)", "int64"]),
    "BatchNormalization statistics of the wrong length": (
        conv_then(helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"),
                  [weight(n, np.ones(4, np.float32)) for n in ("s", "b", "m", "v")]),
        ["node 'bn' (BatchNormalization, #1)", "[4]"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_by_name_at_prepare(case):
    data, words = REFUSED[case]
    with pytest.raises(Exception):  # the oracle: onnxruntime refuses it, at load or at the run
        onnxruntime(data).run(None, {"x": np.ones((1, 3, 4, 4), np.float32)})
    with pytest.raises(nnrun.ModelError) as raised:
        nnrun.InferenceSession(data)
    message = str(raised.value)
    for word in words:
        assert word in message
    assert "TypeError" not in message and "ValueError" not in message  # plain words, not Python's


# --- a node with the wrong number of inputs, in either format


def test_a_tflite_operator_with_too_few_inputs_is_refused_by_name():
    from tflite_model import build_tflite

    x = rng.standard_normal((1, 8, 8, 3)).astype(np.float32)
    cases = {"CONV_2D": "CONV_2D takes 2 to 3 inputs, the node has 1", "ADD": "ADD takes 2 inputs, the node has 1"}
    for op, words in cases.items():
        with pytest.raises(nnrun.ModelError, match=words):
            nnrun.InferenceSession(bytes(build_tflite(op, [("x", x, False)], 1)))


def test_a_contrib_node_with_too_many_inputs_is_refused_by_name():
    """No ONNX schema holds com.microsoft's ops at load: the kernel's own signature does."""
    gelu = helper.make_node("Gelu", ["x", "x", "x"], ["y"], domain="com.microsoft", name="g")
    m = helper.make_model(helper.make_graph([gelu], "g", [tensor("x", [2])], [tensor("y", None)]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    data = m.SerializeToString()
    with pytest.raises(Exception):  # the oracle refuses it too
        onnxruntime(data)
    with pytest.raises(nnrun.ModelError, match="node 'g' \\(Gelu, #0\\): Gelu takes 1 input, the node has 3"):
        nnrun.InferenceSession(data)


def test_an_error_inside_a_loop_body_is_not_its_own_cause():
    """Located once in the body and passed up through the Loop: the chain of causes ends."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Reshape", ["x", "s"], ["o"], name="bad")],
        "body", [tensor("i", [], TensorProto.INT64), tensor("c", [], TensorProto.BOOL)],
        [tensor("c2", [], TensorProto.BOOL), tensor("o", None)])
    data = model([helper.make_node("Loop", ["M", ""], ["y"], body=body, name="loop")],
                 [tensor("x", [6]), tensor("s", [1], TensorProto.INT64), tensor("M", [], TensorProto.INT64)],
                 [tensor("y", None)])
    feeds = {"x": np.ones(6, np.float32), "s": np.array([4]), "M": np.array(2)}
    with pytest.raises(Exception):  # the oracle refuses the reshape too
        onnxruntime(data).run(None, feeds)
    with pytest.raises(nnrun.NnrunError) as raised:
        nnrun.InferenceSession(data).run(None, feeds)
    assert "node 'bad' (Reshape, #1)" in str(raised.value)
    seen, error = set(), raised.value
    while error is not None:
        assert id(error) not in seen, "an error in its own chain of causes"
        seen.add(id(error))
        error = error.__cause__


def test_terminate_stops_a_loop_the_file_sets_to_2_62_iterations():
    """No scan output, so nothing grows: the loop is the model's own computation. A watchdog
    thread's RunOptions.terminate ends it at its next iteration with an ExecutionError."""
    import threading
    import time

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Add", ["acc", "one"], ["acc2"])],
        "body", [tensor("i", [], TensorProto.INT64), tensor("c", [], TensorProto.BOOL), tensor("acc", [1])],
        [tensor("c2", [], TensorProto.BOOL), tensor("acc2", [1])],
        [weight("one", np.ones(1, np.float32))])
    data = model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="loop")],
                 [tensor("x", [1])], [tensor("y", [1])], [weight("M", np.array(1 << 62, np.int64))])
    sess = nnrun.InferenceSession(data)
    options = nnrun.RunOptions()
    threading.Timer(0.3, lambda: setattr(options, "terminate", True)).start()
    started = time.perf_counter()
    with pytest.raises(nnrun.ExecutionError, match="terminate flag"):
        sess.run(None, {"x": np.zeros(1, np.float32)}, options)
    assert time.perf_counter() - started < 30  # stopped, not run to its end (a hang check)
