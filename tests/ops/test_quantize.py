"""Quantization ops (runtime/ops/quantize.py) and the exotic-type conversions
(runtime/ops/exotic_types.py).

Every op with integer results (QuantizeLinear, DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv) is checked exactly against onnx's reference
evaluator: onnxruntime's integer kernels differ by CPU (its int8 x int8 MatMulInteger saturates
on AVX2 without VNNI). DequantizeLinear, whose results are floats, is checked against
onnxruntime, or the reference evaluator where onnxruntime lacks the type or the opset."""

import ml_dtypes
import numpy as np
import pytest
from oracle import (FLOAT16_RTOL, TensorProto, assert_close, check_node, helper, make_model, rng, run_nnrun,
                    run_reference)

import nnrun
from nnrun import ModelError
from nnrun.ops import exotic_types

F32 = np.float32
I8, U8 = np.int8, np.uint8


def floats(shape, seed=0, scale=10.0, dtype=F32):
    return np.asarray((rng(seed).standard_normal(shape) * scale).astype(dtype))


def ints(shape, dtype, seed=0):
    info = ml_dtypes.iinfo(dtype) if np.dtype(dtype) in exotic_types.SMALL_INTEGERS else np.iinfo(dtype)
    return rng(seed).integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


def scales(shape, seed=1, dtype=F32):
    return np.asarray(rng(seed).uniform(0.05, 0.5, size=shape).astype(dtype))


def check_small_float_output(op_type, inputs, attrs=None, initializers=(), opset=21):
    """check_node for outputs of float8/float4 types, compared as float32 (NaN equal to NaN)."""
    node = helper.make_node(op_type, [n for n, _ in inputs] + [n for n, _ in initializers], ["y"],
                            **(attrs or {}))
    model = make_model([node], inputs, [("y", None)], initializers, opset=opset)
    feeds = dict(inputs)
    (actual,), (expected,) = run_nnrun(model, feeds), run_reference(model, feeds)
    assert actual.dtype == expected.dtype
    assert_close(actual.astype(F32), expected.astype(F32), rtol=0, atol=0)


# --- QuantizeLinear --------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("zp_dtype", [U8, I8, None])
@pytest.mark.parametrize("weights", [False, True])
def test_quantize_per_tensor(opset, zp_dtype, weights):
    x = floats((3, 4, 5))
    # Halves exactly: rounding must be to the nearest even.
    x.flat[:6] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]
    scale = np.array(0.5 if weights else 0.25, F32)
    params = [("s", scale)] + ([("zp", np.array(3, zp_dtype))] if zp_dtype else [])
    if weights:
        check_node("QuantizeLinear", [("x", x)], initializers=params, opset=opset)
    else:
        check_node("QuantizeLinear", [("x", x)] + params, opset=opset)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("zp_dtype", [U8, I8])
def test_quantize_per_axis(axis, zp_dtype):
    x = floats((3, 4, 5))
    n = x.shape[axis]
    check_node("QuantizeLinear", [("x", x)], {"axis": axis},
               initializers=[("s", scales(n)), ("zp", ints(n, zp_dtype))], opset=13)


@pytest.mark.parametrize("dtype", [I8, U8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4])
def test_quantize_wide_and_4bit_types(dtype):
    x = floats((4, 6), scale=30 if np.dtype(dtype).itemsize == 1 else 3000)
    zp = np.array(1, dtype)
    check_node("QuantizeLinear", [("x", x)], initializers=[("s", np.array(0.7, F32)), ("zp", zp)],
               opset=21, oracle="reference")


@pytest.mark.parametrize("shape,axis,block", [((4, 6), 1, 2), ((4, 7), 1, 3), ((6, 4), 0, 4),
                                              ((2, 5, 3), -2, 2)])
