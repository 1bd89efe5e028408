"""BatchNormalization, LayerNormalization and InstanceNormalization against onnxruntime."""

import numpy as np
import pytest
from oracle import FLOAT16_RTOL, check_node, rng

import nnrun
from nnrun import ir
from nnrun.ops.normalization import BatchNormalization, LayerNormalization
from nnrun.ops.registry import TensorInfo


def _data(shape, dtype=np.float32, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


def _bn_params(shape, dtype=np.float32, stats_dtype=None, seed=1):
    r = rng(seed)
    stats_dtype = stats_dtype or dtype
    return [("scale", r.standard_normal(shape).astype(dtype)), ("b", r.standard_normal(shape).astype(dtype)),
            ("mean", r.standard_normal(shape).astype(stats_dtype)),
            ("var", r.uniform(0.1, 2.0, shape).astype(stats_dtype))]


@pytest.mark.parametrize("x_shape", [(2, 3), (2, 3, 7), (2, 3, 5, 4), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_batch_norm(opset, x_shape):
    params = _bn_params((x_shape[1],))
    check_node("BatchNormalization", [("x", _data(x_shape))], {"epsilon": 1e-3}, initializers=params,
               opset=opset)


@pytest.mark.parametrize("opset", [7, 9, 15])
def test_batch_norm_fed_parameters(opset):
    params = _bn_params((4,))
    check_node("BatchNormalization", [("x", _data((2, 4, 3, 3)))] + params, opset=opset)


def test_batch_norm_mixed_types():
    # Opset 15: scale and B may differ in type from the statistics.
    params = _bn_params((3,), np.float16, np.float32)
    check_node("BatchNormalization", [("x", _data((2, 3, 4, 4), np.float16))], initializers=params,
               opset=15, oracle="reference", rtol=FLOAT16_RTOL)


def test_batch_norm_float64():
    params = _bn_params((3,), np.float64)
    check_node("BatchNormalization", [("x", _data((2, 3, 4), np.float64))], initializers=params, opset=15)


def test_batch_norm_per_activation_opset7():
    # spatial=0: statistics per (channel, position)
    params = _bn_params((3, 4, 2))
    check_node("BatchNormalization", [("x", _data((2, 3, 4, 2)))], {"spatial": 0}, initializers=params,
               opset=7)


def test_batch_norm_packs_constant_parameters():
    node = ir.Node("bn", "BatchNormalization", "", ["x", "s", "b", "m", "v"], ["y"], {})
    k = BatchNormalization(node, 15)
    x = TensorInfo((1, 3, 2, 2), np.dtype(np.float32))
    params = [TensorInfo.of(a) for _, a in _bn_params((3,))]
    assert k.ready(k.shape_rule(x, *params).derived, x, *params) == []
    assert k.packed == {1, 2, 3, 4}


@pytest.mark.parametrize("x_shape", [(2, 3), (2, 3, 7), (4, 3, 5, 4), (1, 3, 3, 4, 5)])
@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-2, "momentum": 0.5}])
def test_batch_norm_training_mode(attrs, opset, x_shape):
    # The statistics are the batch's own: Y and the running statistics follow from the inputs.
    params = _bn_params((3,))
    x = _data(x_shape) * 3 + 1
    for oracle in ("onnxruntime", "reference"):
        check_node("BatchNormalization", [("x", x)] + params, {**attrs, "training_mode": 1}, n_outputs=3,
                   opset=opset, oracle=oracle)


def test_batch_norm_training_mode_float64_and_half():
    params = _bn_params((3,), np.float64)
    check_node("BatchNormalization", [("x", _data((2, 3, 4), np.float64))] + params, {"training_mode": 1},
               n_outputs=3, opset=15)
    # Half floats: onnxruntime has no such kernel. (With float statistics, the reference evaluator
    # gives the running statistics X's type; the spec, and nnrun, the statistics' own.)
    params = _bn_params((3,), np.float16)
    check_node("BatchNormalization", [("x", _data((2, 3, 4, 4), np.float16))] + params, {"training_mode": 1},
               n_outputs=3, opset=15, oracle="reference", rtol=FLOAT16_RTOL)


