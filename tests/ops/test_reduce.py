"""Reductions and ArgMax/ArgMin (runtime/ops/reduce.py) against onnxruntime; integer reductions
exactly against onnx's reference evaluator, or int64 numpy where the evaluator refuses the type."""

import numpy as np
import pytest
from oracle import FLOAT16_RTOL, check_model, check_node, helper, make_model, rng, run_nnrun, run_onnxruntime

from nnrun import ModelError
from nnrun.ir import Node
from nnrun.ops import TensorInfo, lookup
from nnrun.ops.registry import NeedsValueError

F32 = np.float32

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def data(op, shape, dtype=F32, seed=0):
    r = rng(seed)
    if np.dtype(dtype).kind in "iu":
        return np.asarray(r.integers(1 if op == "ReduceLogSum" else -4, 5, shape).astype(dtype))
    if op == "ReduceLogSum":
        return np.asarray(r.uniform(0.1, 2, shape).astype(dtype))
    if op == "ReduceProd":  # factors near 1 keep the product in range
        return np.asarray(r.uniform(0.5, 1.5, shape).astype(dtype) * np.sign(r.uniform(-1, 3, shape)))
    return np.asarray(r.uniform(-3, 3, shape).astype(dtype))


def since_axes_input(op):
    return 13 if op == "ReduceSum" else 18


def reduce_model(op, x, axes, keepdims, opset, noop=None):
    """One reduce node; `axes` is an attribute before the axes-input opset, an initializer after."""
    attrs = {} if keepdims is None else {"keepdims": keepdims}
    inputs, weights = ["x"], []
    if opset >= since_axes_input(op):
        if noop is not None:
            attrs["noop_with_empty_axes"] = noop
        if axes is not None:
            inputs.append("axes")
            weights.append(("axes", np.array(axes, np.int64)))
    elif axes is not None:
        attrs["axes"] = axes
    node = helper.make_node(op, inputs, ["y"], **attrs)
    return make_model([node], [("x", x)], [("y", None)], weights, opset=opset)


def check_identical(model, feeds):
    """For outputs with no finite value (reductions of nothing, infinities), which
    assert_close cannot scale a tolerance by: they must match exactly."""
    (expected,) = run_onnxruntime(model, feeds)
    (actual,) = run_nnrun(model, feeds)
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


AXES = [None, [0], [1], [-1], [0, 2], [2, -3], [0, 1, 2]]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [None, 0, 1])
@pytest.mark.parametrize("version", ["attribute", "input"])
def test_reduce(op, axes, keepdims, version):
    opset = since_axes_input(op) if version == "input" else 13 if op != "ReduceSum" else 11
    x = data(op, (2, 3, 4))
    check_model(reduce_model(op, x, axes, keepdims, opset), {"x": x})


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [7, 11])
def test_reduce_early_opsets(op, opset):
    """Version 1 (non-negative axes only) and 11 (negative axes) of the attribute form."""
    x = data(op, (3, 2, 5), seed=1)
    axes = [1] if opset < 11 else [-1, 0]
    check_model(reduce_model(op, x, axes, 0, opset), {"x": x})


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("noop", [0, 1])
@pytest.mark.parametrize("axes", [None, []], ids=["omitted", "empty"])
def test_reduce_noop_with_empty_axes(op, noop, axes):
    x = data(op, (2, 3))
    check_model(reduce_model(op, x, axes, 1, since_axes_input(op), noop=noop), {"x": x})


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape,axes", [((0, 3), [0]), ((2, 0, 3), [1]), ((0, 3), [1]),
                                        ((0, 3), None)], ids=str)
