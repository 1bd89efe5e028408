"""Gemm and MatMul (runtime/ops/gemm.py) against onnxruntime; integer MatMul exactly against onnx's
reference evaluator."""

import numpy as np
import pytest
from oracle import assert_close, check_model, check_node, helper, make_model, rng, run_onnxruntime

from nnrun import ModelError
from nnrun.ir import Node
from nnrun.ops import TensorInfo, lookup

F32 = np.float32


def data(shape, dtype=F32, seed=0):
    return np.asarray(rng(seed).standard_normal(shape).astype(dtype))


def kernel(op_type, attrs=None, opset=13, name="n0"):
    return lookup("", op_type, opset)(Node(name, op_type, "", [], ["y"], attrs or {}), opset)


def run_kernel(k, *arrays):
    """Drive a kernel as the executor does, with every input unknown at PREPARE."""
    infos = [None if a is None else TensorInfo(a.shape, a.dtype) for a in arrays]
    inferred = k.shape_rule(*infos)
    (out_info,) = inferred
    scratch = [np.empty(shape, dtype) for shape, dtype in k.ready(inferred.derived, *infos)]
    out = np.full(out_info.shape, np.nan, out_info.dtype)
    k.run(*arrays, outs=(out,), scratch=tuple(scratch))
    return out


M, K, N = 3, 5, 4
C_SHAPES = [None, (), (1,), (N,), (1, N), (M, 1), (M, N)]


@pytest.mark.parametrize("c_shape", C_SHAPES, ids=str)
@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 1.0), (1.0, 0.0), (2.0, -1.5)], ids=str)
@pytest.mark.parametrize("weights", ["initializers", "fed"])
def test_gemm(c_shape, trans_a, trans_b, alpha, beta, weights):
    a = data((K, M) if trans_a else (M, K), seed=1)
    b = data((N, K) if trans_b else (K, N), seed=2)
    operands = [("b", b)] + ([("c", data(c_shape, seed=3))] if c_shape is not None else [])
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    if weights == "initializers":
        check_node("Gemm", [("a", a)], attrs, initializers=operands, opset=13)
    else:
        check_node("Gemm", [("a", a)] + operands, attrs, opset=13)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_opsets(opset):
    attrs = {"transB": 1, "alpha": 0.7, "beta": 0.3}
    check_node("Gemm", [("a", data((2, 6)))], attrs, initializers=[
        ("w", data((8, 6), seed=1)), ("bias", data((8,), seed=2))], opset=opset)


def test_gemm_defaults_and_float64():
    check_node("Gemm", [("a", data((4, 3), np.float64)), ("b", data((3, 2), np.float64, 1)),
                        ("c", data((2,), np.float64, 2))], opset=13)


@pytest.mark.parametrize("shape", [(0, 5, 4), (3, 0, 4), (3, 5, 0)], ids=str)
def test_gemm_zero_sized(shape):
    m, k, n = shape
    # onnxruntime forgets beta when K = 0 (it returns C itself); the reference evaluator does not.
    check_node("Gemm", [("a", data((m, k)))], {"beta": 2.0},
               initializers=[("b", data((k, n), seed=1)), ("c", data((n,), seed=2))], opset=13,
               oracle="reference" if k == 0 else "onnxruntime")


def test_gemm_large_uses_weight_as_it_lies():
    """A transposed weight (Linear layer layout) of a size where BLAS matters."""
    check_node("Gemm", [("a", data((64, 256)))], {"transB": 1},
               initializers=[("w", data((128, 256), seed=1)), ("bias", data((128,), seed=2))],
               opset=13, rtol=1e-4)


def test_gemm_shape_errors():
    with pytest.raises(ModelError, match="inner dimensions differ"):
        kernel("Gemm", name="g1").infer(TensorInfo((2, 3), np.dtype(F32)),
                                         TensorInfo((4, 5), np.dtype(F32)))
    with pytest.raises(ModelError, match="broadcast"):
        kernel("Gemm", {"transB": 1}).infer(TensorInfo((2, 3), np.dtype(F32)),
                                             TensorInfo((5, 3), np.dtype(F32)),
                                             TensorInfo((2, 2), np.dtype(F32)))
    with pytest.raises(ModelError, match="matrices"):
        kernel("Gemm").infer(TensorInfo((2, 3, 1), np.dtype(F32)), TensorInfo((1, 5), np.dtype(F32)))


MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((3, 4), (2, 4, 5)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    ((1, 3, 4), (2, 4, 5)),
    ((2, 2, 3, 4), (4, 5)),
    ((0, 4), (4, 5)),
    ((3, 0), (0, 5)),
    ((2, 0, 4), (4, 5)),
    ((0, 3, 4), (1, 4, 5)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("weights", ["initializer", "fed"])
def test_matmul(shapes, weights):
    a, b = data(shapes[0], seed=1), data(shapes[1], seed=2)
    if weights == "initializer":
        check_node("MatMul", [("a", a)], initializers=[("b", b)], opset=13)
    else:
        check_node("MatMul", [("a", a), ("b", b)], opset=13)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
@pytest.mark.parametrize("opset", [9, 13])
def test_matmul_dtypes(dtype, opset):
    a = rng(1).integers(-5, 5, (2, 3, 4)).astype(dtype)
    b = rng(2).integers(-5, 5, (4, 5)).astype(dtype)
    check_node("MatMul", [("a", a), ("b", b)], opset=opset)


def test_matmul_opset1_and_transformer_sizes():
    check_node("MatMul", [("a", data((2, 3)))], initializers=[("b", data((3, 4), seed=1))], opset=7)
    check_node("MatMul", [("a", data((2, 16, 96)))], initializers=[("w", data((96, 384), seed=1))],
               opset=13)
    check_node("MatMul", [("q", data((2, 4, 16, 24))), ("k", data((2, 4, 24, 16), seed=1))], opset=13)


def test_matmul_shape_errors():
    with pytest.raises(ModelError, match="inner dimensions differ"):
        kernel("MatMul", name="mm").infer(TensorInfo((2, 3), np.dtype(F32)),
                                           TensorInfo((4, 5), np.dtype(F32)))
    with pytest.raises(ModelError, match="broadcast"):
        kernel("MatMul").infer(TensorInfo((2, 3, 4), np.dtype(F32)),
                               TensorInfo((3, 4, 5), np.dtype(F32)))
    with pytest.raises(ModelError, match="rank"):
        kernel("MatMul").infer(TensorInfo((), np.dtype(F32)), TensorInfo((4, 5), np.dtype(F32)))


FUSED = [("Relu", {}, {}), ("LeakyRelu", {"alpha": 0.1}, {"alpha": 0.1}),
         ("Sigmoid", {}, {}), ("HardSwish", {}, {}),
         ("Clip", {"min": -0.5, "max": 0.5}, {"min": -0.5, "max": 0.5})]


@pytest.mark.parametrize("kind,params,attrs", FUSED, ids=lambda v: str(v))
@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_fused_activation(op, kind, params, attrs):
    """A kernel carrying `_activation` gives what onnxruntime gives for the op, then the
    activation."""
    a = data((2, 3, 6) if op == "MatMul" else (3, 6))
    b, c = data((6, 4), seed=1), data((4,), seed=2)
    inputs = ["a", "b", "c"] if op == "Gemm" else ["a", "b"]
    scaling = {"alpha": 0.5, "beta": 2.0} if op == "Gemm" else {}
    nodes = [helper.make_node(op, inputs, ["t"], **scaling)]
    weights = [("b", b)] + ([("c", c)] if op == "Gemm" else [])
    if kind == "Clip":
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
        weights += [("lo", np.float32(attrs["min"])), ("hi", np.float32(attrs["max"]))]
    else:
        nodes.append(helper.make_node(kind, ["t"], ["y"], **attrs))
    model = make_model(nodes, [("a", a)], [("y", None)], weights, opset=14)
    (expected,) = run_onnxruntime(model, {"a": a})

    node_attrs = {"_activation": (kind, params), **scaling}
    k = lookup("", op, 14)(Node("fused", op, "", inputs, ["y"], node_attrs), 14)
    actual = run_kernel(k, a, b, c) if op == "Gemm" else run_kernel(k, a, b)
    assert_close(actual, expected, what=f"{op}+{kind}")


def test_gemm_reused_after_prepare_with_constant_c():
    """The packed beta * C stands in for input 2, which the executor then passes as None."""
    a, b, c = data((3, 6)), data((6, 4), seed=1), data((3, 4), seed=2)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], beta=0.25)
    model = make_model([node], [("a", a)], [("y", None)], [("b", b), ("c", c)], opset=13)
    check_model(model, {"a": a})
    k = kernel("Gemm", {"beta": 0.25})
    infos = [TensorInfo(a.shape, a.dtype), TensorInfo.of(b), TensorInfo.of(c)]
    assert k.ready(k.shape_rule(*infos).derived, *infos) == []
    assert 2 in k.packed
    out = np.empty((3, 4), F32)
    k.run(a, b, None, outs=(out,), scratch=())
    (expected,) = run_onnxruntime(model, {"a": a})
    assert_close(out, expected)


