"""MappedFile (loader/mapped.py) and the paths it takes: only a regular file, or a symlink to one, is
mapped; a FIFO, a device or a directory, as a model or as external data, is refused before a byte of
it is read, naming the path and what it is. A FIFO would block the open or a read until a writer came,
and a device never ends, so the refusals run in a child process: a regression hangs the child, which
the test's timeout ends, not the suite.
"""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper
from oracle import WHOLE_MODEL_RTOL, assert_close, make_model, rng, run_onnxruntime

import nnrun

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NOT_REGULAR = r"""
import json, sys, time
import nnrun

try:  # the process's first session, untimed: its imports are not the refusal's time
    nnrun.InferenceSession(sys.argv[-1])
except nnrun.NnrunError:
    pass
found = []
for path in sys.argv[1:]:
    started = time.monotonic()
    try:
        nnrun.InferenceSession(path)
        found.append([path, None, None, time.monotonic() - started])
    except nnrun.NnrunError as e:
        found.append([path, type(e).__name__, str(e), time.monotonic() - started])
print(json.dumps(found))
"""


def test_a_fifo_a_device_or_a_directory_is_refused_at_once_naming_what_it_is(tmp_path):
    """Each within a second, whatever its name says (a `.tflite` path is not opened to be recognised)."""
    os.mkfifo(tmp_path / "fifo.onnx")
    os.mkfifo(tmp_path / "fifo.tflite")
    (tmp_path / "dir.onnx").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero.onnx")
    paths = {str(tmp_path / "fifo.onnx"): "a FIFO", str(tmp_path / "fifo.tflite"): "a FIFO",
             "/dev/zero": "a character device", "/dev/urandom": "a character device",
             str(tmp_path / "zero.onnx"): "a character device", str(tmp_path / "dir.onnx"): "a directory"}
    child = subprocess.run([sys.executable, "-c", NOT_REGULAR, *paths], capture_output=True, text=True,
                           timeout=60, cwd=TESTS)
    assert child.returncode == 0, child.stderr
    for path, error, message, seconds in json.loads(child.stdout.strip().splitlines()[-1]):
        assert error == "ModelFileError", (path, error, message)
        assert path in message and f"it is {paths[path]}" in message and "not a regular file" in message
        assert seconds < 1, (path, seconds)


def test_a_symlink_to_a_regular_model_file_is_taken(tmp_path):
    w = rng(0).standard_normal((8, 4)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", (np.float32, [2, 8]))],
                       [("y", None)], [("w", w)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    os.symlink("m.onnx", tmp_path / "link.onnx")
    x = {"x": rng(1).standard_normal((2, 8)).astype(np.float32)}
    sess = nnrun.InferenceSession(str(tmp_path / "link.onnx"))
    assert_close(sess.run(None, x)[0], run_onnxruntime(model, x)[0], rtol=WHOLE_MODEL_RTOL)
    with pytest.raises(nnrun.ModelFileError, match="missing.onnx"):
        nnrun.InferenceSession(str(tmp_path / "missing.onnx"))


def test_an_external_data_device_is_refused(tmp_path):
    """A symlink to a device outside the model's directory, and a device node inside it (made where
    the process may; else skipped): refused by the loader's own rules, which stay as they were."""
    t = TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[16])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="data.bin")
    model = make_model([helper.make_node("Identity", ["t"], ["y"])], [], [("y", None)])
    model.graph.initializer.append(t)
    path = str(tmp_path / "m.onnx")
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    os.symlink("/dev/zero", tmp_path / "data.bin")
    with pytest.raises(nnrun.ModelError, match="outside the model directory"):
        nnrun.InferenceSession(path)
    os.remove(tmp_path / "data.bin")
    try:
        os.mknod(tmp_path / "data.bin", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    except OSError as e:
        pytest.skip(f"cannot make a device node here: {e}")
    with pytest.raises(nnrun.ModelError, match="'data.bin' is not a regular file"):
        nnrun.InferenceSession(path)