@pytest.mark.parametrize("dtype", [I8, ml_dtypes.int4])
def test_quantize_blocked(shape, axis, block, dtype):
    x = floats(shape)
    s_shape = list(shape)
    s_shape[axis] = -(-shape[axis] // block)
    check_node("QuantizeLinear", [("x", x)], {"axis": axis, "block_size": block},
               initializers=[("s", scales(s_shape)), ("zp", ints(s_shape, dtype))],
               opset=21, oracle="reference")


def test_quantize_output_dtype_without_zero_point():
    check_node("QuantizeLinear", [("x", floats((3, 4))), ("s", np.array(0.1, F32))],
               {"output_dtype": TensorProto.INT8}, opset=21)


@pytest.mark.parametrize("dtype", ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(dtype, saturate):
    x = floats((3, 5), scale=100)
    x.flat[:4] = [1e6, -1e6, np.inf, np.nan]
    zp = np.zeros((), exotic_types.DTYPES[getattr(TensorProto, dtype)])
    check_small_float_output("QuantizeLinear", [("x", x)], {"saturate": saturate},
                             initializers=[("s", np.array(0.5, F32)), ("zp", zp)], opset=19)


def test_quantize_float4():
    x = floats((3, 5))
    zp = np.zeros((), ml_dtypes.float4_e2m1fn)
    check_small_float_output("QuantizeLinear", [("x", x)],
                             initializers=[("s", np.array(2.0, F32)), ("zp", zp)], opset=23)


def test_quantize_float16_input_and_scale():
    x = floats((4, 4), dtype=np.float16)
    check_node("QuantizeLinear", [("x", x)],
               initializers=[("s", np.array(0.25, np.float16)), ("zp", np.array(128, U8))], opset=19)


def test_quantize_scale_not_along_axis_raises():
    node = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1)
    model = make_model([node], [("x", floats((3, 4)))], [("y", None)],
                       [("s", scales(3)), ("zp", ints(3, U8))], opset=13)
    with pytest.raises(ModelError, match="QuantizeLinear"):
        run_nnrun(model, {"x": floats((3, 4))})


# --- DequantizeLinear ------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("dtype", [U8, I8, np.int32])
@pytest.mark.parametrize("with_zp", [False, True])
def test_dequantize_per_tensor(opset, dtype, with_zp):
    x = ints((3, 4, 5), dtype)
    params = [("s", np.array(0.3, F32))]
    if with_zp:
        params.append(("zp", np.array(0 if dtype == np.int32 else 5, dtype)))
    check_node("DequantizeLinear", [("x", x)] + params, opset=opset)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_dequantize_per_axis(axis):
    x = ints((3, 4, 5), I8)
    n = x.shape[axis]
    check_node("DequantizeLinear", [("x", x)], {"axis": axis},
               initializers=[("s", scales(n)), ("zp", ints(n, I8))], opset=13)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4,
                                   ml_dtypes.int2, ml_dtypes.uint2])
def test_dequantize_wide_and_small_types(dtype):
    x = ints((4, 6), dtype)
    check_node("DequantizeLinear", [],
               initializers=[("x", x), ("s", np.array(0.7, F32)), ("zp", np.array(1, dtype))],
               opset=25, oracle="reference")


@pytest.mark.parametrize("shape,axis,block", [((4, 6), 1, 2), ((4, 7), 1, 3), ((5, 4), 0, 2)])
def test_dequantize_blocked(shape, axis, block):
    s_shape = list(shape)
    s_shape[axis] = -(-shape[axis] // block)
    check_node("DequantizeLinear", [("x", ints(shape, U8))], {"axis": axis, "block_size": block},
               initializers=[("s", scales(s_shape)), ("zp", ints(s_shape, U8))],
               opset=21, oracle="reference")


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn])
def test_dequantize_small_floats(dtype):
    x = floats((3, 4), scale=2).astype(dtype)
    check_node("DequantizeLinear", [], initializers=[("x", x), ("s", np.array(2.0, F32))],
               opset=23, oracle="reference")


@pytest.mark.parametrize("scale_dtype,output_dtype", [(np.float16, 0), (F32, TensorProto.FLOAT16),
                                                      (np.float16, TensorProto.FLOAT)])
