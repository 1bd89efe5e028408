"""The executor's debugging knobs from the API: RunOptions.trace and stop_after, and
nnrun.debug.intermediates, whose values are checked against onnxruntime's (the intermediate
names made graph outputs there)."""

import numpy as np
import onnx
import pytest
from oracle import assert_close, helper, make_model, rng, run_onnxruntime

import nnrun


def conv_chain():
    w = rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["y"], name="flat")]
    return make_model(nodes, [("x", (np.float32, [1, 3, 8, 8]))], [("y", None)], [("w", w)])


def with_outputs(model, names):
    """The model with `names` as extra graph outputs: onnxruntime's way to show intermediates."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    return model


X = {"x": rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}


def session(model, **switches):
    options = nnrun.SessionOptions()
    for name, value in switches.items():
        setattr(options, name, value)
    return nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


def test_intermediates_match_onnxruntime():
    model = conv_chain()
    sess = session(model, fuse_activations=False)  # so that "c" is a step output of its own
    got = nnrun.debug.intermediates(sess, X)
    names = [n for n in got if n != "y"]
    assert set(names) >= {"c", "r", "p"}
    want = run_onnxruntime(with_outputs(model, names), X)[1:]
    for name, expected in zip(names, want):
        assert_close(got[name], expected, what=name)


def test_trace_sees_every_step_in_order_with_its_planned_record():
    sess = session(conv_chain())
    seen = []
    options = nnrun.RunOptions()
    options.trace = lambda step, outputs: seen.append((step.name, step.op_type, outputs[0].shape))
    sess.run(None, X, options)
    assert [s[0] for s in seen] == [s.name for s in sess.plan().steps]
    assert seen[-1][2] == (1, 8)


def test_stop_after_ends_the_run_and_says_which_outputs_it_lacks():
    sess = session(conv_chain(), fuse_activations=False)
    got = nnrun.debug.intermediates(sess, X, stop_after="relu")
    assert "r" in got and "p" not in got
    options = nnrun.RunOptions()
    options.stop_after = "relu"
    with pytest.raises(nnrun.InputError, match=r"\['y'\] are computed after stop_after 'relu'"):
        sess.run(None, X, options)
    options.stop_after = "no such node"
    with pytest.raises(nnrun.InputError, match="names no step"):
        sess.run(None, X, options)
    options.stop_after = 99
    with pytest.raises(nnrun.InputError, match="not a step position"):
        sess.run(None, X, options)
    # the knobs are per run: the next plain run is whole
    assert_close(sess.run(None, X)[0], run_onnxruntime(conv_chain(), X)[0])


def test_a_sequence_intermediate_is_kept_as_a_list_of_its_tensors():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = make_model(nodes, [("x", (np.float32, [2, 3]))], [("y", None)])
    x = rng(2).standard_normal((2, 3)).astype(np.float32)
    found = nnrun.debug.intermediates(nnrun.InferenceSession(model.SerializeToString()), {"x": x}, names=["s"])
    shown = onnx.ModelProto.FromString(model.SerializeToString())  # s made a graph output for onnxruntime
    shown.graph.output.append(helper.make_tensor_sequence_value_info("s", onnx.TensorProto.FLOAT, None))
    expected = run_onnxruntime(shown, {"x": x})[1]
    assert len(found["s"]) == len(expected)
    for a, e in zip(found["s"], expected):
        assert_close(a, e)
