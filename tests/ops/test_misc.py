"""Dropout, Swish, SwiGLU, Shrink, CumProd, LpPool, GlobalLpPool, Compress, the spectral
windows, Det and MaxUnpool against onnxruntime (onnx's reference evaluator for the
opsets onnxruntime does not have yet)."""

import numpy as np
import pytest
from oracle import (FLOAT16_RTOL, assert_close, check_model, check_node, helper, i64, make_model,
                    numpy_helper, rng, run_nnrun, run_onnxruntime, run_reference)

import nnrun


def _data(shape, dtype=np.float32, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


# Dropout

@pytest.mark.parametrize("opset,with_mask", [(7, False), (10, False), (12, False), (12, True), (13, True),
                                             (22, False), (22, True)])
def test_dropout_inference(opset, with_mask):
    attrs = {"ratio": 0.3} if opset < 12 else {}
    check_node("Dropout", [("x", _data((2, 3, 4)))], attrs, n_outputs=2 if with_mask else 1, opset=opset)


@pytest.mark.parametrize("opset", [7, 10])
def test_dropout_old_mask(opset):
    # Before opset 12 onnxruntime's mask is all false (of X's type before opset 10, as the spec
    # says); onnx's reference gives the spec's values (all kept) but always as bool. Take each
    # oracle for what it follows the spec in.
    x = _data((2, 3, 4))
    node = helper.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.3)
    model = make_model([node], [("x", x)], [("y", None), ("mask", None)], opset=opset)
    y, mask = run_nnrun(model, {"x": x})
    ort_y, ort_mask = run_onnxruntime(model, {"x": x})
    _, ref_mask = run_reference(model, {"x": x})
    assert_close(y, ort_y)
    assert mask.dtype == ort_mask.dtype
    np.testing.assert_array_equal(mask, ref_mask.astype(ort_mask.dtype))


@pytest.mark.parametrize("with_mask", [False, True])
def test_dropout_ratio_input_without_training(with_mask):
    check_node("Dropout", [("x", _data((3, 5)))], initializers=[("ratio", np.array(0.4, np.float32))],
               n_outputs=2 if with_mask else 1, opset=13)


@pytest.mark.parametrize("training", [False, True])
def test_dropout_training_mode_zero_ratio(training):
    check_node("Dropout", [("x", _data((3, 5)))],
               initializers=[("ratio", np.array(0.0, np.float32)), ("training_mode", np.array(training))],
               n_outputs=2, opset=13)


@pytest.mark.parametrize("fed", [False, True])
def test_dropout_refuses_training(fed):
    x = _data((3, 5))
    node = helper.make_node("Dropout", ["x", "ratio", "training_mode"], ["y"], name="drop")
    ratio, training = np.array(0.5, np.float32), np.array(True)
    feeds = {"x": x}
    if fed:
        inputs = [("x", x), ("ratio", ratio), ("training_mode", training)]
        feeds.update(ratio=ratio, training_mode=training)
        initializers = []
    else:
        inputs = [("x", x)]
        initializers = [("ratio", ratio), ("training_mode", training)]
    model = make_model([node], inputs, [("y", None)], initializers, opset=13)
    with pytest.raises(nnrun.ModelError, match=r"(PREPARE/infer_shapes|EXECUTE): node 'drop' \(Dropout, #0\): "
                                               "training_mode"):
        run_nnrun(model, feeds)


# Activations

@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, 2.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_swish(alpha, dtype):
    attrs = {} if alpha is None else {"alpha": alpha}
    check_node("Swish", [("x", _data((3, 4, 5), dtype))], attrs, opset=24, oracle="reference")


@pytest.mark.parametrize("alpha", [None, 1.702])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu(alpha, dtype):
    attrs = {} if alpha is None else {"alpha": alpha}
    check_node("SwiGLU", [("a", _data((2, 3, 8), dtype)), ("b", _data((2, 3, 8), dtype, 1))], attrs,
               opset=28, oracle="reference", rtol=FLOAT16_RTOL if dtype == np.float16 else 1e-4)


@pytest.mark.parametrize("attrs", [{}, {"lambd": 1.5}, {"bias": 1.5}, {"lambd": 2.0, "bias": 0.5},
                                   {"lambd": 1.5, "bias": 1.5}, {"lambd": 0.0, "bias": 0.0}])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shrink(attrs, dtype):
    check_node("Shrink", [("x", _data((4, 5), dtype) * 3)], attrs, opset=9)


