"""Elementwise ops (runtime/ops/elementwise.py, activation.py) against onnxruntime; on integers
(arithmetic, Pow, Clip, Max/Min, BitShift, Shrink), exactly against onnx's reference evaluator."""

import numpy as np
import pytest
from oracle import (FLOAT16_RTOL, assert_close, check_model, check_node, helper, make_model, rng,
                    run_onnxruntime)

from nnrun import ModelError
from nnrun.ir import Node
from nnrun.ops import TensorInfo, lookup
from nnrun.ops.activation import FUSABLE, apply_activation

F32, I32, I64 = np.float32, np.int32, np.int64


def data(shape, dtype=F32, seed=0, low=-5, high=5, nonzero=False):
    r = rng(seed)
    if np.dtype(dtype) == np.bool_:
        return np.asarray(r.integers(0, 2, shape).astype(bool))
    if np.dtype(dtype).kind in "iu":
        x = np.asarray(r.integers(low, high + 1, shape).astype(dtype))
        if nonzero:
            x[x == 0] = 1
        return x
    x = np.asarray(r.uniform(low, high, shape).astype(dtype))
    if nonzero:
        x[np.abs(x) < 0.1] = 0.5
    return x


def kernel(op_type, attrs=None, opset=17, name="n0"):
    """A kernel as the compiler constructs it, for shape-rule tests that need no oracle."""
    return lookup("", op_type, opset)(Node(name, op_type, "", [], ["y"], attrs or {}), opset)


def info(shape, dtype=F32):
    return TensorInfo(tuple(shape), np.dtype(dtype))


BROADCAST = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), ()),
    ((), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((3, 1), (1, 4)),
    ((2, 1, 4), (3, 1)),
    ((1,), (5, 1, 1)),
    ((0, 3), (1, 3)),
    ((0, 3), (3,)),
    ((2, 0, 3), (2, 1, 1)),
]


@pytest.mark.parametrize("shapes", BROADCAST, ids=str)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [F32, I32, I64], ids=lambda d: np.dtype(d).name)
def test_arithmetic_broadcast(op, shapes, dtype):
    a = data(shapes[0], dtype, seed=1, low=-20, high=20)
    b = data(shapes[1], dtype, seed=2, low=-6, high=6, nonzero=True)
    check_node(op, [("a", a), ("b", b)])


@pytest.mark.parametrize("op", ["Add", "Mul", "Div", "Pow", "Max", "Equal"])
def test_constant_operand(op):
    """The second operand a weight (initializer) rather than a feed."""
    a = data((2, 3, 4), low=0.5, high=4)
    b = data((3, 1), seed=3, low=0.5, high=2)
    check_node(op, [("a", a)], initializers=[("b", b)], opset=13)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint16, np.uint32, np.uint64, I64],
                         ids=lambda d: np.dtype(d).name)
def test_integer_division_dtypes(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max - 1, 7, info.min + 1, 0], dtype)
    b = np.array([1, 1, 2, 3, 3, 5] if info.min == 0 else [-1, 1, -2, -3, 3, 5], dtype)
    if info.min < 0:
        a[1] = info.min + 1  # min / -1 overflows in C too
    check_node("Div", [("a", a), ("b", b)], opset=14, oracle="reference")


def test_integer_division_truncates():
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1, -1], I32)
    b = np.array([2, 2, -2, -2, 3, 3, 5, -5, 5], I32)
    check_node("Div", [("a", a), ("b", b)])
    check_node("Div", [("a", a.astype(I64)), ("b", b.astype(I64))])
    check_node("Div", [("a", np.array([7, 200, 5], np.uint8)), ("b", np.array([2, 3, 7], np.uint8))],
               opset=14)


@pytest.mark.parametrize("base_dtype,exp_dtype", [
    (F32, F32), (F32, I32), (F32, I64), (I32, I32), (I64, I32), (I32, F32), (I64, I64),
    (np.float64, F32)], ids=str)
def test_pow_mixed_dtypes(base_dtype, exp_dtype):
    base = data((3, 4), base_dtype, seed=4, low=1, high=4)
    # An integer base to a negative integer power is not an integer: the spec leaves it open.
    integers = np.dtype(base_dtype).kind == np.dtype(exp_dtype).kind == "i"
    exponent = data((4,), exp_dtype, seed=5, low=0 if integers else -2, high=3)
    check_node("Pow", [("a", base), ("b", exponent)], opset=15)


