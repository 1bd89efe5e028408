"""CausalConvWithState against onnxruntime."""

import ml_dtypes
import numpy as np
import pytest

import nnrun
from oracle import FLOAT16_RTOL, check_model, check_node, data, helper, make_model


def conv_inputs(batch=2, channels=5, length=9, k=4, bias=False, past=False, dtype=np.float32):
    inputs = [("x", data((batch, channels, length), dtype) / 10), ("w", data((channels, 1, k), dtype, 1) / 10)]
    inputs.append(("b", data((channels,), dtype, 2) / 10) if bias else ("", None))
    inputs.append(("past", data((batch, channels, k - 1), dtype, 3) / 10) if past else ("", None))
    while inputs[-1][0] == "":
        inputs.pop()
    return inputs


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("length", [1, 3, 12])
@pytest.mark.parametrize("bias,past", [(False, False), (True, False), (False, True), (True, True)])
def test_causal_conv(k, length, bias, past):
    # length < k - 1: the new state holds samples of the past state too.
    check_node("CausalConvWithState", conv_inputs(length=length, k=k, bias=bias, past=past), n_outputs=2, opset=27)


@pytest.mark.parametrize("activation", ["none", "silu", "swish"])
def test_causal_conv_activation(activation):
    check_node("CausalConvWithState", conv_inputs(bias=True, past=True), {"activation": activation}, n_outputs=2,
               opset=27)


@pytest.mark.parametrize("past", [False, True])
def test_causal_conv_float16(past):
    check_node("CausalConvWithState", conv_inputs(k=5, past=past, bias=True, dtype=np.float16),
               {"activation": "silu"}, n_outputs=2, opset=27, rtol=FLOAT16_RTOL)


def test_causal_conv_decode_steps_carry_the_state():
    # One sample at a time, the state fed back, gives the whole sequence's convolution.
    node = helper.make_node("CausalConvWithState", ["x", "w", "b", "past"], ["y", "present"], activation="silu")
    x, w, b = data((2, 3, 6)) / 10, data((3, 1, 4), seed=1) / 10, data((3,), seed=2) / 10
    model = make_model([node], [("x", x[:, :, :1]), ("past", np.zeros((2, 3, 3), np.float32))],
                       [("y", None), ("present", None)], initializers=[("w", w), ("b", b)], opset=27)
    state = np.zeros((2, 3, 3), np.float32)
    for t in range(6):
        _, state = check_model(model, {"x": x[:, :, t:t + 1], "past": state})


def test_causal_conv_weight_shape_is_checked():
    node = helper.make_node("CausalConvWithState", ["x", "w"], ["y", "present"])
    model = make_model([node], [("x", np.zeros((1, 4, 5), np.float32)), ("w", np.zeros((4, 2, 3), np.float32))],
                       [("y", None), ("present", None)], opset=27)
    with pytest.raises(nnrun.ModelError, match=r"must be \(4, 1, k\)"):
        nnrun.InferenceSession(model.SerializeToString())


def test_causal_conv_bfloat16():
    # onnxruntime has no bfloat16 CausalConvWithState. bfloat16 keeps 8 significant bits, and
    # the reference evaluator sums in it: a few of its spacings (4e-3 near 1) apart.
    inputs = [(n, a.astype(ml_dtypes.bfloat16)) for n, a in conv_inputs(bias=True, past=True)]
    check_node("CausalConvWithState", inputs, {"activation": "silu"}, n_outputs=2, opset=27, oracle="reference",
               rtol=1e-2)