@pytest.mark.parametrize("attrs", [{"lambd": 2.0, "bias": 1.0}, {"lambd": 2.0}, {"lambd": 2.0, "bias": 2.0}])
@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_shrink_integers(attrs, dtype):
    x = np.arange(-6, 7, dtype=dtype)
    check_node("Shrink", [("x", x)], attrs, opset=9)


# CumProd

@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_cumprod(axis, exclusive, reverse, dtype):
    x = (rng(0).integers(1, 4, size=(3, 4, 5)) * rng(1).choice([-1, 1], size=(3, 4, 5))).astype(dtype)
    check_node("CumProd", [("x", x)], {"exclusive": exclusive, "reverse": reverse},
               initializers=[("axis", np.array(axis, np.int64))], opset=26, oracle="reference")


def test_cumprod_fed_axis():
    x = _data((2, 3, 4)) / 5
    check_node("CumProd", [("x", x), ("axis", np.array(1, np.int32))], {"exclusive": 1}, opset=26,
               oracle="reference")


# Lp pooling

LP_POOL_CASES = [
    ((1, 2, 9), {"kernel_shape": [3]}),
    ((2, 3, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1]}),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "pads": [1, 2, 1, 0]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 7), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 6, 5), {"kernel_shape": [2, 2], "auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 1, 4, 5, 6), {"kernel_shape": [2, 2, 2]}),
]


@pytest.mark.parametrize("shape,attrs", LP_POOL_CASES)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(shape, attrs, p):
    # x**p, summed, then its p-th root: each rounding in the power is scaled by p on the way back.
    check_node("LpPool", [("x", _data(shape))], {**attrs, "p": p}, opset=11, rtol=2e-4)


@pytest.mark.parametrize("attrs", [{"dilations": [2, 2]}, {"ceil_mode": 1, "strides": [2, 2]},
                                   {"ceil_mode": 1, "strides": [2, 2], "pads": [1, 1, 1, 1]}])
@pytest.mark.parametrize("opset", [18, 22])
def test_lp_pool_18(attrs, opset):
    check_node("LpPool", [("x", _data((1, 2, 8, 7)))], {"kernel_shape": [3, 3], "p": 2, **attrs},
               opset=opset)


def test_lp_pool_float_p_opset1():
    check_node("LpPool", [("x", _data((1, 2, 6, 6)))], {"kernel_shape": [2, 2], "p": 2.0}, opset=1,
               oracle="reference")


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 3, 6), (1, 2, 2, 3, 4)])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(shape, p):
    # x**p, summed, then its p-th root: each rounding in the power is scaled by p on the way back.
    check_node("GlobalLpPool", [("x", _data(shape))], {"p": p}, opset=2, rtol=2e-4)


# Compress

@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("known", [False, True])
def test_compress(axis, opset, known):
    x = _data((3, 4, 5))
    length = x.size if axis is None else x.shape[axis]
    condition = rng(3).standard_normal(length - 1) > 0  # shorter than the axis: the rest is dropped
    attrs = {} if axis is None else {"axis": axis}
    if known:
        check_node("Compress", [("x", x)], attrs, initializers=[("condition", condition)], opset=opset)
    else:
        check_node("Compress", [("x", x), ("condition", condition)], attrs, opset=opset)


def test_compress_nothing_kept():
    check_node("Compress", [("x", _data((3, 4))), ("condition", np.zeros(3, bool))], {"axis": 0}, opset=11)


def test_compress_feeds_a_later_node():
    # The data-dependent shape flows on into an ordinary node.
    x = _data((4, 3))
    nodes = [helper.make_node("Compress", ["x", "c"], ["k"], axis=0),
             helper.make_node("Relu", ["k"], ["y"])]
    model = make_model(nodes, [("x", x), ("c", np.zeros(4, bool))], [("y", None)], opset=11)
    for condition in (np.array([True, False, True, True]), np.array([False, True, False, False])):
        check_model(model, {"x": x, "c": condition})


# Windows

@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic,size", [
    (periodic, size) for periodic in (0, 1) for size in (1, 2, 10, 33)
    if periodic or size > 1])  # a symmetric window of one sample divides by zero
