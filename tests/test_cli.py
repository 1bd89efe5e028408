"""`nnrun --model FILE`: the phase table, the JSON report, inputs, dims and saved outputs."""

import json
import os
import subprocess
import sys

import numpy as np

from oracle import WHOLE_MODEL_RTOL, assert_close, run_onnxruntime_path

MODEL = os.path.join("models", "bert_tiny.onnx")


def nnrun_cli(*args):
    result = subprocess.run([sys.executable, "-m", "nnrun.cli", *args], capture_output=True, text=True)
    return result


def test_phase_table():
    result = nnrun_cli("--model", "models/tiny_cnn.onnx", "--repeat", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("MODEL_LOAD takes") and "RSS" in lines[0] and "HWM" in lines[0]
    assert lines[1].startswith("PREPARE    takes")
    assert lines[2].startswith("EXECUTE    takes  min") and "geomean" in lines[2]
    assert lines[4].startswith("PEAK")


def test_json_report_inputs_and_saved_outputs(tmp_path):
    ids = np.random.default_rng(3).integers(0, 1000, size=(1, 16)).astype(np.int64)
    np.save(tmp_path / "ids.npy", ids)
    import onnxruntime as ort

    input_name = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"]).get_inputs()[0].name
    out_dir = tmp_path / "out"
    result = nnrun_cli("--model", MODEL, "--input", f"{input_name}={tmp_path / 'ids.npy'}",
                       "--repeat", "2", "--warmup", "1", "--report", "json",
                       "--save-outputs", str(out_dir))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) >= {"model", "format", "baseline", "phases", "peak", "plan", "outputs"}
    assert report["phases"]["EXECUTE"]["runs"] == 2
    expected = run_onnxruntime_path(MODEL, {input_name: ids})
    saved = sorted(os.listdir(out_dir))
    assert len(saved) == len(expected)
    for name, e in zip(report["outputs"], expected):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        assert_close(np.load(out_dir / f"{safe}.npy"), e, rtol=WHOLE_MODEL_RTOL)


def test_dim_sets_symbolic_dimensions(tmp_path):
    from onnx import helper

    from oracle import make_model

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (np.float32, ["n", 3]))],
                       [("y", None)])
    path = tmp_path / "dyn.onnx"
    path.write_bytes(model.SerializeToString())
    result = nnrun_cli("--model", str(path), "--dim", "n=5", "--report", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["outputs"]["y"]["shape"] == [5, 3]


def test_bad_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x0a\xff\xff\xff\xff\x0f garbage")
    result = nnrun_cli("--model", str(bad))
    assert result.returncode == 2
    assert "ModelError" in result.stderr and "Traceback" not in result.stderr


def test_dump_intermediates_until_a_node_match_onnxruntime(tmp_path):
    from test_debug import X, conv_chain, with_outputs

    from oracle import run_onnxruntime

    model = conv_chain()
    path = tmp_path / "chain.onnx"
    path.write_bytes(model.SerializeToString())
    np.save(tmp_path / "x.npy", X["x"])
    out = tmp_path / "values"
    result = nnrun_cli("--model", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "1",
                       "--no-fuse-activations", "--dump-intermediates", str(out), "--stop-after", "relu")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["c.npy", "r.npy"]
    want = run_onnxruntime(with_outputs(model, ["c", "r"]), X)
    assert_close(np.load(out / "c.npy"), want[1])
    assert_close(np.load(out / "r.npy"), want[2])


def test_weight_cache_directory_and_switch(tmp_path):
    from graphs import packing_model

    from oracle import run_onnxruntime

    model = packing_model()
    path = tmp_path / "packing.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    args = ("--model", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "1", "--report", "json",
            "--save-outputs")
    cache = tmp_path / "cache"
    states = []
    for run in ("cold", "warm"):
        result = nnrun_cli(*args, str(tmp_path / run), "--weight-cache", str(cache))
        assert result.returncode == 0, result.stderr
        states.append(json.loads(result.stdout)["plan"]["weight_cache"]["state"])
        assert_close(np.load(tmp_path / run / "y.npy"), run_onnxruntime(model, {"x": x})[0])
    assert states == ["miss", "hit"] and len(os.listdir(cache)) == 1
    off = nnrun_cli(*args, str(tmp_path / "off"), "--no-weight-cache")
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["plan"]["weight_cache"]["state"] == "off"


def test_cache_lists_and_clears_its_files(tmp_path):
    from graphs import packing_model

    path = tmp_path / "packing.onnx"
    path.write_bytes(packing_model().SerializeToString())
    cache = tmp_path / "cache"
    assert nnrun_cli("--model", str(path), "--repeat", "1", "--weight-cache", str(cache)).returncode == 0
    listed = nnrun_cli("cache", "list", "--dir", str(cache))
    assert listed.returncode == 0, listed.stderr
    assert "1 cache files" in listed.stdout and str(path) in listed.stdout
    cleared = nnrun_cli("cache", "clear", "--dir", str(cache))
    assert cleared.returncode == 0 and "removed 1 cache files" in cleared.stdout
    assert os.listdir(cache) == []
