"""Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9) against onnxruntime, and onnx's reference
evaluator where onnxruntime lacks the case (N-D linear, float64, aspect-ratio policies on all axes).

Integer inputs interpolated (linear, cubic) truncate toward zero, as onnxruntime does and the spec
leaves open: their oracle is the reference evaluator in float64, truncated. Only scales whose
weights are exact in binary are tested there, where float32 and float64 weigh alike.
"""

import numpy as np
import pytest
from oracle import check_model, helper, make_model, onnx, rng, run_nnrun, run_reference


COORDINATE_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]

# On a (2, 3, 5, 7) input: up, down, mixed, integer factors (periodic taps), a single output row.
SCALES = [[1, 1, 2, 2], [1, 1, 0.5, 0.6], [1, 1, 1.7, 0.8], [1, 1, 3, 1], [1, 1, 0.34, 2.5],
          [1, 1, 4, 0.5], [1, 1, 1, 1]]
SIZES = [[2, 3, 10, 14], [2, 3, 3, 4], [2, 3, 9, 5], [2, 3, 1, 1], [2, 3, 5, 7], [2, 3, 1, 13],
         [2, 3, 15, 21]]


def data(shape, dtype=np.float32, seed=0):
    values = rng(seed).standard_normal(shape) * 10
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        values = rng(seed).integers(max(info.min, -100), min(info.max, 200), size=shape)
    return np.asarray(values).astype(dtype)


def resize(x, attrs, scales=None, sizes=None, roi=None, opset=13, oracle="auto", op="Resize"):
    """One Resize node; roi, scales and sizes are initializers ("" when absent)."""
    if op == "Upsample" or opset <= 10:  # inputs (X, scales)
        node = helper.make_node(op, ["x", "scales"], ["y"], name="resize", **attrs)
        model = make_model([node], [("x", x)], [("y", None)],
                           [("scales", np.array(scales, np.float32))], opset=opset)
        return check_resize(model, x, oracle)
    inputs, inits = ["x"], []
    for name, value, dtype in (("roi", roi, np.float32), ("scales", scales, np.float32),
                               ("sizes", sizes, np.int64)):
        if value is None and opset == 11 and name != "sizes":
            value = []  # opset 11 has no optional roi and scales: an empty tensor stands for none
        if value is None:
            inputs.append("")
        else:
            inputs.append(name)
            inits.append((name, np.array(value, dtype=dtype)))
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node(op, inputs, ["y"], name="resize", **attrs)
    model = make_model([node], [("x", x)], [("y", None)], inits, opset=opset)
    return check_resize(model, x, oracle)