def test_pow_negative_base_and_opset7():
    base = np.array([-2, -1.5, 0, 1.5, 2], F32)
    check_node("Pow", [("a", base), ("b", np.array([2, 3, 2, -1, 0.5], F32))], opset=7)
    check_node("Pow", [("a", base), ("b", np.array(3, F32))], opset=7)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_mod_integers(fmod, dtype):
    a = np.array([5, -5, 5, -5, 7, 0, -9], dtype)
    b = np.array([3, 3, -3, -3, 7, 4, 4], dtype)
    check_node("Mod", [("a", a), ("b", b)], {"fmod": fmod}, opset=13)
    check_node("Mod", [("a", a.reshape(7, 1)), ("b", b[:3])], {"fmod": fmod}, opset=13)


MOD_EDGES = [(0.0, -2.0), (-0.0, 2.0), (0.0, 2.0), (-0.0, -2.0), (-3.0, np.inf), (3.0, np.inf), (-1.0, -np.inf),
             (1.0, -np.inf), (np.inf, 2.0), (-np.inf, 2.0), (1.0, 0.0), (1.0, -0.0), (np.nan, 2.0), (1.0, np.nan),
             (0.0, np.inf), (-0.0, -np.inf), (6.0, 3.0), (-6.0, 3.0), (6.0, -3.0), (1e30, 7.0), (-1e-30, 5.0)]


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.float16, F32, np.float64])
def test_mod_float(dtype, fmod):
    # fmod=0 on floats (opset 28 on): the divisor's sign, with the special cases opset 28 lists.
    # assert_close takes -0.0 for 0.0: the signs of zeros are checked after, against numpy's rule.
    a, b = (np.array(v, dtype) for v in zip(*MOD_EDGES))
    for oracle in ("onnxruntime", "reference"):
        (actual,) = check_node("Mod", [("a", a), ("b", b)], {"fmod": fmod}, opset=28, oracle=oracle)
    with np.errstate(all="ignore"):
        expected = (np.fmod if fmod else np.mod)(a.astype(np.float64), b.astype(np.float64))
    number = ~np.isnan(expected)
    np.testing.assert_array_equal(np.signbit(actual[number]), np.signbit(expected[number]))
    mixed = data((6, 1), dtype, seed=3), data((5,), dtype, seed=4)
    check_node("Mod", [("a", mixed[0]), ("b", mixed[1])], {"fmod": fmod}, opset=10 if fmod else 28,
               rtol=FLOAT16_RTOL if dtype == np.float16 else 1e-4)


def test_mod_float_fmod_0_before_opset_28_is_refused():
    with pytest.raises(ModelError, match="before opset 28"):
        kernel("Mod", {"fmod": 0}, opset=13).infer(info((5,)), info((5,)))


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1), (1, 5)), ((), (3,))],
                         ids=str)
def test_logic(op, shapes):
    check_node(op, [("a", data(shapes[0], bool, 1)), ("b", data(shapes[1], bool, 2))])


def test_not():
    check_node("Not", [("x", data((3, 4), bool))])
    check_node("Not", [("x", np.zeros((0, 2), bool))])


@pytest.mark.parametrize("op,opset,dtype", [
    (op, opset, dtype)
    for op, opset in [("Equal", 7), ("Equal", 13), ("Less", 9), ("Greater", 13),
                      ("LessOrEqual", 12), ("GreaterOrEqual", 16)]
    for dtype in [F32, I32, I64]
    if not (op == "Equal" and opset < 11 and dtype == F32)  # Equal takes floats from opset 11
])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)),
                                    ((3, 4), ())], ids=str)
def test_comparisons(op, opset, dtype, shapes):
    # small integer ranges so that ties occur
    a = np.asarray(np.round(data(shapes[0], dtype, seed=1, low=-2, high=2)))
    b = np.asarray(np.round(data(shapes[1], dtype, seed=2, low=-2, high=2)))
    check_node(op, [("a", a), ("b", b)], opset=opset)


def test_equal_bool():
    check_node("Equal", [("a", data((3, 4), bool, 1)), ("b", data((4,), bool, 2))], opset=13)


@pytest.mark.parametrize("shapes", [
    ((2, 3), (2, 3), (2, 3)), ((2, 3), (), (3,)), ((3, 1), (1, 4), ()), ((), (2, 3), (2, 1)),
    ((2, 1, 3), (4, 1), (1,)), ((0, 3), (3,), ())], ids=str)
@pytest.mark.parametrize("dtype", [F32, I64])
def test_where(shapes, dtype):
    check_node("Where", [("c", data(shapes[0], bool)), ("x", data(shapes[1], dtype, 1)),
                         ("y", data(shapes[2], dtype, 2))])


