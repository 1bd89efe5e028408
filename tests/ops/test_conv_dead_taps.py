"""Convolutions over images smaller than their window's reach: the kernel's taps that read only
padding for every output are left out at PREPARE (conv_core.live_window), the weight packed without
them. Checked against onnxruntime on every kind of kernel, and the window arithmetic by brute force."""

import itertools
import math

import numpy as np
import pytest
from oracle import assert_close, check_model, helper, make_model, rng, run_onnxruntime

import nnrun
from nnrun.ops import conv_core


def _reads(window, axis, tap):
    """Brute force: the input positions tap `tap` of `axis` reads over all the outputs."""
    s, d, pb = window.strides[axis], window.dilations[axis], window.pads_begin[axis]
    return [j * s - pb + tap * d for j in range(window.out_spatial[axis])]


def _inside(window, axis, tap):
    return any(0 <= p < window.in_spatial[axis] for p in _reads(window, axis, tap))


@pytest.mark.parametrize("in_spatial, kernel, strides, dilations, pads, expected", [
    # PP-OCR's classifier: 5x5 padded by 2 over 2 rows: rows 0 and 4 of the kernel read only padding
    ((2, 96), (5, 5), None, None, [2, 2, 2, 2], ((3, 5), (1, 2), (1, 2))),
    # a 3x3 over a 1x1 image: the centre alone, a pointwise convolution
    ((1, 1), (3, 3), None, None, [1, 1, 1, 1], ((1, 1), (0, 0), (0, 0))),
    # silero VAD's encoder: length 2, kernel 3, stride 2, pad 1: the first tap reads only padding
    ((2,), (3,), (2,), None, [1, 1], ((2,), (0,), (1,))),
    ((1,), (3,), None, None, [1, 1], ((1,), (0,), (0,))),
    # asymmetric padding, only the end dead
    ((2, 8), (4, 3), None, None, [0, 1, 2, 1], ((2, 3), (0, 1), (0, 1))),
])
def test_the_live_window_drops_the_taps_that_read_only_padding(in_spatial, kernel, strides, dilations, pads,
                                                                 expected):
    window = conv_core.make_window(in_spatial, kernel, strides, dilations, pads)
    live, kept = conv_core.live_window(window)
    assert (live.kernel, live.pads_begin, live.pads_end) == expected
    assert live.out_spatial == window.out_spatial and live.in_spatial == window.in_spatial
    assert tuple(k.stop - k.start for k in kept) == live.kernel


@pytest.mark.parametrize("in_spatial, kernel, strides, dilations, pads", [
    ((7, 7), (3, 3), None, None, [1, 1, 1, 1]),       # every tap reads the image somewhere
    ((6, 6), (3, 3), None, None, [3, 3, 3, 3]),       # even padded by the whole kernel
    ((1,), (2,), (5,), None, [2, 2]),                 # every tap of the axis reads padding: left as it is
    ((3,), (3,), None, (3,), [4, 4]),                 # the trim would crop the image (dilation 3)
])
def test_no_live_window_where_no_tap_is_dead_or_the_trim_would_crop(in_spatial, kernel, strides, dilations,
                                                                     pads):
    window = conv_core.make_window(in_spatial, kernel, strides, dilations, pads)
    found = conv_core.live_window(window)
    if found is not None:  # the dilated case: only when it keeps the padding whole
        live, _ = found
        assert min(live.pads_begin + live.pads_end) >= 0
    else:
        assert found is None


def test_every_dropped_tap_reads_only_padding_and_every_window_keeps_its_outputs():
    """Over many geometries, by brute force: the taps left out read no input position, the first and
    last kept read some, and the smaller window, remade from its kernel and pads, has the same outputs
    (make_window's arithmetic, so every kernel plans it as it would any window)."""
    checked = trimmed = 0
    for size, k, s, d, pb, pe in itertools.product(range(1, 6), range(1, 6), range(1, 4), range(1, 3),
                                                   range(0, 5), range(0, 5)):
        try:
            window = conv_core.make_window((size,), (k,), (s,), (d,), [pb, pe])
        except ValueError:
            continue
        checked += 1
        found = conv_core.live_window(window)
        live_taps = [t for t in range(k) if _inside(window, 0, t)]
        if found is None:
            lo_hi_trimmable = live_taps and (live_taps[0] > 0 or live_taps[-1] < k - 1)
            # none dead at the ends, none alive at all, or a trim that would crop the image
            assert not lo_hi_trimmable or pb - live_taps[0] * d < 0 or pe - (k - 1 - live_taps[-1]) * d < 0
            continue
        trimmed += 1
        live, (kept,) = found
        assert kept.start == live_taps[0] and kept.stop == live_taps[-1] + 1
        remade = conv_core.make_window((size,), live.kernel, (s,), (d,), [*live.pads_begin, *live.pads_end])
        assert remade == live and remade.out_spatial == window.out_spatial
        # the kept taps read what they read before, position for position
        for t in range(kept.start, kept.stop):
            assert _reads(live, 0, t - kept.start) == _reads(window, 0, t)
    assert checked > 1000 and trimmed > 100


