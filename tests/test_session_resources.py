"""What a session holds of the system, and when it lets go (session.py, plan_cache.py, paging.OpenFile):
dropping the last reference with the garbage collector off unmaps the model and closes every
descriptor at once (the session holds no reference cycle); `close()` and the end of a `with` block do
the same while the object lives on, and a run after them raises SessionClosedError.

Counted from the kernel's side: /proc/self/fd entries and /proc/self/maps lines that name a file of
the test's directory (the model, its external data, its weight cache files).
"""

import gc
import os
import threading

import numpy as np
import onnx
import pytest
from graphs import loop_model
from onnx import helper
from oracle import make_model, rng

import nnrun

X = {"x": rng(1).standard_normal((4, 512)).astype(np.float32)}


def held(directory):
    """(descriptors, mapped regions) of this process that name a file under `directory`."""
    root = os.path.realpath(directory) + os.sep
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used
            continue
        if target.startswith(root):
            fds.append(target)
    with open("/proc/self/maps") as f:
        maps = [line.split(None, 5)[-1].strip() for line in f if root in line]
    return sorted(fds), sorted(maps)


def mlp(dims=(4, 512), seed=0):
    r = rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    inits = [("w1", (r.standard_normal((512, 512)) / 23).astype(np.float32)),
             ("w2", (r.standard_normal((64, 512)) / 23).astype(np.float32)),
             ("b2", r.standard_normal(64).astype(np.float32))]
    return make_model(nodes, [("x", (np.float32, list(dims)))], [("y", None)], inits)


def options(cache=None, **fields):
    chosen = nnrun.SessionOptions()
    chosen.weight_cache_dir = cache and str(cache)
    for name, value in fields.items():
        setattr(chosen, name, value)
    return chosen


def onnx_case(tmp_path):
    onnx.save(mlp(), tmp_path / "m.onnx")
    return tmp_path / "m.onnx", options(), [X]


def unrun_case(tmp_path):
    path, chosen, _ = onnx_case(tmp_path)
    return path, chosen, []


def tflite_case(tmp_path):
    from tflite_model import build_tflite

    r = rng(2)
    x = r.standard_normal((4, 512)).astype(np.float32)
    model = build_tflite("FULLY_CONNECTED", [("x", x, False), ("w", r.standard_normal((256, 512)).astype(np.float32),
                                                                 True),
                                              ("b", r.standard_normal(256).astype(np.float32), True)], 1)
    (tmp_path / "fc.tflite").write_bytes(model)
    return tmp_path / "fc.tflite", options(tmp_path / "cache"), [{"x": x}]


def external_case(tmp_path):
    onnx.save(mlp(), tmp_path / "m.onnx", save_as_external_data=True, location="m.bin", size_threshold=0)
    return tmp_path / "m.onnx", options(), [X]


def cache_miss_case(tmp_path):
    onnx.save(mlp(), tmp_path / "m.onnx")
    return tmp_path / "m.onnx", options(tmp_path / "cache"), [X]


def cache_hit_case(tmp_path):
    path, chosen, feeds = cache_miss_case(tmp_path)
    nnrun.InferenceSession(str(path), sess_options=chosen)  # writes the cache file
    return path, chosen, feeds


def run_case(tmp_path):
    """Plans for two input shapes, a thread pool, profiling, and under a budget a prefetch thread and
    a weight read in blocks."""
    w = (rng(3).standard_normal((1024, 2048)) / 32).astype(np.float32)  # 8 MiB
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", (np.float32, ["N", 1024]))],
                       [("y", None)], [("w", w)])
    onnx.save(model, tmp_path / "mm.onnx", save_as_external_data=True, location="mm.bin", size_threshold=0)
    chosen = options(tmp_path / "cache", memory_budget="4M", intra_op_num_threads=2, enable_profiling=True,
                     profile_file_prefix=str(tmp_path / "profile"))
    return tmp_path / "mm.onnx", chosen, [{"x": np.ones((n, 1024), np.float32)} for n in (4, 2, 4)]


def loop_case(tmp_path):
    """A Loop: its kernel plans its body through the session's plans (which hold the kernel)."""
    onnx.save(loop_model(3, False), tmp_path / "loop.onnx")
    return tmp_path / "loop.onnx", options(tmp_path / "cache"), [{"x": np.ones(2, np.float32),
                                                                 "acc0": np.zeros(2, np.float32)}]


CASES = {"onnx": onnx_case, "onnx, not run": unrun_case, "tflite": tflite_case, "external data": external_case,
         "weight cache written": cache_miss_case, "weight cache read": cache_hit_case,
         "runs under a budget": run_case, "control flow": loop_case}


def nnrun_garbage():
    """The nnrun objects the cycle collector finds unreachable now (none, if nothing made a cycle)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("nnrun")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("case", list(CASES))
def test_dropping_the_session_unmaps_and_closes_at_once_with_the_collector_off(tmp_path, case):
    path, chosen, feeds = CASES[case](tmp_path)
    gc.collect()
    gc.disable()
    try:
        sess = nnrun.InferenceSession(str(path), sess_options=chosen)
        for feed in feeds:
            sess.run(None, feed)
        fds, maps = held(tmp_path)
        assert fds and maps
        del sess
        assert held(tmp_path) == ([], [])
        assert nnrun_garbage() == []
    finally:
        gc.enable()


@pytest.mark.parametrize("case", ["onnx", "external data", "runs under a budget", "control flow"])
def test_close_unmaps_and_closes_while_the_object_lives_and_later_runs_are_refused(tmp_path, case):
    path, chosen, feeds = CASES[case](tmp_path)
    sess = nnrun.InferenceSession(str(path), sess_options=chosen)
    for feed in feeds:
        sess.run(None, feed)
    threads = [t for t in threading.enumerate() if t.name == "nnrun-prefetch"]
    inputs = [(i.name, i.shape, i.type) for i in sess.get_inputs()]
    sess.close()
    assert held(tmp_path) == ([], [])
    sess.close()  # a second close does nothing
    with pytest.raises(nnrun.SessionClosedError, match="the session is closed") as e:
        sess.run(None, feeds[0])
    assert isinstance(e.value, nnrun.NnrunError)
    with pytest.raises(nnrun.SessionClosedError):
        sess.report()
    assert [(i.name, i.shape, i.type) for i in sess.get_inputs()] == inputs
    for thread in threads:  # a prefetch thread of a closed session ends
        thread.join(timeout=5)
    if case == "runs under a budget":
        assert not any(t.is_alive() for t in threads)


def test_a_with_block_closes_the_session_at_its_end_even_when_it_raises(tmp_path):
    path, chosen, _ = onnx_case(tmp_path)
    with nnrun.InferenceSession(str(path), sess_options=chosen) as sess:
        assert sess.run(None, X)[0].shape == (4, 64)
        assert held(tmp_path)[1]
    assert held(tmp_path) == ([], [])
    with pytest.raises(nnrun.SessionClosedError):
        sess.run(None, X)
    with pytest.raises(KeyError):
        with nnrun.InferenceSession(str(path), sess_options=chosen) as sess:
            raise KeyError("in the block")
    assert held(tmp_path) == ([], [])


def test_run_async_after_close_reports_the_closed_session(tmp_path):
    path, chosen, _ = onnx_case(tmp_path)
    sess = nnrun.InferenceSession(str(path), sess_options=chosen)
    sess.close()
    done, got = threading.Event(), []

    def callback(outputs, user_data, error):
        got.append((outputs, error))
        done.set()

    sess.run_async(None, X, callback, None)
    assert done.wait(10)
    assert got[0][0] is None and "the session is closed" in got[0][1]