@pytest.mark.parametrize("dtype", [bool, np.int8, np.uint8, np.int16, np.float16, np.int32,
                                   np.float64, np.uint64], ids=lambda d: np.dtype(d).name)
def test_where_dtypes(dtype):
    """Every item size of the bitwise select, on a condition that changes at random."""
    c = data((5, 7), bool, seed=3)
    x, y = data((5, 7), dtype, 1), data((7,), dtype, 2)
    if np.dtype(dtype).kind == "f":
        x.flat[:3] = [np.nan, -np.inf, -0.0]
    check_node("Where", [("c", c), ("x", x), ("y", y)], opset=16, oracle="reference")


def test_where_strings():
    c = np.array([True, False, True])
    check_node("Where", [("c", c), ("x", np.array(["a", "b", "c"], object)),
                        ("y", np.array(["x", "y", "z"], object))],
               opset=16)


def test_where_opset9_and_constant_branch():
    check_node("Where", [("c", data((2, 3), bool)), ("x", data((2, 3), F32, 1))],
               initializers=[("y", np.float32(-1))], opset=9)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_bitshift(direction, dtype):
    x = np.array([1, 2, 3, 16, 255], dtype)
    check_node("BitShift", [("x", x), ("y", np.array([1, 2, 3, 4, 0], dtype))],
               {"direction": direction}, opset=11)
    check_node("BitShift", [("x", x), ("y", np.array(2, dtype))], {"direction": direction}, opset=11)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("shapes", [((3, 4),), ((3, 4), (3, 4)), ((3, 4), (4,), ()),
                                    ((4,), (3, 1), (1, 4)), ((2, 1, 3), (4, 1), (1,), (3,))], ids=str)
def test_variadic(op, shapes):
    inputs = [(f"x{i}", data(s, F32, seed=i)) for i, s in enumerate(shapes)]
    check_node(op, inputs, opset=13)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_opset8(op):
    check_node(op, [("a", data((3, 4), F32, 1)), ("b", data((4,), F32, 2))], opset=8)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_max_min_integers(op, dtype):
    check_node(op, [("a", data((3, 4), dtype, 1)), ("b", data((4,), dtype, 2))], opset=12)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("scalar_first", [False, True])
def test_max_min_against_a_scalar(op, dtype, scalar_first):
    x = data((3, 4), dtype, 1)
    if dtype == F32:
        x.flat[:3] = [np.nan, np.inf, -np.inf]
    bound = np.array([0.5 if dtype == F32 else 1], dtype)
    inputs = [("b", bound), ("x", x)] if scalar_first else [("x", x), ("b", bound)]
    check_node(op, inputs, opset=13)
    check_node(op, [("x", x)], initializers=[("b", bound.reshape(()))], opset=13)


def test_max_min_nan():
    a = np.array([1, np.nan, 3, np.nan], F32)
    b = np.array([np.nan, 2, 1, np.nan], F32)
    check_node("Max", [("a", a), ("b", b)], opset=13)
    check_node("Min", [("a", a), ("b", b)], opset=13)


@pytest.mark.parametrize("op", ["Add", "Where", "Sum"])
def test_shapes_that_do_not_broadcast(op):
    k = kernel(op, name="bad_node")
    infos = [info((2, 3)), info((4,))]
    if op == "Where":
        infos = [info((2, 3), bool)] + infos
    with pytest.raises(ModelError, match="do not broadcast"):
        k.infer(*infos)


def test_mismatched_dtypes():
    with pytest.raises(ModelError, match="dtype"):
        kernel("Add").infer(info((2,), F32), info((2,), I64))


# ------------------------------------------------------------------ unary

def positive(shape, dtype=F32):
    return data(shape, dtype, low=0.1, high=5)


def unit(shape, dtype=F32):
    return data(shape, dtype, low=-0.95, high=0.95)


def signed(shape, dtype=F32):
    x = data(shape, dtype, low=-6, high=6)
    if x.size >= 4:  # edges where a formula branches or rounds
        x.flat[:4] = [0.0, -0.0, 2.5, -1.5] if x.dtype.kind == "f" else [0, -1, 2, -3]
    return x