@pytest.mark.parametrize("known", [False, True])
def test_window(op, periodic, size, known):
    size = np.array(size, np.int64)
    attrs = {"periodic": periodic}
    # Absolute: a window's values lie in [0, 1] and the ends are near 0.
    if known:
        check_node(op, [], attrs, initializers=[("size", size)], opset=17, atol=1e-6)
    else:
        check_node(op, [("size", size)], attrs, opset=17, atol=1e-6)


@pytest.mark.parametrize("dtype_code,dtype", [(11, np.float64), (7, np.int64), (10, np.float16)])
def test_window_output_datatype(dtype_code, dtype):
    check_node("HannWindow", [("size", np.array(8, np.int32))], {"output_datatype": dtype_code}, opset=17,
               rtol=FLOAT16_RTOL)


# Det

@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 3, 1, 1), (5, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opset", [11, 22])
def test_det(shape, dtype, opset):
    # onnxruntime has Det for float only.
    check_node("Det", [("x", _data(shape, dtype))], opset=opset,
               oracle="onnxruntime" if dtype == np.float32 else "reference")


# MaxUnpool

def _pooled(shape, kernel, strides):
    """MaxPool's values and indices, from onnxruntime, as MaxUnpool's inputs."""
    x = _data(shape)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=kernel, strides=strides)
    model = make_model([node], [("x", x)], [("y", None), ("i", None)], opset=11)
    return run_onnxruntime(model, {"x": x})


@pytest.mark.parametrize("shape,kernel,strides", [((1, 2, 4, 4), [2, 2], [2, 2]),
                                                  ((2, 3, 6, 6), [2, 2], [2, 2]),
                                                  ((1, 2, 6, 8), [3, 2], [3, 2]),
                                                  ((1, 2, 8), [2], [2])])
@pytest.mark.parametrize("opset", [9, 11, 22])
def test_max_unpool(shape, kernel, strides, opset):
    y, i = _pooled(shape, kernel, strides)
    check_node("MaxUnpool", [("y", y), ("i", i)], {"kernel_shape": kernel, "strides": strides}, opset=opset,
               oracle="onnxruntime" if opset < 22 else "reference")


@pytest.mark.parametrize("known", [False, True])
def test_max_unpool_output_shape(known):
    # The indices address the unpooled (4, 4) planes, which fill the corner of the (5, 5) ones,
    # as in onnx's reference and backend cases.
    y, i = _pooled((1, 1, 4, 4), [2, 2], [2, 2])
    output_shape = i64(1, 1, 5, 5)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    if known:
        check_node("MaxUnpool", [("y", y), ("i", i)], attrs, initializers=[("shape", output_shape)], opset=11,
                   oracle="reference")
    else:
        check_node("MaxUnpool", [("y", y), ("i", i), ("shape", output_shape)], attrs, opset=11,
                   oracle="reference")


def test_window_size_must_be_sane():
    node = helper.make_node("HannWindow", ["size"], ["y"])
    size = numpy_helper.from_array(np.array(1 << 40, np.int64), "size")
    model = make_model([node], [], [("y", None)], opset=17)
    model.graph.initializer.append(size)
    with pytest.raises(nnrun.SizeLimitError, match="beyond max_tensor_bytes"):
        run_nnrun(model, {})


# MaxRoiPool

@pytest.mark.parametrize("pooled,scale", [((2, 2), 1.0), ((3, 2), 0.5), ((1, 1), 0.25)])
def test_max_roi_pool(pooled, scale):
    x = _data((2, 3, 8, 10))
    rois = np.array([[0, 0, 0, 9, 7], [1, 2.4, 1.6, 6.5, 5.5], [1, 5, 5, 5, 5], [0, -3, -2, 4, 3],
                     [0, 6, 4, 30, 20]], np.float32)
    check_node("MaxRoiPool", [("x", x), ("rois", rois)],
               {"pooled_shape": list(pooled), "spatial_scale": scale}, opset=11)


def test_max_roi_pool_opset22():
    # onnxruntime stops at opset 1, and 22 only adds types: the oracle runs the opset 1 node.
    x = _data((1, 2, 6, 6))
    rois = np.array([[0, 1, 1, 4, 5]], np.float32)

    def model(opset):
        node = helper.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[2, 3])
        return make_model([node], [("x", x), ("rois", rois)], [("y", None)], opset=opset)

    feeds = {"x": x, "rois": rois}
    assert_close(run_nnrun(model(22), feeds)[0], run_onnxruntime(model(11), feeds)[0])
