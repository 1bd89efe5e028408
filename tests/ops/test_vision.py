"""GridSample, AffineGrid, RoiAlign, NonMaxSuppression, Col2Im, CenterCropPad and DeformConv
against onnxruntime (or onnx's reference evaluator where onnxruntime lacks the op)."""

import numpy as np
import pytest

from oracle import (assert_close, check_model, check_node, data, helper, i64, make_model, rng, run_nnrun,
                    run_reference)


def grid(shape, low=-1.3, high=1.3, seed=1):
    return rng(seed).uniform(low, high, shape).astype(np.float32)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_16(mode, padding, align):
    check_node("GridSample", [("x", data((2, 3, 5, 6))), ("g", grid((2, 4, 7, 2)))],
               {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=16)


@pytest.mark.parametrize("opset", [20, 22])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(opset, mode, padding, align):
    check_node("GridSample", [("x", data((1, 2, 4, 5))), ("g", grid((1, 3, 6, 2), seed=opset))],
               {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=opset)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_volumetric(mode, padding, align):
    check_node("GridSample", [("x", data((1, 2, 3, 4, 5))), ("g", grid((1, 2, 3, 4, 3)))],
               {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=20)


def test_grid_sample_exact_pixel_centres_and_size_one_axis():
    check_node("GridSample", [("x", data((1, 1, 1, 4))), ("g", grid((1, 2, 3, 2)))],
               {"padding_mode": "reflection", "align_corners": 1}, opset=20)
    centres = np.stack(np.meshgrid(np.linspace(-1, 1, 5), np.linspace(-1, 1, 4)), -1)[None]
    check_node("GridSample", [("x", data((1, 2, 4, 5))), ("g", centres.astype(np.float32))],
               {"mode": "nearest", "align_corners": 1}, opset=20)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 3, 1, 5), (1, 2, 3, 4, 5)])
def test_affine_grid(align, size):
    r = len(size) - 2
    theta = data((size[0], r, r + 1)) / 10
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"], align_corners=align)
    model = make_model([node], [("theta", theta)], [("y", None)],
                       initializers=[("size", i64(*size))], opset=20)
    # onnxruntime has no 3-D AffineGrid, and puts a size-1 axis at +1 with align_corners
    # where onnx's reference (and PyTorch's linspace) put it at -1.
    ort = r == 2 and not (align and 1 in size[2:])
    check_model(model, {"theta": theta}, oracle="onnxruntime" if ort else "reference")


ROI_ALIGN_ATTRS = [{}, {"output_height": 3, "output_width": 2, "sampling_ratio": 2},
                   {"output_height": 4, "output_width": 4, "spatial_scale": 0.5},
                   {"coordinate_transformation_mode": "output_half_pixel",
                    "output_height": 2, "output_width": 3}]


@pytest.mark.parametrize("opset,attrs", [
    (opset, attrs) for opset in (10, 16, 22) for attrs in ROI_ALIGN_ATTRS
    # opset 10 has no coordinate_transformation_mode
    if opset >= 16 or "coordinate_transformation_mode" not in attrs], ids=str)
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(opset, mode, attrs):
    attrs = dict(attrs, mode=mode)
    x = data((2, 3, 10, 12))
    rois = np.array([[0, 0, 9, 9], [1.5, 2.2, 7.1, 5.3], [-2, -1, 14, 3], [6, 6, 6.5, 6.2]],
                    np.float32)
    oracle = "onnxruntime" if opset < 22 else "reference"
    check_node("RoiAlign", [("x", x), ("rois", rois), ("idx", i64(0, 1, 1, 0))], attrs, opset=opset,
               oracle=oracle)


def nms_boxes(n_batch=2, n_boxes=12, center=False, seed=0):
    g = rng(seed)
    lo = g.uniform(0, 8, (n_batch, n_boxes, 2))
    size = g.uniform(0.5, 4, (n_batch, n_boxes, 2))
    if center:
        boxes = np.concatenate([lo + size / 2, size], axis=-1)  # (x_center, y_center, w, h)
    else:
        hi = lo + size
        boxes = np.stack([lo[..., 0], lo[..., 1], hi[..., 0], hi[..., 1]], -1)
        boxes[0, ::3] = boxes[0, ::3][:, [2, 3, 0, 1]]  # flipped corners
    return boxes.astype(np.float32)


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("limits", [(3, 0.5, 0.0), (100, 0.3, None), (2, 0.0, 0.2), (0, 0.5, 0.0),
                                    (5, 0.7, -2.0)])
