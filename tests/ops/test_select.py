"""TopK, NonZero, Unique, CumSum, Einsum, OneHot, ReverseSequence (runtime/ops/select.py)
against onnxruntime."""

import numpy as np
import pytest
from oracle import (assert_close, check_model, check_node, data, helper, i64, make_model, rng,
                    run_nnrun, run_onnxruntime)

from nnrun import ModelError

# TopK


def topk_model(x, k, opset, **attrs):
    if opset < 10:
        node = helper.make_node("TopK", ["x"], ["values", "indices"], k=k, **attrs)
        inits = []
    else:
        node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], **attrs)
        inits = [("k", i64(k))]
    return make_model([node], [("x", x)], [("values", None), ("indices", None)], inits, opset=opset)


@pytest.mark.parametrize("opset,shape,axis,k", [
    (opset, shape, axis, k)
    for opset in (1, 10, 11)
    for shape, axis, k in [((10,), -1, 3), ((4, 7), 1, 7), ((4, 7), 0, 2), ((2, 3, 5), -2, 1),
                           ((2, 3, 5), 2, 0), ((3, 100), -1, 10)]
    if not (opset == 1 and k == 0)], ids=str)  # onnxruntime refuses the attribute k=0
def test_topk(opset, shape, axis, k):
    x = data(shape)
    check_model(topk_model(x, k, opset, axis=axis), {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_topk_largest_smallest_and_ties(largest, dtype):
    # Many ties: the lower index comes first, both ways.
    x = rng(3).integers(-3, 4, size=(5, 12)).astype(dtype)
    x[0, :] = 2
    if dtype in (np.int32, np.int64):
        x[1, :3] = np.iinfo(dtype).min
        x[1, 3:6] = np.iinfo(dtype).max
    check_model(topk_model(x, 5, 11, axis=1, largest=largest), {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("values,k,axis", [
    ("distinct", 20, -1), ("distinct", 3, 0), ("ties", 5, -1), ("ties", 40, 1), ("one_row_ties", 6, -1)])
def test_topk_small_k_of_many(largest, values, k, axis):
    """k much smaller than the axis: a partition, not a sort; ties at the k-th value still
    resolve to the lower index."""
    shape = (4, 400) if axis != 0 else (400, 3)
    if values == "distinct":
        x = data(shape)
    else:
        x = rng(4).integers(-3, 4, size=shape).astype(np.float32)
        if values == "one_row_ties":
            x[1:] = data((3, 400))
    check_model(topk_model(x, k, 11, axis=axis, largest=largest), {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [1, 3, 30])
def test_topk_infinities(largest, k):
    x = data((3, 300))
    x[0, [5, 50, 7]] = np.inf
    x[1, [9, 2]] = -np.inf
    x[2, ::7] = np.float32(3e38)
    check_model(topk_model(x, k, 11, axis=-1, largest=largest), {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [1, 3, 10, 40])
def test_topk_nan_is_the_largest_value(largest, k):
    """NaN orders above +inf, as onnxruntime (and ArgMax, ReduceMax) have it; ties by index."""
    x = data((4, 50))
    x[rng(7).random((4, 50)) < 0.1] = np.nan
    x[0, 3], x[1, 7] = np.inf, -np.inf
    x[2, :] = np.nan
    check_model(topk_model(x, k, 11, axis=1, largest=largest), {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_unsorted(largest):
    """sorted=0 leaves the order open: compare each row's (value, index) pairs as sets."""
    x = data((4, 20))
    model = topk_model(x, 6, 11, axis=-1, largest=largest, sorted=0)
    expected = run_onnxruntime(model, {"x": x})
    actual = run_nnrun(model, {"x": x})
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
    order_a = np.argsort(actual[1], axis=-1)
    order_e = np.argsort(expected[1], axis=-1)
    for got, want in zip(actual, expected):
        assert_close(np.take_along_axis(got, order_a, -1), np.take_along_axis(want, order_e, -1))


def test_topk_k_too_large_is_a_model_error():
    x = data((3, 4))
    with pytest.raises(ModelError, match="k 5"):
        run_nnrun(topk_model(x, 5, 11), {"x": x})


# NonZero and Unique


@pytest.mark.parametrize("value", [
    np.array([[1, 0, 2], [0, 0, 3]], np.float32), np.zeros((2, 3), np.int64),
    np.array([True, False, True]), np.array(5.0, np.float32), np.arange(24).reshape(2, 3, 4) % 3])
def test_nonzero_of_a_constant_folds(value):
    # The input is a constant, so NonZero folds at PREPARE; an Identity makes the output a real step.
    nodes = [helper.make_node("NonZero", ["c"], ["nz"]), helper.make_node("Identity", ["nz"], ["y"])]
    model = make_model(nodes, [], [("y", None)], [("c", value)], opset=13)
    check_model(model, {})


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4)])
def test_nonzero_of_an_input(shape):
    x = (data(shape) > 3).astype(np.float32)
    check_node("NonZero", [("x", x)], opset=13)


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}, {"axis": 1, "sorted": 0}, {"axis": -1}])
def test_unique_of_a_constant_folds(attrs):
    value = np.array([[2, 1, 2], [0, 3, 0], [2, 1, 2], [0, 3, 0]], np.float32)
    outs = ["y", "indices", "inverse", "counts"]
    nodes = [helper.make_node("Unique", ["c"], [o + "_" for o in outs], **attrs)]
    nodes += [helper.make_node("Identity", [o + "_"], [o]) for o in outs]
    model = make_model(nodes, [], [(o, None) for o in outs], [("c", value)], opset=11)
    check_model(model, {})


# CumSum


@pytest.mark.parametrize("opset", [11, 14])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), 1), ((3, 5), -2), ((2, 3, 4), 1), ((2, 3, 4), -1)])
def test_cumsum(opset, exclusive, reverse, shape, axis):
    x = data(shape)
    check_node("CumSum", [("x", x)], {"exclusive": exclusive, "reverse": reverse},
               initializers=[("axis", np.array(axis, np.int32))], opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_cumsum_types_and_axis_fed(dtype):
    x = data((4, 6), dtype=dtype)
    check_node("CumSum", [("x", x), ("axis", np.array(1, np.int64))], {"reverse": 1, "exclusive": 1},
               opset=14)


# Einsum


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 3, 4, 5)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 6, 8)]),
    ("ab,bc,cd->ad", [(3, 4), (4, 5), (5, 2)]),
    ("nchw,c->nhw", [(2, 3, 4, 5), (3,)]),
    ("ba...,ca->bc...", [(2, 3, 4), (5, 3)]),
    ("...", [(2, 3)]),
])
def test_einsum(equation, shapes):
    inputs = [(f"x{i}", data(s, seed=i) / 10) for i, s in enumerate(shapes)]
    check_node("Einsum", inputs, {"equation": equation}, opset=12)


