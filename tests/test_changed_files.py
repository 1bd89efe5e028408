"""A file a session maps, changed after the session was created (session.py, paging.OpenFile): the
model file, an external data file, a weight cache file, truncated or rewritten in place, makes the
next run raise ModelFileChangedError naming the file, never SIGBUS and never other outputs; a file
replaced by a rename keeps running the file that was mapped, with onnxruntime's outputs for it.

A truncated mapping read by a kernel ends the process with SIGBUS, so each truncation runs in a
process of its own: a regression fails the test (killed by a signal) instead of ending pytest.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import helper
from oracle import WHOLE_MODEL_RTOL, assert_close, make_model, rng, run_onnxruntime, run_onnxruntime_path

import nnrun
from nnrun.paging import PAGER, region_of

TESTS = os.path.dirname(os.path.abspath(__file__))
X = {"x": rng(1).standard_normal((4, 512)).astype(np.float32)}


def mlp(seed=0):
    """MatMul then Gemm over 1 MiB weights that kernels read in place from the mapping: x (4, 512) -> (4, 64)."""
    r = rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc")]
    inits = [("w1", (r.standard_normal((512, 512)) / 23).astype(np.float32)),
             ("w2", (r.standard_normal((512, 64)) / 23).astype(np.float32)),
             ("b2", r.standard_normal(64).astype(np.float32))]
    return make_model(nodes, [("x", (np.float32, [4, 512]))], [("y", None)], inits)


def written(path, data, mtime_s=None):
    """`data` written to `path` and synced; its modification time set `mtime_s` seconds back, so
    that a rewrite a moment later cannot fall in the same tick of the filesystem's clock."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if mtime_s is not None:
        past = time.time_ns() - int(mtime_s * 1e9)
        os.utime(path, ns=(past, past))
    return str(path)


CHILD = r"""
import json, os, sys
import numpy as np
import nnrun

job = json.loads(sys.argv[1])
options = nnrun.SessionOptions()
options.weight_cache_dir = job["cache"]
options.memory_budget = job.get("budget")
feeds = {name: np.load(path) for name, path in job["feeds"].items()}
sess = nnrun.InferenceSession(job["model"], sess_options=options)
sess.run(None, feeds)  # a first run pages the weights in, as a serving process's would
target = job["target"] or sess.report()["plan"]["weight_cache"]["path"]
if job["change"] == "truncate":
    os.truncate(target, os.path.getsize(target) // 3)
else:  # rewrite in place, same size: the bytes of another file
    with open(job["change"], "rb") as f:
        replacement = f.read()
    with open(target, "r+b") as f:
        f.write(replacement)
try:
    sess.run(None, feeds)
except nnrun.ModelFileChangedError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "path": e.path,
                      "model_error": isinstance(e, nnrun.ModelError)}))
else:
    print(json.dumps({"error": None}))
"""


def changed_in_a_child(tmp_path, model, target, change="truncate", feeds=X, cache=None, budget=None):
    """Make a session of `model` in a new process, run it, change `target` (None: the weight cache
    file), run again; what the second run raised. A child killed by a signal fails the test."""
    fed = {}
    for name, array in feeds.items():
        fed[name] = str(tmp_path / f"feed_{name}.npy")
        np.save(fed[name], array)
    job = {"model": str(model), "target": target and str(target), "change": str(change), "feeds": fed,
           "cache": cache and str(cache), "budget": budget}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True,
                           timeout=120, cwd=TESTS)
    if child.returncode < 0:
        pytest.fail(f"the run after the change was killed by {signal.Signals(-child.returncode).name}\n"
                    f"{child.stderr}")
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.strip().splitlines()[-1])


def assert_names(result, path, what):
    assert result["error"] == "ModelFileChangedError" and result["model_error"], result
    assert result["path"] == str(path)
    assert f"{what} {path} changed after the session was created" in result["message"]
    assert "make a new session" in result["message"]


def test_a_truncated_onnx_model_raises_before_the_run(tmp_path):
    path = written(tmp_path / "m.onnx", mlp().SerializeToString())
    size = os.path.getsize(path)
    result = changed_in_a_child(tmp_path, path, path)
    assert_names(result, path, "model file")
    assert f"size {size} -> {size // 3} bytes" in result["message"]


def test_a_truncated_tflite_model_raises_before_the_run(tmp_path):
    from tflite_model import build_tflite

    r = rng(2)
    x = r.standard_normal((4, 512)).astype(np.float32)
    w = (r.standard_normal((256, 512)) / 23).astype(np.float32)  # (out, in), 512 KiB
    b = r.standard_normal(256).astype(np.float32)
    path = written(tmp_path / "fc.tflite", build_tflite("FULLY_CONNECTED", [("x", x, False), ("w", w, True),
                                                                             ("b", b, True)], 1))
    feeds = {nnrun.InferenceSession(path).get_inputs()[0].name: x}
    assert_names(changed_in_a_child(tmp_path, path, path, feeds=feeds), path, "model file")


