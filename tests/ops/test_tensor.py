"""Tensor-manipulation ops against onnxruntime: Transpose, Concat, Split, Slice, Gather,
GatherElements, Cast, CastLike, Pad, Tile, Trilu, DepthToSpace, SpaceToDepth, ScatterND,
ScatterElements."""

import numpy as np
import pytest
from oracle import check_model, check_node, data, helper, i64, make_model, rng

import nnrun

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min




def session(model):
    return nnrun.InferenceSession(model.SerializeToString())


# ---- Transpose -----------------------------------------------------------------------------------

TRANSPOSES = [((2, 3), None), ((2, 3), [1, 0]), ((2, 3, 4), None), ((2, 3, 4), [0, 2, 1]),
              ((2, 3, 4, 5), [0, 2, 3, 1]), ((2, 3, 4, 5), [3, 1, 0, 2]), ((5,), [0]), ((), None),
              ((2, 0, 3), [2, 0, 1]), ((1, 2, 3, 4, 5), [4, 2, 0, 3, 1])]


@pytest.mark.parametrize("shape, perm", TRANSPOSES)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_transpose(shape, perm, dtype):
    check_node("Transpose", [("x", data(shape, dtype))], {} if perm is None else {"perm": perm})


# ---- Concat ------------------------------------------------------------------------------------

CONCATS = [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(2, 3), (2, 4)], -1),
           ([(2, 3, 4), (2, 3, 4)], -3), ([(2, 3)], 0), ([(2, 0), (2, 3), (2, 0)], 1),
           ([(0, 3), (0, 3)], 0), ([(5,), (2,), (1,)], 0)]


@pytest.mark.parametrize("shapes, axis", CONCATS)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("opset", [11, 13])
def test_concat(shapes, axis, dtype, opset):
    inputs = [(f"x{i}", data(s, dtype, seed=i)) for i, s in enumerate(shapes)]
    check_node("Concat", inputs, {"axis": axis}, opset=opset)


def test_concat_opset7():
    check_node("Concat", [("a", data((2, 3))), ("b", data((2, 2)))], {"axis": 1}, opset=7)


def test_concat_of_weights_and_inputs():
    check_node("Concat", [("x", data((2, 3)))], {"axis": 0}, initializers=[("w", data((1, 3), seed=5))])


# ---- Split ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, axis, split, n", [
    ((6, 4), 0, None, 3), ((6, 4), 1, None, 2), ((6, 4), 0, [1, 5], 2), ((6, 4), 1, [1, 1, 2], 3),
    ((6, 4), 0, [0, 6], 2), ((3, 5, 2), 1, [2, 3], 2)])
@pytest.mark.parametrize("opset", [7, 11])
def test_split_attribute(shape, axis, split, n, opset):
    attrs = {"axis": axis} if split is None else {"axis": axis, "split": split}
    check_node("Split", [("x", data(shape))], attrs, n_outputs=n, opset=opset)


def test_split_negative_axis_11():
    check_node("Split", [("x", data((4, 6)))], {"axis": -1, "split": [2, 4]}, n_outputs=2, opset=11)


