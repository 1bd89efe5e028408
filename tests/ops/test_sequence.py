"""Sequences: tuples of arrays made and read by eager steps, never in the arena; Identity, If,
Loop and SequenceMap carrying them. Checked against onnx's reference evaluator, and against
onnxruntime for what a caller sees through the session (a list fed, a list returned)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import nnrun
from graphs import typed_model
from oracle import assert_close_values, check_values, data, i64, run_onnxruntime

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def tensor(name, elem_type=F, shape=None):
    return helper.make_tensor_value_info(name, elem_type, shape)


def sequence(name, elem_type=F, shape=None):
    return helper.make_tensor_sequence_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), opset=17):
    return typed_model(nodes, inputs, outputs, initializers, opset)


def three_tensors(seed=0):
    return [data((2, 3), seed=seed), data((1, 3), seed=seed + 1), data((4, 3), seed=seed + 2)]


def test_construct_then_at_every_position_and_length():
    a, b, c = three_tensors()
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    outputs = [tensor("n", I64, [])]
    for k, position in enumerate((0, 1, 2, -1, -3)):
        nodes += [helper.make_node("Constant", [], [f"p{k}"], value=numpy_helper.from_array(i64(position)[0])),
                  helper.make_node("SequenceAt", ["s", f"p{k}"], [f"at{k}"])]
        outputs.append(tensor(f"at{k}"))
    m = model(nodes, [tensor("a", F, [2, 3]), tensor("b", F, [1, 3]), tensor("c", F, [4, 3])], outputs)
    check_values(m, {"a": a, "b": b, "c": c})


@pytest.mark.parametrize("position", [None, 0, 1, -1, -2])
def test_insert_into_a_fed_sequence(position):
    inputs = [sequence("s"), tensor("t", F, [5, 3])]
    names = ["s", "t"]
    feeds = {"s": three_tensors(), "t": data((5, 3), seed=9)}
    if position is not None:
        inputs.append(tensor("p", I64, []))
        names.append("p")
        feeds["p"] = np.array(position, np.int64)
    m = model([helper.make_node("SequenceInsert", names, ["out"])], inputs, [sequence("out")])
    check_values(m, feeds)


def test_insert_at_the_end_position_appends():
    # position == length: the spec's end of the sequence (the reference evaluator wraps it to
    # the front), so onnxruntime is the oracle.
    m = model([helper.make_node("SequenceInsert", ["s", "t", "p"], ["out"])],
              [sequence("s"), tensor("t", F, [2, 3]), tensor("p", I64, [])], [sequence("out")])
    check_values(m, {"s": three_tensors(), "t": data((2, 3), seed=5), "p": np.array(3, np.int64)},
                 oracle="onnxruntime")


@pytest.mark.parametrize("position", [None, 0, 1, -1, -3])
def test_erase(position):
    inputs, names, feeds = [sequence("s")], ["s"], {"s": three_tensors()}
    if position is not None:
        inputs.append(tensor("p", I64, []))
        names.append("p")
        feeds["p"] = np.array(position, np.int64)
    m = model([helper.make_node("SequenceErase", names, ["out"]),
               helper.make_node("SequenceLength", ["out"], ["n"])], inputs, [sequence("out"), tensor("n", I64, [])])
    check_values(m, feeds)


def test_empty_then_inserts_of_an_int_type():
    nodes = [helper.make_node("SequenceEmpty", [], ["e"], dtype=I64),
             helper.make_node("SequenceInsert", ["e", "x"], ["s1"]),
             helper.make_node("SequenceInsert", ["s1", "y", "zero"], ["s2"]),
             helper.make_node("SequenceLength", ["e"], ["n0"])]
    m = model(nodes, [tensor("x", I64, [3]), tensor("y", I64, [2])], [sequence("s2", I64), tensor("n0", I64, [])],
              [("zero", np.array(0, np.int64))])
    check_values(m, {"x": i64(1, 2, 3), "y": i64(7, 8)})


@pytest.mark.parametrize("axis, split, keepdims", [
    (0, None, 1), (1, None, 0), (-1, None, 1),  # pieces of one
    (1, np.array(4, np.int64), 1),  # of 4, the last of 2
    (0, i64(1, 3), 1), (-2, i64(0, 4), 0),  # of the lengths listed (keepdims ignored)
])
def test_split_to_sequence(axis, split, keepdims):
    inputs, names, feeds = [tensor("x", F, [4, 6])], ["x"], {"x": data((4, 6))}
    if split is not None:
        inputs.append(tensor("split", I64, list(split.shape)))
        names.append("split")
        feeds["split"] = split
    m = model([helper.make_node("SplitToSequence", names, ["s"], axis=axis, keepdims=keepdims)],
              inputs, [sequence("s")])
    check_values(m, feeds)


@pytest.mark.parametrize("axis, new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1), (-3, 1)])
def test_concat_from_sequence(axis, new_axis):
    shape = (2, 3) if new_axis else None
    tensors = [data(shape or ((2, 3) if axis else (k + 1, 3)), seed=k) for k in range(3)]
    if not new_axis and axis:
        tensors = [data((2, k + 1), seed=k) for k in range(3)]
    m = model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis)],
              [sequence("s")], [tensor("y")])
    check_values(m, {"s": tensors})


def test_sequence_of_intermediates_keeps_their_values_while_the_arena_is_reused():
    # r0 and r1 live in the arena; the steps after the SequenceConstruct reuse those bytes,
    # so the sequence must hold copies.
    nodes = [helper.make_node("Relu", ["x"], ["r0"]),
             helper.make_node("Neg", ["x"], ["r1"]),
             helper.make_node("SequenceConstruct", ["r0", "r1"], ["s"]),
             helper.make_node("Mul", ["x", "x"], ["m0"]),
             helper.make_node("Add", ["m0", "x"], ["m1"]),
             helper.make_node("Sigmoid", ["m1"], ["m2"]),
             helper.make_node("SequenceInsert", ["s", "m2"], ["s2"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=0)]
    m = model(nodes, [tensor("x", F, [8, 16])], [tensor("y"), sequence("s2")])
    check_values(m, {"x": data((8, 16)) / 10})
    plan = nnrun.InferenceSession(m.SerializeToString()).plan()
    eager = {s.op_type for s in plan.steps if s.eager}
    assert eager == {"SequenceConstruct", "SequenceInsert", "ConcatFromSequence"}
    arena = {plan.slot_names[a.slot] for a in plan.arena}
    assert not arena & {"s", "s2"}


def test_a_loop_accumulates_a_sequence_and_concatenates_it():
    # The body appends x * (i + 1) to the carried sequence; ConcatFromSequence after the loop.
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["i1"]),
         helper.make_node("Cast", ["i1"], ["f"], to=F),
         helper.make_node("Mul", ["x", "f"], ["scaled"]),
         helper.make_node("SequenceInsert", ["seq_in", "scaled"], ["seq_out"])],
        "body", [tensor("i", I64, []), tensor("cond_in", B, []), sequence("seq_in")],
        [tensor("cond_out", B, []), sequence("seq_out")],
        [numpy_helper.from_array(np.array(1, np.int64), "one")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"]),
             helper.make_node("Loop", ["m", "true", "empty"], ["seq"], body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)]
    m = model(nodes, [tensor("x", F, [2, 3]), tensor("m", I64, [])], [tensor("y"), sequence("seq")],
              [("true", np.array(True))])
    for trips in (1, 4):
        check_values(m, {"x": data((2, 3)), "m": np.array(trips, np.int64)})


def test_a_loop_carries_a_fed_sequence_and_reads_an_outer_one():
    # The shape of SequenceMap written out: SequenceAt on the captured outer sequence.
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("SequenceAt", ["xs", "i"], ["x"]),
         helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("SequenceInsert", ["acc_in", "shape"], ["acc_out"])],
        "body", [tensor("i", I64, []), tensor("cond_in", B, []), sequence("acc_in", I64)],
        [tensor("cond_out", B, []), sequence("acc_out", I64)])
    nodes = [helper.make_node("SequenceLength", ["xs"], ["n"]),
             helper.make_node("Loop", ["n", "true", "acc0"], ["shapes"], body=body)]
    m = model(nodes, [sequence("xs"), sequence("acc0", I64)], [sequence("shapes", I64)], [("true", np.array(True))])
    check_values(m, {"xs": three_tensors(), "acc0": [i64(9)]})


@pytest.mark.parametrize("cond", [True, False])
def test_if_branches_make_sequences(cond):
    then_branch = helper.make_graph([helper.make_node("SplitToSequence", ["x"], ["t"], axis=0)], "then", [],
                                    [sequence("t")])
    else_branch = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["e"])], "else", [],
                                    [sequence("e")])
    m = model([helper.make_node("If", ["c"], ["s"], then_branch=then_branch, else_branch=else_branch),
               helper.make_node("SequenceLength", ["s"], ["n"])],
              [tensor("c", B, []), tensor("x", F, [3, 2])], [sequence("s"), tensor("n", I64, [])])
    check_values(m, {"c": np.array(cond), "x": data((3, 2))})


def test_sequence_map_over_two_sequences_and_a_tensor():
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]),
         helper.make_node("Mul", ["sum", "w"], ["scaled"]),
         helper.make_node("ReduceSum", ["a"], ["total"], keepdims=0)],
        "body", [tensor("a", F, ["N"]), tensor("b", F, ["N"]), tensor("w", F, ["N"])],
        [tensor("scaled", F, ["N"]), tensor("total", F, [])])
    node = helper.make_node("SequenceMap", ["xs", "ys", "w"], ["scaled", "totals"], body=body)
    m = model([node], [sequence("xs"), sequence("ys"), tensor("w", F, [4])],
              [sequence("scaled"), sequence("totals")])
    xs = [data(4, seed=k) for k in range(3)]
    ys = [data(4, seed=10 + k) for k in range(3)]
    # The reference evaluator maps one sequence with tensors, or two sequences: onnxruntime here.
    check_values(m, {"xs": xs, "ys": ys, "w": data(4, seed=20)}, oracle="onnxruntime")


def test_sequence_map_over_a_sequence_with_a_tensor():
    body = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["d"]), helper.make_node("Shape", ["d"], ["s"])],
                             "body", [tensor("x", F, None), tensor("w", F, [3])],
                             [tensor("d", F, None), tensor("s", I64, None)])
    m = model([helper.make_node("SequenceMap", ["xs", "w"], ["ds", "shapes"], body=body)],
              [sequence("xs"), tensor("w", F, [3])], [sequence("ds"), sequence("shapes", I64)])
    check_values(m, {"xs": [data((k + 1, 3), seed=k) for k in range(3)], "w": data(3, seed=7)})


def test_sequence_map_body_reads_an_outer_value():
    body = helper.make_graph([helper.make_node("Mul", ["x", "outer"], ["y"])], "body",
                             [tensor("x", F, None)], [tensor("y", F, None)])
    m = model([helper.make_node("Relu", ["w"], ["outer"]),
               helper.make_node("SequenceMap", ["xs"], ["ys"], body=body)],
              [sequence("xs"), tensor("w", F, [3])], [sequence("ys")])
    # The reference evaluator's SequenceMap gives its body no outer values: onnxruntime here.
    check_values(m, {"xs": [data((2, 3), seed=k) for k in range(4)], "w": data(3, seed=7)}, oracle="onnxruntime")


def test_identity_of_a_sequence_and_an_empty_one():
    m = model([helper.make_node("Identity", ["s"], ["y"])], [sequence("s")], [sequence("y")])
    check_values(m, {"s": three_tensors()})
    check_values(m, {"s": []})


def test_the_session_takes_a_list_and_returns_a_list_as_onnxruntime():
    m = model([helper.make_node("SequenceInsert", ["s", "t"], ["out"]),
               helper.make_node("SequenceLength", ["out"], ["n"])],
              [sequence("s", F, [None, 3]), tensor("t", F, [2, 3])], [sequence("out"), tensor("n", I64, [])])
    feeds = {"s": three_tensors(), "t": data((2, 3), seed=4)}
    expected = run_onnxruntime(m, feeds)
    sess = nnrun.InferenceSession(m.SerializeToString())
    actual = sess.run(None, feeds)
    assert isinstance(actual[0], list)
    for a, e in zip(actual, expected):
        assert_close_values(a, e)
    import onnxruntime as ort
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.type for i in sess.get_inputs()] == [i.type for i in theirs.get_inputs()]
    assert [o.type for o in sess.get_outputs()] == [o.type for o in theirs.get_outputs()]
    # The caller's list is left as it was, and a second run with other lengths takes the same plan.
    before = [t.copy() for t in feeds["s"]]
    assert_close_values(sess.run(None, {"s": feeds["s"][:1], "t": feeds["t"]}),
                        run_onnxruntime(m, {"s": feeds["s"][:1], "t": feeds["t"]}))
    assert_close_values(feeds["s"], before)
    assert len(sess._plans.plans(sess.graph)) == 1


def test_a_fed_sequence_returned_as_it_is():
    m = model([helper.make_node("Relu", ["t"], ["r"])], [sequence("s"), tensor("t", F, [2])],
              [sequence("s"), tensor("r", F, [2])])
    actual = nnrun.InferenceSession(m.SerializeToString()).run(None, {"s": three_tensors(), "t": data(2)})
    assert_close_values(actual[0], three_tensors())


def test_the_session_refuses_a_tensor_for_a_sequence_and_wrong_element_types():
    m = model([helper.make_node("Identity", ["s"], ["y"])], [sequence("s")], [sequence("y")])
    sess = nnrun.InferenceSession(m.SerializeToString())
    with pytest.raises(nnrun.errors.InputError, match="seq\\(tensor\\(float\\)\\)"):
        sess.run(None, {"s": data(3)})
    with pytest.raises(nnrun.errors.InputError, match=r"'s'\[1\]"):
        sess.run(None, {"s": [data(3), i64(1, 2)]})
    with pytest.raises(nnrun.errors.InputError, match="got None"):
        sess.run(None, {"s": None})


def test_a_position_out_of_range_names_the_node():
    m = model([helper.make_node("SequenceAt", ["s", "p"], ["y"], name="pick")],
              [sequence("s"), tensor("p", I64, [])], [tensor("y")])
    sess = nnrun.InferenceSession(m.SerializeToString())
    with pytest.raises(nnrun.NnrunError, match="node 'pick' \\(SequenceAt.*position 3 is out of range"):
        sess.run(None, {"s": three_tensors(), "p": np.array(3, np.int64)})


def test_tensor_only_graphs_have_no_eager_steps():
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
              [tensor("x", F, [2, 3])], [tensor("y", F, [2, 3])])
    assert nnrun.InferenceSession(m.SerializeToString()).plan().stats["eager_steps"] == 0
