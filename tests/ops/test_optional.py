"""Optionals: an element (a tensor, or a sequence) or None when empty, as onnxruntime gives and
takes them. Checked against onnxruntime where an Optional node is made or an empty optional
returned (the reference evaluator's Optional wraps its input in a list, and none of its ops
may return an empty optional), against the reference evaluator elsewhere."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import nnrun
from graphs import typed_model
from oracle import assert_close_values, check_values, data, run_onnxruntime

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def tensor(name, elem_type=F, shape=None):
    return helper.make_tensor_value_info(name, elem_type, shape)


def optional(name, elem_type=F, shape=None, of_sequence=False):
    element = helper.make_tensor_type_proto(elem_type, shape)
    if of_sequence:
        element = helper.make_sequence_type_proto(element)
    return helper.make_value_info(name, helper.make_optional_type_proto(element))


def model(nodes, inputs, outputs, initializers=(), opset=18):
    return typed_model(nodes, inputs, outputs, initializers, opset)


def test_an_optional_made_of_an_intermediate_holds_it():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Optional", ["r"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["back"]),
             helper.make_node("Neg", ["back"], ["y"])]
    m = model(nodes, [tensor("x", F, [2, 3])], [tensor("has", B, []), tensor("y", F, [2, 3])])
    check_values(m, {"x": data((2, 3))}, oracle="onnxruntime")
    # A tensor always holds its element: nothing of it is left to run per run.
    plan = nnrun.InferenceSession(m.SerializeToString()).plan()
    assert plan.stats["eager_steps"] == 0


def test_an_empty_optional_has_no_element():
    empty = helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(F, [2]))
    m = model([empty, helper.make_node("OptionalHasElement", ["o"], ["has"])], [], [tensor("has", B, [])])
    check_values(m, {}, oracle="onnxruntime")


@pytest.mark.parametrize("inputs", [[], [""]])
def test_has_element_of_an_omitted_input_is_false(inputs):
    m = model([helper.make_node("OptionalHasElement", inputs, ["has"])], [], [tensor("has", B, [])])
    check_values(m, {})


@pytest.mark.parametrize("of_sequence", [False, True])
def test_a_fed_optional_full_or_empty(of_sequence):
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Identity", ["o"], ["same"])]
    out = optional("same", F, [3], of_sequence)
    m = model(nodes, [optional("o", F, [3], of_sequence)], [tensor("has", B, []), out])
    element = [data(3, seed=1), data(3, seed=2)] if of_sequence else data(3)
    for value in (element, None):
        check_values(m, {"o": value}, oracle="onnxruntime")


def test_get_element_of_a_sequence_in_an_optional():
    nodes = [helper.make_node("OptionalGetElement", ["o"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    m = model(nodes, [optional("o", F, [2], of_sequence=True)], [tensor("y")])
    check_values(m, {"o": [data(2, seed=1), data(2, seed=2)]})


def test_get_element_of_an_empty_optional_names_the_node():
    m = model([helper.make_node("OptionalGetElement", ["o"], ["y"], name="get")], [optional("o", F, [3])],
              [tensor("y", F, [3])])
    with pytest.raises(nnrun.NnrunError, match="node 'get' \\(OptionalGetElement.*the optional input is empty"):
        nnrun.InferenceSession(m.SerializeToString()).run(None, {"o": None})


def test_an_if_returns_an_empty_or_a_full_optional_sequence():
    then_branch = helper.make_graph(
        [helper.make_node("Optional", [], ["t"],
                          type=helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2])))],
        "then", [], [optional("t", F, [2], of_sequence=True)])
    else_branch = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x"], ["s"]), helper.make_node("Optional", ["s"], ["e"])],
        "else", [], [optional("e", F, [2], of_sequence=True)])
    m = model([helper.make_node("If", ["c"], ["o"], then_branch=then_branch, else_branch=else_branch),
               helper.make_node("OptionalHasElement", ["o"], ["has"])],
              [tensor("c", B, []), tensor("x", F, [2])], [tensor("has", B, [])])
    for cond in (True, False):
        check_values(m, {"c": np.array(cond), "x": data(2)}, oracle="onnxruntime")


def test_a_loop_carries_an_optional_sequence_that_starts_empty():
    # The body starts a sequence when the carried optional is empty, then appends to it.
    start = helper.make_graph([helper.make_node("SequenceConstruct", ["x"], ["first"])], "start", [],
                              [helper.make_tensor_sequence_value_info("first", F, [2])])
    go_on = helper.make_graph([helper.make_node("OptionalGetElement", ["o_in"], ["held"])], "go_on", [],
                              [helper.make_tensor_sequence_value_info("held", F, [2])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("OptionalHasElement", ["o_in"], ["has"]),
         helper.make_node("Not", ["has"], ["empty"]),
         helper.make_node("If", ["empty"], ["seq"], then_branch=start, else_branch=go_on),
         helper.make_node("Cast", ["i"], ["f"], to=F),
         helper.make_node("Add", ["x", "f"], ["next"]),
         helper.make_node("SequenceInsert", ["seq", "next"], ["seq_out"])],
        "body", [tensor("i", I64, []), tensor("cond_in", B, []), optional("o_in", F, [2], of_sequence=True)],
        [tensor("cond_out", B, []), helper.make_tensor_sequence_value_info("seq_out", F, [2])])
    m = model([helper.make_node("Loop", ["m", "true", "o"], ["seq"], body=body)],
              [tensor("m", I64, []), tensor("x", F, [2]), optional("o", F, [2], of_sequence=True)],
              [helper.make_tensor_sequence_value_info("seq", F, [2])], [("true", np.array(True))])
    # A 0-d element fed stays 0-d (onnx's backend case loop16_seq_none starts with one).
    for start_with in (None, [data(2, seed=3)], [np.array(0.5, np.float32)]):
        check_values(m, {"m": np.array(3, np.int64), "x": data(2), "o": start_with})


def test_the_session_takes_none_and_an_array_for_an_optional_tensor_as_onnxruntime():
    m = model([helper.make_node("OptionalHasElement", ["o"], ["has"])], [optional("o", F, [3])],
              [tensor("has", B, [])])
    sess = nnrun.InferenceSession(m.SerializeToString())
    for value in (data(3), None):
        assert_close_values(sess.run(None, {"o": value}), run_onnxruntime(m, {"o": value}))
    import onnxruntime as ort
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.type for i in sess.get_inputs()] == [i.type for i in theirs.get_inputs()]
    with pytest.raises(nnrun.errors.InputError, match="optional\\(tensor\\(float\\)\\).*got a list"):
        sess.run(None, {"o": [data(3)]})
