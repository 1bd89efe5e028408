"""BitCast against onnxruntime (the reference evaluator for the 4-bit types, which onnxruntime
does not bitcast): bits are compared exactly, NaN payloads and negative zeros included."""

import ml_dtypes
import numpy as np
import pytest

import nnrun
from oracle import TensorProto, check_node, helper, make_model, rng


def bit_patterns(dtype, shape, seed=0):
    """Random bits of `dtype`: every pattern, NaNs, infinities and negative zeros among them."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng(seed).integers(0, 2, shape).astype(np.bool_)
    raw = rng(seed).integers(0, 256, (*shape, dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


PAIRS = [(np.float32, TensorProto.INT32), (np.float32, TensorProto.UINT32), (np.int32, TensorProto.FLOAT),
         (np.uint32, TensorProto.INT32), (np.float64, TensorProto.INT64), (np.int64, TensorProto.DOUBLE),
         (np.uint64, TensorProto.DOUBLE), (np.float16, TensorProto.INT16), (np.float16, TensorProto.UINT16),
         (np.uint16, TensorProto.FLOAT16), (np.int8, TensorProto.UINT8), (np.uint8, TensorProto.INT8),
         (np.int32, TensorProto.UINT32)]
# onnxruntime has no BitCast of bool, and cannot hand a bfloat16 output to numpy.
REFERENCE_PAIRS = [(np.float16, TensorProto.BFLOAT16), (np.bool_, TensorProto.UINT8), (np.bool_, TensorProto.INT8)]


def pair_id(p):
    return str(np.dtype(p)) if isinstance(p, type) else TensorProto.DataType.Name(p).lower()


@pytest.mark.parametrize("shape", [(), (0,), (7,), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("source,to", PAIRS + REFERENCE_PAIRS, ids=pair_id)
def test_bitcast(source, to, shape):
    oracle = "reference" if (source, to) in REFERENCE_PAIRS else "onnxruntime"
    check_node("BitCast", [("x", bit_patterns(source, shape))], {"to": to}, opset=26, oracle=oracle)


def test_bitcast_special_floats():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3.4e38], np.float32)
    check_node("BitCast", [("x", x)], {"to": TensorProto.INT32}, opset=26)


@pytest.mark.parametrize("source,to", [(ml_dtypes.int4, TensorProto.UINT4), (ml_dtypes.uint4, TensorProto.INT4),
                                       (ml_dtypes.uint4, TensorProto.FLOAT4E2M1)])
def test_bitcast_4bit(source, to):
    values = np.arange(16) if np.dtype(source) == np.dtype(ml_dtypes.uint4) else np.arange(-8, 8)
    check_node("BitCast", [("x", values.astype(source))], {"to": to}, opset=26, oracle="reference")


def test_bitcast_of_a_weight():
    # A weight folds at PREPARE: the folded value must be the same bits.
    w = bit_patterns(np.float32, (3, 4), seed=3)
    node = helper.make_node("BitCast", ["w"], ["y"], to=TensorProto.INT32)
    model = make_model([node], [], [("y", None)], initializers=[("w", w)], opset=26)
    (y,) = nnrun.InferenceSession(model.SerializeToString()).run(None, {})
    np.testing.assert_array_equal(y, w.view(np.int32))  # the spec's definition: the same bytes


@pytest.mark.parametrize("source,to", [(np.float32, TensorProto.INT16), (np.int8, TensorProto.INT4),
                                       (np.float64, TensorProto.FLOAT)])
def test_bitcast_between_widths_is_refused(source, to):
    node = helper.make_node("BitCast", ["x"], ["y"], to=to)
    model = make_model([node], [("x", np.zeros(3, source))], [("y", None)], opset=26)
    with pytest.raises(nnrun.ModelError, match="widths must be equal"):
        nnrun.InferenceSession(model.SerializeToString())
