"""MaxPool, AveragePool and the global pools against onnxruntime (or onnx's reference evaluator)."""

import numpy as np
import pytest
from compiled import needs_numba
from oracle import FLOAT16_RTOL, check_model, check_node, helper, make_model, rng, run_nnrun

import nnrun
from nnrun import ir
from nnrun.ops import conv_core, jit
from nnrun.ops.pool import AveragePool, MaxPool
from nnrun.ops.registry import TensorInfo


def _data(shape, dtype=np.float32, seed=0):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng(seed).integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return rng(seed).standard_normal(shape).astype(dtype)


WINDOWS_2D = [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "strides": [3, 2], "pads": [1, 0, 1, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 4], "strides": [2, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"},
    {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]},
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 0]},  # padding at the end no window reads
]


@pytest.mark.parametrize("attrs", WINDOWS_2D)
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_2d(op_type, attrs, kernels):
    check_node(op_type, [("x", _data((2, 3, 11, 10)))], attrs)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 2, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 0]},
])
def test_average_pool_count_include_pad(attrs, kernels):
    check_node("AveragePool", [("x", _data((1, 2, 9, 8)))], {**attrs, "count_include_pad": 1})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "dilations": [2, 2]},
    {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2], "pads": [1, 1, 0, 2]},
    {"kernel_shape": [3, 2], "dilations": [1, 3], "strides": [2, 1], "ceil_mode": 1},
])
@pytest.mark.parametrize("op_type, extra, opset", [("MaxPool", {}, 12), ("AveragePool", {}, 19),
                                                   ("AveragePool", {"count_include_pad": 1}, 19)])
def test_pool_dilations(op_type, extra, opset, attrs, kernels):
    check_node(op_type, [("x", _data((1, 3, 12, 11)))], {**attrs, **extra}, opset=opset)


@pytest.mark.parametrize("x_shape, attrs", [
    ((2, 3, 13), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}),
    ((1, 2, 10), {"kernel_shape": [4], "strides": [3], "ceil_mode": 1}),
    ((1, 2, 10), {"kernel_shape": [3], "auto_pad": "SAME_UPPER", "strides": [2]}),
    ((1, 2, 6, 7, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "ceil_mode": 1}),
])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_1d_3d(op_type, x_shape, attrs, kernels):
    check_node(op_type, [("x", _data(x_shape))], attrs)


