"""Sizes a run's values decide, checked at EXECUTE against max_tensor_bytes before anything of that size
is made (executor/run.py's eager steps), and allocations that fail (the arena) raised as nnrun's
errors, never as MemoryError. Each refusal is quick: the bound below is a hang check with room for
a loaded machine, not a speed measurement."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from onnx import helper, numpy_helper
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
