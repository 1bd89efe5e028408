"""FlexAttention (ai.onnx.preview) against onnx's reference evaluator (onnxruntime does not
implement the op), and the spec's formula in float64 where the evaluator cannot run a case."""

import numpy as np
import pytest

import nnrun
from oracle import (FLOAT16_RTOL, TensorProto, assert_close, check_model, data, helper, make_model, numpy_helper,
                    run_nnrun)

PREVIEW = "ai.onnx.preview"


def qkv(batch=2, hq=4, hkv=4, length=5, span=7, d=8, dv=8, dtype=np.float32):
    shapes = (batch, hq, length, d), (batch, hkv, span, d), (batch, hkv, span, dv)
    # Scaled down so softmax is not one-hot.
    return [(n, (data(s, seed=i) / 10).astype(dtype)) for i, (n, s) in enumerate(zip("qkv", shapes))]


def modifier(name, nodes, initializers=(), elem=TensorProto.FLOAT):
    """A score_mod / prob_mod graph from `x` to `y`."""
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", elem, ["B", "H", "L", "S"])],
                             [helper.make_tensor_value_info("y", elem, ["B", "H", "L", "S"])],
                             [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers])


def add_bias(value=0.5, elem=TensorProto.FLOAT, dtype=np.float32):
    return modifier("add_bias", [helper.make_node("Add", ["x", "bias"], ["y"])], [("bias", dtype(value))], elem)


# Nodes giving the query positions `q2` (L, 1) and key positions `ki` (S,) from the scores' shape.
POSITIONS = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "two"], ["l"], axis=0),
             helper.make_node("Gather", ["shape", "three"], ["s"], axis=0),
             helper.make_node("Range", ["zero", "l", "one"], ["qi"]),
             helper.make_node("Range", ["zero", "s", "one"], ["ki"]),
             helper.make_node("Unsqueeze", ["qi", "axis1"], ["q2"])]
POSITION_CONSTANTS = [("two", np.int64(2)), ("three", np.int64(3)), ("zero", np.int64(0)), ("one", np.int64(1)),
                      ("axis1", np.array([1], np.int64))]


def causal():
    """Where(query position >= key position, scores, -inf)."""
    nodes = POSITIONS + [helper.make_node("GreaterOrEqual", ["q2", "ki"], ["keep"]),
                         helper.make_node("Where", ["keep", "x", "ninf"], ["y"])]
    return modifier("causal", nodes, POSITION_CONSTANTS + [("ninf", np.float32(-np.inf))])


