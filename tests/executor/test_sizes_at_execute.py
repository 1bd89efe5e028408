"""Sizes a run's values decide, checked at EXECUTE against max_tensor_bytes before anything of that size
is made (executor/run.py's eager steps, a Loop's scan outputs, sequences), and allocations that fail
(the arena) raised as nnrun's errors, never as MemoryError. Each refusal is quick: the bound below
is a hang check with room for a loaded machine, not a speed measurement."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracle import make_model

import nnrun
from nnrun.errors import SizeLimitError

LIMIT = 1 << 30
HANG_BOUND_S = 1.0


def i64(*values):
    return np.array(values, np.int64)


def session(model, limit=LIMIT):
    options = nnrun.SessionOptions()
    options.max_tensor_bytes = limit
    return nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


def refused_at_run(sess, feeds):
    """The message of the SizeLimitError `sess.run` raises, within HANG_BOUND_S."""
    started = time.perf_counter()
    with pytest.raises(SizeLimitError) as e:
        sess.run(None, feeds)
    elapsed = time.perf_counter() - started
    assert elapsed < HANG_BOUND_S, f"{elapsed:.2f} s: {e.value}"
    return str(e.value)


@pytest.mark.parametrize("op,inputs,feeds,initializers,shape", [
    ("ConstantOfShape", ["s"], {"s": i64(1 << 35)}, [], "[34359738368] float32"),
    ("Expand", ["x", "s"], {"x": np.ones(1, np.float32), "s": i64(1 << 62, 1 << 62)}, [],
     f"[{1 << 62}, {1 << 62}] float32"),
    ("Tile", ["x", "s"], {"x": np.ones(4, np.float32), "s": i64(1 << 62)}, [], f"[{1 << 64}] float32"),
    ("Range", ["a", "b", "s"], {"a": np.array(-(1 << 62)), "b": np.array(1 << 62), "s": np.array(1)}, [],
     f"[{1 << 63}] int64"),
    ("Pad", ["x", "s"], {"x": np.ones((1, 1), np.float32), "s": i64(1 << 62, 0, 1 << 62, 0)}, [],
     f"[{(1 << 63) + 1}, 1] float32"),
    ("OneHot", ["x", "s", "v"], {"x": i64(0, 1), "s": np.array(1 << 40)}, [("v", np.array([0, 1], np.float32))],
     "[2, 1099511627776] float32"),
    ("Resize", ["x", "", "", "s"], {"x": np.ones((1, 1, 4, 4), np.float32), "s": i64(1, 1, 1 << 20, 1 << 20)}, [],
     "[1, 1, 1048576, 1048576] float32"),
])
def test_sizes_from_fed_values_are_refused_before_allocation(op, inputs, feeds, initializers, shape):
    """The node's size comes from a graph input: known only per run, checked then."""
    node = helper.make_node(op, inputs, ["y"], name="hostile")
    declared = [(n, (a.dtype, list(a.shape))) for n, a in feeds.items()]
    model = make_model([node], declared, [("y", None)], initializers)
    message = refused_at_run(session(model), feeds)
    assert message.startswith(f"EXECUTE: node 'hostile' ({op}, #0): output 'y' of shape {shape} would take ")
    assert message.endswith(f" bytes, beyond max_tensor_bytes ({LIMIT:,})")


def test_nonzero_indices_are_counted_before_they_are_made():
    """A million true bools (1 MiB) make 8 MiB of int64 indices."""
    node = helper.make_node("NonZero", ["x"], ["y"], name="where")
    model = make_model([node], [("x", (np.bool_, [1 << 20]))], [("y", None)])
    message = refused_at_run(session(model, limit=4 << 20), {"x": np.ones(1 << 20, np.bool_)})
    assert message == ("EXECUTE: node 'where' (NonZero, #0): output 'y' of shape [1, 1048576] int64 would take "
                       "8,388,608 bytes, beyond max_tensor_bytes (4,194,304)")


def test_a_fed_size_within_the_limit_runs():
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], value=numpy_helper.from_array(np.array([2.5], np.float32)))
    model = make_model([node], [("s", (np.int64, [2]))], [("y", None)])
    (y,) = session(model, limit=24).run(None, {"s": i64(2, 3)})
    np.testing.assert_array_equal(y, np.full((2, 3), 2.5, np.float32))  # ConstantOfShape's definition
    with pytest.raises(SizeLimitError, match=r"output 'y' of shape \[2, 4\] float32 would take 32 bytes"):
        session(model, limit=24).run(None, {"s": i64(2, 4)})


def _loop_model(body_nodes, body_outputs, m_fed=False, carried=(), body_initializers=(), outer=()):
    """Loop(M, "", carried...) over `body_nodes`, whose inputs are i, c_in and each carried name."""
    inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
              helper.make_tensor_value_info("c_in", TensorProto.BOOL, [])]
    inputs += [helper.make_tensor_sequence_value_info(f"{name}_in", TensorProto.FLOAT, None) for name in carried]
    body = helper.make_graph(body_nodes, "body", inputs, body_outputs,
                             [numpy_helper.from_array(a, n) for n, a in body_initializers])
    loop = helper.make_node("Loop", ["M", "", *[f"{name}0" for name in carried]], ["y"], name="loop", body=body)
    nodes = [helper.make_node("SequenceEmpty", [], [f"{name}0"], dtype=TensorProto.FLOAT) for name in carried]
    graph_inputs = [helper.make_tensor_value_info("M", TensorProto.INT64, [])] if m_fed else []
    graph_inputs += [helper.make_tensor_value_info(n, TensorProto.INT64, [len(v)]) for n, v in outer]
    initializers = [] if m_fed else [numpy_helper.from_array(np.array(1 << 40, np.int64), "M")]
    output = (helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, None) if carried
              else helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes + [loop], "g", graph_inputs, [output], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


