"""Deep graphs: long chains and deeply nested subgraphs load, plan and run, against onnxruntime.

A chain of a few hundred thousand nodes must cost time linear in its nodes at every phase (the
figures are measured apart, not asserted here); graphs nested as deep as protobuf lets a file
nest them (31 levels of If, Loop or Scan with their value infos) load and run as in onnxruntime,
and deeper ones are refused as onnxruntime refuses them, with a ModelError that names the limit.
Nested files are written byte by byte: onnx's helper cannot build them past 32 levels.
"""

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import nnrun
from nnrun.loader.protowire import encode_varint, length_delimited
from oracle import WHOLE_MODEL_RTOL, assert_close, check_model, data


# --- long chains ---------------------------------------------------------------------------------------

def chain_model(n, make_node, initializers=()):
    """x [1, 16] -> n nodes, each reading the one before -> y."""
    nodes = [make_node(i, "x" if i == 0 else f"t{i - 1}", "y" if i == n - 1 else f"t{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [onnx.numpy_helper.from_array(a, name) for name, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def checked_session(model, feeds):
    """nnrun's session of `model`, its outputs checked against onnxruntime's on the whole model with
    its default optimizations (as the whole-model tests do: without them onnxruntime makes a kernel of
    each of 200,000 identities, 7 s). The models here compute floats."""
    import onnxruntime

    data = model.SerializeToString()
    expected = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = nnrun.InferenceSession(data)
    for k, (got, want) in enumerate(zip(sess.run(None, feeds), expected)):
        assert_close(got, want, rtol=WHOLE_MODEL_RTOL, what=f"output {k}")
    return sess


def test_a_chain_of_200000_identities():
    model = chain_model(200_000, lambda i, a, b: helper.make_node("Identity", [a], [b]))
    sess = checked_session(model, {"x": data((1, 16))})
    assert sess.plan().stats["steps"] <= 1  # the identities are dropped


def test_a_chain_of_50000_adds_and_muls_with_constants():
    half = np.full((1, 16), 0.5, np.float32)
    model = chain_model(50_000, lambda i, a, b: helper.make_node("Mul" if i % 2 else "Add", [a, "half"], [b]),
                        [("half", half)])
    sess = checked_session(model, {"x": data((1, 16))})
    assert sess.plan().stats["steps"] == 50_000


# --- nested subgraphs, written byte by byte --------------------------------------------------------------

def _varint_field(number, value):
    return encode_varint(number << 3) + encode_varint(value)


def _text(number, text):
    return length_delimited(number, text.encode())


def _value(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape).SerializeToString()


def _graph(nodes, name, outputs, inputs=(), initializers=(), doc=""):
    return (b"".join(length_delimited(1, n) for n in nodes) + _text(2, name)
            + b"".join(length_delimited(5, t.SerializeToString()) for t in initializers)
            + (_text(10, doc) if doc else b"")
            + b"".join(length_delimited(11, v) for v in inputs) + b"".join(length_delimited(12, v) for v in outputs))


def _node(op, inputs, outputs, attributes=()):
    return (b"".join(_text(1, i) for i in inputs) + b"".join(_text(2, o) for o in outputs) + _text(4, op)
            + b"".join(length_delimited(5, a) for a in attributes))


def _graph_attribute(name, graph):
    return _text(1, name) + _varint_field(20, onnx.AttributeProto.GRAPH) + length_delimited(6, graph)


def _int_attribute(name, value):
    return _text(1, name) + _varint_field(20, onnx.AttributeProto.INT) + _varint_field(3, value)


def _model(main):
    opset = helper.make_opsetid("", 17).SerializeToString()
    return _varint_field(1, 8) + length_delimited(8, opset) + length_delimited(7, main)


F, BOOL, INT64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def nested_if(depth, doc=""):
    """`depth` Ifs, each in the then-branch of the one before; the innermost then-branch is Relu(x),
    every else-branch Neg(x) (both read x from the outermost scope). `doc`: every graph's doc_string."""
    then = _graph([_node("Relu", ["x"], [f"y{depth}"])], f"then{depth}", [_value(f"y{depth}", F, [1, 4])], doc=doc)
    for d in reversed(range(depth)):
        other = _graph([_node("Neg", ["x"], [f"n{d}"])], f"else{d}", [_value(f"n{d}", F, [1, 4])])
        node = _node("If", ["cond"], [f"y{d}"], [_graph_attribute("then_branch", then),
                                                 _graph_attribute("else_branch", other)])
        then = _graph([node], f"then{d}", [_value(f"y{d}", F, [1, 4])], doc=doc)
    main = _graph([node], "main", [_value("y0", F, [1, 4])], [_value("x", F, [1, 4]), _value("cond", BOOL, [])])
    return _model(main), {"x": data((1, 4)), "cond": np.array(True)}


def nested_loop(depth):
    """`depth` Loops, each in the body of the one before, each run once (M and the condition from the
    outermost scope) carrying v; the innermost body negates it."""
    body = None
    for d in reversed(range(1, depth + 1)):
        inner = (_node("Neg", [f"v{d}"], [f"v{d}_out"]) if body is None else
                 _node("Loop", ["M", "t", f"v{d}"], [f"v{d}_out"], [_graph_attribute("body", body)]))
        body = _graph([_node("Identity", [f"c{d}"], [f"c{d}_out"]), inner], f"body{d}",
                      [_value(f"c{d}_out", BOOL, []), _value(f"v{d}_out", F, [1, 4])],
                      [_value(f"i{d}", INT64, []), _value(f"c{d}", BOOL, []), _value(f"v{d}", F, [1, 4])])
    constants = [helper.make_tensor("M", INT64, [], [1]), helper.make_tensor("t", BOOL, [], [True])]
    main = _graph([_node("Loop", ["M", "t", "x"], ["y"], [_graph_attribute("body", body)])], "main",
                  [_value("y", F, [1, 4])], [_value("x", F, [1, 4])], constants)
    return _model(main), {"x": data((1, 4))}


def nested_scan(depth):
    """`depth` Scans, each in the body of the one before, with one state and one scan input of length
    1 (the slice the enclosing Scan gives, unsqueezed); the innermost body adds them."""
    body = None
    for d in reversed(range(1, depth + 1)):
        v, s = f"v{d}", f"s{d}"
        if body is None:
            nodes = [_node("Add", [v, s], [f"{v}_out"])]
        else:
            nodes = [_node("Unsqueeze", [s, "axes"], [f"u{d}"]),
                     _node("Scan", [v, f"u{d}"], [f"{v}_out", f"sc{d}"],
                           [_graph_attribute("body", body), _int_attribute("num_scan_inputs", 1)])]
        nodes.append(_node("Identity", [s], [f"{s}_out"]))
        body = _graph(nodes, f"body{d}", [_value(f"{v}_out", F, [4]), _value(f"{s}_out", F, [4])],
                      [_value(v, F, [4]), _value(s, F, [4])])
    main = _graph([_node("Scan", ["x", "s"], ["y", "sc0"], [_graph_attribute("body", body),
                                                           _int_attribute("num_scan_inputs", 1)])],
                  "main", [_value("y", F, [4]), _value("sc0", F, [1, 4])],
                  [_value("x", F, [4]), _value("s", F, [1, 4])],
                  [helper.make_tensor("axes", INT64, [1], [0])])
    return _model(main), {"x": data((4,)), "s": data((1, 4), seed=1)}


NESTED = {"If": nested_if, "Loop": nested_loop, "Scan": nested_scan}


@pytest.mark.parametrize("op", NESTED)
@pytest.mark.parametrize("depth", [3, 31])
def test_nesting_as_deep_as_onnxruntime_loads_runs(op, depth):
    model, feeds = NESTED[op](depth)
    check_model(onnx.ModelProto.FromString(model), feeds)


def test_nested_ifs_with_known_conditions_are_inlined_at_every_depth():
    model, feeds = nested_if(31)
    proto = onnx.ModelProto.FromString(model)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(True), "cond"))
    del proto.graph.input[1]
    feeds.pop("cond")
    sess = checked_session(proto, feeds)
    assert "If" not in [s.op_type for s in sess.plan().steps]