def test_dequantize_output_types(scale_dtype, output_dtype):
    attrs = {"output_dtype": output_dtype} if output_dtype else {}
    check_node("DequantizeLinear", [("x", ints((4, 5), U8))], attrs,
               initializers=[("s", np.array(0.125, scale_dtype)), ("zp", np.array(7, U8))],
               opset=23, oracle="reference", rtol=FLOAT16_RTOL)


# --- DynamicQuantizeLinear -------------------------------------------------------------------

@pytest.mark.parametrize("shift", [0.0, 50.0, -50.0])
def test_dynamic_quantize(shift):
    x = floats((3, 7)) + F32(shift)
    check_node("DynamicQuantizeLinear", [("x", x)], n_outputs=3, opset=11)


def test_dynamic_quantize_constant_input():
    # All zeros: the spec's scale is 0 / 255, which quantizes nothing. onnxruntime's rule
    # (`scale = max == min ? 1.0f : ...`) gives 1.0, and nnrun follows it; the reference
    # evaluator divides that 1.0 by 255 again.
    x = np.zeros((2, 3), F32)
    model = make_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"])], [("x", x)],
                       [(n, None) for n in ("y", "s", "zp")], opset=11)
    y, s, zp = run_nnrun(model, {"x": x})
    assert_close(y, np.zeros((2, 3), U8))
    assert_close(s, np.array(1.0, F32))
    assert_close(zp, np.array(0, U8))


# --- MatMulInteger and QLinearMatMul ---------------------------------------------------------

@pytest.mark.parametrize("a_shape,b_shape", [((3, 5), (5, 4)), ((2, 3, 5), (5, 4)),
                                             ((2, 3, 5), (2, 5, 4)), ((5,), (5, 4))])
@pytest.mark.parametrize("b_dtype", [U8, I8])
@pytest.mark.parametrize("weights", [False, True])
def test_matmul_integer(a_shape, b_shape, b_dtype, weights):
    a, b = ints(a_shape, U8), ints(b_shape, b_dtype, seed=1)
    zps = [("a_zp", np.array(12, U8)), ("b_zp", np.array(3, b_dtype))]
    if weights:
        check_node("MatMulInteger", [("a", a)], initializers=[("b", b)] + zps, opset=10)
    else:
        check_node("MatMulInteger", [("a", a), ("b", b)] + zps, opset=10)


def test_matmul_integer_per_column_zero_points():
    a, b = ints((3, 5), U8), ints((5, 4), U8, seed=1)
    check_node("MatMulInteger", [("a", a), ("b", b), ("a_zp", np.array(9, U8)), ("b_zp", ints(4, U8, 3))],
               opset=10)


def test_matmul_integer_without_zero_points_long_inner_dim():
    # K large enough that float32 accumulation would not be exact.
    a, b = ints((2, 600), U8), ints((600, 3), U8, seed=1)
    check_node("MatMulInteger", [("a", a), ("b", b)], opset=10)


@pytest.mark.parametrize("opset,scale_dtype", [(10, F32), (21, F32), (21, np.float16)])
@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("a_shape", [(3, 5), (2, 3, 5)])
def test_qlinear_matmul(opset, scale_dtype, dtype, a_shape):
    a, b = ints(a_shape, dtype), ints((5, 4), dtype, seed=1)
    s = lambda v: np.array(v, scale_dtype)  # noqa: E731
    check_node("QLinearMatMul", [("a", a), ("as", s(0.05)), ("azp", np.array(3, dtype)), ("b", b),
                                 ("bs", s(0.02)), ("bzp", np.array(-2 if dtype == I8 else 100, dtype)),
                                 ("ys", s(0.3)), ("yzp", np.array(10, dtype))], opset=opset)