@pytest.mark.parametrize("shape, axis, split, n", [
    ((6, 4), 0, None, 3), ((6, 4), -1, None, 4), ((6, 4), 0, [2, 4], 2), ((2, 7), -1, [3, 0, 4], 3),
    ((5,), 0, [5], 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
@pytest.mark.parametrize("opset", [13, 18])
def test_split_input(shape, axis, split, n, dtype, opset):
    if opset == 18 and split is None:
        attrs = {"axis": axis, "num_outputs": n}
    else:
        attrs = {"axis": axis}
    inits = [] if split is None else [("split", i64(*split))]
    check_node("Split", [("x", data(shape, dtype))], attrs, initializers=inits, n_outputs=n, opset=opset)


@pytest.mark.parametrize("dim, n", [(7, 3), (5, 2), (10, 4), (3, 3), (8, 3)])
def test_split_18_uneven(dim, n):
    check_node("Split", [("x", data((2, dim)))], {"axis": 1, "num_outputs": n}, n_outputs=n, opset=18)


def test_split_with_an_unnamed_output():
    # onnxruntime crashes on this model; onnx's reference evaluator runs it.
    x = data((6, 2))
    node = helper.make_node("Split", ["x"], ["a", "", "c"], axis=0)
    model = make_model([node], [("x", x)], [("a", None), ("c", None)], opset=13)
    check_model(model, {"x": x}, oracle="reference")


def test_split_uneven_without_sizes_is_an_error():
    x = data((7,))
    node = helper.make_node("Split", ["x"], ["a", "b"], name="uneven")
    model = make_model([node], [("x", x)], [("a", None), ("b", None)], opset=13)
    with pytest.raises(nnrun.ModelError, match="uneven"):
        session(model).run(None, {"x": x})


# ---- Slice -------------------------------------------------------------------------------------------

SLICES = [  # starts, ends, axes, steps on a (5, 6, 7) input
    ([1], [3], [0], None),
    ([0, 1], [5, -1], None, None),
    ([1, 2], [4, 6], [2, 1], None),
    ([-3], [-1], [-1], None),
    ([4], [0], [0], [-1]),
    ([-1], [INT64_MIN], [1], [-1]),
    ([INT64_MAX], [INT64_MIN], [2], [-2]),
    ([0], [INT64_MAX], [2], [3]),
    ([-100], [100], [0], [2]),
    ([10], [20], [1], [1]),           # empty: start past the end
    ([3], [1], [1], [1]),             # empty: end before start
    ([1], [3], [0], [-1]),            # empty: wrong direction
    ([5, 6], [-10, -10], [1, 2], [-3, -2]),
    ([0, 0, 0], [5, 6, 7], [0, 1, 2], [1, 1, 1]),
    ([2, -2], [INT64_MAX, 0], [0, -2], [1, -1]),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
@pytest.mark.parametrize("opset", [10, 13])
def test_slice(starts, ends, axes, steps, opset):
    inits = [("starts", i64(*starts)), ("ends", i64(*ends))]
    if axes is not None:
        inits.append(("axes", i64(*axes)))
    if steps is not None:
        if axes is None:
            inits.append(("axes", i64(*range(len(starts)))))
        inits.append(("steps", i64(*steps)))
    check_node("Slice", [("x", data((5, 6, 7)))], initializers=inits, opset=opset)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_slice_dtypes(dtype):
    check_node("Slice", [("x", data((4, 5), dtype))],
               initializers=[("s", i64(1, 0)), ("e", i64(3, 5)), ("a", i64(0, 1)), ("st", i64(1, 2))])


def test_slice_int32_parameters():
    check_node("Slice", [("x", data((4, 5)))],
               initializers=[("s", np.array([3], np.int32)), ("e", np.array([0], np.int32)),
                             ("a", np.array([1], np.int32)), ("st", np.array([-1], np.int32))])


def test_slice_omitted_axes_with_steps():
    node = helper.make_node("Slice", ["x", "s", "e", "", "st"], ["y"])
    x = data((4, 5))
    model = make_model([node], [("x", x)], [("y", None)],
                       [("s", i64(3, 4)), ("e", i64(0, 1)), ("st", i64(-1, -2))], opset=13)
    check_model(model, {"x": x})


@pytest.mark.parametrize("starts, ends, axes", [([1], [3], [0]), ([0, 1], [2, -1], None),
                                               ([-3], [100], [1])])
def test_slice_opset1(starts, ends, axes):
    attrs = {"starts": starts, "ends": ends}
    if axes is not None:
        attrs["axes"] = axes
    check_node("Slice", [("x", data((4, 5)))], attrs, opset=7)


def test_slice_bounds_fed_at_run_time():
    x = data((4, 5))
    node = helper.make_node("Slice", ["x", "s", "e"], ["y"], name="late")
    model = make_model([node], [("x", x), ("s", (np.int64, [1])), ("e", (np.int64, [1]))],
                       [("y", None)], opset=13)
    for start, end in ((1, 3), (0, -1), (2, 100)):
        check_model(model, {"x": x, "s": i64(start), "e": i64(end)})


# ---- Gather, GatherElements ------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("indices", [np.array(1), np.array(-1), i64(0, -1, 2, 2),
                                     np.array([[0, 1], [-2, 1]], np.int64), np.array([], np.int64)])
@pytest.mark.parametrize("fed", [True, False])
def test_gather(axis, indices, fed):
    x = data((3, 4, 5))
    indices = np.asarray(indices, dtype=np.int64)
    if fed:
        check_node("Gather", [("x", x), ("i", indices)], {"axis": axis})
    else:
        check_node("Gather", [("x", x)], {"axis": axis}, initializers=[("i", indices)])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_dtypes(dtype, index_dtype):
    check_node("Gather", [("x", data((4, 3), dtype)), ("i", np.array([3, -4, 1], index_dtype))],
               {"axis": 0})


def test_gather_opset7_and_zero_size():
    check_node("Gather", [("x", data((3, 0))), ("i", i64(2, 0))], {"axis": 0}, opset=7)


def test_gather_of_weights_with_fed_indices():
    i = i64(1, 0, -1)
    node = helper.make_node("Gather", ["w", "i"], ["y"], axis=1)
    check_model(make_model([node], [("i", i)], [("y", None)], [("w", data((2, 3)))]), {"i": i})


def test_gather_out_of_range_at_run_time():
    x = data((3, 4))
    node = helper.make_node("Gather", ["x", "i"], ["y"], name="lookup", axis=1)
    model = make_model([node], [("x", x), ("i", i64(0))], [("y", None)])
    sess = session(model)
    sess.run(None, {"x": x, "i": i64(-4)})
    with pytest.raises(nnrun.ExecutionError, match="lookup"):
        sess.run(None, {"x": x, "i": i64(4)})
    with pytest.raises(nnrun.ExecutionError, match="lookup"):
        sess.run(None, {"x": x, "i": i64(-5)})


def test_gather_constant_out_of_range():
    x = data((3, 4))
    node = helper.make_node("Gather", ["x", "i"], ["y"], name="lookup")
    model = make_model([node], [("x", x)], [("y", None)], [("i", i64(3))])
    with pytest.raises(nnrun.ModelError, match="lookup"):
        session(model).run(None, {"x": x})


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("index_shape", [(3, 4, 5), (2, 4, 5), (3, 2, 1), (1, 1, 7)])
def test_gather_elements(axis, index_shape):
    x = data((3, 4, 5))
    dim = x.shape[axis]
    shape = list(index_shape)
    # The indices may be larger than the data only along the gathered axis.
    for a in range(3):
        if a != axis % 3:
            shape[a] = min(shape[a], x.shape[a])
    indices = rng(1).integers(-dim, dim, size=shape).astype(np.int64)
    check_node("GatherElements", [("x", x), ("i", indices)], {"axis": axis}, opset=13)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_gather_elements_opset11(dtype):
    indices = np.array([[1, 0], [0, -1]], np.int32)
    check_node("GatherElements", [("x", data((2, 2), dtype)), ("i", indices)], {"axis": 1}, opset=11)


def test_gather_elements_out_of_range():
    x = data((2, 2))
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], name="ge")
    model = make_model([node], [("x", x), ("i", i64(0, 0).reshape(1, 2))], [("y", None)], opset=13)
    with pytest.raises(nnrun.ExecutionError, match="ge"):
        session(model).run(None, {"x": x, "i": i64(2, 0).reshape(1, 2)})


