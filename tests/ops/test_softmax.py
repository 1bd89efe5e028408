"""Softmax, LogSoftmax and Hardmax (runtime/ops/softmax.py) against onnxruntime."""

import numpy as np
import pytest
from oracle import check_node, rng

from nnrun import ModelError
from nnrun.ir import Node
from nnrun.ops import TensorInfo, lookup

OPS = ["Softmax", "LogSoftmax", "Hardmax"]


def data(shape, dtype=np.float32, seed=0, scale=3.0):
    return np.asarray((rng(seed).standard_normal(shape) * scale).astype(dtype))


SHAPES_AND_AXES = [
    ((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), -1),
    ((2, 3, 4), -3), ((5,), 0), ((2, 3, 4, 5), 2), ((1, 1, 6), 1), ((4, 1), 1)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset,shape,axis", [
    (opset, shape, axis)
    for opset in (7, 11, 13)
    for shape, axis in SHAPES_AND_AXES
    # negative axes exist from opset 11; before 13 the default axis 1 needs rank 2
    if not (opset < 11 and axis is not None and axis < 0)
    and not (len(shape) == 1 and opset < 13 and axis is None)
], ids=str)
def test_softmax_family(op, opset, shape, axis):
    """Opset < 13 flattens around axis (default 1); opset 13 takes one axis (default -1)."""
    attrs = {} if axis is None else {"axis": axis}
    check_node(op, [("x", data(shape))], attrs, opset=opset)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_is_stable(op, opset):
    x = np.array([[1000, 1001, 1002], [-1000, -1001, -1002], [0, 1e-30, -80], [88, 89, -1e30]],
                 np.float32)
    check_node(op, [("x", x)], opset=opset)


def test_hardmax_ties_take_the_first():
    x = np.array([[1, 3, 3, 2], [0, 0, 0, 0], [5, -1, 5, 5]], np.float32)
    for opset in (11, 13):
        check_node("Hardmax", [("x", x)], opset=opset)
    check_node("Hardmax", [("x", x.T.copy())], {"axis": 0}, opset=13)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_zero_sized(op, opset):
    check_node(op, [("x", np.zeros((0, 3, 4), np.float32))], {"axis": 1}, opset=opset)
    check_node(op, [("x", np.zeros((2, 3, 0), np.float32))], {"axis": 1}, opset=opset)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_float64_and_large(op):
    check_node(op, [("x", data((3, 7), np.float64))], opset=13)
    check_node(op, [("x", data((4, 8, 128, 128), seed=1))], opset=13)
    check_node(op, [("x", data((4, 8, 1000), seed=2))], {"axis": 1}, opset=11)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset,axis", [(11, 3), (13, -4), (13, 3)])
def test_axis_out_of_range(op, opset, axis):
    k = lookup("", op, opset)(Node("sm", op, "", ["x"], ["y"], {"axis": axis}), opset)
    with pytest.raises(ModelError, match="axis -?[0-9] is out of range"):
        k.infer(TensorInfo((2, 3, 4), np.dtype(np.float32)))