SAME_WINDOWS = [  # (x shape, attributes): stride 1, padded to keep the size; one axis at a time
    ((2, 64, 11, 10), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 128, 9, 12), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    ((1, 128, 8, 9), {"kernel_shape": [4, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 128, 8, 9), {"kernel_shape": [4, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 128, 9, 7), {"kernel_shape": [3, 5], "pads": [0, 3, 2, 1]}),
    ((1, 64, 13, 13), {"kernel_shape": [13, 13], "pads": [6, 6, 6, 6]}),  # SPP's widest over its image
    ((2, 64, 40), {"kernel_shape": [3], "pads": [1, 1]}),
    ((2, 512, 30), {"kernel_shape": [4], "pads": [3, 0]}),
]


@pytest.mark.parametrize("x_shape, attrs", SAME_WINDOWS)
@pytest.mark.parametrize("op_type, extra", [("MaxPool", {}), ("AveragePool", {}),
                                            ("AveragePool", {"count_include_pad": 1})])
def test_pools_that_keep_the_size_run_one_axis_at_a_time(op_type, extra, x_shape, attrs, kernels):
    """Stride 1 and padded to the input's size: the rows' windows reduced into scratch, then the
    columns', each a few flat passes, the positions at each axis's ends made from the taps inside."""
    kernel = MaxPool if op_type == "MaxPool" else AveragePool
    k = kernel(ir.Node("p", op_type, "", ["x"], ["y"], {**attrs, **extra}), 19)
    x = TensorInfo(x_shape, np.dtype(np.float32))
    k.ready(k.shape_rule(x).derived, x)
    assert k.plan.separable
    check_node(op_type, [("x", _data(x_shape))], {**attrs, **extra}, opset=19)


@pytest.mark.parametrize("dtype", [np.int8, np.float64, np.float16])
def test_max_pools_that_keep_the_size_in_other_types(dtype):
    check_node("MaxPool", [("x", _data((1, 3, 9, 8), dtype))], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
               opset=12)


def test_a_kernel_as_long_as_a_small_image_keeps_the_phase_planes():
    """Where the separable pooling's fix-ups at the axes' ends would cost more than the taps they
    save (9x9 over 32 planes of 9x9), the phase planes serve, and give the same."""
    window = conv_core.make_window((9, 9), (9, 9), pads=(4, 4, 4, 4))
    assert not conv_core.pool_plan(window, "max", 32).separable
    assert conv_core.pool_plan(conv_core.make_window((14, 14), (3, 3), pads=(1, 1, 1, 1)), "max", 512).separable
    check_node("MaxPool", [("x", _data((1, 32, 9, 9)))], {"kernel_shape": [9, 9], "pads": [4, 4, 4, 4]})


def test_a_pool_one_axis_at_a_time_keeps_its_scratch_within_the_limit():
    """Its scratch (the rows' results of a block of whole planes) stays within the scratch limit a
    memory budget sets; a plane larger than the limit keeps the phase planes, which tile."""
    window = conv_core.make_window((64, 64), (3, 3), pads=(1, 1, 1, 1))
    plan = conv_core.pool_plan(window, "max", 256)
    assert plan.separable and plan.scratch_elems * 4 <= 2 * conv_core.CACHE_TILE
    with conv_core.scratch_limit(8 * 1024):  # half a plane
        assert not conv_core.pool_plan(window, "max", 256).separable
    with conv_core.scratch_limit(64 * 1024):  # four planes
        plan = conv_core.pool_plan(window, "max", 256)
        assert plan.separable and plan.scratch_elems * 4 <= 64 * 1024


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float64, np.float16])
def test_max_pool_dtypes(dtype, kernels):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    check_node("MaxPool", [("x", _data((1, 3, 9, 8), dtype))], attrs, opset=12)


def test_average_pool_float64(kernels):
    check_node("AveragePool", [("x", _data((1, 3, 9, 8), np.float64))],
               {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, oracle="reference")


@pytest.mark.parametrize("opset", [7, 8, 10, 11, 12, 19, 21])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_opsets(op_type, opset):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1]}
    if op_type == "AveragePool":
        attrs["count_include_pad"] = 1
    check_node(op_type, [("x", _data((2, 3, 9, 8)))], attrs, opset=opset)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 1, 2, 0], "ceil_mode": 1},  # phase planes
    {"kernel_shape": [2, 3], "strides": [2, 2]},                                        # views of the image
])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_many_tiles(monkeypatch, op_type, attrs, kernels):
    # One plane per chunk, and row tiles of one row in the channels-last path.
    monkeypatch.setattr(conv_core, "CACHE_TILE", 16)
    with conv_core.scratch_limit(16):
        check_node(op_type, [("x", _data((2, 2, 11, 9)))], attrs)


def test_max_pool_storage_order_without_indices():
    check_node("MaxPool", [("x", _data((1, 2, 6, 6)))], {"kernel_shape": [2, 2], "storage_order": 1})


def test_pool_scratch_stays_bounded():
    node = ir.Node("p", "MaxPool", "", ["x"], ["y"], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                      "pads": [1, 1, 1, 1]})
    k = MaxPool(node, 12)
    x = TensorInfo((4, 64, 224, 224), np.dtype(np.float32))
    scratch = k.ready(k.shape_rule(x).derived, x)
    nbytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in scratch)
    assert 0 < nbytes <= conv_core.SCRATCH_LIMIT


WINDOWS_WITH_INDICES = WINDOWS_2D + [
    {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 2, 1, 0]},
    {"kernel_shape": [3, 2], "dilations": [1, 3], "strides": [2, 1], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", WINDOWS_WITH_INDICES)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(storage_order, attrs):
    check_node("MaxPool", [("x", _data((2, 3, 11, 10)))], {**attrs, "storage_order": storage_order},
               n_outputs=2, opset=12)


@pytest.mark.parametrize("x_shape, attrs", [
    ((2, 3, 13), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}),
    ((1, 2, 6, 7, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "ceil_mode": 1}),
])
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_1d_3d(storage_order, x_shape, attrs):
    check_node("MaxPool", [("x", _data(x_shape))], {**attrs, "storage_order": storage_order}, n_outputs=2,
               opset=12)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float64, np.float16])