@pytest.mark.parametrize("as_weights", [False, True])
def test_non_max_suppression(opset, center, limits, as_weights):
    boxes = nms_boxes(center=bool(center))
    scores = rng(3).uniform(0, 1, (2, 3, 12)).astype(np.float32)
    scores[1, 0, 4] = scores[1, 0, 7]  # a tie: the lower index wins
    max_out, iou, floor = limits
    extra = [("max_out", i64(max_out)), ("iou", np.array([iou], np.float32))]
    if floor is not None:
        extra.append(("floor", np.array([floor], np.float32)))
    inputs = [("boxes", boxes), ("scores", scores)]
    node = helper.make_node("NonMaxSuppression", [n for n, _ in inputs + extra], ["y"],
                            center_point_box=center)
    fed = inputs + extra if not as_weights else inputs
    weights = [] if not as_weights else extra
    model = make_model([node], fed, [("y", None)], initializers=weights, opset=opset)
    check_model(model, {n: a for n, a in fed})


@pytest.mark.parametrize("max_out", [4, None])
def test_non_max_suppression_optional_inputs_omitted(max_out):
    # The spec's defaults: no max_output_boxes_per_class selects nothing, no iou_threshold is 0.
    # The reference evaluator wants both given, so its model spells the defaults out.
    feeds = {"boxes": nms_boxes(), "scores": rng(3).uniform(0, 1, (2, 3, 12)).astype(np.float32)}
    given = {} if max_out is None else {"m": i64(max_out)}

    def nms(extra):
        node = helper.make_node("NonMaxSuppression", ["boxes", "scores", *extra], ["y"])
        return make_model([node], [(n, a) for n, a in {**feeds, **extra}.items()], [("y", None)], opset=11)

    (actual,) = run_nnrun(nms(given), {**feeds, **given})
    explicit = {"m": i64(0 if max_out is None else max_out), "iou": np.array([0], np.float32)}
    (expected,) = run_reference(nms(explicit), {**feeds, **explicit})
    assert_close(actual, expected)


@pytest.mark.parametrize("image,block,attrs", [
    ((5, 5), (2, 2), {}),
    ((6, 7), (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ((5, 5), (1, 5), {"pads": [0, 1, 0, 1]}),
    ((3, 4, 5), (2, 2, 2), {"strides": [1, 2, 1]}),
])
def test_col2im(image, block, attrs):
    r = len(image)
    strides = attrs.get("strides", [1] * r)
    pads = attrs.get("pads", [0] * 2 * r)
    dil = attrs.get("dilations", [1] * r)
    counts = [(image[a] + pads[a] + pads[a + r] - dil[a] * (block[a] - 1) - 1) // strides[a] + 1
              for a in range(r)]
    cols = data((2, 3 * int(np.prod(block)), int(np.prod(counts))))
    node = helper.make_node("Col2Im", ["cols", "image", "block"], ["y"], **attrs)
    model = make_model([node], [("cols", cols)], [("y", None)],
                       initializers=[("image", i64(*image)), ("block", i64(*block))], opset=18)
    check_model(model, {"cols": cols}, oracle="onnxruntime" if r == 2 else "reference")


@pytest.mark.parametrize("shape,target,axes", [
    ((5, 6, 3), (3, 4, 3), None), ((5, 6, 3), (8, 9, 3), None), ((5, 6, 3), (2, 9), [0, 1]),
    ((3, 6, 7), (5, 4), [-2, -1]), ((4, 4), (4, 1), None), ((4, 5), (0, 5), None),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_center_crop_pad(shape, target, axes, dtype):
    x = data(shape, dtype)
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"],
                            **({"axes": axes} if axes else {}))
    model = make_model([node], [("x", x)], [("y", None)], initializers=[("shape", i64(*target))],
                       opset=18)
    check_model(model, {"x": x}, oracle="reference")


@pytest.mark.parametrize("opset", [19, 22])
@pytest.mark.parametrize("attrs,offset_group,use_mask,use_bias", [
    ({}, 1, False, False),
    ({"pads": [1, 1, 1, 1]}, 1, True, True),
    ({"strides": [2, 1], "dilations": [1, 2], "pads": [0, 2, 1, 0]}, 2, True, False),
    ({"group": 2}, 2, False, True),
])
def test_deform_conv(opset, attrs, offset_group, use_mask, use_bias):
    r = 2
    group = attrs.get("group", 1)
    x = data((2, 4, 6, 7)) / 10
    w = data((6, 4 // group, 3, 2), seed=1) / 10
    strides = attrs.get("strides", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    dil = attrs.get("dilations", [1, 1])
    out = [(x.shape[2 + a] + pads[a] + pads[a + r] - dil[a] * (w.shape[2 + a] - 1) - 1) // strides[a] + 1
           for a in range(r)]
    offset = (rng(2).uniform(-2, 2, (2, offset_group * 6 * 2, *out))).astype(np.float32)
    inputs = [("x", x), ("w", w), ("offset", offset)]
    inputs.append(("b", data((6,), seed=3)) if use_bias else ("", None))
    if use_mask:
        inputs.append(("mask", rng(4).uniform(0, 1, (2, offset_group * 6, *out)).astype(np.float32)))
    check_node("DeformConv", inputs, dict(attrs, offset_group=offset_group), opset=opset,
               oracle="reference")