UNARY = [  # op, opset, input maker, attributes
    ("Relu", 6, signed, {}), ("Relu", 14, signed, {}),
    ("Sigmoid", 13, signed, {}), ("Tanh", 13, signed, {}),
    ("LeakyRelu", 6, signed, {}), ("LeakyRelu", 16, signed, {"alpha": 0.3}),
    ("LeakyRelu", 16, signed, {"alpha": 2.0}), ("LeakyRelu", 16, signed, {"alpha": -0.5}),
    ("LeakyRelu", 16, signed, {"alpha": 0.0}),
    ("HardSigmoid", 6, signed, {}), ("HardSigmoid", 6, signed, {"alpha": 0.5, "beta": 0.1}),
    ("HardSwish", 14, signed, {}),
    ("Erf", 13, signed, {}), ("Sqrt", 13, positive, {}), ("Exp", 13, signed, {}),
    ("Log", 13, positive, {}), ("Neg", 13, signed, {}), ("Abs", 13, signed, {}),
    ("Reciprocal", 13, positive, {}), ("Floor", 13, signed, {}), ("Ceil", 13, signed, {}),
    ("Round", 11, signed, {}), ("Sign", 13, signed, {}), ("Sin", 7, signed, {}),
    ("Cos", 7, signed, {}), ("Tan", 7, unit, {}), ("Asin", 7, unit, {}), ("Acos", 7, unit, {}),
    ("Atan", 7, signed, {}), ("Sinh", 9, unit, {}), ("Cosh", 9, unit, {}),
    ("Asinh", 9, signed, {}), ("Acosh", 9, lambda s: positive(s) + 1, {}),
    ("Atanh", 9, unit, {}),
    ("Elu", 6, signed, {}), ("Elu", 6, signed, {"alpha": 0.5}), ("Elu", 6, signed, {"alpha": 2.0}),
    ("Selu", 6, signed, {}), ("Selu", 6, signed, {"alpha": 0.5, "gamma": 2.0}),
    ("Softplus", 1, signed, {}), ("Softsign", 1, signed, {}),
    ("Gelu", 20, signed, {}), ("Gelu", 20, signed, {"approximate": "tanh"}),
    ("Mish", 18, signed, {}), ("ThresholdedRelu", 10, signed, {}),
    ("ThresholdedRelu", 10, signed, {"alpha": -0.5}),
    ("Celu", 12, signed, {}), ("Celu", 12, signed, {"alpha": 2.5}),
    ("IsNaN", 13, signed, {}),
]


@pytest.mark.parametrize("op,opset,make,attrs", UNARY,
                         ids=[f"{u[0]}-{u[1]}-{u[3]}" for u in UNARY])
def test_unary(op, opset, make, attrs):
    check_node(op, [("x", make((3, 4, 5)))], attrs, opset=opset)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Gelu", "Softplus", "Elu"])
def test_unary_scalar_and_empty(op):
    check_node(op, [("x", np.array(0.7, F32))], opset=20)
    check_node(op, [("x", np.zeros((2, 0, 3), F32))], opset=20)


@pytest.mark.parametrize("op,opset", [("Relu", 14), ("Abs", 13), ("Neg", 13), ("Sign", 13)])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_unary_integers(op, opset, dtype):
    check_node(op, [("x", signed((3, 4), dtype))], opset=opset)


@pytest.mark.parametrize("op", ["Sigmoid", "Erf", "Softplus", "Elu", "Tanh", "LeakyRelu", "HardSwish"])
def test_unary_float64(op):
    # onnxruntime implements several of these for float32 only
    check_node(op, [("x", signed((3, 4), np.float64))], opset=14, oracle="reference")


SPECIALS = np.array([np.inf, -np.inf, np.nan, 100, -100, 0, 1e-30, -3, 3], F32)


@pytest.mark.parametrize("op,opset,attrs", [
    # (LeakyRelu with alpha 0 is Relu here; onnxruntime computes 0 * -inf = nan.)
    ("Relu", 13, {}), ("Sigmoid", 13, {}), ("Tanh", 13, {}), ("LeakyRelu", 16, {}),
    ("LeakyRelu", 16, {"alpha": 3.0}),
    ("HardSigmoid", 6, {}), ("HardSwish", 14, {}), ("Softplus", 1, {}), ("Softsign", 1, {}),
    ("Elu", 6, {}), ("Elu", 6, {"alpha": 2.0}), ("Selu", 6, {}), ("Celu", 12, {}),
    ("Mish", 18, {}), ("Gelu", 20, {}), ("Gelu", 20, {"approximate": "tanh"}),
    ("ThresholdedRelu", 10, {}), ("Round", 11, {}), ("Sign", 13, {}), ("Erf", 13, {})],
    ids=str)