def test_max_pool_indices_dtypes(dtype):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    check_node("MaxPool", [("x", _data((1, 3, 9, 8), dtype))], attrs, n_outputs=2, opset=12)


def test_max_pool_indices_ties_and_infinities():
    # Of equal values the first in the window's row-major order; a window of -inf points inside X.
    # onnxruntime: the reference evaluator's indices are off here (they point at a smaller value, and
    # ignore storage_order) while its values are right.
    x = np.array([[1, 1, 2, 2], [1, 1, 2, 2], [-np.inf, -np.inf, 5, 5], [-np.inf, -np.inf, 5, 5]], np.float32)
    for attrs in ({"kernel_shape": [2, 2]}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}):
        for order in (0, 1):
            check_node("MaxPool", [("x", x.reshape(1, 1, 4, 4))], {**attrs, "storage_order": order}, n_outputs=2)
    x = np.full((1, 1, 3, 3), -np.inf, np.float32)
    check_node("MaxPool", [("x", x)], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}, n_outputs=2)


@pytest.mark.parametrize("attrs", [{}, {"kernel_shape": [2]}, {"kernel_shape": [2, 2], "pads": [1, 1]},
                                   {"kernel_shape": [5, 5]}])
def test_pool_rejects_bad_models(attrs):
    node = ir.Node("p", "MaxPool", "", ["x"], ["y"], attrs)
    with pytest.raises(nnrun.ModelError):
        MaxPool(node, 12).infer(TensorInfo((1, 2, 4, 4), np.dtype(np.float32)))


@pytest.mark.parametrize("x_shape", [(2, 3, 7, 5), (1, 4, 9), (1, 2, 3, 4, 5), (2, 3, 1, 1)])
@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op_type, x_shape):
    check_node(op_type, [("x", _data(x_shape))])


@pytest.mark.parametrize("kind, op_type", [("max", "MaxPool"), ("average", "AveragePool")])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [3, 2], "pads": [1, 0, 1, 2], "ceil_mode": 1},
])
def test_core_channels_last(monkeypatch, kind, op_type, attrs):
    from oracle import assert_close, helper, make_model, run_onnxruntime
    monkeypatch.setattr(conv_core, "CACHE_TILE", 64)
    x = _data((2, 3, 11, 10))
    (expected,) = run_onnxruntime(make_model([helper.make_node(op_type, ["x"], ["y"], **attrs)],
                                             [("x", x)], [("y", None)]), {"x": x})
    window = conv_core.make_window(x.shape[2:], attrs["kernel_shape"], attrs["strides"], None, attrs["pads"],
                                   ceil_mode=bool(attrs.get("ceil_mode")))
    plan = conv_core.pool_plan(window, kind, 3, np.float32, conv_core.CHANNELS_LAST)
    out = np.full((2, *window.out_spatial, 3), np.nan, np.float32)
    conv_core.pool(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), out, plan)
    assert_close(out.transpose(0, 3, 1, 2), expected)


def test_a_window_inside_the_image_pools_straight_from_it():  # as installed: numpy's paths
    def plan(**window):
        return conv_core.pool_plan(conv_core.make_window((11, 10), **window), "max", 3)
    assert plan(kernel=(2, 2), strides=(2, 2)).views  # every tap a strided view of the image
    assert plan(kernel=(3, 2), strides=(2, 3), dilations=(2, 1)).views
    assert not plan(kernel=(3, 3), strides=(2, 2), pads=[1, 1, 1, 1]).views  # padding: phase planes
    assert not plan(kernel=(3, 3), strides=(2, 2), pads=[0, 0, 1, 1]).views  # the last window reads it


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_window_over_whole_plane(op_type):
    check_node(op_type, [("x", _data((2, 3, 7, 6)))], {"kernel_shape": [7, 6]})