def test_qlinear_matmul_per_column_weights():
    a, b = ints((3, 5), U8), ints((5, 4), U8, seed=1)
    check_node("QLinearMatMul", [("a", a), ("as", np.array(0.05, F32)), ("azp", np.array(3, U8))],
               initializers=[("b", b), ("bs", scales(4)), ("bzp", ints(4, U8, 3)),
                             ("ys", np.array(0.3, F32)), ("yzp", np.array(10, U8))], opset=10)


# --- ConvInteger and QLinearConv -------------------------------------------------------------

CONVS = [
    ({}, (1, 2, 5, 5), (3, 2, 3, 3)),
    ({"pads": [1, 1, 1, 1]}, (2, 2, 5, 5), (3, 2, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 0, 1, 0]}, (1, 3, 6, 7), (4, 3, 3, 2)),
    ({"group": 2}, (1, 4, 5, 5), (6, 2, 3, 3)),
    ({"group": 3}, (1, 3, 5, 5), (3, 1, 3, 3)),
    ({}, (1, 4, 5, 5), (3, 4, 1, 1)),
    ({"auto_pad": "SAME_UPPER"}, (1, 2, 6, 6), (2, 2, 3, 3)),
    ({"dilations": [2, 2], "pads": [2, 1, 2, 1]}, (1, 2, 6, 6), (2, 2, 3, 3)),
]


@pytest.mark.parametrize("attrs,x_shape,w_shape", CONVS, ids=str)
@pytest.mark.parametrize("weights", [False, True])
def test_conv_integer(attrs, x_shape, w_shape, weights):
    x, w = ints(x_shape, U8), ints(w_shape, U8, seed=1)
    zps = [("xzp", np.array(100, U8)), ("wzp", np.array(7, U8))]
    if weights:
        check_node("ConvInteger", [("x", x)], attrs, initializers=[("w", w)] + zps, opset=10)
    else:
        check_node("ConvInteger", [("x", x), ("w", w)] + zps, attrs, opset=10)


def test_conv_integer_without_zero_points():
    check_node("ConvInteger", [("x", ints((1, 2, 4, 4), U8)), ("w", ints((2, 2, 2, 2), U8, 1))], opset=10)


@pytest.mark.parametrize("attrs,x_shape,w_shape", CONVS, ids=str)
@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(attrs, x_shape, w_shape, dtype, per_channel):
    x, w = ints(x_shape, dtype), ints(w_shape, I8 if dtype == I8 else U8, seed=1)
    c_out = w_shape[0]
    w_scale = scales(c_out) if per_channel else np.array(0.02, F32)
    w_zp = np.zeros(c_out if per_channel else (), w.dtype)
    if w.dtype == U8:
        w_zp = w_zp + np.uint8(5)
    bias = rng(4).integers(-500, 500, size=c_out).astype(np.int32)
    check_node("QLinearConv", [("x", x), ("xs", np.array(0.05, F32)), ("xzp", np.array(4, dtype))],
               attrs, initializers=[("w", w), ("ws", w_scale), ("wzp", w_zp), ("ys", np.array(0.4, F32)),
                                    ("yzp", np.array(20, dtype)), ("b", bias)], opset=10)