def _gemm_session(a, w, bias, attrs=None):
    model = make_model([helper.make_node("Gemm", ["a", "w", "bias"], ["y"], transB=1, **(attrs or {}))],
                       [("a", a)], [("y", None)], [("w", w), ("bias", bias)])
    import nnrun
    return model, nnrun.InferenceSession(model.SerializeToString())


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.5, "beta": 2.0}], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_of_one_row_reads_its_weight_packed_transposed(attrs, dtype):
    """A classifier's head at batch one, B stored (N, K) and of 1 MB or more: one row by B packed
    (K, N) at PREPARE (conv_core.ROW_PRODUCT_MIN), against onnxruntime."""
    a, w, bias = data((1, 640), dtype), data((500, 640), dtype, 1), data((500,), dtype, 2)
    model, session = _gemm_session(a, w, bias, attrs)
    (expected,) = run_onnxruntime(model, {"a": a})
    assert_close(session.run(None, {"a": a})[0], expected, rtol=1e-4)
    kernel = session.plan().steps[0].kernel
    assert kernel.b_transposed.shape == (640, 500) and kernel.b_transposed.flags.c_contiguous


def test_gemm_packed_transposed_only_for_one_row_of_a_large_weight():
    """Two rows, a weight below 1 MB, or B not transposed: the weight as it lies."""
    for a, w in [(data((2, 640)), data((500, 640), seed=1)), (data((1, 256)), data((500, 256), seed=1))]:
        model, session = _gemm_session(a, w, data((500,), seed=2))
        (expected,) = run_onnxruntime(model, {"a": a})
        assert_close(session.run(None, {"a": a})[0], expected, rtol=1e-4)
        assert session.plan().steps[0].kernel.b_transposed is None
    check_node("Gemm", [("a", data((1, 640)))], initializers=[("w", data((640, 500), seed=1))], opset=13)


def test_gemm_packed_weight_is_not_also_held_aligned():
    """A weight a kernel packed is read by no step as it lies: the plan holds no aligned copy of it
    beside the packed one, wherever the file left it (an embedded payload, unaligned)."""
    import nnrun
    a, w, bias = data((1, 640)), data((500, 640), seed=1), data((500,), seed=2)
    model = make_model([helper.make_node("Gemm", ["a", "w", "bias"], ["y"], transB=1)], [("a", a)], [("y", None)],
                       [("w", w), ("bias", bias)])
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    session = nnrun.InferenceSession(model.SerializeToString(), options)
    (expected,) = run_onnxruntime(model, {"a": a})
    assert_close(session.run(None, {"a": a})[0], expected, rtol=1e-4)
    plan = session.plan()
    assert plan.steps[0].kernel.b_transposed is not None
    assert not any(getattr(v, "shape", None) == (500, 640) for v in plan.constants.values())
    assert [r.where for r in plan.steps[0].weights][0] == "packed"
    assert session.report()["plan"]["weights_packed_bytes"] < w.nbytes + 4096