@pytest.mark.parametrize("data_shape, indices, batch_dims", [
    ((2, 2), [[0, 0], [1, 1]], 0),
    ((2, 2), [[1], [0]], 0),
    ((2, 3, 4), [[[0, 1]], [[1, -1]]], 0),
    ((2, 3, 4), [[1, 2, -1], [0, 0, 0]], 0),
    ((2, 3, 4), [[1], [0]], 1),
    ((2, 3, 4), [[[1, 3], [2, 0]], [[0, 0], [-1, -4]]], 1),
    ((2, 3, 4, 2), [[[0], [2]], [[1], [1]]], 1),
    ((2, 3, 4), [[[0]], [[2]]], 1),
])
@pytest.mark.parametrize("fed", [True, False])
def test_gather_nd(data_shape, indices, batch_dims, fed):
    x = data(data_shape)
    indices = np.array(indices, np.int64)
    attrs, opset = ({"batch_dims": batch_dims}, 13) if batch_dims else ({}, 11)
    if fed:
        check_node("GatherND", [("x", x), ("i", indices)], attrs, opset=opset)
    else:
        check_node("GatherND", [("x", x)], attrs, initializers=[("i", indices)], opset=opset)


def test_gather_nd_out_of_range():
    x = data((2, 3))
    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd")
    model = make_model([node], [("x", x), ("i", i64(0, 0).reshape(1, 2))], [("y", None)], opset=13)
    with pytest.raises(nnrun.ExecutionError, match="gnd"):
        session(model).run(None, {"x": x, "i": i64(0, 3).reshape(1, 2)})


# ---- Cast, CastLike ----------------------------------------------------------------------------------

