"""DFT, STFT and MelWeightMatrix against onnxruntime, and the reference evaluator where
onnxruntime lacks a type or a form (named at each test)."""

import ml_dtypes
import numpy as np
import pytest

import nnrun
from oracle import (FLOAT16_RTOL, TensorProto, assert_close, check_model, check_node, data, helper, make_model,
                    run_nnrun)


def signal(shape, dtype=np.float32, seed=0):
    return data(shape, dtype, seed) / 10


def scalar(value):
    return np.array(value, np.int64)


def check(op, inputs, attrs, opset, oracle="onnxruntime", rtol=1e-4):
    """One node whose inputs are, in order, ("name", value) fed, ("=name", value) a weight
    (known at PREPARE), or None for an omitted optional input."""
    names, fed, weights = [], [], []
    for item in inputs:
        if item is None:
            names.append("")
            continue
        name, value = item
        names.append(name.lstrip("="))
        (weights if name.startswith("=") else fed).append((name.lstrip("="), np.asarray(value)))
    model = make_model([helper.make_node(op, names, ["y"], **attrs)], fed, [("y", None)], initializers=weights,
                       opset=opset)
    return check_model(model, dict(fed), oracle=oracle, rtol=rtol)


# DFT

@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("shape,axis", [((2, 8, 1), 1), ((2, 7, 2), 1), ((1, 6, 5, 2), 2), ((3, 4, 5, 1), -2),
                                        ((2, 5, 6, 2), -3), ((9, 1), 0)], ids=str)
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 0), (0, 1)])
def test_dft(opset, shape, axis, inverse, onesided):
    if onesided:
        shape = (*shape[:-1], 1)  # a forward one-sided DFT is of a real signal
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset == 17:
        check("DFT", [("x", signal(shape))], {**attrs, "axis": axis}, opset=17)
    else:
        check("DFT", [("x", signal(shape)), None, ("=axis", scalar(axis))], attrs, opset=20)


def test_dft_20_default_axis():
    check("DFT", [("x", signal((2, 3, 7, 2)))], {}, opset=20)


@pytest.mark.parametrize("length", [4, 6, 9, 16])
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 0), (0, 1)])
def test_dft_length_pads_or_truncates(length, inverse, onesided):
    x = signal((2, 7, 3, 1 if onesided and not inverse else 2))
    check("DFT", [("x", x), ("=n", scalar(length))], {"inverse": inverse, "onesided": onesided, "axis": 1},
          opset=17)


@pytest.mark.parametrize("bins,length", [(5, None), (5, 8), (5, 9), (6, 10), (4, 5), (7, 4), (7, 16)], ids=str)
def test_dft_irfft(bins, length):
    # The inverse of a one-sided spectrum: a real signal of dft_length samples (by default
    # 2 * (bins - 1)) from its first dft_length // 2 + 1 bins, zeros past those given.
    # onnxruntime reads every bin given instead, so where they are more or fewer than that the
    # reference evaluator (numpy's irfft) is the oracle.
    x = signal((2, bins, 3, 2))
    n = [] if length is None else [("=n", scalar(length))]
    oracle = "onnxruntime" if length is None or bins == length // 2 + 1 else "reference"
    check("DFT", [("x", x)] + n, {"inverse": 1, "onesided": 1, "axis": 1}, opset=17, oracle=oracle)


def test_dft_float64():
    check_node("DFT", [("x", signal((2, 12, 2), np.float64))], {"axis": 1}, opset=17)
    check_node("DFT", [("x", signal((2, 12, 1), np.float64))], {"axis": 1, "onesided": 1}, opset=17)


def test_dft_float16():
    # onnxruntime has no float16 DFT.
    check_node("DFT", [("x", signal((2, 10, 2), np.float16))], {"axis": 1}, opset=17, oracle="reference",
               rtol=FLOAT16_RTOL)


@pytest.mark.parametrize("onesided", [0, 1])
def test_dft_bfloat16(onesided):
    # Neither oracle runs a bfloat16 DFT: the spec's transform in float64, rounded to bfloat16
    # (8 significant bits: one rounding is within 1e-2 of the largest magnitude).
    x = signal((2, 12, 3, 1)).astype(ml_dtypes.bfloat16)
    model = make_model([helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=onesided)], [("x", x)], [("y", None)],
                       opset=17)
    (y,) = run_nnrun(model, {"x": x})
    spectrum = np.fft.fft(x[..., 0].astype(np.float64), axis=1)[:, :7 if onesided else 12]
    expected = np.stack([spectrum.real, spectrum.imag], axis=-1).astype(ml_dtypes.bfloat16)
    assert y.dtype == expected.dtype
    assert_close(y.astype(np.float32), expected.astype(np.float32), rtol=1e-2)