CONTINUE = helper.make_tensor_value_info("c_out", TensorProto.BOOL, [])
SCAN = helper.make_tensor_value_info("s", TensorProto.FLOAT, None)


def test_loop_trip_count_fed_at_run_time_is_refused_before_looping():
    body = [helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Cast", ["i"], ["s"], to=TensorProto.FLOAT)]
    sess = session(_loop_model(body, [CONTINUE, SCAN], m_fed=True))
    message = refused_at_run(sess, {"M": np.array(1 << 40, np.int64)})
    assert "node 'loop' (Loop, #0): output 'y' of shape [1099511627776] float32" in message
    (y,) = sess.run(None, {"M": np.array(3, np.int64)})
    np.testing.assert_array_equal(y, [0, 1, 2])  # Loop's definition: the iteration numbers, scanned


def test_loop_scan_of_a_shape_known_only_by_running_is_refused_after_one_iteration():
    """Each iteration scans a tensor whose shape the body's values decide (NonZero): the first
    iteration tells its size, and 2^40 iterations of it are refused before the second."""
    body = [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("NonZero", ["v"], ["nz"]),
            helper.make_node("Cast", ["nz"], ["s"], to=TensorProto.FLOAT)]
    sess = session(_loop_model(body, [CONTINUE, SCAN], outer=[("v", [0] * 1024)]))
    message = refused_at_run(sess, {"v": np.ones(1024, np.int64)})
    assert message.startswith("EXECUTE: node 'loop' (Loop, #0): the scan outputs of 1,099,511,627,776 iterations "
                              "would hold")


def test_loop_that_may_stop_is_refused_once_its_scans_outgrow_the_limit():
    """The body decides when to stop (i < 2^40): the scan outputs are checked as they grow."""
    body = [helper.make_node("Less", ["i", "last"], ["c_out"]), helper.make_node("ConstantOfShape", ["n"], ["s"])]
    model = _loop_model(body, [CONTINUE, SCAN], outer=[("n", [1])],
                        body_initializers=[("last", np.array(1 << 40, np.int64))])
    message = refused_at_run(session(model, limit=1 << 20), {"n": i64(1 << 14)})  # 64 KiB an iteration
    assert message.startswith("EXECUTE: node 'loop' (Loop, #0): the scan outputs after 16 iterations would hold 16 "
                              "tensors")


def test_sequence_insert_in_a_loop_is_refused_once_the_sequence_outgrows_the_limit():
    body = [helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("SequenceInsert", ["seq_in", "t"], ["seq_out"], name="insert")]
    outputs = [CONTINUE, helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None)]
    model = _loop_model(body, outputs, carried=["seq"], body_initializers=[("t", np.ones(1 << 14, np.float32))])
    message = refused_at_run(session(model, limit=1 << 20), {})
    # The body's error, located in the body (its node's index is the body's).
    assert message.startswith("EXECUTE: node 'insert' (SequenceInsert, #1): the sequence would hold 16 tensors, "
                              "1,050,368 bytes with their headers, beyond max_tensor_bytes (1,048,576)")


def test_split_to_sequence_into_too_many_pieces_is_refused():
    """A million one-byte pieces take a hundred megabytes of headers: refused before splitting."""
    node = helper.make_node("SplitToSequence", ["x"], ["y"], name="split", keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1 << 20])],
                              [helper.make_tensor_sequence_value_info("y", TensorProto.UINT8, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    message = refused_at_run(session(model, limit=1 << 24), {"x": np.zeros(1 << 20, np.uint8)})
    assert message.startswith("EXECUTE: node 'split' (SplitToSequence, #0): the sequence would hold 1,048,576 "
                              "tensors")


# The arena: a run whose arena cannot be allocated (the process's address space is capped below
# it) fails with nnrun's error, whether the arena exceeds max_tensor_bytes or not.
ARENA_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from onnx import helper
    sys.path.insert(0, {tests!r})
    from oracle import make_model
    import nnrun

    n = 1 << 27  # two live intermediates of 512 MiB: an arena of 1 GiB
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("ReduceMax", ["r"], ["y"], keepdims=0)]
    model = make_model(nodes, [("x", (np.float32, [1]))], [("y", None)], [("shape", np.array([n], np.int64))])
    options = nnrun.SessionOptions()
    options.max_tensor_bytes = {limit}
    options.enable_mem_poll = False
    sess = nnrun.InferenceSession(model.SerializeToString(), sess_options=options)
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
    try:
        sess.run(None, {{"x": np.ones(1, np.float32)}})
    except BaseException as e:
        print(type(e).__name__, e)
""")


@pytest.mark.parametrize("limit,expected", [
    (768 << 20, "SizeLimitError EXECUTE: cannot allocate the arena of 1,073,741,824 bytes, beyond max_tensor_bytes "
                "(805,306,368): MemoryError"),
    (2 << 30, "ExecutionError EXECUTE: cannot allocate the arena of 1,073,741,824 bytes: MemoryError"),
])
def test_an_arena_that_cannot_be_allocated_is_an_nnrun_error(limit, expected):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = ARENA_SCRIPT.format(tests=tests, limit=limit)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith(expected), result.stdout + result.stderr