def test_einsum_integers():
    check_node("Einsum", [("a", data((3, 4), np.int32)), ("b", data((4, 2), np.int32, seed=1))],
               {"equation": "ij,jk->ik"}, opset=12)


def test_einsum_bad_equation_is_a_model_error():
    with pytest.raises(ModelError, match="does not fit"):
        run_nnrun(make_model([helper.make_node("Einsum", ["a"], ["y"], equation="ijk->i")],
                             [("a", data((3, 4)))], [("y", None)], opset=12), {"a": data((3, 4))})


# OneHot


@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.float32])
def test_onehot(opset, axis, index_dtype):
    indices = np.array([[0, 3, 1], [2, 4, 0]], index_dtype)
    if opset >= 11:
        indices[0, 0] = -1
    check_node("OneHot", [("i", indices)], {"axis": axis},
               initializers=[("depth", np.array(4, np.int64)), ("values", np.array([-2, 5], np.float32))],
               opset=opset, oracle=ORACLE_OF_INDEX[index_dtype])


# onnxruntime implements OneHot with int64 depth and float values only for int64 indices.
ORACLE_OF_INDEX = {np.int64: "onnxruntime", np.int32: "reference", np.float32: "reference"}


@pytest.mark.parametrize("values", [np.array([0, 1], np.int64), np.array([1.5, -1], np.float64)])
def test_onehot_value_types(values):
    indices = np.array([5, -5, 2, -4, 0], np.int64)
    check_node("OneHot", [("i", indices)],
               initializers=[("depth", np.array(5.0, np.float32)), ("values", values)], opset=11,
               oracle="reference")  # onnxruntime lacks these type combinations


# ReverseSequence


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("lens", [[4, 3, 1], [1, 1, 1], [4, 4, 4]])
def test_reverse_sequence(batch_axis, time_axis, lens):
    shape = (4, 3, 2) if batch_axis == 1 else (3, 4, 2)
    check_node("ReverseSequence", [("x", data(shape)), ("lens", i64(*lens))],
               {"batch_axis": batch_axis, "time_axis": time_axis}, opset=10)


# Shapes known only per run: the node runs eagerly


def test_topk_with_k_fed_at_run_time():
    x = data((3, 9))
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)
    model = make_model([node], [("x", x), ("k", i64(4))], [("values", None), ("indices", None)], opset=11)
    check_model(model, {"x": x, "k": i64(4)})


def test_onehot_with_depth_fed_at_run_time():
    indices = np.array([[0, 3], [2, 7]], np.int64)
    depth = np.array(6, np.int64)
    check_node("OneHot", [("i", indices), ("d", depth)],
               initializers=[("values", np.array([0, 1], np.float32))], opset=11)


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}])
def test_unique_of_an_input(attrs):
    x = rng(5).integers(0, 4, size=(6, 2)).astype(np.float32)
    check_node("Unique", [("x", x)], attrs, n_outputs=4, opset=11)


@pytest.mark.parametrize("equation,shape", [("i->ii", (3,)), ("ij->k", (3, 4))])
def test_einsum_impossible_output_is_a_model_error(equation, shape):
    x = data(shape)
    model = make_model([helper.make_node("Einsum", ["a"], ["y"], equation=equation)], [("a", x)],
                       [("y", None)], opset=12)
    with pytest.raises(ModelError):
        run_nnrun(model, {"a": x})
