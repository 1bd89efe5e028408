"""Activations as numba compiles them (`compiled_kernels`): a convolution's bias and activation
against onnx's reference evaluator or onnxruntime (Add of the bias, then the activation node), erf
and GELU against onnxruntime; each also to the bit against numpy's formulas, which the compiled
kernels compute in the same order and type; special values included."""

import numpy as np
import pytest
from compiled import needs_numba
from oracle import assert_close, helper, make_model, run_onnxruntime, run_reference

import nnrun
from nnrun.ops import conv_core, elementwise, jit

pytestmark = needs_numba

ACTIVATIONS = [
    None,
    ("Relu", {}, {}),
    ("Clip", {"min": -0.5, "max": 0.5}, {}),
    ("Clip", {"min": None, "max": 0.5}, {}),
    # Parameters a float32 attribute holds exactly, so that float64 cases compare to the bit.
    ("LeakyRelu", {"alpha": 0.25}, {"alpha": 0.25}),
    ("LeakyRelu", {"alpha": 1.5}, {"alpha": 1.5}),
    ("HardSigmoid", {"alpha": 0.375, "beta": 0.625}, {"alpha": 0.375, "beta": 0.625}),
    ("HardSwish", {}, {}),
]


@pytest.fixture
def epilogue(monkeypatch):
    monkeypatch.setenv("NNRUN_JIT", "1")
    monkeypatch.setattr(conv_core, "EPILOGUE_MIN", 0)  # the cases are small
    return lambda dtype: jit.epilogue_kernel(dtype)


def _values(shape, dtype, seed=0):
    """Values over the activations' bends (HardSwish's -3 and 3), and the special ones."""
    x = np.random.default_rng(seed).uniform(-5, 5, shape).astype(dtype)
    flat = x.reshape(-1)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -3, 3, np.finfo(dtype).max, -np.finfo(dtype).max], dtype)
    flat[:special.size] = special
    return x


def _reference(x, bias, activation, channel_axis):
    shape = [1] * x.ndim
    shape[channel_axis] = bias.size
    nodes = [helper.make_node("Add", ["x", "b"], ["s"])]
    inits = [("b", bias.reshape(shape))]
    if activation is None:
        nodes.append(helper.make_node("Identity", ["s"], ["y"]))
    elif activation[0] == "Clip":
        bounds = activation[1]
        nodes.append(helper.make_node("Clip", ["s"] + [k if bounds[k] is not None else "" for k in ("min", "max")],
                                      ["y"]))
        inits += [(k, np.array(v, x.dtype)) for k, v in bounds.items() if v is not None]
    else:
        nodes.append(helper.make_node(activation[0], ["s"], ["y"], **activation[2]))
    model = make_model(nodes, [("x", x)], [("y", None)], inits)
    # Clip without a bound clamps +-inf to the type's limits in onnxruntime (and nnrun), where the
    # reference evaluator keeps them.
    oracle = run_onnxruntime if activation is not None and activation[0] == "Clip" else run_reference
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and the like, on purpose
        return oracle(model, {"x": x})[0]


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: "bias only" if a is None else f"{a[0]} {a[1]}")
@pytest.mark.parametrize("layout", [conv_core.CHANNELS_FIRST, conv_core.CHANNELS_LAST])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_bias_and_activation(epilogue, activation, layout, dtype):
    kernel = epilogue(dtype)
    assert kernel is not None
    fused = None if activation is None else activation[:2]
    shape = (2, 5, 4, 3) if layout == conv_core.CHANNELS_FIRST else (2, 4, 3, 5)
    channel_axis = 1 if layout == conv_core.CHANNELS_FIRST else 3
    x = _values(shape, dtype)
    bias = np.random.default_rng(1).uniform(-1, 1, 5).astype(dtype)
    compiled, numpy_made = x.copy(), x.copy()
    conv_core._bias_activation(compiled, bias, fused, layout, epilogue=kernel)
    with np.errstate(invalid="ignore", over="ignore"):  # as the executor runs kernels
        conv_core._bias_activation(numpy_made, bias, fused, layout)
    expected = _reference(x, bias, activation, channel_axis)
    rtol, atol = (1e-6, 0) if dtype == np.float32 else (1e-12, 0)
    if dtype == np.float64 and fused is not None and fused[0] == "HardSwish":
        atol = 1e-7  # the reference evaluator's 1/6 is a float32's, which x / 6 + 1/2 near -3 shows
    np.testing.assert_allclose(compiled, expected, rtol=rtol, atol=atol)
    # numpy's formulas, to the bit (NaN where they give NaN)
    assert np.array_equal(compiled.view(f"u{compiled.itemsize}"), numpy_made.view(f"u{numpy_made.itemsize}"))