def check_resize(model, x, oracle):
    node = model.graph.node[0]
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "nearest")
    if x.dtype.kind not in "iu" or mode == "nearest":
        return check_model(model, {"x": x}, oracle=oracle)
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    wide.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    if node.op_type == "Upsample":  # the evaluator's Upsample is nearest only: the same as a Resize
        wide.graph.node[0].CopyFrom(helper.make_node(
            "Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode="asymmetric"))
        wide.opset_import[0].version = 13
    (interpolated,) = run_reference(wide, {"x": x.astype(np.float64)})
    info = np.iinfo(x.dtype)
    expected = np.clip(np.trunc(interpolated), info.min, info.max).astype(x.dtype)
    (actual,) = run_nnrun(model, {"x": x})
    np.testing.assert_array_equal(actual, expected, strict=True)
    return [actual]


X = data((2, 3, 5, 7))


# ---- nearest ------------------------------------------------------------------------------------

@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_nearest_scales(coordinates, nearest, scales):
    resize(X, {"mode": "nearest", "coordinate_transformation_mode": coordinates,
               "nearest_mode": nearest}, scales=scales)


@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("sizes", SIZES)
def test_nearest_sizes(coordinates, nearest, sizes):
    resize(X, {"mode": "nearest", "coordinate_transformation_mode": coordinates,
               "nearest_mode": nearest}, sizes=sizes)


@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("n_in, n_out", [(7, 4), (7, 2), (7, 38), (20, 6), (26, 64), (5, 3)])
def test_nearest_ties(nearest, n_in, n_out):
    # Sizes whose source coordinates fall within a float32 rounding of k + 0.5.
    x = np.arange(n_in, dtype=np.float32).reshape(1, 1, 1, n_in)
    for coordinates in ("asymmetric", "half_pixel"):
        resize(x, {"mode": "nearest", "coordinate_transformation_mode": coordinates,
                   "nearest_mode": nearest}, sizes=[1, 1, 1, n_out])


@pytest.mark.parametrize("attrs, scales", [
    ({"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 2, 2]),
    ({}, [1, 1, 2, 2]),
    ({}, [1, 1, 3, 3]),
    ({}, [1, 1, 1, 2]),
    ({}, [1, 1, 2, 1]),
    ({}, [1, 2, 1, 3]),
    ({}, [2, 1, 1, 4]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8, np.int32])
def test_nearest_integer_upsampling(attrs, scales, dtype):
    resize(data((2, 3, 4, 5), dtype), {"mode": "nearest", **attrs}, scales=scales)


def test_nearest_large_table_goes_axis_by_axis():
    resize(data((1, 1, 300, 400)), {"mode": "nearest"}, scales=[1, 1, 1.7, 1.3])


def test_nearest_every_axis():
    resize(X, {"mode": "nearest"}, scales=[2, 1.5, 2.5, 0.5])
    resize(data((6,)), {"mode": "nearest"}, scales=[2.5])
    resize(data((3, 4, 5)), {"mode": "nearest", "coordinate_transformation_mode": "align_corners"},
           scales=[1.7, 1.5, 0.6])


# ---- linear -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_linear_scales(coordinates, scales):
    resize(X, {"mode": "linear", "coordinate_transformation_mode": coordinates}, scales=scales)


@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("sizes", SIZES)
def test_linear_sizes(coordinates, sizes):
    resize(X, {"mode": "linear", "coordinate_transformation_mode": coordinates}, sizes=sizes)


@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("shape, scales", [((1, 2, 3, 4, 5), [1, 1, 2, 1.5, 0.6]),   # trilinear
                                           ((3, 4, 5), [1.7, 1.5, 0.6]),
                                           ((4, 5), [1.7, 0.6]),
                                           ((2, 5, 7, 3), [1, 1.5, 2.5, 1]),          # NHWC
                                           ((1, 4, 16, 16), [1, 1, 4, 4]),
                                           ((1, 4, 16, 16), [1, 1, 0.25, 0.5])])
def test_linear_shapes(coordinates, shape, scales):
    resize(data(shape), {"mode": "linear", "coordinate_transformation_mode": coordinates}, scales=scales)


def test_linear_on_every_axis():
    resize(X, {"mode": "linear"}, scales=[2, 1.5, 2.5, 0.5], oracle="reference")


@pytest.mark.parametrize("dtype, scales", [
    (dtype, scales) for dtype in (np.uint8, np.int8, np.int32, np.float16)
    for scales in ([1, 1, 1.7, 0.6], [1, 1, 2, 2], [1, 1, 4, 0.5])
    # Integers truncate: weights like 1/1.7 round differently in float32 and float64 and flip them.
    if np.dtype(dtype).kind == "f" or 1.7 not in scales], ids=str)
def test_linear_dtypes(dtype, scales):
    resize(data((1, 2, 4, 5), dtype), {"mode": "linear"}, scales=scales)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_float64(mode):
    resize(X.astype(np.float64), {"mode": mode}, scales=[1, 1, 1.7, 0.6], oracle="reference")


# ---- cubic ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("a", [-0.75, -0.5])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 0.5, 0.6], [1, 1, 1.7, 0.8], [1, 1, 0.34, 2.5]])
def test_cubic_scales(coordinates, a, exclude_outside, scales):
    resize(X, {"mode": "cubic", "coordinate_transformation_mode": coordinates, "cubic_coeff_a": a,
               "exclude_outside": exclude_outside}, scales=scales)


@pytest.mark.parametrize("coordinates", COORDINATE_MODES)
@pytest.mark.parametrize("sizes", SIZES[:4])
def test_cubic_sizes(coordinates, sizes):
    resize(X, {"mode": "cubic", "coordinate_transformation_mode": coordinates}, sizes=sizes)


def test_cubic_2d_and_float16():
    resize(data((6, 7)), {"mode": "cubic"}, scales=[1.5, 0.7])
    resize(data((1, 2, 4, 5), np.float16), {"mode": "cubic"}, scales=[1, 1, 2, 1.5])


# ---- tf_crop_and_resize -------------------------------------------------------------------------------

ROI = [0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", SCALES)
def test_crop_and_resize_scales(mode, scales):
    resize(X, {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
               "extrapolation_value": -3.0}, scales=scales, roi=ROI)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", SIZES)
def test_crop_and_resize_sizes(mode, sizes):
    resize(X, {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
               "extrapolation_value": 2.0}, sizes=sizes, roi=ROI)


# ---- opset variants -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", SCALES)
def test_resize_10(mode, scales):
    resize(X, {"mode": mode}, scales=scales, opset=10)


@pytest.mark.parametrize("coordinates, mode",
                         [(c, m) for c in COORDINATE_MODES for m in ("nearest", "linear", "cubic")]
                         + [("tf_half_pixel_for_nn", "nearest")])
def test_resize_11(coordinates, mode):
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    resize(X, attrs, scales=[1, 1, 1.5, 0.7], opset=11)
    resize(X, attrs, sizes=[2, 3, 8, 3], opset=11)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2], [-1, -2], [2], [-1]])
def test_resize_18_axes(mode, axes):
    n = len(axes)
    resize(X, {"mode": mode, "axes": axes}, scales=[1.5, 0.6][:n], opset=18)
    resize(X, {"mode": mode, "axes": axes}, sizes=[9, 4][:n], opset=18)
    resize(X, {"mode": mode, "axes": axes, "coordinate_transformation_mode": "tf_crop_and_resize"},
           scales=[1.5, 0.6][:n], roi=[0.1, 0.2][:n] + [0.8, 1.1][:n], opset=18)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes, sizes", [([2, 3], [9, 4]), ([3, 2], [9, 4]), ([3], [9]),
                                         (None, [2, 3, 9, 4])])
def test_resize_18_keep_aspect_ratio(mode, policy, axes, sizes):
    attrs = {"mode": mode, "keep_aspect_ratio_policy": policy}
    if axes is not None:
        attrs["axes"] = axes
    # onnxruntime's linear and cubic do not resize the two outer axes, which 'all axes' would.
    oracle = "reference" if axes is None and mode != "nearest" else "onnxruntime"
    resize(X, attrs, sizes=sizes, opset=18, oracle=oracle)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 1.5, 0.7], [1, 1, 2.3, 1.9], [1, 1, 0.33, 0.4]])