CAST_TYPES = {1: np.float32, 11: np.float64, 10: np.float16, 3: np.int8, 2: np.uint8, 5: np.int16,
              4: np.uint16, 6: np.int32, 7: np.int64, 12: np.uint32, 13: np.uint64, 9: np.bool_}


def cast_source(dtype):
    """Values every target type holds: non-negative, below 100, some fractional, some zeros."""
    values = np.array([0, 1, 2.5, 7.75, 99.9, 0, 42, 3.25, 64, 0.5, 13, 100], np.float64).reshape(3, 4)
    if np.dtype(dtype) == np.bool_:
        return values > 1
    return values.astype(dtype)


@pytest.mark.parametrize("source", list(CAST_TYPES.values()), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("to", list(CAST_TYPES), ids=lambda c: np.dtype(CAST_TYPES[c]).name)
def test_cast(source, to):
    check_node("Cast", [("x", cast_source(source))], {"to": to}, opset=13)


@pytest.mark.parametrize("to", [3, 5, 6, 7])
def test_cast_negative_truncates_toward_zero(to):
    x = np.array([-2.7, -0.5, 0.5, 2.7, -100.25], np.float32)
    check_node("Cast", [("x", x)], {"to": to}, opset=13)


@pytest.mark.parametrize("opset, attrs", [(6, {}), (9, {}), (19, {"saturate": 1}),
                                          (21, {})])
def test_cast_opsets(opset, attrs):
    check_node("Cast", [("x", data((2, 3)))], {"to": 6, **attrs}, opset=opset)


def test_cast_special_floats_to_bool():
    x = np.array([0.0, -0.0, np.inf, -np.inf, 1e-30, np.nan], np.float32)
    check_node("Cast", [("x", x)], {"to": 9})


def test_cast_bfloat16_round_trip():
    x = np.array([1.5, -2.25, 3.1, 1e30, -7e-3], np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["b"], to=16), helper.make_node("Cast", ["b"], ["y"], to=1)]
    check_model(make_model(nodes, [("x", x)], [("y", None)], opset=13), {"x": x})


def test_cast_zero_size():
    check_node("Cast", [("x", data((0, 3)))], {"to": 7})


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_a_cast_to_the_type_it_has_is_a_view_of_its_input(op):
    # Exporters write them (silero VAD has four): no step runs, and the output, a graph output as
    # well as one read on, is the input's values.
    extra = ["like"] if op == "CastLike" else []
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op, ["r"] + extra, ["c"], **({"to": 1} if op == "Cast" else {})),
             helper.make_node("Neg", ["c"], ["y"])]
    inits = [("like", np.zeros(1, np.float32))] if extra else []
    model = make_model(nodes, [("x", data((2, 3)))], [("c", None), ("y", None)], inits, opset=15)
    check_model(model, {"x": data((2, 3))})
    sess = session(model)
    sess.run(None, {"x": data((2, 3))})
    steps = [s for s in sess._last.steps if s.node.op_type == op]
    assert len(steps) == 1 and steps[0].alias_of >= 0


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_a_cast_to_the_type_it_has_of_a_constant_folds_to_its_value(op):
    extra = ["like"] if op == "CastLike" else []
    nodes = [helper.make_node(op, ["w"] + extra, ["c"], **({"to": 1} if op == "Cast" else {})),
             helper.make_node("Add", ["x", "c"], ["y"])]
    inits = [("w", data((2, 3), seed=3))] + ([("like", np.zeros(1, np.float32))] if extra else [])
    check_model(make_model(nodes, [("x", data((2, 3)))], [("y", None)], inits, opset=15), {"x": data((2, 3))})


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_a_cast_to_the_type_it_has_after_a_shape_only_a_run_tells(op):
    # Compress by a fed condition: the cast runs eagerly, and hands its input on as its result.
    # (Large enough that an output left unwritten is fresh pages, not a freed copy of the values.)
    extra = ["like"] if op == "CastLike" else []
    nodes = [helper.make_node("Compress", ["x", "keep"], ["k"], axis=0),
             helper.make_node(op, ["k"] + extra, ["y"], **({"to": 1} if op == "Cast" else {}))]
    inits = [("like", np.zeros(1, np.float32))] if extra else []
    model = make_model(nodes, [("x", data((256, 512))), ("keep", np.zeros(256, np.bool_))], [("y", None)], inits,
                       opset=15)
    check_model(model, {"x": data((256, 512)), "keep": np.arange(256) % 3 > 0})