@pytest.mark.parametrize("op_type", ["ConvInteger", "QLinearConv"])
@pytest.mark.parametrize("weights", [False, True])
def test_quantized_convolutions_as_shifted_gemms(monkeypatch, op_type, weights):
    """Every stride-1 2-D convolution of one group shifted (the thresholds at 0): a constant weight
    is packed tap-major once, a fed one arranged on each run; exact against the reference."""
    from nnrun.ops import conv_core

    for limit in ("SHIFTED_MIN_PIXELS", "SHIFTED_MIN_CHANNELS", "SHIFTED_MIN_OUT_CHANNELS"):
        monkeypatch.setattr(conv_core, limit, 0)
    monkeypatch.delenv("NNRUN_JIT", raising=False)  # compiled, 2 channels would take another kernel
    x, w = ints((2, 2, 6, 7), U8), ints((3, 2, 3, 3), U8, seed=1)
    attrs = {"pads": [1, 0, 1, 2]}
    if op_type == "ConvInteger":
        zps = [("xzp", np.array(100, U8)), ("wzp", np.array(7, U8))]
        inputs, params = [("x", x)], [("w", w)] + zps
    else:
        zps = [("ws", np.array(0.02, F32)), ("wzp", np.array(5, U8)), ("ys", np.array(0.4, F32)),
               ("yzp", np.array(20, U8))]
        inputs, params = [("x", x), ("xs", np.array(0.05, F32)), ("xzp", np.array(4, U8))], [("w", w)] + zps
    if not weights:
        inputs, params = inputs + params, []
    model = make_model([helper.make_node(op_type, [n for n, _ in inputs + params], ["y"], **attrs)],
                       inputs, [("y", None)], params, opset=10)
    sess = nnrun.InferenceSession(model.SerializeToString())
    feeds = {n: a for n, a in inputs}
    np.testing.assert_array_equal(sess.run(None, feeds)[0], run_reference(model, feeds)[0])
    kernel = sess.plan().steps[0].kernel
    assert kernel.plan.method == "gemm-shifted"
    assert (kernel.w_packed is not None and kernel.w_packed.shape == (9, 3, 2)) == weights


# --- exotic_types: conversions against the reference evaluator's Cast ------------------------

def reference_cast(x, to, **attrs):
    node = helper.make_node("Cast", ["x"], ["y"], to=to, **attrs)
    model = make_model([node], [("x", x)], [("y", None)], opset=25)
    return run_reference(model, {"x": x})[0]


SPECIALS = np.array([0.0, -0.0, 0.3, -1.7, 2.5, 3.5, 300.0, -300.0, 460.0, 5e4, 6e4, 1e6, -1e6,
                     np.inf, -np.inf, np.nan, 1e-3, 1e-8], F32)


@pytest.mark.parametrize("name", ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
                                  "FLOAT4E2M1", "INT4", "UINT4", "INT2", "UINT2"])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("source", [F32, np.float16, np.float64])
def test_convert_into_matches_reference_cast(name, saturate, source):
    code = getattr(TensorProto, name)
    with np.errstate(over="ignore"):  # float16 overflows to infinity, which is a case too
        x = SPECIALS.astype(source)
    if name in ("INT4", "UINT4", "INT2", "UINT2"):
        x = x[np.isfinite(x) & (np.abs(x) < 100)]  # out of range is undefined for integers
    expected = reference_cast(x, code, saturate=saturate)
    out = np.empty(x.shape, exotic_types.DTYPES[code])
    exotic_types.convert_into(out, x, saturate=bool(saturate))
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_e8m0_matches_reference_cast(round_mode, saturate):
    # Finite inputs only: for infinity the spec (E8M0_MAX when saturating) and the
    # reference evaluator (NaN) disagree, and nnrun follows the spec.
    x = np.array([0.0, 0.124, 0.25, 0.5, 0.75, 1.1, 1.5, 2.0, 3.0, 4.0, 8.0, 1e-39, 1e38, 3e38], F32)
    expected = reference_cast(x, TensorProto.FLOAT8E8M0, saturate=saturate, round_mode=round_mode)
    out = np.empty(x.shape, exotic_types.FLOAT8E8M0)
    exotic_types.convert_into(out, x, saturate=bool(saturate), round_mode=round_mode)
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_e8m0_saturates_infinity_per_spec():
    codes = exotic_types.e8m0_codes(np.array([np.inf, np.nan], F32), saturate=True)
    assert codes.tolist() == [0xFE, 0xFF]


def test_dtype_mapping_matches_onnx():
    for code, dtype in exotic_types.DTYPES.items():
        assert np.dtype(helper.tensor_dtype_to_np_dtype(code)) == dtype
        assert exotic_types.numpy_dtype(code) == dtype and exotic_types.is_exotic(dtype)
    assert exotic_types.numpy_dtype(TensorProto.FLOAT) is None