def soft_cap(cap=2.0):
    nodes = [helper.make_node("Div", ["x", "cap"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Mul", ["b", "cap"], ["y"])]
    return modifier("soft_cap", nodes, [("cap", np.float32(cap))])


def head_slopes(heads):
    """ALiBi: scores + slope[h] * (key position - query position)."""
    slopes = (2.0 ** -np.arange(1, heads + 1)).astype(np.float32).reshape(heads, 1, 1)
    nodes = POSITIONS + [helper.make_node("Sub", ["ki", "q2"], ["rel"]),
                         helper.make_node("Cast", ["rel"], ["relf"], to=TensorProto.FLOAT),
                         helper.make_node("Mul", ["relf", "slopes"], ["b"]),
                         helper.make_node("Add", ["x", "b"], ["y"])]
    return modifier("alibi", nodes, POSITION_CONSTANTS + [("slopes", slopes)])


def scale_probs(value=0.5):
    return modifier("scale_probs", [helper.make_node("Mul", ["x", "k"], ["y"])], [("k", np.float32(value))])


def check_flex(inputs, attrs=None, extra_inputs=(), rtol=1e-4):
    node = helper.make_node("FlexAttention", [n for n, _ in inputs], ["y"], domain=PREVIEW, **(attrs or {}))
    model = make_model([node], list(inputs) + list(extra_inputs), [("y", None)], opset=26,
                       extra_opsets=[(PREVIEW, 1)])
    feeds = dict(list(inputs) + list(extra_inputs))
    return check_model(model, feeds, oracle="reference", rtol=rtol)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("length,span", [(5, 7), (1, 9), (6, 6)])
def test_flex_attention(hq, hkv, length, span):
    check_flex(qkv(hq=hq, hkv=hkv, length=length, span=span))


def test_flex_attention_value_head_size():
    check_flex(qkv(d=8, dv=12))


@pytest.mark.parametrize("scale", [0.05, 1.0, 2.5])
def test_flex_attention_scale(scale):
    check_flex(qkv(), {"scale": scale})


@pytest.mark.parametrize("name,graph", [("bias", add_bias()), ("causal", causal()), ("soft_cap", soft_cap()),
                                        ("alibi", head_slopes(4))])
@pytest.mark.parametrize("hkv", [4, 2])
def test_flex_attention_score_mod(name, graph, hkv):
    check_flex(qkv(hkv=hkv, length=6, span=6), {"score_mod": graph})


def test_flex_attention_prob_mod():
    check_flex(qkv(hkv=2), {"prob_mod": scale_probs(0.5)})


def test_flex_attention_score_and_prob_mod():
    check_flex(qkv(length=4, span=4), {"score_mod": causal(), "prob_mod": scale_probs(2.0)})


def test_flex_attention_float64():
    mod = add_bias(0.25, TensorProto.DOUBLE, np.float64)
    check_flex(qkv(dtype=np.float64), {"score_mod": mod})


def test_flex_attention_float16():
    check_flex(qkv(dtype=np.float16, hkv=2), {"score_mod": soft_cap(1.5)}, rtol=FLOAT16_RTOL)


def test_flex_attention_softmax_precision_double():
    mod = add_bias(0.25, TensorProto.DOUBLE, np.float64)
    check_flex(qkv(), {"softmax_precision": TensorProto.DOUBLE, "score_mod": mod})


def test_flex_attention_softmax_precision_float16():
    mod = add_bias(0.25, TensorProto.FLOAT16, np.float16)
    check_flex(qkv(), {"softmax_precision": TensorProto.FLOAT16, "score_mod": mod}, rtol=FLOAT16_RTOL)


@pytest.mark.parametrize("captured_as", ["weight", "input"])
def test_flex_attention_score_mod_reads_the_outer_graph(captured_as):
    # The modifier reads a bias of the outer graph: a weight, or a graph input fed per run.
    # The reference evaluator does not give a modifier the outer scope: the oracle is the
    # spec's formula in float64.
    (_, q), (_, k), (_, v) = inputs = qkv(length=5, span=7)
    bias = data((1, 4, 5, 7), seed=9) / 10
    mod = modifier("outer_bias", [helper.make_node("Add", ["x", "outer_bias"], ["y"])])
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=PREVIEW, score_mod=mod)
    fed = inputs + ([("outer_bias", bias)] if captured_as == "input" else [])
    model = make_model([node], fed, [("y", None)], initializers=[("outer_bias", bias)] if captured_as == "weight"
                       else (), opset=26, extra_opsets=[(PREVIEW, 1)])
    (y,) = run_nnrun(model, dict(fed))
    scores = q.astype(np.float64) @ k.astype(np.float64).swapaxes(2, 3) / np.sqrt(q.shape[3]) + bias
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    assert_close(y, (probs @ v.astype(np.float64)).astype(np.float32))


def test_flex_attention_score_mod_must_keep_the_shape():
    mod = modifier("reduce", [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                   [("axes", np.array([3], np.int64))])
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=PREVIEW, score_mod=mod)
    model = make_model([node], qkv(), [("y", None)], opset=26, extra_opsets=[(PREVIEW, 1)])
    with pytest.raises(nnrun.ModelError, match="must keep the shape"):
        nnrun.InferenceSession(model.SerializeToString())
