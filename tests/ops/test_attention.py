"""Attention and RotaryEmbedding against onnxruntime (or onnx's reference evaluator where
onnxruntime lacks the opset or differs from the spec's reference)."""

import numpy as np
import pytest

from oracle import FLOAT16_RTOL, check_model, check_node, data, helper, i64, make_model


def qkv(batch=2, hq=4, hkv=2, sq=5, skv=6, d=8, dv=8, rank=4, dtype=np.float32):
    if rank == 4:
        shapes = (batch, hq, sq, d), (batch, hkv, skv, d), (batch, hkv, skv, dv)
    else:
        shapes = (batch, sq, hq * d), (batch, skv, hkv * d), (batch, skv, hkv * dv)
    # Scaled down so softmax is not one-hot.
    return [(n, (data(s, seed=i) / 10).astype(dtype)) for i, (n, s) in enumerate(zip("qkv", shapes))]


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}, {"scale": 0.3}, {"softcap": 2.0},
                                   {"is_causal": 1, "softcap": 1.5, "scale": 0.5}])
def test_attention_heads(opset, hq, hkv, rank, attrs):
    attrs = dict(attrs)
    if rank == 3:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    check_node("Attention", qkv(hq=hq, hkv=hkv, rank=rank), attrs, opset=opset)


def test_attention_different_value_head_size():
    check_node("Attention", qkv(d=8, dv=6), {"is_causal": 1}, opset=23)
    check_node("Attention", qkv(d=8, dv=6, rank=3), {"q_num_heads": 4, "kv_num_heads": 2}, opset=23)


@pytest.mark.parametrize("mask_shape,causal", [
    (shape, causal)
    for shape in [(6,), (5, 6), (4, 5, 6), (2, 1, 5, 6), (2, 4, 5, 6), (1, 4, 5, 6)]
    for causal in (0, 1)
    # No oracle for a rank-1 mask with is_causal: onnx's reference cannot compose them,
    # onnxruntime wants rank >= 2.
    if not (causal and len(shape) == 1)], ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_masks(mask_shape, kind, causal):
    mask = data(mask_shape, np.bool_, seed=7) if kind == "bool" else data(mask_shape, seed=7)
    if kind == "bool":
        mask[..., 0] = True  # no fully masked rows here: see test_attention_fully_masked_rows
    oracle = "reference" if len(mask_shape) == 1 else "onnxruntime"  # onnxruntime wants rank >= 2
    check_node("Attention", qkv() + [("mask", mask)], {"is_causal": causal}, opset=23, oracle=oracle)


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
def test_attention_past_and_present(opset, causal, rank):
    inputs = qkv(sq=3, skv=3, rank=rank)
    past_k, past_v = data((2, 2, 4, 8), seed=11) / 10, data((2, 2, 4, 8), seed=12) / 10
    mask = data((3, 7), np.bool_, seed=3)
    mask[:, 0] = True
    attrs = {"is_causal": causal}
    if rank == 3:
        attrs.update(q_num_heads=4, kv_num_heads=2)
    check_node("Attention", inputs + [("mask", mask), ("pk", past_k), ("pv", past_v)], attrs,
               n_outputs=3, opset=opset)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_attention_qk_matmul_output(mode, softcap):
    past_k, past_v = data((2, 2, 2, 8), seed=11) / 10, data((2, 2, 2, 8), seed=12) / 10
    mask = data((5, 8), seed=5)
    # onnx's reference (which the backend cases come from) reports mode 0 after softcap, and
    # its causal bias is -inf where onnxruntime's mode 2 shows the float minimum.
    oracle = "reference" if (softcap and mode == 0) or mode == 2 else "onnxruntime"
    check_node("Attention", qkv() + [("mask", mask), ("pk", past_k), ("pv", past_v)],
               {"qk_matmul_output_mode": mode, "softcap": softcap, "is_causal": 1},
               n_outputs=4, opset=23, oracle=oracle)


def test_attention_fully_masked_rows_are_zero():
    mask = np.ones((2, 4, 5, 6), bool)
    mask[0, 1, 2] = False
    mask[1, :, 4] = False
    check_node("Attention", qkv() + [("mask", mask)], {"qk_matmul_output_mode": 3}, n_outputs=4,
               opset=23, oracle="reference")


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_nonpad_kv_seqlen(causal, with_mask):
    inputs = qkv(sq=3, skv=8)
    mask = ("mask", data((3, 8), seed=4)) if with_mask else ("", None)
    nonpad = ("nonpad", i64(8, 5))
    check_node("Attention", inputs + [mask, ("", None), ("", None), nonpad], {"is_causal": causal},
               opset=24, oracle="reference")


@pytest.mark.parametrize("left,right,causal", [(2, 0, 0), (2, 1, 0), (1, -1, 1), (-1, 2, 0), (0, 0, 0)])
def test_attention_sliding_window(left, right, causal):
    check_node("Attention", qkv(sq=5, skv=7), {"left_window_size": left, "right_window_size": right,
                                               "is_causal": causal}, opset=25, oracle="reference")


def test_attention_short_mask_is_padded():
    mask = data((5, 4), seed=9)
    check_node("Attention", qkv() + [("mask", mask)], {}, opset=25, oracle="reference")


def test_attention_float16():
    check_node("Attention", qkv(dtype=np.float16), {"is_causal": 1}, opset=23, rtol=FLOAT16_RTOL)


def test_attention_softmax_precision():
    check_node("Attention", qkv(dtype=np.float16), {"softmax_precision": 1}, opset=23, rtol=FLOAT16_RTOL)


def test_attention_in_graph_with_weights():
    # K and V are initializers (mapped weights): read-only inputs must not be written.
    inputs = qkv()
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    model = make_model([node], [inputs[0]], [("y", None)], initializers=inputs[1:], opset=23)
    check_model(model, {"q": inputs[0][1]})


def rotary_inputs(batch=2, heads=3, seq=4, head=8, rotary=None, rank=4, positions=True, seed=0):
    half = (rotary or head) // 2
    x_shape = (batch, heads, seq, head) if rank == 4 else (batch, seq, heads * head)
    x = data(x_shape, seed=seed)
    if positions:
        angles = np.random.default_rng(seed).uniform(0, 6.3, (10, half))
        pos = np.random.default_rng(seed + 1).integers(0, 10, (batch, seq))
        extra = [("pos", pos.astype(np.int64))]
    else:
        angles = np.random.default_rng(seed).uniform(0, 6.3, (batch, seq, half))
        extra = []
    return [("x", x), ("cos", np.cos(angles).astype(np.float32)),
            ("sin", np.sin(angles).astype(np.float32))] + extra


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary", [None, 4])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("positions", [True, False])
def test_rotary_embedding(interleaved, rotary, rank, positions):
    attrs = {"interleaved": interleaved}
    if rotary:
        attrs["rotary_embedding_dim"] = rotary
    if rank == 3:
        attrs["num_heads"] = 3
    check_node("RotaryEmbedding", rotary_inputs(rotary=rotary, rank=rank, positions=positions), attrs,
               opset=23)
