"""TFLite builtin kernels (domain "tflite") against LiteRT.

Each case is a one-operator .tflite model written with the flatbuffers Builder
(the schema's generated builders from the `tflite` package) and run by LiteRT;
nnrun runs the same operator through its compiler, from an ir.Graph made to the
loader's interface (attributes as the loader decodes them). Outputs must agree
to 1e-4 relative to the largest output magnitude.
"""


import numpy as np
import pytest

pytest.importorskip("flatbuffers")
pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert.interpreter")

from tflite_model import build_tflite, run_litert  # noqa: E402

from nnrun import ir, ops  # noqa: E402
from nnrun.compiler.build import compile_graph  # noqa: E402
from nnrun.executor import Executor  # noqa: E402

RTOL = 1e-4


def run_nnrun(op, inputs, n_outputs, attrs, domain="tflite"):
    ops.load_all()
    initializers = {name: np.ascontiguousarray(a) for name, a, constant in inputs if constant}
    graph_inputs = [ir.ValueInfo(name, np.dtype(a.dtype), tuple(a.shape)) for name, a, constant in inputs
                    if not constant]
    outputs = [f"out{i}" for i in range(n_outputs)]
    attrs = dict(attrs, tflite_opcode_version=1)
    node = ir.Node(f"{op}_0", op, domain, [name for name, _, _ in inputs], outputs, attrs)
    graph = ir.Graph("g", [node], graph_inputs, [ir.ValueInfo(o, None, None) for o in outputs],
                     initializers, opsets={"tflite": 1, "tflite.custom": 1}, format="tflite")
    feeds = {name: a for name, a, constant in inputs if not constant}
    plan = compile_graph(graph, {k: (v.shape, v.dtype) for k, v in feeds.items()})
    result = Executor(plan).run(feeds)
    return [result[o] for o in outputs]


def check(op, inputs, n_outputs=1, attrs=None, custom_options=None):
    """Run the op in LiteRT and in nnrun; compare every output."""
    attrs = dict(attrs or {})
    inputs = [(name, np.asarray(a), constant) for name, a, constant in inputs]
    model = build_tflite(op, inputs, n_outputs, dict(attrs), custom_options)
    expected = run_litert(model, [a for _, a, constant in inputs if not constant])
    nn_attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
    if custom_options is not None:
        nn_attrs = {"custom_options": custom_options}
    got = run_nnrun(op, inputs, n_outputs, nn_attrs, "tflite.custom" if custom_options is not None else "tflite")
    for e, g in zip(expected, got):
        assert_close(g, e)


def assert_close(got, expected):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    if expected.size == 0:
        return
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(got, expected)
        return
    scale = max(float(np.abs(expected).max()), 1e-30)
    np.testing.assert_allclose(got, expected, rtol=0, atol=RTOL * scale)


RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def inp(name, a):
    return (name, a, False)


def const(name, a):
    return (name, a, True)


# --------------------------------------------------------------------------- convolution and pooling


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("stride,dilation", [(1, 1), (2, 1), (1, 2), (3, 1)])
@pytest.mark.parametrize("act", ["NONE", "RELU6"])
def test_conv2d(padding, stride, dilation, act, kernels):
    attrs = {"padding": padding, "stride_w": stride, "stride_h": stride, "dilation_w_factor": dilation,
             "dilation_h_factor": dilation, "fused_activation_function": act}
    check("CONV_2D", [inp("x", rand(1, 11, 10, 3)), const("w", rand(5, 3, 3, 3)), const("b", rand(5))],
          attrs=attrs)


