"""Shape ops against onnxruntime: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Identity,
Constant, ConstantOfShape, Expand, Range, EyeLike."""

import numpy as np
import pytest
from oracle import check_model, check_node, data, helper, i64, make_model, numpy_helper

import nnrun

DTYPES = [np.float32, np.int64, np.int32, np.bool_]




# ---- Shape, Size -----------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [7, 13])
@pytest.mark.parametrize("shape", [(2, 3, 4), (5,), (), (0, 3)])
def test_shape(shape, opset):
    check_node("Shape", [("x", data(shape))], opset=opset)


@pytest.mark.parametrize("start, end", [(0, None), (1, None), (-1, None), (0, -1), (1, 3), (-2, -1),
                                        (-10, 10), (3, 1), (5, 9), (None, 2)])
def test_shape_15_start_end(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check_node("Shape", [("x", data((2, 3, 4, 5)))], attrs, opset=15)


@pytest.mark.parametrize("shape", [(2, 3, 4), (), (0, 7)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_size(shape, dtype):
    check_node("Size", [("x", data(shape, dtype))])


def test_shape_arithmetic_folds():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the shape path folds at PREPARE.
    x = data((2, 3, 4))
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
        helper.make_node("Concat", ["d0u", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    model = make_model(nodes, [("x", x)], [("y", None)],
                       [("i0", np.array(0, np.int64)), ("ax", i64(0)), ("minus1", i64(-1))], opset=13)
    check_model(model, {"x": x})


# ---- Reshape --------------------------------------------------------------------------------

RESHAPES = [
    ((2, 3, 4), (6, 4)),
    ((2, 3, 4), (-1,)),
    ((2, 3, 4), (0, -1)),
    ((2, 3, 4), (0, 0, 2, 2)),
    ((2, 3, 4), (2, -1, 0)),
    ((2, 3, 4), (-1, 3, 1, 2)),
    ((24,), (2, 3, 4)),
    ((1,), ()),
    ((), (1, 1)),
    ((0, 3), (3, -1)),
    ((0, 3), (0, 3)),
]


@pytest.mark.parametrize("opset", [7, 13, 14])
@pytest.mark.parametrize("x_shape, target", RESHAPES)
def test_reshape(x_shape, target, opset):
    check_node("Reshape", [("x", data(x_shape))], initializers=[("shape", i64(*target))], opset=opset)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_dtypes(dtype):
    check_node("Reshape", [("x", data((2, 6), dtype))], initializers=[("shape", i64(3, -1))])


@pytest.mark.parametrize("x_shape, target", [((0, 3), (3, 0)), ((2, 0, 3), (0, 5)), ((2, 3), (3, 2))])
def test_reshape_allowzero(x_shape, target):
    check_node("Reshape", [("x", data(x_shape))], {"allowzero": 1},
               initializers=[("shape", i64(*target))], opset=14)


def session(model):
    return nnrun.InferenceSession(model.SerializeToString())


def test_reshape_shape_fed_at_run_time():
    # The output shape then depends on a value known only per run: the node runs eagerly.
    x = data((2, 6))
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="late_shape"),
             helper.make_node("Neg", ["r"], ["y"])]
    model = make_model(nodes, [("x", x), ("shape", (np.int64, [2]))], [("y", None)])
    for shape in (i64(3, 4), i64(-1, 2), i64(12, 1)):
        check_model(model, {"x": x, "shape": shape})


@pytest.mark.parametrize("target", [(5, -1), (-1, -1), (7, 2)])
def test_reshape_bad_shape(target):
    x = data((2, 6))
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="bad")
    model = make_model([node], [("x", x)], [("y", None)], [("shape", i64(*target))])
    with pytest.raises(nnrun.ModelError, match="bad"):
        session(model).run(None, {"x": x})


def test_reshape_of_weight_folds():
    w = data((3, 4))
    x = data((2, 6), seed=1)
    nodes = [helper.make_node("Reshape", ["w", "shape"], ["w2"]),
             helper.make_node("Reshape", ["x", "shape"], ["x2"]),
             helper.make_node("Concat", ["w2", "x2"], ["y"], axis=0)]
    model = make_model(nodes, [("x", x)], [("y", None)], [("w", w), ("shape", i64(-1, 6))])
    check_model(model, {"x": x})


# ---- Flatten, Squeeze, Unsqueeze, Identity -----------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, 3, 4, -1, -2, -4])
@pytest.mark.parametrize("opset", [11, 13])
def test_flatten(axis, opset):
    check_node("Flatten", [("x", data((2, 3, 4, 5)))], {"axis": axis}, opset=opset)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_flatten_opset9(axis):
    check_node("Flatten", [("x", data((2, 0, 5)))], {"axis": axis}, opset=9)


SQUEEZES = [((1, 3, 1, 4), None), ((1, 3, 1, 4), [0]), ((1, 3, 1, 4), [0, 2]), ((1, 3, 1, 4), [-2]),
            ((1, 3, 1, 4), [2, -4]), ((1,), [0]), ((1, 1), None), ((3, 0, 1), [2])]


@pytest.mark.parametrize("shape, axes", SQUEEZES)
def test_squeeze_11(shape, axes):
    check_node("Squeeze", [("x", data(shape))], {} if axes is None else {"axes": axes}, opset=11)


@pytest.mark.parametrize("shape, axes", SQUEEZES)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_squeeze_13(shape, axes, dtype):
    if axes is None:
        check_node("Squeeze", [("x", data(shape, dtype))], opset=13)
    else:
        check_node("Squeeze", [("x", data(shape, dtype))], initializers=[("axes", i64(*axes))], opset=13)


def test_squeeze_non_unit_axis_is_an_error():
    x = data((2, 3))
    node = helper.make_node("Squeeze", ["x", "axes"], ["y"], name="sq")
    model = make_model([node], [("x", x)], [("y", None)], [("axes", i64(0))], opset=13)
    with pytest.raises(nnrun.ModelError, match="sq"):
        session(model).run(None, {"x": x})


UNSQUEEZES = [((3, 4), [0]), ((3, 4), [2]), ((3, 4), [-1]), ((3, 4), [0, 3]), ((3, 4), [3, 0]),
              ((3, 4), [1, -1]), ((), [0]), ((), [0, 1]), ((2, 0), [1])]


@pytest.mark.parametrize("shape, axes", UNSQUEEZES)
def test_unsqueeze_11(shape, axes):
    check_node("Unsqueeze", [("x", data(shape))], {"axes": axes}, opset=11)


@pytest.mark.parametrize("shape, axes", UNSQUEEZES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_unsqueeze_13(shape, axes, dtype):
    check_node("Unsqueeze", [("x", data(shape, dtype))], initializers=[("axes", i64(*axes))], opset=13)


@pytest.mark.parametrize("dtype", DTYPES + [np.float16, np.uint8])
@pytest.mark.parametrize("shape", [(2, 3), (), (0,)])
def test_identity(shape, dtype):
    check_node("Identity", [("x", data(shape, dtype))])


def test_identity_chain_of_aliases():
    x = data((2, 3, 4))
    nodes = [helper.make_node("Flatten", ["x"], ["a"], axis=2),
             helper.make_node("Unsqueeze", ["a", "ax"], ["b"]),
             helper.make_node("Identity", ["b"], ["c"]),
             helper.make_node("Squeeze", ["c", "ax"], ["y"])]
    model = make_model(nodes, [("x", x)], [("y", None)], [("ax", i64(1))], opset=13)
    check_model(model, {"x": x})


# ---- Constant ------------------------------------------------------------------------------------

CONSTANTS = [
    {"value": numpy_helper.from_array(data((2, 3)), "v")},
    {"value": numpy_helper.from_array(i64(4, 5, 6), "v")},
    {"value": numpy_helper.from_array(np.array(True), "v")},
    {"value": numpy_helper.from_array(np.zeros((0, 2), np.float32), "v")},
    {"value_float": 2.5},
    {"value_floats": [1.0, -2.0, 3.5]},
    {"value_int": -7},
    {"value_ints": [1, 2, 3]},
]


@pytest.mark.parametrize("opset", [13, 19])
@pytest.mark.parametrize("attrs", CONSTANTS, ids=lambda a: next(iter(a)))
def test_constant(attrs, opset):
    check_node("Constant", [], attrs, opset=opset)


@pytest.mark.parametrize("attrs", [{"value_string": "hello"}, {"value_strings": ["a", "bc"]}])
def test_constant_strings(attrs):
    node = helper.make_node("Constant", [], ["y"], **attrs)
    model = make_model([node], [], [("y", None)], opset=13)
    nnrun_out = session(model).run(None, {})[0]
    expected = np.array(list(attrs.values())[0], dtype=object)
    assert nnrun_out.shape == expected.shape
    assert [str(v) for v in nnrun_out.reshape(-1)] == [str(v) for v in expected.reshape(-1)]


def test_constant_feeds_an_op():
    x = data((2, 3))
    nodes = [helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [("x", x)], [("y", None)], opset=13)
    check_model(model, {"x": x})


def test_constant_sparse_is_unsupported():
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.0], np.float32), "v"),
                                       numpy_helper.from_array(i64(1), "i"), [3])
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse)
    model = make_model([node], [], [("y", None)], opset=13)
    with pytest.raises(nnrun.NnrunError):
        session(model).run(None, {})


