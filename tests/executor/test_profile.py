"""The profiler (runtime/executor/profile.py), the memory timeline (runtime/timeline.py) and
their command-line switches: one Chrome-trace event per step of every run, onnxruntime's
profiling API, outputs unchanged by profiling (checked against onnxruntime)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from oracle import WHOLE_MODEL_RTOL, assert_close, run_onnxruntime_path

import nnrun
from nnrun.compiler.plan import MAPPED
from nnrun.executor.profile import format_top_ops, top_ops
from nnrun.timeline import largest_live, memory_timeline

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
MODEL = os.path.join(MODELS, "mobilenet_tiny.onnx")


def feeds_for(sess, seed=0):
    arg = sess.get_inputs()[0]
    return {arg.name: np.random.default_rng(seed).standard_normal(arg.shape).astype(np.float32)}


def profiled_session(tmp_path, **fields):
    options = nnrun.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace")
    for k, v in fields.items():
        setattr(options, k, v)
    return nnrun.InferenceSession(MODEL, sess_options=options)


def test_one_event_per_step_of_every_run_and_outputs_unchanged(tmp_path):
    sess = profiled_session(tmp_path)
    feeds = feeds_for(sess)
    for _ in range(3):
        (y,) = sess.run(None, feeds)
    assert_close(y, run_onnxruntime_path(MODEL, feeds)[0], rtol=WHOLE_MODEL_RTOL)
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "trace_")) and path.endswith(".json")
    events = json.load(open(path))["traceEvents"]
    plan = sess.plan()
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 3 * len(plan.steps)
    assert [e["name"] for e in nodes[:len(plan.steps)]] == [s.name for s in plan.steps]
    phases = [e["name"] for e in events if e["cat"] == "Session"]
    assert phases == ["MODEL_LOAD", "PREPARE", "EXECUTE", "EXECUTE", "EXECUTE"]
    first = nodes[0]["args"]
    step = plan.steps[0]
    assert first["op_name"] == step.op_type and first["node_index"] == step.index
    assert first["weight_bytes"] == step.weight_bytes and first["arena_live_bytes"] == plan.live_bytes[0]
    assert first["output_type_shape"] == [{"float32": list(step.output_values[0].shape)}]
    assert all(e["dur"] >= 0 and e["ph"] == "X" for e in events)
    # Steps lie inside their run, in order.
    runs = [e for e in events if e["name"] == "EXECUTE"]
    per_run = len(plan.steps)
    for run, chunk in zip(runs, (nodes[i:i + per_run] for i in range(0, len(nodes), per_run))):
        assert run["ts"] <= chunk[0]["ts"] and chunk[-1]["ts"] + chunk[-1]["dur"] <= run["ts"] + run["dur"] + 1


def test_end_profiling_starts_afresh_and_returns_nothing_when_off(tmp_path):
    sess = profiled_session(tmp_path)
    sess.run(None, feeds_for(sess))
    sess.end_profiling()
    sess.run(None, feeds_for(sess))
    events = json.load(open(sess.end_profiling()))["traceEvents"]
    assert [e["name"] for e in events if e["cat"] == "Session"] == ["EXECUTE"]
    assert nnrun.InferenceSession(MODEL).end_profiling() == ""


def test_top_ops_add_up_to_the_steps():
    sess = profiled_session_in_memory()
    for _ in range(2):
        sess.run(None, feeds_for(sess))
    trace = sess._profiler.trace()
    runs, execute_us, by_type, by_node = top_ops(trace)
    assert runs == 2
    assert sum(count for count, _ in by_type.values()) == 2 * len(sess.plan().steps)
    assert sum(total for _, total in by_type.values()) <= execute_us
    text = format_top_ops(trace)
    assert "Conv" in text and "% EXECUTE" in text


def profiled_session_in_memory():
    options = nnrun.SessionOptions()
    options.enable_profiling = True
    return nnrun.InferenceSession(MODEL, sess_options=options)


def test_memory_timeline_follows_the_plan():
    plan = nnrun.InferenceSession(MODEL).plan()
    rows = memory_timeline(plan)
    assert len(rows) == len(plan.steps)
    assert max(r["arena_live_bytes"] for r in rows) == plan.lower_bound_bytes
    weights = {w.name: w.nbytes for s in plan.steps for w in s.weights}
    assert rows[-1]["weights_resident_bytes"] == sum(weights.values())
    resident = [r["weights_resident_bytes"] for r in rows]
    assert resident == sorted(resident)  # pages come in and, without a budget, stay
    peak = max(range(len(rows)), key=lambda i: rows[i]["arena_live_bytes"])
    named = largest_live(plan, peak)
    assert named and all(b.first <= peak <= b.last for b in named)
    assert [b.nbytes for b in named] == sorted((b.nbytes for b in named), reverse=True)


def test_mapped_weights_come_in_at_their_first_reader(tmp_path):
    from oracle import helper, make_model

    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])]
    model = make_model(nodes, [("x", np.zeros((4, 16), np.float32))], [("y", None)], [("w", w)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    plan = nnrun.InferenceSession(str(path)).plan()
    rows = memory_timeline(plan)
    if plan.steps[1].weights[0].where == MAPPED:
        assert [r["weights_resident_bytes"] for r in rows] == [0, w.nbytes]
    else:  # a kernel that packs it: resident from the start
        assert [r["weights_resident_bytes"] for r in rows] == [w.nbytes, w.nbytes]


def test_the_cli_writes_the_profile_and_the_timeline(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra is part of the test extra")
    trace, picture = tmp_path / "p.json", tmp_path / "t.png"
    out = subprocess.run([sys.executable, "-m", "nnrun.cli", "--model", MODEL, "--repeat", "2",
                          "--warmup", "1", "--profile", str(trace), "--memory-timeline", str(picture),
                          "--disable-pass", "fuse_activations"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "Op types by total time over 2 runs" in out and "Top 10 nodes by time" in out
    events = json.load(open(trace))["traceEvents"]
    assert sum(1 for e in events if e["name"] == "EXECUTE") == 2  # the warm-up run is not in it
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in os.listdir(tmp_path) if p.startswith("nnrun_profile")]


def test_the_cli_refuses_an_unknown_pass():
    out = subprocess.run([sys.executable, "-m", "nnrun.cli", "--model", MODEL, "--disable-pass", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown passes ['nope']" in out.stderr