def test_a_truncated_external_data_file_raises_before_the_run(tmp_path):
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(mlp(), path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    data = os.path.realpath(tmp_path / "weights.bin")
    assert_names(changed_in_a_child(tmp_path, path, data), data, "external data file")


def test_a_model_rewritten_in_place_with_other_weights_of_the_same_size_raises(tmp_path):
    original, other = mlp(0).SerializeToString(), mlp(1).SerializeToString()
    assert len(original) == len(other) and original != other
    path = written(tmp_path / "m.onnx", original, mtime_s=10)
    replacement = written(tmp_path / "other.bin", other)
    result = changed_in_a_child(tmp_path, path, path, change=replacement)
    assert_names(result, path, "model file")
    assert "rewritten in place (same size" in result["message"]


@pytest.mark.parametrize("state", ["miss", "hit"])
def test_a_truncated_weight_cache_file_raises_and_a_new_session_rebuilds_it(tmp_path, state):
    """The Gemm's weight (transB) is packed into the cache file: a run reads the file's mapping."""
    model = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5)],
                       [("x", (np.float32, [4, 512]))], [("y", None)],
                       [("w", rng(3).standard_normal((256, 512)).astype(np.float32)),
                        ("b", rng(4).standard_normal(256).astype(np.float32))])
    path = written(tmp_path / "gemm.onnx", model.SerializeToString())
    cache = tmp_path / "cache"
    options = nnrun.SessionOptions()
    options.weight_cache_dir = str(cache)
    if state == "hit":  # the file is there before the session: the session maps it as it finds it
        nnrun.InferenceSession(path, sess_options=options)
    result = changed_in_a_child(tmp_path, path, None, cache=cache)
    (cache_file,) = cache.glob("*.nnw")
    assert_names(result, cache_file, "weight cache file")
    # A new session finds the file truncated: it rebuilds it, and its outputs are right.
    sess = nnrun.InferenceSession(path, sess_options=options)
    assert sess.report()["plan"]["weight_cache"]["state"] == "miss"
    assert_close(sess.run(None, X)[0], run_onnxruntime(model, X)[0], rtol=WHOLE_MODEL_RTOL)


def test_a_model_replaced_by_rename_keeps_running_the_model_that_was_mapped(tmp_path):
    original, other = mlp(0), mlp(1)
    path = written(tmp_path / "m.onnx", original.SerializeToString())
    expected = run_onnxruntime(original, X)[0]
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    sess = nnrun.InferenceSession(path, sess_options=options)
    assert_close(sess.run(None, X)[0], expected, rtol=WHOLE_MODEL_RTOL)
    os.replace(written(tmp_path / "m.onnx.tmp", other.SerializeToString()), path)
    for _ in range(2):
        assert_close(sess.run(None, X)[0], expected, rtol=WHOLE_MODEL_RTOL)
    # A new session takes the file now at the path.
    renewed = nnrun.InferenceSession(path, sess_options=options).run(None, X)[0]
    assert_close(renewed, run_onnxruntime_path(path, X)[0], rtol=WHOLE_MODEL_RTOL)


def test_a_weight_read_in_blocks_comes_from_the_mapped_file_after_a_rename(tmp_path):
    """Under a budget a weight larger than it is read in blocks with pread: from the file that was
    mapped (an external data file here, whose payload lies aligned, so is read where it lies), not
    from whatever file has its path by then."""
    import onnx

    def matmul(seed):
        w = (rng(seed).standard_normal((1024, 2048)) / 32).astype(np.float32)  # 8 MiB
        return make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                          [("x", (np.float32, [4, 1024]))], [("y", None)], [("w", w)])

    x = {"x": rng(5).standard_normal((4, 1024)).astype(np.float32)}
    original = matmul(0)
    expected = run_onnxruntime(original, x)[0]
    onnx.save(original, tmp_path / "mm.onnx", save_as_external_data=True, location="mm.bin", size_threshold=0)
    data = os.path.realpath(tmp_path / "mm.bin")
    options = nnrun.SessionOptions()
    options.memory_budget = "4M"
    options.weight_cache_dir = str(tmp_path / "cache")
    sess = nnrun.InferenceSession(str(tmp_path / "mm.onnx"), sess_options=options)
    assert [b.whole.path for b in sess.plan().streaming.blocks if b is not None] == [data]
    assert_close(sess.run(None, x)[0], expected)
    (tmp_path / "other").mkdir()
    onnx.save(matmul(1), tmp_path / "other" / "mm.onnx", save_as_external_data=True, location="mm.bin",
              size_threshold=0)
    os.replace(tmp_path / "other" / "mm.bin", data)
    for _ in range(2):
        assert_close(sess.run(None, x)[0], expected)


def test_reads_by_pread_of_a_truncated_file_raise_instead_of_sigbus(tmp_path):
    """What the prefetch thread reads weights in with (Pager.read_in), and the OpenFile's read."""
    path = tmp_path / "w.onnx"
    weights = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    path.write_bytes(weights.tobytes())
    from nnrun.loader.mapped import MappedFile

    mapped = MappedFile.open(path)
    array = np.frombuffer(mapped.buffer, np.float32)[1 << 17:]  # the second half
    region = region_of(array)
    assert region.file is mapped.file and region.path == str(path)
    bounce = memoryview(bytearray(64 << 10))
    PAGER.read_in(region, bounce)
    os.truncate(path, 1 << 19)  # into the first half: the region lies wholly past the end
    with pytest.raises(nnrun.ModelFileChangedError, match="w.onnx ends at byte 524288"):
        PAGER.read_in(region, bounce)
    with pytest.raises(nnrun.ModelFileChangedError, match="truncated after the session was created"):
        mapped.file.read_into(bytearray(16), (1 << 19) - 8)
    assert "size 1048576 -> 524288 bytes" in mapped.file.changed()


def test_a_session_without_a_file_checks_nothing():
    sess = nnrun.InferenceSession(mlp().SerializeToString())
    assert sess._files == ()
    assert_close(sess.run(None, X)[0], run_onnxruntime(mlp(), X)[0], rtol=WHOLE_MODEL_RTOL)
