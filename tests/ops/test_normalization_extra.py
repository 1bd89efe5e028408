"""RMSNormalization, GroupNormalization, LpNormalization, MeanVarianceNormalization and LRN
against onnxruntime."""

import numpy as np
import pytest
from oracle import FLOAT16_RTOL, check_node, helper, make_model, rng, run_nnrun

import nnrun


def _data(shape, dtype=np.float32, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((4, 6), 0), ((2, 3, 5), 1), ((2, 3, 5), -2),
                                        ((2, 3, 4, 5), 2), ((2, 3, 4, 5), -4), ((3, 0, 4), -1)])
@pytest.mark.parametrize("scale_rank", [1, "full"])
def test_rms_norm(shape, axis, scale_rank):
    normalized = shape[axis % len(shape):]
    scale_shape = normalized[-1:] if scale_rank == 1 else normalized
    check_node("RMSNormalization", [("x", _data(shape)), ("scale", _data(scale_shape, seed=1))],
               {"axis": axis, "epsilon": 1e-3}, opset=23)


def test_rms_norm_float16_stash():
    check_node("RMSNormalization", [("x", _data((3, 8), np.float16)), ("scale", _data((8,), np.float16, 1))],
               opset=23, rtol=FLOAT16_RTOL)


@pytest.mark.parametrize("shape,groups", [((2, 6, 4, 3), 3), ((2, 6, 5), 2), ((1, 4, 3, 3), 4),
                                          ((3, 4, 2, 2), 1), ((2, 6), 3)])
@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm(opset, shape, groups):
    per = shape[1] if opset >= 21 else groups
    oracle = "onnxruntime" if opset >= 21 else "reference"  # onnxruntime has opset 18's only as a function
    check_node("GroupNormalization", [("x", _data(shape)), ("scale", _data((per,), seed=1)),
                                      ("bias", _data((per,), seed=2))],
               {"num_groups": groups, "epsilon": 1e-3}, opset=opset, oracle=oracle)


def test_group_norm_rejects_indivisible_groups():
    x, p = _data((2, 6, 3)), _data((6,))
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=4)
    model = make_model([node], [("x", x), ("s", p), ("b", p)], [("y", None)], opset=21)
    with pytest.raises(nnrun.ModelError, match="num_groups 4"):
        run_nnrun(model, {"x": x, "s": p, "b": p})


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (2, 3, 4, 5)])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("opset", [1, 22])
def test_lp_norm(opset, p, axis, shape):
    check_node("LpNormalization", [("x", _data(shape))], {"axis": axis, "p": p}, opset=opset)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_norm_zero_slice(p):
    x = _data((3, 4))
    x[1] = 0
    check_node("LpNormalization", [("x", x)], {"axis": -1, "p": p}, opset=22)


@pytest.mark.parametrize("axes", [None, [0, 2, 3], [2, 3], [1], [-1, -2]])
@pytest.mark.parametrize("opset", [9, 13])
def test_mvn(opset, axes):
    attrs = {} if axes is None else {"axes": axes}
    check_node("MeanVarianceNormalization", [("x", _data((2, 3, 4, 5)) + 3)], attrs, opset=opset)


def test_mvn_3d():
    check_node("MeanVarianceNormalization", [("x", _data((2, 3, 7)))], {"axes": [0, 2]}, opset=13)


# onnxruntime takes odd sizes only, and onnx's reference LRN loops over the batch where it
# means the channels: even sizes have no oracle.
@pytest.mark.parametrize("size", [1, 3, 5, 15])
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn(opset, size):
    check_node("LRN", [("x", _data((2, 6, 4, 3)))], {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 2.0},
               opset=opset)


def test_lrn_defaults():
    check_node("LRN", [("x", _data((1, 4, 3, 3)))], {"size": 3}, opset=13)