@pytest.mark.parametrize("like", [np.int32, np.float64, np.bool_, np.float16])
def test_castlike(like):
    check_node("CastLike", [("x", cast_source(np.float32)), ("like", np.zeros(2, like))], opset=15)


# ---- Pad ---------------------------------------------------------------------------------------------

PADS = [[1, 2, 3, 4], [0, 0, 0, 0], [2, 0, 0, 3], [0, 3, 1, 0], [3, 3, 3, 3]]
CROPS = [[-1, 1, 0, -2], [1, -2, -1, 2]]


@pytest.mark.parametrize("pads", PADS + CROPS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_opset2(pads, mode):
    attrs = {"pads": pads, "mode": mode}
    if mode == "constant":
        attrs["value"] = 1.5
    check_node("Pad", [("x", data((4, 5)))], attrs, opset=7)


@pytest.mark.parametrize("pads", PADS + CROPS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("opset", [11, 13])
def test_pad(pads, mode, opset):
    inits = [("pads", i64(*pads))]
    if mode == "constant":
        inits.append(("value", np.array(-2.5, np.float32)))
    check_node("Pad", [("x", data((4, 5)))], {"mode": mode}, initializers=inits, opset=opset)


@pytest.mark.parametrize("pads", [[1, 2, 3, 4], [4, 5, 4, 5], [0, 1, 2, 0], [9, 0, 0, 11]] + CROPS)
def test_pad_wrap(pads):
    check_node("Pad", [("x", data((4, 5)))], {"mode": "wrap"}, initializers=[("pads", i64(*pads))],
               opset=19)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("axes", [[1], [-1], [0, 2], [2, -3], [-2, 0]])
def test_pad_axes_18(mode, axes):
    opset = 19 if mode == "wrap" else 18
    pads = [1 + i for i in range(len(axes))] + [2] * len(axes)
    node = helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode=mode)
    x = data((3, 4, 5))
    model = make_model([node], [("x", x)], [("y", None)], [("pads", i64(*pads)), ("axes", i64(*axes))],
                       opset=opset)
    check_model(model, {"x": x})


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_, np.uint8])
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_dtypes(dtype, mode):
    inits = [("pads", i64(1, 0, 2, 1))]
    if mode == "constant":
        inits.append(("value", np.array(1, dtype)))
    check_node("Pad", [("x", data((3, 4), dtype))], {"mode": mode}, initializers=inits, opset=13)


def test_pad_constant_value_fed():
    x = data((2, 3))
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"])
    model = make_model([node], [("x", x), ("value", np.array(7.0, np.float32))], [("y", None)],
                       [("pads", i64(1, 1, 1, 1))], opset=13)
    check_model(model, {"x": x, "value": np.array(7.0, np.float32)})


def test_pad_zero_size_constant():
    check_node("Pad", [("x", data((0, 3)))], initializers=[("pads", i64(1, 0, 1, 2))], opset=13)


def test_pad_4d_nchw():
    check_node("Pad", [("x", data((2, 3, 5, 6)))], {"mode": "reflect"},
               initializers=[("pads", i64(0, 0, 2, 1, 0, 0, 1, 2))], opset=13)


# ---- Tile, Trilu -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, repeats", [((2, 3), (1, 1)), ((2, 3), (2, 3)), ((2, 3), (0, 2)),
                                            ((3,), (4,)), ((2, 1, 3), (1, 5, 2)), ((0, 2), (3, 1))])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_tile(shape, repeats, dtype):
    check_node("Tile", [("x", data(shape, dtype))], initializers=[("r", i64(*repeats))])


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3), (2, 3, 4), (2, 1, 3, 3), (0, 3)])
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 2, -3, 7, -7])
def test_trilu(shape, upper, k):
    inits = [] if k is None else [("k", np.array(k, np.int64))]
    check_node("Trilu", [("x", data(shape))], {"upper": upper}, initializers=inits, opset=14)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_trilu_dtypes(dtype):
    check_node("Trilu", [("x", data((3, 4), dtype))], {"upper": 0}, opset=14)


# ---- DepthToSpace, SpaceToDepth ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, blocksize", [((1, 8, 2, 3), 2), ((2, 18, 3, 2), 3), ((1, 4, 1, 1), 2),
                                              ((2, 12, 2, 2), 2)])
@pytest.mark.parametrize("opset", [11, 13])
def test_depth_to_space(mode, shape, blocksize, opset):
    check_node("DepthToSpace", [("x", data(shape))], {"blocksize": blocksize, "mode": mode}, opset=opset)