def test_resize_19_half_pixel_symmetric(mode, scales):
    attrs = {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}
    resize(X, attrs, scales=scales, opset=19)
    resize(X, attrs, sizes=[2, 3, 9, 4], opset=19)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 1.5, 2.5], [1.0, 1.0, 3.0, 1.0]])
def test_upsample_7(mode, scales):
    node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
    check_model(make_model([node], [("x", X)], [("y", None)], opset=7), {"x": X})


@pytest.mark.parametrize("mode,scales,dtype", [
    (mode, scales, dtype)
    for mode in ("nearest", "linear")
    for scales in ([1, 1, 2, 2], [1, 1, 1.5, 2.5], [1, 1, 3, 1], [1, 1, 4, 2])
    for dtype in (np.float32, np.uint8, np.int32)
    # Integer outputs truncate: with weights like 1/3 a float32 rounding (whose order
    # onnxruntime's fused 2-D kernel and a separable one do not share) flips the integer,
    # so integer linear upsampling is checked only where the weights are exact in binary.
    if not (mode == "linear" and dtype != np.float32 and scales[2] in (1.5, 3))
], ids=str)
def test_upsample_9(mode, scales, dtype):
    resize(data((2, 3, 5, 7), dtype), {"mode": mode}, scales=scales, opset=9, op="Upsample")


# ---- edges and errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_zero_size_batch(mode):
    resize(np.zeros((0, 3, 4, 5), np.float32), {"mode": mode}, scales=[1, 1, 2, 2])


def test_folded_when_the_input_is_constant():
    w = data((1, 1, 3, 4))
    x = data((1, 1, 6, 8), seed=1)
    nodes = [helper.make_node("Resize", ["w", "", "scales"], ["up"], mode="linear"),
             helper.make_node("Add", ["up", "x"], ["y"])]
    model = make_model(nodes, [("x", x)], [("y", None)],
                       [("w", w), ("scales", np.array([1, 1, 2, 2], np.float32))], opset=13)
    check_model(model, {"x": x})


def test_scales_fed_at_run_time():
    # The output shape then depends on a value known only per run: the node runs eagerly.
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="late_scales")
    model = make_model([node], [("x", X), ("scales", (np.float32, [4]))], [("y", None)], opset=13)
    for scales in ([1, 1, 2, 2], [1, 1, 0.5, 3]):
        check_model(model, {"x": X, "scales": np.array(scales, np.float32)})


# ---- antialias (opset 18) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "pytorch_half_pixel", "asymmetric"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 0.45], [1, 1, 0.3, 0.5], [1, 1, 0.5, 0.5],
                                    [1, 1, 0.8, 1.5]])
def test_antialias(mode, coordinates, exclude_outside, scales):
    resize(data((1, 2, 9, 11)), {"mode": mode, "antialias": 1, "exclude_outside": exclude_outside,
                                 "coordinate_transformation_mode": coordinates},
           scales=scales, opset=18)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_sizes_and_axes(mode):
    resize(data((1, 2, 9, 11)), {"mode": mode, "antialias": 1}, sizes=[1, 2, 4, 3], opset=18)
    resize(data((1, 2, 9, 11)), {"mode": mode, "antialias": 1, "axes": [3, 2]}, sizes=[5, 2], opset=18)