@pytest.mark.parametrize("attrs, outputs, opset", [
    ({}, ["y", "running_mean", "running_var"], 15),
    ({}, ["y", "mean", "var", "saved_mean", "saved_var"], 7),
])
def test_batch_norm_training_is_refused(attrs, outputs, opset):
    node = ir.Node("bn", "BatchNormalization", "", ["x", "s", "b", "m", "v"], outputs, attrs)
    with pytest.raises(nnrun.ModelError, match="training"):
        BatchNormalization(node, opset)


def test_batch_norm_rejects_bad_parameter_shapes():
    node = ir.Node("bn", "BatchNormalization", "", ["x", "s", "b", "m", "v"], ["y"], {})
    params = [TensorInfo.of(a) for _, a in _bn_params((4,))]
    with pytest.raises(nnrun.ModelError, match="scale"):
        BatchNormalization(node, 15).infer(TensorInfo((1, 3, 2, 2), np.dtype(np.float32)), *params)


@pytest.mark.parametrize("x_shape, axis", [((2, 5, 8), -1), ((2, 5, 8), -2), ((2, 5, 8), 1), ((2, 5, 8), 0),
                                           ((3, 16), -1), ((2, 3, 4, 5), 2)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm(x_shape, axis, with_bias):
    normalized = x_shape[axis % len(x_shape):]
    inits = [("scale", _data(normalized, seed=1))]
    if with_bias:
        inits.append(("b", _data(normalized, seed=2)))
    check_node("LayerNormalization", [("x", _data(x_shape))], {"axis": axis, "epsilon": 1e-3},
               initializers=inits)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_statistics_outputs(axis):
    x = _data((2, 4, 6))
    normalized = x.shape[axis % 3:]
    check_node("LayerNormalization", [("x", x), ("scale", _data(normalized, seed=1)),
                                      ("b", _data(normalized, seed=2))], {"axis": axis}, n_outputs=3)


def test_layer_norm_broadcast_scale():
    check_node("LayerNormalization", [("x", _data((2, 4, 6)))], {"axis": 1},
               initializers=[("scale", _data((1, 6), seed=1)), ("b", _data((6,), seed=2))])


@pytest.mark.parametrize("dtype, rtol", [(np.float16, 2e-3), (np.float64, 1e-6)])
def test_layer_norm_other_types(dtype, rtol):
    x = _data((3, 4, 10), dtype)
    check_node("LayerNormalization", [("x", x)], {"axis": -1},
               initializers=[("scale", _data((10,), dtype, 1)), ("b", _data((10,), dtype, 2))],
               n_outputs=3, rtol=rtol)


def test_layer_norm_rejects_bad_axis():
    node = ir.Node("ln", "LayerNormalization", "", ["x", "s"], ["y"], {"axis": 3})
    with pytest.raises(nnrun.ModelError, match="axis"):
        LayerNormalization(node, 17).infer(TensorInfo((2, 3, 4), np.dtype(np.float32)),
                                           TensorInfo((4,), np.dtype(np.float32)))


@pytest.mark.parametrize("x_shape", [(2, 3, 7), (2, 3, 5, 4), (1, 2, 3, 4, 2)])
@pytest.mark.parametrize("fed", [False, True])
def test_instance_norm(x_shape, fed):
    params = [("scale", _data((x_shape[1],), seed=1)), ("b", _data((x_shape[1],), seed=2))]
    x = [("x", _data(x_shape))]
    if fed:
        check_node("InstanceNormalization", x + params, {"epsilon": 1e-3})
    else:
        check_node("InstanceNormalization", x, {"epsilon": 1e-3}, initializers=params)


def test_instance_norm_float16():
    params = [("scale", _data((3,), np.float16, 1)), ("b", _data((3,), np.float16, 2))]
    check_node("InstanceNormalization", [("x", _data((2, 3, 6, 5), np.float16))], initializers=params,
               rtol=FLOAT16_RTOL)