def test_depth_to_space_opset7():
    check_node("DepthToSpace", [("x", data((1, 8, 2, 3)))], {"blocksize": 2}, opset=7)


@pytest.mark.parametrize("shape, blocksize", [((1, 2, 4, 6), 2), ((2, 3, 6, 3), 3), ((1, 1, 2, 2), 2)])
@pytest.mark.parametrize("opset", [7, 13])
def test_space_to_depth(shape, blocksize, opset):
    check_node("SpaceToDepth", [("x", data(shape))], {"blocksize": blocksize}, opset=opset)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, blocksize", [((1, 2, 4, 6), 2), ((2, 3, 6, 3), 3), ((1, 1, 2, 2), 2)])
def test_space_to_depth_modes(shape, blocksize, mode):
    # Opset 28's mode: onnxruntime runs it; the reference evaluator too.
    x = data(shape)
    for oracle in ("onnxruntime", "reference"):
        check_node("SpaceToDepth", [("x", x)], {"blocksize": blocksize, "mode": mode}, opset=28, oracle=oracle)
    # Each mode undoes DepthToSpace's of the same name.
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["d"], blocksize=blocksize, mode=mode),
             helper.make_node("DepthToSpace", ["d"], ["y"], blocksize=blocksize, mode=mode)]
    check_model(make_model(nodes, [("x", x)], [("y", None)], opset=28), {"x": x}, oracle="reference")


def test_space_depth_round_trip():
    x = data((2, 3, 4, 6))
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["d"], blocksize=2),
             helper.make_node("DepthToSpace", ["d"], ["y"], blocksize=2, mode="CRD")]
    check_model(make_model(nodes, [("x", x)], [("y", None)], opset=13), {"x": x})


# ---- ScatterND, ScatterElements ------------------------------------------------------------------------

SCATTER_ND = [
    ((4, 5), np.array([[1], [3]]), (2, 5)),
    ((4, 5), np.array([[0, 1], [3, 4], [-1, -5]]), (3,)),
    ((2, 3, 4), np.array([[[0, 1]], [[1, -1]]]), (2, 1, 4)),
    ((6,), np.array([[5], [0], [-3]]), (3,)),
]


@pytest.mark.parametrize("shape, indices, updates_shape", SCATTER_ND)
@pytest.mark.parametrize("opset, reduction", [(11, None), (13, None), (16, "add"), (16, "mul"),
                                              (18, "max"), (18, "min"), (18, "none")])
def test_scatter_nd(shape, indices, updates_shape, opset, reduction):
    attrs = {} if reduction is None else {"reduction": reduction}
    check_node("ScatterND", [("x", data(shape)), ("i", indices.astype(np.int64)),
                             ("u", data(updates_shape, seed=3))], attrs, opset=opset)


def test_scatter_nd_duplicates_add():
    check_node("ScatterND", [("x", data((4,))), ("i", i64(1, 1, 2).reshape(3, 1)),
                             ("u", data((3,), seed=2))], {"reduction": "add"}, opset=16)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("opset, reduction", [(11, None), (13, None), (16, "add"), (16, "mul"),
                                              (18, "max"), (18, "min")])
def test_scatter_elements(axis, opset, reduction):
    x = data((3, 4))
    # Distinct targets along the axis (negative ones among them), so 'none' is well defined.
    if axis == 0:
        indices = np.array([[0, 2, 1], [-1, 0, 2]], np.int64)
    else:
        indices = np.array([[0, -1, 2], [3, 1, -4]], np.int64)
    attrs = {"axis": axis} if reduction is None else {"axis": axis, "reduction": reduction}
    check_node("ScatterElements", [("x", x), ("i", indices), ("u", data((2, 3), seed=4))], attrs,
               opset=opset)


@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_opset9(axis):
    indices = np.array([[0, 2, 1], [1, 0, 2]], np.int64) if axis == 0 else \
        np.array([[0, 3, 2], [3, 1, 0]], np.int64)
    check_node("Scatter", [("x", data((3, 4))), ("i", indices), ("u", data((2, 3), seed=4))],
               {"axis": axis}, opset=9)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_scatter_elements_dtypes(dtype):
    check_node("ScatterElements", [("x", data((2, 5), dtype)), ("i", i64(4, -1, 0).reshape(1, 3)),
                                   ("u", data((1, 3), dtype, seed=1))], {"axis": 1}, opset=13)