def test_unary_special_values(op, opset, attrs):
    check_node(op, [("x", SPECIALS)], attrs, opset=opset)


@pytest.mark.parametrize("op,attrs", [("Erf", {}), ("Gelu", {}), ("Selu", {}), ("Elu", {"alpha": 3.0}),
                                      ("Celu", {"alpha": -1.5}), ("ThresholdedRelu", {"alpha": 0.3}),
                                      ("PRelu", {})], ids=str)
def test_unary_over_several_blocks(op, attrs):
    """Sizes beyond activation.BLOCK, not a multiple of it, run block by block."""
    x = signed((3, 65536 + 7))
    if op == "PRelu":
        check_node(op, [("x", x), ("slope", data((65536 + 7,), seed=2))], opset=16)
    elif op == "Celu":
        check_node(op, [("x", x)], attrs, opset=12, oracle="reference")
    else:
        check_node(op, [("x", x)], attrs, opset=20)


@pytest.mark.parametrize("kind,params", [("LeakyRelu", {"alpha": 0.1}), ("HardSwish", {})], ids=str)
def test_apply_activation_in_place_over_several_blocks(kind, params):
    x = signed((2, 65536 + 3))
    (expected,) = run_onnxruntime(
        make_model([helper.make_node(kind, ["x"], ["y"], **params)], [("x", x)], [("y", None)],
                   opset=16), {"x": x})
    assert_close(apply_activation(x.copy(), (kind, params)), expected)


def test_activations_in_place_on_several_threads_at_once_keep_their_own_temporaries():
    """Each thread's formulas in place work in a buffer of that thread's, reused from call to call:
    shares of one output activated on the kernels' pool threads at once never mix their blocks."""
    from concurrent.futures import ThreadPoolExecutor

    from nnrun.ops.activation import temporary

    first = temporary(1000, np.float32)
    assert np.shares_memory(first, temporary(500, np.float64))  # this thread's one buffer
    with ThreadPoolExecutor(1) as other:
        assert not np.shares_memory(first, other.submit(temporary, 1000, np.float32).result())
    xs = [data((3, 65536 + 7), seed=k, low=-6, high=6) for k in range(4)]
    (expected,) = zip(*[run_onnxruntime(make_model([helper.make_node("HardSwish", ["x"], ["y"])], [("x", x)],
                                                   [("y", None)], opset=16), {"x": x}) for x in xs])
    for _ in range(3):
        ys = [x.copy() for x in xs]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda y: apply_activation(y, ("HardSwish", {})), ys))
        for y, e in zip(ys, expected):
            assert_close(y, e)


@pytest.mark.parametrize("op", ["Erf", "Gelu"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_erf_other_float_types(op, dtype):
    check_node(op, [("x", signed((4, 5), dtype))], opset=20, oracle="reference",
               rtol=FLOAT16_RTOL if dtype == np.float16 else 1e-4)


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, 2.5001], F32)
    check_node("Round", [("x", x)], opset=11)


@pytest.mark.parametrize("negative,positive", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf(negative, positive):
    check_node("IsInf", [("x", SPECIALS)], {"detect_negative": negative, "detect_positive": positive},
               opset=20)


@pytest.mark.parametrize("attrs", [{}, {"min": -1.0}, {"max": 0.5}, {"min": -0.5, "max": 2.0}],
                         ids=str)
def test_clip_opset6(attrs):
    check_node("Clip", [("x", signed((3, 4)))], attrs, opset=6)


@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("bounds", ["none", "min", "max", "both", "min>max"])
@pytest.mark.parametrize("where", ["fed", "initializer"])
def test_clip_inputs(opset, bounds, where):
    x = signed((3, 4, 5))
    lo, hi = {"none": (None, None), "min": (-1.0, None), "max": (None, 2.0),
              "both": (-1.5, 0.5), "min>max": (1.0, -1.0)}[bounds]
    names, feeds, weights = ["x"], [("x", x)], []
    for name, bound in (("lo", lo), ("hi", hi)):
        if bound is None:
            names.append("")
            continue
        names.append(name)
        (feeds if where == "fed" else weights).append((name, np.array(bound, F32)))
    while names[-1] == "":
        names.pop()  # trailing omitted inputs are simply left out
    # check_node puts weights after feeds; build the node's input list explicitly instead
    node = helper.make_node("Clip", names, ["y"])
    model = make_model([node], [(n, a) for n, a in feeds], [("y", None)], weights, opset=opset)
    check_model(model, dict(feeds))


@pytest.mark.parametrize("dtype", [I32, I64])
def test_clip_integers(dtype):
    x = data((4, 5), dtype, low=-10, high=10)
    check_node("Clip", [("x", x), ("lo", np.array(-3, dtype)), ("hi", np.array(4, dtype))], opset=12)
    check_node("Clip", [("x", x)], initializers=[("lo", np.array(0, dtype))], opset=13)


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (5,), (4, 5), (1, 3, 4, 5), ()], ids=str)
@pytest.mark.parametrize("slope_range", [(0.01, 0.9), (1.0, 3.0), (-1.0, 2.0), (0.0, 0.0)], ids=str)
@pytest.mark.parametrize("where", ["initializer", "fed"])
def test_prelu(slope_shape, slope_range, where):
    x = signed((2, 3, 4, 5))
    x.flat[4:8] = [np.inf, -np.inf, np.nan, -1e30]
    slope = data(slope_shape, F32, seed=3, low=slope_range[0], high=slope_range[1])
    if where == "initializer":
        check_node("PRelu", [("x", x)], initializers=[("slope", slope)], opset=16)
    else:
        check_node("PRelu", [("x", x), ("slope", slope)], opset=9)


