"""Whole models built by tools/ (random weights) against onnxruntime.

Also the memory contracts on them: the arena fits 1.05 x the order's lower
bound, and packed weights' mapped pages are really released after PREPARE.
"""

import numpy as np
import pytest

import nnrun
from nnrun.weights import ExternalData
from nnrun_tools.build_models import ensure
from oracle import WHOLE_MODEL_RTOL, assert_close, run_onnxruntime_path

LARGE = ["resnet50", "vgg16", "vgg16_external", "mobilenetv2", "inception", "unet", "bert"]


def feeds_for(sess, seed=0, dims=None):
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in sess.graph.inputs:
        shape = [d if isinstance(d, int) else (dims or {}).get(d, 8) for d in arg.dims]
        if np.dtype(arg.dtype).kind == "f":
            feeds[arg.name] = rng.standard_normal(shape).astype(arg.dtype)
        else:
            feeds[arg.name] = rng.integers(0, 1000, size=shape).astype(arg.dtype)
    return feeds


@pytest.fixture(scope="module", params=LARGE)
def built(request):
    return request.param, ensure(request.param)


def test_matches_onnxruntime_and_fits_the_arena_bound(built):
    name, path = built
    sess = nnrun.InferenceSession(str(path))
    feeds = feeds_for(sess)
    actual = sess.run(None, feeds)
    expected = run_onnxruntime_path(path, feeds)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, rtol=WHOLE_MODEL_RTOL, what=f"{name} output {i}")
    plan = sess.plan()
    assert plan.lower_bound_bytes > 0
    assert plan.arena_bytes <= 1.05 * plan.lower_bound_bytes, (plan.arena_bytes, plan.lower_bound_bytes)


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_packed_weights_pages_are_released(name):
    path = ensure(name)
    sess = nnrun.InferenceSession(str(path))
    report = sess.report()["plan"]
    packed = report["weights_packed_bytes"]
    assert packed > 0.5 * report["weights_mapped_bytes"]
    resident = sess.graph.source.resident_bytes()
    assert resident is not None
    assert resident < 0.05 * packed, (resident, packed)
    # (with compiled kernels the packed bytes count the compiled product's tiles, and, from the
    # weight cache, the folded weights they were packed from: more than the file's weights)
    assert report["weights_released_bytes"] > 0.9 * min(packed, report["weights_mapped_bytes"])


def test_release_can_be_switched_off():
    path = ensure("resnet50")
    options = nnrun.SessionOptions()
    options.release_weights = False
    options.weight_cache_dir = None  # a warm weight cache would not read the weights at all
    sess = nnrun.InferenceSession(str(path), sess_options=options)
    assert sess.report()["plan"]["weights_released_bytes"] == 0
    # Folding read every conv weight, so without the release the pages stay resident.
    assert sess.graph.source.resident_bytes() > 0.5 * sess.report()["plan"]["weights_packed_bytes"]


def test_dynamic_sequence_gets_one_plan_per_signature():
    path = ensure("bert_dynamic")
    sess = nnrun.InferenceSession(str(path))
    for seq in (16, 37, 16):
        feeds = feeds_for(sess, dims={"seq": seq})
        actual = sess.run(None, feeds)
        expected = run_onnxruntime_path(path, feeds)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=WHOLE_MODEL_RTOL, what=f"seq {seq}")
    assert sess.report()["plan"]["plans"] == 2


def test_aligned_external_weights_are_used_as_they_lie():
    # VGG-16 saved with external data: every payload aligned, no BatchNormalization to fold, so
    # the plan reads every weight from the mapping but those its convolutions over large images
    # pack tap-major for shifted GEMMs (conv2, conv3, conv4: 1 MB of 553), kept in the weight cache.
    path = ensure("vgg16_external")
    options = nnrun.SessionOptions()
    options.compiled_kernels = False  # (the compiled product would pack every convolution's weight in its tiles)
    sess = nnrun.InferenceSession(str(path), options)
    plan = sess.report()["plan"]
    shifted = [s.kernel for s in sess.plan().steps if getattr(s.kernel, "w_shifted", None) is not None]
    assert len(shifted) == 3 and all(k.plan.method == "gemm-shifted" for k in shifted)
    assert plan["weights_mapped_bytes"] > 500e6
    assert plan["weights_packed_bytes"] == sum(k.w_shifted.nbytes for k in shifted) < 2e6
    assert plan["weights_anonymous_bytes"] == 0
    # the three packed originals' pages are handed back (no step reads them as they lie), less the
    # pages they share with the weights beside them in the file
    assert 0.95 * plan["weights_packed_bytes"] <= plan["weights_released_bytes"] <= plan["weights_packed_bytes"]
    # and PREPARE read none of them (the subnormals' sample is read from the file, not the mapping)
    data = {w.source for w in sess.graph.initializers.values() if isinstance(w, ExternalData)}
    assert len(data) == 1 and data.pop().resident_bytes() < 0.01 * plan["weights_mapped_bytes"]
