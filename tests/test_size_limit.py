"""SessionOptions.max_tensor_bytes (size_limit.py): the default, what a session does with it, and the
checks every size goes through. Behaviour only; the hostile models themselves are in
compiler/test_sizes_at_prepare.py (sizes the file fixes) and executor/test_sizes_at_execute.py
(sizes a run's values decide)."""

import numpy as np
import pytest
from onnx import helper
from oracle import assert_close, make_model, run_onnxruntime

import nnrun
from nnrun import size_limit
from nnrun.errors import ModelError, SizeLimitError


def test_default_is_half_the_memory_or_of_the_cgroup_limit():
    gib = 1 << 30
    assert size_limit.default_max_tensor_bytes(physical=16 * gib, cgroup=lambda: None) == 8 * gib
    assert size_limit.default_max_tensor_bytes(physical=16 * gib, cgroup=lambda: (4 * gib, gib)) == 2 * gib
    assert size_limit.default_max_tensor_bytes(physical=16 * gib, cgroup=lambda: (64 * gib, gib)) == 8 * gib


def test_resolve():
    assert size_limit.resolve(1000) == 1000
    assert size_limit.resolve(np.int64(1000)) == 1000
    assert size_limit.resolve(None) == size_limit.default_max_tensor_bytes()
    for wrong in (0, -5, True, "1G", 1.5):
        with pytest.raises(nnrun.InputError, match="max_tensor_bytes"):
            size_limit.resolve(wrong)


def test_tensor_bytes_in_python_ints():
    assert size_limit.tensor_bytes((2, 3), np.float32, limit=24) == 24
    assert size_limit.tensor_bytes((np.int64(2), 3), np.float64, limit=100) == 48
    # A zero dim: no bytes, however large the others.
    assert size_limit.tensor_bytes((1 << 62, 1 << 62, 0), np.float32, limit=1) == 0
    # numpy's int64 product of these dims is 0: Python's is what the message gives.
    assert int(np.prod(np.array([1 << 62, 1 << 62, 4], np.int64))) == 0
    with pytest.raises(SizeLimitError) as e:
        size_limit.tensor_bytes((1 << 62, 1 << 62, 4), np.float32, "output 'y'", limit=1 << 40)
    assert str(e.value) == (f"output 'y' of shape [{1 << 62}, {1 << 62}, 4] float32 would take "
                            f"{(1 << 128):,} bytes, beyond max_tensor_bytes ({1 << 40:,})")
    with pytest.raises(SizeLimitError, match="25 bytes"):
        size_limit.tensor_bytes((5, 5), np.uint8, limit=24)
    with pytest.raises(ModelError, match="negative dimension") as e:
        size_limit.tensor_bytes((2, -1), np.float32, limit=100)
    assert not isinstance(e.value, SizeLimitError)
    with pytest.raises(ModelError, match="not an integer"):
        size_limit.tensor_bytes((2, 1.5), np.float32, limit=100)


def test_held_bytes_counts_a_header_per_tensor():
    assert size_limit.held_bytes(10, 40, "the sequence", limit=10_000) == 40 + 10 * size_limit.ELEMENT_OVERHEAD
    with pytest.raises(SizeLimitError, match="the sequence would hold 100 tensors"):
        size_limit.held_bytes(100, 0, "the sequence", limit=10_000)


def test_the_limit_in_force():
    with size_limit.in_force(123):
        assert size_limit.current() == 123
        with size_limit.in_force(None):
            assert size_limit.current() == size_limit.default_max_tensor_bytes()
        assert size_limit.current() == 123


def _relu_expand_model():
    """x (2, 3) -> Relu -> Expand to (4, 2, 3) -> y: tensors of 24 and 96 bytes."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Expand", ["r", "shape"], ["y"], name="widen")]
    return make_model(nodes, [("x", (np.float32, [2, 3]))], [("y", None)],
                      [("shape", np.array([4, 2, 3], np.int64))])


def test_a_low_limit_refuses_a_normal_model_and_names_the_tensor():
    model = _relu_expand_model()
    options = nnrun.SessionOptions()
    options.max_tensor_bytes = 50
    with pytest.raises(SizeLimitError) as e:
        nnrun.InferenceSession(model.SerializeToString(), sess_options=options)
    assert str(e.value) == ("PREPARE/infer_shapes: node 'widen' (Expand, #1): output 'y' of shape [4, 2, 3] "
                            "float32 would take 96 bytes, beyond max_tensor_bytes (50)")
    options.max_tensor_bytes = 20
    with pytest.raises(SizeLimitError, match=r"^PREPARE/infer_shapes: input 'x' of shape \[2, 3\] float32 would "
                                             r"take 24 bytes, beyond max_tensor_bytes \(20\)$"):
        nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


def test_a_limit_that_fits_changes_nothing():
    model = _relu_expand_model()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    options = nnrun.SessionOptions()
    options.max_tensor_bytes = 96
    (y,) = nnrun.InferenceSession(model.SerializeToString(), sess_options=options).run(None, {"x": x})
    assert_close(y, run_onnxruntime(model, {"x": x})[0])


def test_size_limit_error_is_a_model_error_and_onnxruntimes_classes():
    from nnrun.capi.onnxruntime_pybind11_state import Fail, InvalidGraph

    assert issubclass(SizeLimitError, ModelError)
    assert issubclass(SizeLimitError, InvalidGraph) and issubclass(SizeLimitError, Fail)
    assert nnrun.SizeLimitError is SizeLimitError
