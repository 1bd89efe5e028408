"""LinearAttention against onnxruntime."""

import ml_dtypes
import numpy as np
import pytest

import nnrun
from oracle import FLOAT16_RTOL, check_model, check_node, helper, make_model, rng


def la_inputs(batch=2, t=5, hq=4, hkv=2, dk=6, dv=5, rule="gated_delta", past=False, decay="per_key",
              beta="per_head", dtype=np.float32, state_dtype=None, seed=0):
    """Query, key, value (keys L2-normalised, as the delta rules want), and what the rule reads."""
    r = rng(seed)
    q = r.standard_normal((batch, t, hq * dk)) / 2
    k = r.standard_normal((batch, t, hkv, dk))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(batch, t, hkv * dk)
    v = r.standard_normal((batch, t, hkv * dv))
    inputs = [("q", q.astype(dtype)), ("k", k.astype(dtype)), ("v", v.astype(dtype))]
    state = r.standard_normal((batch, hkv, dk, dv)) / 4
    inputs.append(("past", state.astype(state_dtype or dtype)) if past else ("", None))
    if rule in ("gated", "gated_delta"):
        width = hkv * dk if decay == "per_key" else hkv
        inputs.append(("decay", -r.uniform(0.01, 0.5, (batch, t, width)).astype(dtype)))  # log of a factor < 1
    else:
        inputs.append(("", None))
    if rule in ("delta", "gated_delta"):
        width = hkv if beta == "per_head" else 1
        inputs.append(("beta", r.uniform(0.1, 0.9, (batch, t, width)).astype(dtype)))
    while inputs[-1][0] == "":
        inputs.pop()
    return inputs


def attrs(rule, hq=4, hkv=2, **more):
    return {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv, **more}


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("past", [False, True])
def test_linear_attention(rule, hq, hkv, past):
    check_node("LinearAttention", la_inputs(hq=hq, hkv=hkv, rule=rule, past=past), attrs(rule, hq, hkv),
               n_outputs=2, opset=27)


@pytest.mark.parametrize("rule,decay,beta", [("gated", "per_head", None), ("gated_delta", "per_head", "shared"),
                                             ("gated_delta", "per_key", "shared"), ("delta", None, "shared")])
def test_linear_attention_decay_and_beta_widths(rule, decay, beta):
    check_node("LinearAttention", la_inputs(rule=rule, decay=decay, beta=beta, past=True), attrs(rule),
               n_outputs=2, opset=27)


@pytest.mark.parametrize("t", [1, 17])
@pytest.mark.parametrize("dk,dv", [(8, 8), (3, 7), (1, 4)])
def test_linear_attention_sizes(t, dk, dv):
    check_node("LinearAttention", la_inputs(t=t, dk=dk, dv=dv, past=True), attrs("gated_delta"), n_outputs=2,
               opset=27)


@pytest.mark.parametrize("scale", [0.25, 1.5])
def test_linear_attention_scale(scale):
    check_node("LinearAttention", la_inputs(rule="gated"), attrs("gated", scale=scale), n_outputs=2, opset=27)


@pytest.mark.parametrize("past", [False, True])
def test_linear_attention_float16(past):
    check_node("LinearAttention", la_inputs(dtype=np.float16, past=past), attrs("gated_delta"), n_outputs=2,
               opset=27, rtol=FLOAT16_RTOL)


def test_linear_attention_float32_state_of_float16_tokens():
    # The state keeps its own type (S): float32 here, beside float16 tokens.
    inputs = la_inputs(dtype=np.float16, past=True, state_dtype=np.float32)
    check_node("LinearAttention", inputs, attrs("gated_delta"), n_outputs=2, opset=27, rtol=FLOAT16_RTOL)


def test_linear_attention_decode_steps_carry_the_state():
    # Token by token, the state fed back, gives what the whole sequence gives.
    inputs = dict(la_inputs(t=4, past=True))
    node = helper.make_node("LinearAttention", ["q", "k", "v", "past", "decay", "beta"], ["y", "present"],
                            **attrs("gated_delta"))
    model = make_model([node], [(n, a[:, :1] if a.ndim == 3 else a) for n, a in inputs.items()],
                       [("y", None), ("present", None)], opset=27)
    state = inputs["past"]
    for i in range(4):
        feeds = {n: a[:, i:i + 1] for n, a in inputs.items() if a.ndim == 3}
        _, state = check_model(model, {**feeds, "past": state})


@pytest.mark.parametrize("rule,given,drop,message", [("gated", "gated_delta", "decay", "needs decay"),
                                                     ("linear", "gated", None, "takes no decay"),
                                                     ("delta", "delta", "beta", "needs beta"),
                                                     ("gated", "gated_delta", None, "takes no beta")])
def test_linear_attention_inputs_follow_the_rule(rule, given, drop, message):
    inputs = la_inputs(rule=given)
    names = [n if n != drop else "" for n, _ in inputs]
    node = helper.make_node("LinearAttention", names, ["y", "present"], **attrs(rule))
    model = make_model([node], [(n, a) for n, a in inputs if n and n != drop], [("y", None), ("present", None)],
                       opset=27)
    with pytest.raises(nnrun.ModelError, match=message):
        nnrun.InferenceSession(model.SerializeToString())


def test_linear_attention_bfloat16():
    # onnxruntime has no bfloat16 LinearAttention. bfloat16 keeps 8 significant bits (spacing
    # 4e-3 near 1), rounded at the inputs and outputs.
    inputs = [(n, a.astype(ml_dtypes.bfloat16)) for n, a in la_inputs(past=True)]
    check_node("LinearAttention", inputs, attrs("gated_delta"), n_outputs=2, opset=27, oracle="reference", rtol=1e-2)