@pytest.mark.parametrize("op", NESTED)
@pytest.mark.parametrize("depth", [32, 200])
def test_nesting_deeper_than_protobuf_parses_is_refused_as_by_onnxruntime(op, depth):
    import onnxruntime

    model, _ = NESTED[op](depth)
    with pytest.raises(Exception) as theirs:
        onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert type(theirs.value).__name__ == "InvalidProtobuf"
    with pytest.raises(nnrun.ModelError, match="nested deeper than 100") as ours:
        nnrun.InferenceSession(model)
    # nnrun's errors derive from the classes of onnxruntime's names (nnrun.capi stands in for its module)
    assert type(theirs.value).__name__ in {c.__name__ for c in type(ours.value).__mro__}


def test_the_walk_of_the_file_stops_at_the_limit():
    # Every level larger than the walk leaves to protobuf: the walk itself meets the 101st message.
    model, _ = nested_if(200, doc="d" * 2048)
    with pytest.raises(nnrun.ModelError, match=r"byte offset \d+: messages nested deeper than 100"):
        nnrun.InferenceSession(model)


def _at_stack_depth(frames_left, call):
    """call() with the Python stack this many frames short of the recursion limit."""
    here, frame = 0, sys._getframe()
    while frame is not None:
        here, frame = here + 1, frame.f_back

    def down(n):
        return call() if n <= 0 else down(n - 1)

    return down(sys.getrecursionlimit() - frames_left - here - 2)


@pytest.mark.parametrize("frames_left", [400, 250, 150, 80])
def test_no_recursion_error_escapes_even_from_a_deep_stack(frames_left):
    model, feeds = nested_loop(31)
    nnrun.InferenceSession(model)  # imports done before the stack runs short

    def create_and_run():
        try:
            nnrun.InferenceSession(model).run(None, feeds)
        except nnrun.NnrunError as e:
            return e
        return None

    error = _at_stack_depth(frames_left, create_and_run)
    assert error is None or "recursion" in str(error)