def test_conv2d_pointwise_batch():
    check("CONV_2D", [inp("x", rand(2, 6, 7, 8)), const("w", rand(4, 1, 1, 8)), const("b", rand(4))],
          attrs={"padding": "VALID", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("stride,dilation", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("channels,multiplier", [(4, 1), (3, 2), (1, 3)])
def test_depthwise(padding, stride, dilation, channels, multiplier, kernels):
    attrs = {"padding": padding, "stride_w": stride, "stride_h": stride, "dilation_w_factor": dilation,
             "dilation_h_factor": dilation, "depth_multiplier": multiplier, "fused_activation_function": "RELU"}
    check("DEPTHWISE_CONV_2D", [inp("x", rand(1, 9, 8, channels)),
                                const("w", rand(1, 3, 3, channels * multiplier)),
                                const("b", rand(channels * multiplier))], attrs=attrs)


@pytest.mark.parametrize("padding,in_hw,out_hw,stride", [("SAME", (4, 5), (8, 10), 2), ("VALID", (4, 5), (9, 11), 2),
                                                         ("SAME", (3, 3), (3, 3), 1)])
def test_transpose_conv(padding, in_hw, out_hw, stride):
    check("TRANSPOSE_CONV", [const("shape", np.array([1, *out_hw, 4], np.int32)), const("w", rand(4, 3, 3, 2)),
                             inp("x", rand(1, *in_hw, 2))],
          attrs={"padding": padding, "stride_w": stride, "stride_h": stride})


@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("k,stride", [(2, 2), (3, 2), (3, 1)])
def test_pool(op, padding, k, stride):
    check(op, [inp("x", rand(1, 9, 10, 3))],
          attrs={"padding": padding, "stride_w": stride, "stride_h": stride, "filter_width": k,
                 "filter_height": k, "fused_activation_function": "RELU"})


# --------------------------------------------------------------------------- dense and elementwise


@pytest.mark.parametrize("keep", [False, True])
def test_fully_connected(keep):
    check("FULLY_CONNECTED", [inp("x", rand(2, 3, 8)), const("w", rand(5, 8)), const("b", rand(5))],
          attrs={"fused_activation_function": "RELU", "keep_num_dims": keep})


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV"])
@pytest.mark.parametrize("act", ["NONE", "RELU", "RELU_N1_TO_1", "TANH"])
def test_binary(op, act):
    b = rand(1, 1, 5) if op != "DIV" else np.abs(rand(1, 1, 5)) + 0.5
    check(op, [inp("a", rand(2, 3, 5)), const("b", b)], attrs={"fused_activation_function": act})


@pytest.mark.parametrize("op", ["MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"])
def test_plain_binary(op):
    check(op, [inp("a", rand(2, 3, 5)), inp("b", rand(3, 1))])


@pytest.mark.parametrize("op", ["RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH", "ABS",
                                "NEG", "EXP", "SQRT", "RSQRT"])
def test_unary(op):
    x = rand(2, 4, 5) * 4
    if op in ("SQRT", "RSQRT"):
        x = np.abs(x) + 0.1
    check(op, [inp("x", x)])


def test_prelu():
    check("PRELU", [inp("x", rand(1, 4, 5, 3)), const("alpha", rand(1, 1, 3))])


def test_leaky_relu():
    check("LEAKY_RELU", [inp("x", rand(2, 7))], attrs={"alpha": 0.1})


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_softmax(beta):
    check("SOFTMAX", [inp("x", rand(2, 3, 7))], attrs={"beta": beta})


def test_log_softmax():
    check("LOG_SOFTMAX", [inp("x", rand(2, 7))])


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX"])
@pytest.mark.parametrize("axes,keep", [([1, 2], True), ([1, 2], False), ([-1], False)])
def test_reduce(op, axes, keep):
    check(op, [inp("x", rand(2, 4, 5, 3)), const("axes", np.array(axes, np.int32))], attrs={"keep_dims": keep})


def test_arg_max():
    check("ARG_MAX", [inp("x", rand(2, 4, 5)), const("axis", np.array([1], np.int32))],
          attrs={"output_type": "INT32", "_out_dtype": "INT32"})


# --------------------------------------------------------------------------- shapes and copies


def test_pad():
    check("PAD", [inp("x", rand(1, 3, 4, 2)), const("p", np.array([[0, 0], [1, 2], [2, 0], [0, 1]], np.int32))])


def test_padv2():
    check("PADV2", [inp("x", rand(1, 3, 4, 2)), const("p", np.array([[0, 0], [1, 1], [0, 2], [0, 0]], np.int32)),
                    const("v", np.array(-3.5, np.float32))])


def test_reshape():
    check("RESHAPE", [inp("x", rand(2, 3, 4)), const("s", np.array([4, -1], np.int32))],
          attrs={"new_shape": [4, 6]})


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concatenation(axis):
    check("CONCATENATION", [inp("a", rand(2, 3, 4)), inp("b", rand(2, 3, 4))],
          attrs={"axis": axis, "fused_activation_function": "NONE"})


@pytest.mark.parametrize("align,half", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("size", [(8, 10), (3, 5), (7, 7)])
@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
def test_resize(op, align, half, size):
    check(op, [inp("x", rand(1, 4, 5, 3)), const("size", np.array(size, np.int32))],
          attrs={"align_corners": align, "half_pixel_centers": half})


def test_depth_to_space():
    check("DEPTH_TO_SPACE", [inp("x", rand(1, 3, 4, 8))], attrs={"block_size": 2})


def test_space_to_depth():
    check("SPACE_TO_DEPTH", [inp("x", rand(1, 4, 6, 3))], attrs={"block_size": 2})


@pytest.mark.parametrize("begin,end,strides,masks", [
    ([0, 1, 0], [1, 3, 4], [1, 1, 1], {}),
    ([0, 0, 3], [1, 3, 0], [1, 1, -1], {"begin_mask": 1, "end_mask": 4}),
    ([0, 1, 0], [1, 2, 4], [1, 1, 2], {"shrink_axis_mask": 3}),
    ([0, -2, 1], [0, -1, 3], [1, 1, 1], {"begin_mask": 1, "end_mask": 1}),
    ([0, 1], [0, 3], [1, 2], {"ellipsis_mask": 1}),
    ([0, 0, 0], [1, 3, 4], [1, 1, 1], {"new_axis_mask": 2}),
])
def test_strided_slice(begin, end, strides, masks):
    attrs = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0}
    attrs.update(masks)
    check("STRIDED_SLICE", [inp("x", rand(2, 3, 4)), const("b", np.array(begin, np.int32)),
                            const("e", np.array(end, np.int32)), const("s", np.array(strides, np.int32))],
          attrs=attrs)


def test_slice():
    check("SLICE", [inp("x", rand(2, 5, 4)), const("b", np.array([0, 1, 1], np.int32)),
                    const("s", np.array([-1, 3, 2], np.int32))])


def test_transpose():
    check("TRANSPOSE", [inp("x", rand(2, 3, 4)), const("p", np.array([2, 0, 1], np.int32))])


@pytest.mark.parametrize("dims", [[], [0, 2]])
def test_squeeze(dims):
    check("SQUEEZE", [inp("x", rand(1, 3, 1, 4))], attrs={"squeeze_dims": dims} if dims else {})


def test_expand_dims():
    check("EXPAND_DIMS", [inp("x", rand(3, 4)), const("a", np.array([1], np.int32))])


def test_dequantize_float16():
    # A constant-only graph: nothing to feed, LiteRT computes it at invoke.
    model_inputs = [const("w", rand(3, 4).astype(np.float16))]
    expected = run_litert(build_tflite("DEQUANTIZE", model_inputs, 1), [])
    got = run_nnrun("DEQUANTIZE", model_inputs, 1, {})
    assert_close(got[0], expected[0])


def test_gather():
    check("GATHER", [inp("x", rand(5, 4)), const("i", np.array([[0, 4], [2, 2]], np.int32))], attrs={"axis": 0})


def test_gather_axis1():
    check("GATHER", [inp("x", rand(3, 5, 2)), const("i", np.array([4, 0, 1], np.int32))], attrs={"axis": 1})


def test_split():
    check("SPLIT", [const("axis", np.array(1, np.int32)), inp("x", rand(2, 6, 3))], n_outputs=3,
          attrs={"num_splits": 3})


def test_pack_unpack():
    check("PACK", [inp("a", rand(3, 4)), inp("b", rand(3, 4))], attrs={"values_count": 2, "axis": 1})
    check("UNPACK", [inp("x", rand(3, 2, 4))], n_outputs=2, attrs={"num": 2, "axis": 1})


def test_cast():
    check("CAST", [inp("x", rand(3, 4) * 10)], attrs={"in_data_type": "FLOAT32", "out_data_type": "INT32",
                                                     "_out_dtype": "INT32"})


def test_shape():
    check("SHAPE", [inp("x", rand(3, 4))], attrs={"out_type": "INT32", "_out_dtype": "INT32"})


def test_fill():
    check("FILL", [const("d", np.array([2, 3], np.int32)), inp("v", np.array(1.5, np.float32))])


def test_densify():
    from nnrun.ops.tflite.quantize import densify
    dense = np.array([[0, 2, 0, 0], [0, 0, 0, 0], [5, 0, 0, 7]], np.float32)
    sparsity = {"traversal_order": [0, 1], "block_map": [],
                "dim_metadata": [{"format": "DENSE", "dense_size": 3},
                                 {"format": "SPARSE_CSR", "array_segments": np.array([0, 1, 1, 3]),
                                  "array_indices": np.array([1, 0, 3])}]}
    values = np.array([2, 5, 7], np.float32)
    assert np.array_equal(densify(None, values, sparsity, (3, 4)), dense)


@pytest.mark.parametrize("padding,stride,in_hw", [(1, 2, (4, 5)), (2, 2, (4, 5)), (1, 1, (3, 4))])
def test_convolution2d_transpose_bias(padding, stride, in_hw):
    """mediapipe's custom op has no LiteRT kernel here: its oracle is TRANSPOSE_CONV with a bias."""
    import struct
    x, w, bias = rand(1, *in_hw, 3), rand(4, 3, 3, 3), rand(4)
    if padding == 1:
        out_hw = (in_hw[0] * stride, in_hw[1] * stride)
    else:
        out_hw = ((in_hw[0] - 1) * stride + 3, (in_hw[1] - 1) * stride + 3)
    builtin = [const("shape", np.array([1, *out_hw, 4], np.int32)), const("w", w), inp("x", x), const("b", bias)]
    expected = run_litert(build_tflite("TRANSPOSE_CONV", builtin, 1, {
        "padding": "SAME" if padding == 1 else "VALID", "stride_w": stride, "stride_h": stride}), [x])
    options = struct.pack("<3i", padding, stride, stride)
    got = run_nnrun("Convolution2DTransposeBias", [inp("x", x), const("w", w), const("b", bias)], 1,
                    {"custom_options": options}, "tflite.custom")
    assert_close(got[0], expected[0])


def test_transpose_conv_bias_relu():
    x = rand(1, 3, 4, 2)
    check("TRANSPOSE_CONV", [const("shape", np.array([1, 6, 8, 5], np.int32)), const("w", rand(5, 2, 2, 2)),
                             inp("x", x), const("b", rand(5))],
          attrs={"padding": "SAME", "stride_w": 2, "stride_h": 2})


@pytest.mark.parametrize("act", ["RELU", "RELU_N1_TO_1", "TANH"])
def test_conv2d_activations(act, kernels):
    # LiteRT applies a fused activation as a clamp range: TANH is no clamp, so no activation.
    check("CONV_2D", [inp("x", rand(1, 5, 6, 4)), const("w", rand(3, 2, 2, 4)), const("b", rand(3))],
          attrs={"padding": "SAME", "stride_w": 1, "stride_h": 2, "fused_activation_function": act})


def test_grouped_conv2d():
    check("CONV_2D", [inp("x", rand(1, 6, 6, 4)), const("w", rand(6, 3, 3, 2)), const("b", rand(6))],
          attrs={"padding": "SAME", "stride_w": 1, "stride_h": 1})


def test_session_on_tflite_file(tmp_path):
    """The loader's path: a .tflite file through nnrun.InferenceSession."""
    import nnrun
    x = rand(1, 7, 7, 3)
    model = build_tflite("DEPTHWISE_CONV_2D", [inp("x", x), const("w", rand(1, 3, 3, 6)), const("b", rand(6))], 1,
                         {"padding": "SAME", "stride_w": 2, "stride_h": 2, "depth_multiplier": 2,
                          "fused_activation_function": "RELU6"})
    path = tmp_path / "dw.tflite"
    path.write_bytes(model)
    expected = run_litert(model, [x])
    got = nnrun.InferenceSession(str(path)).run(None, {"x": x})
    assert_close(got[0], expected[0])


INT32_OPERANDS = (np.array([7, -7, 7, -7, 2**31 - 1, -2**31 + 1, 0, 5, -2**31 + 1], np.int32),
                  np.array([2, 2, -2, -2, 3, 7, 3, -3, 2**31 - 1], np.int32))


@pytest.mark.parametrize("op", ["DIV", "FLOOR_DIV", "FLOOR_MOD"])
def test_integer_division_matches_litert(op):
    """DIV truncates toward zero, FLOOR_DIV and FLOOR_MOD round down, all exactly, as LiteRT's."""
    a, b = INT32_OPERANDS
    check(op, [inp("a", a), inp("b", b)], attrs={"fused_activation_function": "NONE"} if op == "DIV" else {})


def test_int64_division_stays_in_integers():
    """LiteRT has no int64 DIV; nnrun's truncates exactly, also beyond 2**53 where a double rounds.
    The oracle is Python's integer arithmetic."""
    a = np.array([2**53 + 1, -(2**53 + 1), 2**62 + 3, 7, -7], np.int64)
    b = np.array([1, 1, 3, -2, 2], np.int64)
    (got,) = run_nnrun("DIV", [("a", a, False), ("b", b, False)], 1, {"fused_activation_function": "NONE"})
    want = [abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) for x, y in zip(a.tolist(), b.tolist())]
    assert got.tolist() == want


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
@pytest.mark.parametrize("axes", [[1, -1, 1], []])
def test_reduce_repeated_or_no_axes(op, axes):
    """Repeated axes count once; an empty axes tensor reduces nothing (LiteRT's rules, not ONNX's)."""
    check(op, [inp("x", rand(2, 3, 4)), const("axes", np.array(axes, np.int32))], attrs={"keep_dims": False})


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_reduce_integers(op):
    """Integer sums and means stay integers: MEAN truncates toward zero, as LiteRT's does."""
    x = RNG.integers(-50, 50, (2, 5, 3)).astype(np.int32)
    check(op, [inp("x", x), const("axes", np.array([1], np.int32))], attrs={"keep_dims": True, "_out_dtype": "INT32"})