@pytest.mark.parametrize("onesided,inverse", [(0, 0), (0, 1), (1, 0)])
def test_dft_axis_fed_at_run(onesided, inverse):
    # A fed axis is known per run only: the same plan takes each axis (or the node runs eagerly
    # when the axis decides the shape).
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], onesided=onesided, inverse=inverse)
    x = signal((2, 6, 6, 1 if onesided else 2))
    model = make_model([node], [("x", x), ("axis", scalar(1))], [("y", None)], opset=20)
    for axis in (1, 2, -2, -3):
        check_model(model, {"x": x, "axis": scalar(axis)})


def test_dft_on_the_complex_axis_is_refused():
    node = helper.make_node("DFT", ["x"], ["y"], axis=2)
    model = make_model([node], [("x", signal((2, 5, 2)))], [("y", None)], opset=17)
    with pytest.raises(nnrun.ModelError, match="not a signal axis"):
        nnrun.InferenceSession(model.SerializeToString())


# STFT

@pytest.mark.parametrize("length,step,frame,windowed", [(64, 8, 16, True), (64, 8, 16, False), (50, 7, 12, True),
                                                        (33, 5, 33, False), (40, 16, 10, True)], ids=str)
@pytest.mark.parametrize("onesided,complex_signal", [(0, False), (1, False), (0, True)])  # no one-sided complex
def test_stft(length, step, frame, windowed, onesided, complex_signal):
    x = signal((2, length, 2 if complex_signal else 1))
    window = ("=window", np.hanning(frame).astype(np.float32)) if windowed else None
    check("STFT", [("x", x), ("=step", scalar(step)), window, ("=frame", scalar(frame))], {"onesided": onesided},
          opset=17)


def test_stft_window_gives_the_frame_length():
    x = signal((1, 40, 1))
    check("STFT", [("x", x), ("=step", scalar(6)), ("=window", np.hamming(10).astype(np.float32))], {}, opset=17)


def test_stft_float64():
    x = signal((2, 48, 1), np.float64)
    check("STFT", [("x", x), ("=step", scalar(8)), ("=window", np.hanning(16))], {}, opset=17)


def test_stft_fed_step():
    node = helper.make_node("STFT", ["x", "step", "window"], ["y"])
    x = signal((1, 64, 1))
    model = make_model([node], [("x", x), ("step", scalar(4))], [("y", None)],
                       initializers=[("window", np.hanning(16).astype(np.float32))], opset=17)
    for step in (4, 8, 13):
        check_model(model, {"x": x, "step": scalar(step)})


# MelWeightMatrix

@pytest.mark.parametrize("mels,n,rate,low,high", [(8, 16, 8192, 0.0, 4096.0), (20, 512, 16000, 20.0, 8000.0),
                                                  (40, 400, 16000, 0.0, 7600.0), (5, 64, 22050, 300.0, 3000.0),
                                                  (64, 1024, 44100, 125.0, 7500.0), (3, 9, 100, 0.0, 40.0)],
                         ids=str)
def test_mel_weight_matrix(mels, n, rate, low, high):
    inputs = [("mels", np.array(mels, np.int64)), ("n", np.array(n, np.int64)), ("rate", np.array(rate, np.int64)),
              ("low", np.array(low, np.float32)), ("high", np.array(high, np.float32))]
    check_node("MelWeightMatrix", [], {}, initializers=inputs, opset=17)
    check_node("MelWeightMatrix", inputs, {}, opset=17)  # fed: the node runs eagerly


@pytest.mark.parametrize("dtype", [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32])
def test_mel_weight_matrix_output_type(dtype):
    # onnxruntime makes float32 and float64 only.
    oracle = "onnxruntime" if dtype == TensorProto.DOUBLE else "reference"
    inputs = [("mels", np.array(10, np.int32)), ("n", np.array(128, np.int32)), ("rate", np.array(16000, np.int32)),
              ("low", np.array(0.0, np.float32)), ("high", np.array(8000.0, np.float32))]
    check_node("MelWeightMatrix", [], {"output_datatype": dtype}, initializers=inputs, opset=17, oracle=oracle)