# ---- ConstantOfShape, Expand, Range, EyeLike -------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3), (0, 4), (), (5,)])
@pytest.mark.parametrize("value", [None, np.array([7], np.int64), np.array([1.5], np.float32),
                                   np.array([True]), np.array([3], np.int32)])
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value, "v")}
    check_node("ConstantOfShape", [], attrs, initializers=[("shape", np.array(shape, np.int64))],
               opset=9)


def test_constant_of_shape_large_runs():
    # Larger than the folding budget: planned as a step and run.
    x = data((2,))
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=numpy_helper.from_array(np.array([0.5], np.float32), "v")),
             helper.make_node("Add", ["c", "x"], ["y"])]
    model = make_model(nodes, [("x", x)], [("y", None)], [("shape", i64(700, 400, 2))], opset=20)
    check_model(model, {"x": x})


EXPANDS = [((3, 1), (2, 3, 4)), ((3, 1), (3, 4)), ((1,), (2, 2)), ((2, 3), (1, 1)), ((2, 1, 3), (4, 1)),
           ((), (3,)), ((4,), (0, 4)), ((2, 3), (2, 1, 3)), ((1, 3), (1,))]


@pytest.mark.parametrize("x_shape, shape", EXPANDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("opset", [8, 13])
def test_expand(x_shape, shape, dtype, opset):
    check_node("Expand", [("x", data(x_shape, dtype))], initializers=[("shape", i64(*shape))],
               opset=opset)


RANGES = [(0, 10, 1), (0, 10, 3), (10, 0, -3), (5, 5, 1), (5, 0, 1), (-4, 7, 2), (0, 1000, 7)]


@pytest.mark.parametrize("start, limit, delta", RANGES)
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32, np.float64, np.int16])
def test_range(start, limit, delta, dtype):
    check_node("Range", [], initializers=[(n, np.array(v, dtype)) for n, v in
                                          (("s", start), ("l", limit), ("d", delta))], opset=11)


@pytest.mark.parametrize("start, limit, delta", [(0.5, 3.2, 0.3), (1.0, -2.0, -0.7), (0.0, 1.0, 0.1)])
def test_range_fractional(start, limit, delta):
    check_node("Range", [], initializers=[(n, np.array(v, np.float32)) for n, v in
                                          (("s", start), ("l", limit), ("d", delta))], opset=11)


@pytest.mark.parametrize("shape", [(3, 3), (3, 5), (5, 2), (0, 3)])
@pytest.mark.parametrize("k", [0, 1, -1, 3, -4, 10])
def test_eyelike(shape, k):
    check_node("EyeLike", [("x", data(shape))], {"k": k}, opset=9)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
@pytest.mark.parametrize("to", [None, 1, 7, 6, 11])
def test_eyelike_dtype(dtype, to):
    attrs = {} if to is None else {"dtype": to}
    check_node("EyeLike", [("x", data((3, 4), dtype))], attrs, opset=9)
