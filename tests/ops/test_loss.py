"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""

import numpy as np
import pytest
from oracle import FLOAT16_RTOL, check_node, helper, make_model, rng, run_nnrun

import nnrun

SHAPES = [(5, 4), (3, 4, 6), (2, 3, 4, 5), (2, 3, 2, 2, 3)]


def _scores(shape, dtype=np.float32, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


def _labels(shape, classes, ignore=None, seed=1):
    labels = rng(seed).integers(0, classes, size=(shape[0],) + tuple(shape[2:])).astype(np.int64)
    if ignore is not None:
        labels.reshape(-1)[::3] = ignore
    return labels


def _weight(classes, seed=2):
    return rng(seed).uniform(0.2, 2.0, classes).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -5])
def test_nll_loss(ignore_index, weighted, reduction, shape, opset=13):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = [("x", _scores(shape)), ("target", _labels(shape, shape[1], ignore_index))]
    if weighted:
        inputs.append(("weight", _weight(shape[1])))
    check_node("NegativeLogLikelihoodLoss", inputs, attrs, opset=opset)


@pytest.mark.parametrize("opset", [12, 22])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_nll_loss_other_opsets(reduction, opset):
    # 12 and 22 differ from 13 only in element types.
    test_nll_loss(-5, True, reduction, (3, 4, 6), opset=opset)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 0, -1])
@pytest.mark.parametrize("log_prob", [False, True])
def test_softmax_cross_entropy(log_prob, ignore_index, weighted, reduction, shape):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = [("x", _scores(shape)), ("target", _labels(shape, shape[1], ignore_index))]
    if weighted:
        inputs.append(("weight", _weight(shape[1])))
    check_node("SoftmaxCrossEntropyLoss", inputs, attrs, n_outputs=2 if log_prob else 1, opset=13)


@pytest.mark.parametrize("opset", [12, 13])
def test_softmax_cross_entropy_opsets_int32_labels(opset):
    shape = (4, 5, 3)
    labels = _labels(shape, 5).astype(np.int32)
    check_node("SoftmaxCrossEntropyLoss", [("x", _scores(shape)), ("target", labels)], n_outputs=2,
               opset=opset)


def test_softmax_cross_entropy_double_and_large_scores():
    shape = (3, 4, 2)
    scores = (_scores(shape, np.float64) * 200)  # the max is subtracted before exp
    check_node("SoftmaxCrossEntropyLoss", [("x", scores), ("target", _labels(shape, 4))],
               {"reduction": "sum"}, n_outputs=2, opset=13)


def test_nll_loss_float16():
    shape = (4, 3, 5)
    check_node("NegativeLogLikelihoodLoss",
               [("x", _scores(shape, np.float16)), ("target", _labels(shape, 3))],
               {"reduction": "mean"}, opset=13, rtol=FLOAT16_RTOL)


def _nll_model(x, labels, **attrs):
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "target"], ["loss"], **attrs)
    return make_model([node], [("x", x), ("target", labels)], [("loss", None)], opset=13)


def test_nll_loss_rejects_bad_shapes():
    x, labels = _scores((3, 4, 5)), _labels((3, 4, 6), 4)
    with pytest.raises(nnrun.ModelError, match="labels have shape"):
        run_nnrun(_nll_model(x, labels), {"x": x, "target": labels})


def test_nll_loss_rejects_bad_reduction():
    x, labels = _scores((3, 4)), _labels((3, 4), 4)
    with pytest.raises(nnrun.ModelError, match="reduction"):
        run_nnrun(_nll_model(x, labels, reduction="max"), {"x": x, "target": labels})


def test_nll_loss_rejects_out_of_range_label():
    x, labels = _scores((3, 4)), _labels((3, 4), 4)
    labels[1] = 7
    with pytest.raises(nnrun.NnrunError, match=r"outside \[0, 4\)"):
        run_nnrun(_nll_model(x, labels), {"x": x, "target": labels})