def test_an_unbatched_output_and_no_bias(epilogue):
    # The depthwise paths' channel blocks: (channels, *spatial), each channel's rows its own.
    x = _values((4, 3, 3), np.float32)
    compiled, numpy_made = x.copy(), x.copy()
    conv_core._bias_activation(compiled, None, ("HardSwish", {}), conv_core.CHANNELS_FIRST, batched=False,
                               epilogue=epilogue(np.float32))
    with np.errstate(invalid="ignore"):
        conv_core._bias_activation(numpy_made, None, ("HardSwish", {}), conv_core.CHANNELS_FIRST, batched=False)
    assert np.array_equal(compiled.view(np.uint32), numpy_made.view(np.uint32))


def test_small_outputs_go_to_numpy_unless_numpy_takes_several_passes(epilogue, monkeypatch):
    monkeypatch.setattr(conv_core, "EPILOGUE_MIN", 100)
    calls = []
    monkeypatch.setattr(conv_core, "_compiled_epilogue", lambda *a: calls.append(a[3]) or True)
    for size, activation in ((99, ("Relu", {})), (100, ("Relu", {})), (99, ("HardSwish", {})), (99, None)):
        conv_core._bias_activation(np.zeros((1, 1, size), np.float32), np.zeros(1, np.float32), activation,
                                   conv_core.CHANNELS_FIRST, epilogue=epilogue(np.float32))
    assert calls == [("Relu", {}), ("HardSwish", {})]


def test_activations_it_lacks_and_outputs_not_contiguous_go_to_numpy(epilogue):
    kernel = epilogue(np.float32)
    x = _values((1, 4, 6), np.float32)
    assert not conv_core._compiled_epilogue(kernel, x.copy(), None, ("Sigmoid", {}), conv_core.CHANNELS_FIRST, True)
    assert not conv_core._compiled_epilogue(kernel, x[:, :, ::2], None, ("Relu", {}), conv_core.CHANNELS_FIRST,
                                            True)
    assert conv_core._compiled_epilogue(kernel, x.copy(), None, ("Relu", {}), conv_core.CHANNELS_FIRST, True)


SPECIALS = np.array([np.inf, -np.inf, np.nan, 100, -100, 0, -0.0, 1e-30, -3, 3, 4, -4, 4.0001, -4.0001], np.float32)


@pytest.mark.parametrize("op", ["Erf", "Gelu"])
@pytest.mark.parametrize("x", [SPECIALS, np.random.default_rng(3).standard_normal((3, 70_001)).astype(np.float32) * 3],
                         ids=["special values", "several shares"])
def test_compiled_erf_and_gelu(monkeypatch, op, x):
    monkeypatch.setattr(elementwise, "COMPILED_SHARE", 1000)  # ranges on both threads
    model = make_model([helper.make_node(op, ["x"], ["y"])], [("x", x)], [("y", None)], opset=20)
    (expected,) = run_onnxruntime(model, {"x": x})
    made = {}
    for kind in ("numpy", "compiled"):
        monkeypatch.setenv("NNRUN_JIT", "1" if kind == "compiled" else "0")
        options = nnrun.SessionOptions()
        options.intra_op_num_threads = 2
        sess = nnrun.InferenceSession(model.SerializeToString(), options)
        (made[kind],) = sess.run(None, {"x": x})
        kernel = sess._last.steps[0].kernel
        assert (kernel.compiled is not None) == (kind == "compiled")
    assert_close(made["compiled"], expected, rtol=1e-5)
    assert np.array_equal(made["compiled"].view(np.uint32), made["numpy"].view(np.uint32))