def test_reduce_zero_sized(op, shape, axes):
    x = np.zeros(shape, F32)
    check_identical(reduce_model(op, x, axes, 0, 18), {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integers(op, dtype):
    x = data(op, (3, 4), dtype)
    model = reduce_model(op, x, [1], 0, 13 if op != "ReduceSum" else 11)
    if op not in INT64_REDUCTIONS:
        check_model(model, {"x": x})
        return
    # The reference evaluator refuses integer ReduceLogSum and widens ReduceSumSquare to int64.
    expected = INT64_REDUCTIONS[op](x.astype(np.int64)).astype(dtype)
    np.testing.assert_array_equal(run_nnrun(model, {"x": x})[0], expected, strict=True)


# Integer reductions from the spec in int64 numpy, over axis 1; a logarithm truncates toward zero.
INT64_REDUCTIONS = {
    "ReduceSumSquare": lambda x: (x * x).sum(axis=1),
    "ReduceLogSum": lambda x: np.trunc(np.log(x.sum(axis=1))),
}


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceLogSumExp"])
def test_reduce_infinities(op):
    x = np.array([[1, np.inf, 2], [-np.inf, -np.inf, -np.inf], [3, 4, -np.inf]], F32)
    check_identical(reduce_model(op, x, [1], 0, 18), {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axes", [[-1], [0], [1], [1, 2], [0, 1]], ids=str)
def test_reduce_linear_float_types(op, dtype, axes):
    """Sums over trailing or leading axes go through a matrix-vector product, others not."""
    x = data(op, (4, 5, 6), dtype)
    rtol = FLOAT16_RTOL if dtype == np.float16 else 1e-4
    check_model(reduce_model(op, x, axes, 1, 18), {"x": x}, rtol=rtol)


def test_reduce_scalar_and_large():
    check_node("ReduceSum", [("x", np.array(2.5, F32))], {"keepdims": 0}, opset=11)
    x = data("ReduceMean", (8, 64, 257), seed=3)
    check_model(reduce_model("ReduceMean", x, [-1], 1, 18), {"x": x})
    check_model(reduce_model("ReduceL2", x, [0, 2], 0, 18), {"x": x})


def kernel(op_type, attrs=None, opset=18, name="r0"):
    return lookup("", op_type, opset)(Node(name, op_type, "", [], ["y"], attrs or {}), opset)


def test_axes_input_known_only_at_run_time():
    x = TensorInfo((2, 3), np.dtype(F32))
    with pytest.raises(NeedsValueError, match="'axes' decides a shape"):
        kernel("ReduceMean").infer(x, TensorInfo((1,), np.dtype(np.int64)))
    data = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(F32)
    model = make_model([helper.make_node("ReduceMean", ["x", "axes"], ["y"])],
                       [("x", data), ("axes", (np.int64, [1]))], [("y", None)], opset=18)
    for axes in ([1], [-1]):
        check_model(model, {"x": data, "axes": np.array(axes, np.int64)})
    with pytest.raises(ModelError, match="out of range"):
        kernel("ReduceMean").infer(x, TensorInfo.of(np.array([2])))
    with pytest.raises(ModelError, match="repeated"):
        kernel("ReduceMax", {"axes": [1, -1]}, opset=13).infer(x)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduce(op, axis, keepdims, last):
    # few distinct values, so that ties decide between first and last index
    x = rng(2).integers(-2, 3, (3, 4, 5)).astype(F32)
    check_node(op, [("x", x)], {"axis": axis, "keepdims": keepdims, "select_last_index": last},
               opset=13)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset", [7, 11, 12])
@pytest.mark.parametrize("dtype", [F32, np.int32, np.int64])
def test_arg_reduce_opsets_and_dtypes(op, opset, dtype):
    x = rng(3).integers(-3, 4, (4, 6)).astype(dtype)
    check_node(op, [("x", x)], {"keepdims": 0} if opset < 11 else {"axis": -1}, opset=opset)


def test_arg_reduce_zero_sized_and_errors():
    check_node("ArgMax", [("x", np.zeros((0, 3), F32))], {"axis": 1}, opset=13)
    with pytest.raises(ModelError, match="empty"):
        kernel("ArgMax", {"axis": 0}, opset=13).infer(TensorInfo((0, 3), np.dtype(F32)))
    with pytest.raises(ModelError, match="out of range"):
        kernel("ArgMin", {"axis": 2}, opset=13).infer(TensorInfo((2, 3), np.dtype(F32)))