def test_prelu_opset7_and_integers():
    check_node("PRelu", [("x", signed((2, 3)))], initializers=[("s", np.float32([0.1, 0.2, 0.3]))],
               opset=7)
    check_node("PRelu", [("x", signed((2, 3), I32)), ("s", np.array([2, -1, 0], I32))], opset=16)


def test_prelu_slope_must_broadcast_to_x():
    # A per-channel slope of shape (C,) against NCHW is not unidirectionally broadcastable.
    with pytest.raises(ModelError, match="broadcast"):
        kernel("PRelu", opset=16).infer(info((1, 3, 4, 5)), info((3,)))
    with pytest.raises(ModelError, match="slope"):
        kernel("PRelu", opset=16).infer(info((3, 1)), info((3, 4)))


# ------------------------------------------------------------------ fused activations

FUSED = [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {"alpha": 1.5}),
         ("Clip", {"min": -0.5, "max": 1.5}), ("Clip", {"max": 1.0}), ("Sigmoid", {}),
         ("Tanh", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {})]


def test_fused_list_is_covered():
    assert {kind for kind, _ in FUSED} == FUSABLE


@pytest.mark.parametrize("kind,params", FUSED, ids=str)
def test_apply_activation_in_place(kind, params):
    """The fused path (in place) gives what onnxruntime gives for the standalone op."""
    x = np.concatenate([signed((60,)), SPECIALS])
    if kind == "Clip":
        # From opset 11 a bound left out is no bound, as in the fused params.
        bounds = [(name, np.float32(params[name])) for name in ("min", "max") if name in params]
        node = helper.make_node(kind, ["x"] + [n if n in params else "" for n in ("min", "max")],
                                ["y"])
        model = make_model([node], [("x", x)], [("y", None)], bounds, opset=13)
    else:
        node = helper.make_node(kind, ["x"], ["y"], **params)
        model = make_model([node], [("x", x)], [("y", None)], opset=14)
    (expected,) = run_onnxruntime(model, {"x": x})
    y = x.copy()
    assert apply_activation(y, (kind, dict(params, unused_extra=1))) is y
    assert_close(y, expected, what=kind)
    assert apply_activation(y, None) is y


@pytest.mark.parametrize("kind,params", FUSED, ids=str)
def test_apply_activation_on_a_share_of_a_batched_output(kind, params):
    """A channel share of a batched output (out[:, c0:c1]) is not contiguous: every value of it
    is activated in place and nothing outside it is touched."""
    x = signed((3, 8, 5, 7))
    if kind == "Clip":
        node = helper.make_node(kind, ["x"] + [n if n in params else "" for n in ("min", "max")], ["y"])
        bounds = [(name, np.float32(params[name])) for name in ("min", "max") if name in params]
        model = make_model([node], [("x", x)], [("y", None)], bounds, opset=13)
    else:
        model = make_model([helper.make_node(kind, ["x"], ["y"], **params)], [("x", x)], [("y", None)], opset=14)
    (expected,) = run_onnxruntime(model, {"x": x})
    y = x.copy()
    apply_activation(y[:, 2:6], (kind, params))
    assert_close(y[:, 2:6], expected[:, 2:6], what=kind)
    np.testing.assert_array_equal(y[:, :2], x[:, :2])
    np.testing.assert_array_equal(y[:, 6:], x[:, 6:])
