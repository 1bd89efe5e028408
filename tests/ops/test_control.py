"""If, Loop and Scan: subgraphs planned like the main graph, outer-scope values captured."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import nnrun
from graphs import loop_model
from oracle import check_model, make_model

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def if_model(same_shapes=True):
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    then_out = helper.make_tensor_value_info("t", F, None)
    else_out = helper.make_tensor_value_info("e", F, None)
    # then: x @ w (captures x and the outer weight w); else: x * 2 (+ its own initializer),
    # sliced when the shapes are to differ.
    then_branch = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                                    [then_out])
    else_nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
                  helper.make_node("Mul", ["m", "two"], ["e" if same_shapes else "e_full"])]
    else_inits = [numpy_helper.from_array(np.array(2, np.float32), "two")]
    if not same_shapes:
        else_nodes.append(helper.make_node("Slice", ["e_full", "starts", "ends", "axes"], ["e"]))
        else_inits += [numpy_helper.from_array(np.array([v], np.int64), n)
                       for n, v in (("starts", 0), ("ends", 2), ("axes", 1))]
    else_branch = helper.make_graph(else_nodes, "else", [], [else_out], else_inits)
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Relu", ["y"], ["z"])]
    return make_model(nodes, [("x", (np.float32, [2, 3]))], [("z", None)],
                      [("w", w), ("zero", np.array(0, np.float32))])


def test_if_with_equal_branch_shapes_is_planned_statically():
    model = if_model()
    for sign in (1, -1):
        x = sign * np.abs(np.random.default_rng(0).standard_normal((2, 3))).astype(np.float32)
        check_model(model, {"x": x})
    sess = nnrun.InferenceSession(model.SerializeToString())
    assert sess.plan().stats["eager_steps"] == 0


def test_if_with_different_branch_shapes_runs_eagerly():
    model = if_model(same_shapes=False)
    for sign in (1, -1):
        x = sign * np.abs(np.random.default_rng(1).standard_normal((2, 3))).astype(np.float32)
        check_model(model, {"x": x})
    sess = nnrun.InferenceSession(model.SerializeToString())
    assert sess.plan().stats["eager_steps"] == 2  # the If and the Relu after it


def test_loop_with_known_trip_count_is_planned_statically():
    model = loop_model(5, body_stops=False)
    x = np.array([0.5, -1.0], np.float32)
    check_model(model, {"x": x, "acc0": np.zeros(2, np.float32)})
    assert nnrun.InferenceSession(model.SerializeToString()).plan().stats["eager_steps"] == 0


def test_loop_whose_body_decides_when_to_stop():
    model = loop_model(100, body_stops=True)
    for x in (np.array([1.0, 2.0], np.float32), np.array([0.25, 0.5], np.float32)):
        check_model(model, {"x": x, "acc0": np.zeros(2, np.float32)})


def test_scan_cumulative_sum_in_both_directions():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "scale"], ["y"])],
        "body",
        [helper.make_tensor_value_info("s_in", F, [3]), helper.make_tensor_value_info("row", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("y", F, [3])])
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    for direction in (0, 1):
        node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                                scan_input_directions=[direction])
        model = make_model([node], [("s0", (np.float32, [3])), ("x", x)], [("s", None), ("ys", None)],
                           [("scale", np.array(0.5, np.float32))], opset=16)
        check_model(model, {"s0": np.ones(3, np.float32), "x": x})


def scan8_model():
    # Opset 8: a batch axis first; two scan inputs, the second read backwards; each batch row
    # scanned over its own sequence length.
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "b"], ["y"])],
        "body",
        [helper.make_tensor_value_info("s_in", F, [3]), helper.make_tensor_value_info("a", F, [3]),
         helper.make_tensor_value_info("b", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("y", F, [3])])
    node = helper.make_node("Scan", ["lens", "s0", "a", "b"], ["s", "ys"], body=body, num_scan_inputs=2,
                            directions=[0, 1])
    return make_model([node], [("lens", (np.int64, [2])), ("s0", (np.float32, [2, 3])),
                               ("a", (np.float32, [2, 4, 3])), ("b", (np.float32, [2, 4, 3]))],
                      [("s", None), ("ys", None)], opset=8)


def test_scan_of_opset_8_over_batch_rows_of_their_own_lengths():
    r = np.random.default_rng(3)
    feeds = {"s0": r.standard_normal((2, 3)).astype(np.float32),
             "a": r.standard_normal((2, 4, 3)).astype(np.float32),
             "b": r.standard_normal((2, 4, 3)).astype(np.float32)}
    for lens in ((4, 4), (4, 2), (1, 3)):
        check_model(scan8_model(), {**feeds, "lens": np.array(lens, np.int64)})