def _conv_model(x_shape, w_shape, attrs, group=1, activation=None, seed=0):
    r = rng(seed)
    x = r.standard_normal(x_shape).astype(np.float32)
    w = r.standard_normal(w_shape).astype(np.float32)
    b = r.standard_normal(w_shape[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if activation else "y"], group=group, **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    return make_model(nodes, [("x", x)], [("y", None)], [("w", w), ("b", b)]), {"x": x}


DEAD_TAP_CASES = [
    # (x shape, w shape, attributes, group)
    ((1, 16, 2, 24), (16, 1, 5, 5), {"pads": [2, 2, 2, 2]}, 16),             # depthwise, PP-OCR's classifier
    ((1, 16, 1, 24), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, 16),             # depthwise over one row
    ((2, 8, 1, 1), (6, 8, 3, 3), {"pads": [1, 1, 1, 1]}, 1),                 # a 3x3 over 1x1: pointwise
    ((1, 8, 2, 2), (6, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, 1),
    ((1, 8, 2, 9), (8, 4, 5, 3), {"pads": [2, 1, 2, 1]}, 2),                 # grouped
    ((1, 6, 2, 7), (4, 6, 4, 3), {"pads": [0, 1, 2, 1]}, 1),                 # asymmetric: the end dead
    ((1, 8, 2), (8, 8, 3), {"pads": [1, 1], "strides": [2]}, 1),             # silero VAD's encoder, 1-D
    ((1, 8, 1), (8, 8, 3), {"pads": [1, 1]}, 1),
    ((1, 4, 2, 12), (4, 1, 5, 4), {"auto_pad": "SAME_UPPER"}, 4),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs, group", DEAD_TAP_CASES)
@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish"])
def test_convolutions_without_their_dead_taps_match_onnxruntime(x_shape, w_shape, attrs, group, activation,
                                                                kernels):
    model, feeds = _conv_model(x_shape, w_shape, attrs, group, activation)
    check_model(model, feeds)
    sess = nnrun.InferenceSession(model.SerializeToString())
    kernel = sess.plan().steps[0].kernel
    assert math.prod(kernel.window.kernel) < math.prod(w_shape[2:])
    assert kernel.packed == frozenset([1])  # the weight without its dead taps is the kernel's own


def test_the_dead_taps_stay_out_of_shifted_gemms(monkeypatch):
    """A stride-1 convolution that takes shifted GEMMs packs its weight tap-major without them (the
    BLAS GEMMs a tap; the compiled product's tiles: K of 9 taps x 8 channels)."""
    for name in ("SHIFTED_MIN_PIXELS", "SHIFTED_MIN_CHANNELS", "SHIFTED_MIN_OUT_CHANNELS"):
        monkeypatch.setattr(conv_core, name, 0)
    model, feeds = _conv_model((1, 8, 2, 40), (6, 8, 5, 3), {"pads": [2, 1, 2, 1]})
    for compiled in (False, True):
        options = nnrun.SessionOptions()
        options.compiled_kernels = compiled
        sess = nnrun.InferenceSession(model.SerializeToString(), options)
        kernel = sess.plan().steps[0].kernel
        tiled = getattr(kernel.plan.tiles, "tiled", None)
        assert kernel.plan.method == "gemm-shifted"
        assert compiled or tiled is None
        if tiled is None:  # (compiled: where the compiled product does not serve, as installed)
            assert kernel.w_shifted.shape == (9, 6, 8)
        else:
            assert kernel.w_shifted.shape[1:] == (72, tiled.MR)
        assert_close(sess.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])


def test_a_weight_cache_keeps_the_weight_without_its_dead_taps(tmp_path):
    """A second session reads the smaller weight from the cache the first wrote, under its own name."""
    model, feeds = _conv_model((1, 16, 2, 24), (16, 1, 5, 5), {"pads": [2, 2, 2, 2]}, 16)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    expected = run_onnxruntime(model, feeds)[0]
    states = []
    for _ in range(2):
        options = nnrun.SessionOptions()
        options.weight_cache_dir = str(tmp_path / "cache")
        options.compiled_kernels = False
        sess = nnrun.InferenceSession(str(path), options)
        assert_close(sess.run(None, feeds)[0], expected)
        states.append(sess.report()["plan"]["weight_cache"]["state"])
        # numpy's row matrices' strips of the 3x5 window left: 2 output rows in a band of 4 padded
        # rows, 4 + 1 rows of 5 taps
        assert sess.plan().steps[0].kernel.w_taps.shape == (16, 25)
    assert states == ["miss", "hit"]


def test_a_weight_computed_at_run_time_keeps_every_tap():
    """Only a constant weight is cut: one fed at run time is convolved whole, and still matches."""
    r = rng(3)
    x, w = r.standard_normal((1, 4, 1, 6)).astype(np.float32), r.standard_normal((5, 4, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = make_model([node], [("x", x), ("w", w)], [("y", None)])
    check_model(model, {"x": x, "w": w})
    sess = nnrun.InferenceSession(model.SerializeToString())
    sess.run(None, {"x": x, "w": w})
    assert sess.plan().steps[0].kernel.window.kernel == (3, 3)


def test_a_plan_for_other_shapes_keeps_its_own_window():
    """A model of symbolic height planned for 2 rows (dead taps left out) and then for 24 (none):
    each plan convolves with its own window and weight."""
    r = rng(4)
    w, b = r.standard_normal((8, 1, 5, 5)).astype(np.float32), r.standard_normal(8).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=8, pads=[2, 2, 2, 2])
    model = make_model([node], [("x", (np.float32, [1, 8, "h", 12]))], [("y", None)], [("w", w), ("b", b)])
    sess = nnrun.InferenceSession(model.SerializeToString())
    for height in (2, 24, 2):
        x = r.standard_normal((1, 8, height, 12)).astype(np.float32)
        assert_close(sess.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0])