def test_pool_rejects_absurd_kernels():
    node = ir.Node("p", "MaxPool", "", ["x"], ["y"], {"kernel_shape": [100000, 100000],
                                                       "pads": [99999, 99999, 99999, 99999]})
    with pytest.raises(nnrun.ModelError, match="taps"):
        MaxPool(node, 12).infer(TensorInfo((1, 2, 4, 4), np.dtype(np.float32)))


@pytest.mark.parametrize("dtype, oracle", [(np.float64, "reference"), (np.float16, "onnxruntime")])
@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_dtypes(op_type, dtype, oracle):
    check_node(op_type, [("x", _data((2, 3, 5, 4), dtype))], oracle=oracle,
               rtol=FLOAT16_RTOL if dtype == np.float16 else 1e-4)


@needs_numba
def test_which_pools_the_compiled_kernels_serve(monkeypatch):
    """With compiled kernels: 1-D and 2-D pools channels first, but a window that reads no padding
    over a small plane (numpy's strided views are as fast there) and channels last (TFLite's)."""
    monkeypatch.setenv("NNRUN_JIT", "1")

    def plan(in_spatial, kind="max", layout=conv_core.CHANNELS_FIRST, **window):
        return conv_core.pool_plan(conv_core.make_window(in_spatial, **window), kind, 3, layout=layout)
    assert plan((14, 14), kernel=(3, 3), pads=[1] * 4).compiled.kernel is jit.max_pool_kernel(np.float32)
    assert plan((14, 14), "average", kernel=(3, 3), pads=[1] * 4).compiled.kernel is jit.depthwise_kernel(np.float32)
    assert plan((50,), kernel=(3,), strides=(2,), pads=[1, 1]).compiled is not None
    assert plan((56, 56), kernel=(2, 2), strides=(2, 2)).views  # inside, 3,136 pixels
    assert plan((128, 128), kernel=(2, 2), strides=(2, 2)).compiled is not None  # inside, 16,384
    assert plan((6, 6, 6), kernel=(2, 2, 2)).compiled is None  # 3-D
    assert plan((14, 14), layout=conv_core.CHANNELS_LAST, kernel=(3, 3), pads=[1] * 4).compiled is None


@pytest.mark.parametrize("x_shape, attrs", [
    ((2, 5, 14, 14), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),     # GoogLeNet's pool branch
    ((1, 4, 9, 11), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),      # YOLO's SPPF
    ((1, 3, 8, 7), {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0]}),       # asymmetric padding
    ((1, 3, 6, 5), {"kernel_shape": [2, 4], "pads": [1, 3, 0, 1], "ceil_mode": 1}),
    ((1, 2, 4, 3), {"kernel_shape": [3, 5], "pads": [1, 2, 1, 2]}),       # wider than the image
    ((1, 3, 7, 9), {"kernel_shape": [2, 2]}),                              # no padding
    ((1, 3, 7, 9), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 13), {"kernel_shape": [3], "pads": [1, 1]}),                   # 1-D
    ((1, 2, 10), {"kernel_shape": [4], "pads": [2, 1]}),
])
def test_max_pool_of_stride_one(x_shape, attrs, kernels):
    # stride-1 windows as the pool branches of GoogLeNet and YOLO write them, both kinds of kernel
    x = _data(x_shape)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [("x", x)], [("y", None)])
    check_model(model, {"x": x})


@pytest.mark.parametrize("kernels", ["numpy", pytest.param("compiled", marks=needs_numba)], indirect=True)
@pytest.mark.parametrize("stride", [1, 2])
def test_max_pool_propagates_nan(kernels, stride):
    """A window holding a NaN gives NaN, as numpy's maximum does (onnxruntime and onnx's reference
    evaluator disagree with each other here; the oracle is numpy's max over each padded window)."""
    x = _data((1, 3, 9, 8))
    x[0, 0, 2, 3] = x[0, 2, 8, 7] = np.nan
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    expected = windows[:, :, ::stride, ::stride].max(axis=(4, 5))
    got = run_nnrun(make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[stride] * 2,
                                                 pads=[1, 1, 1, 1])], [("x", x)], [("y", None)]), {"x": x})[0]
    # stride 2: two windows hold the first, one the second; stride 1: nine and four (a corner)
    assert np.isnan(got).sum() == (3 if stride == 2 else 13)
    np.testing.assert_array_equal(got, expected)
