"""Sizes a model file fixes, checked at PREPARE against max_tensor_bytes before anything of that size
is allocated or looped over (compiler/build.py infer_shapes and prepare_kernels, the shape rules'
sane_shape, the convolution planner): hostile one-node models, each refused with a SizeLimitError
naming the node, the shape, the bytes and the limit, and quickly (the bound below is a hang check
with room for a loaded machine, not a speed measurement)."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracle import make_model

import nnrun
from nnrun.errors import SizeLimitError

LIMIT = 1 << 30  # the tests' max_tensor_bytes, whatever the machine's memory
HANG_BOUND_S = 1.0


def i64(*values):
    return np.array(values, np.int64)


def refused(model, feeds=None, limit=LIMIT, error=SizeLimitError):
    """The message of the error a session on `model` raises (made, then run on `feeds`), within
    HANG_BOUND_S; `limit` None: the default max_tensor_bytes."""
    options = nnrun.SessionOptions()
    options.max_tensor_bytes = limit
    started = time.perf_counter()
    with pytest.raises(error) as e:
        nnrun.InferenceSession(model.SerializeToString(), sess_options=options).run(None, feeds or {})
    elapsed = time.perf_counter() - started
    assert elapsed < HANG_BOUND_S, f"{elapsed:.2f} s: {e.value}"
    return str(e.value)


def one_node(op, inputs, feeds=(), initializers=(), opset=17, **attrs):
    """A model of one node named 'hostile': `feeds` are (name, dtype, shape) graph inputs."""
    node = helper.make_node(op, inputs, ["y"], name="hostile", **attrs)
    return make_model([node], [(n, (d, s)) for n, d, s in feeds], [("y", None)], list(initializers), opset=opset)


X4 = [("x", np.float32, [1, 1, 4, 4])]
W3 = [("w", np.ones((1, 1, 3, 3), np.float32))]

HOSTILE = {
    "ConstantOfShape [2^35]": (one_node("ConstantOfShape", ["s"], initializers=[("s", i64(1 << 35))]),
                               "[34359738368] float32", 1 << 37),
    "Expand to [2^20, 2^20]": (one_node("Expand", ["x", "s"], [("x", np.float32, [1])], [("s", i64(1 << 20, 1 << 20))]),
                               "[1048576, 1048576] float32", 1 << 42),
    "Tile repeats 2^30": (one_node("Tile", ["x", "r"], [("x", np.float32, [4])], [("r", i64(1 << 30))]),
                          "[4294967296] float32", 1 << 34),
    "Range(0, 2^40, 1)": (one_node("Range", ["a", "b", "c"], initializers=[
        ("a", np.array(0, np.int64)), ("b", np.array(1 << 40, np.int64)), ("c", np.array(1, np.int64))]),
        "[1099511627776] int64", 1 << 43),
    "Pad pads 2^30": (one_node("Pad", ["x", "p"], [("x", np.float32, [1, 1])], [("p", i64(1 << 30, 0, 1 << 30, 0))]),
                      "[2147483649, 1] float32", (2 * (1 << 30) + 1) * 4),
    "Resize scales 1e9": (one_node("Resize", ["x", "", "s"], X4, [("s", np.array([1, 1, 1e9, 1e9], np.float32))]),
                          "[1, 1, 4000000000, 4000000000] float32", 4 * 4_000_000_000 ** 2),
    "Upsample scales 1e9": (one_node("Upsample", ["x", "s"], X4, [("s", np.array([1, 1, 1e9, 1e9], np.float32))],
                                     opset=9), "[1, 1, 4000000000, 4000000000] float32", 4 * 4_000_000_000 ** 2),
    "Conv pads 2^30": (one_node("Conv", ["x", "w"], X4, W3, pads=[1 << 30] * 4),
                       "[1, 1, 2147483650, 2147483650] float32", 4 * 2147483650 ** 2),
    "Conv input dim 2^40": (one_node("Conv", ["x", "w"], [("x", np.float32, [1, 1, 1 << 40, 4])], W3),
                            "input 'x' of shape [1, 1, 1099511627776, 4] float32", 1 << 44),
    "MaxPool pads 2^30": (one_node("MaxPool", ["x"], X4, kernel_shape=[1, 1], pads=[1 << 30] * 4),
                          "[1, 1, 2147483652, 2147483652] float32", 4 * 2147483652 ** 2),
    "OneHot depth 2^40": (one_node("OneHot", ["i", "d", "v"], [("i", np.int64, [4])], [
        ("d", np.array(1 << 40, np.int64)), ("v", np.array([0, 1], np.float32))]), "[4, 1099511627776] float32",
        1 << 44),
    "Einsum outer product": (one_node("Einsum", ["a", "b", "c"], [(n, np.float32, [1 << 12]) for n in "abc"],
                                      equation="i,j,k->ijk"), "[4096, 4096, 4096] float32", 1 << 38),
    "ConvTranspose strides 2^20": (one_node("ConvTranspose", ["x", "w"], [("x", np.float32, [1, 1, 2, 2])], W3,
                                            strides=[1 << 20, 1 << 20]),
                                   "[1, 1, 1048579, 1048579] float32", 4 * 1048579 ** 2),
    "MaxUnpool output_shape": (one_node("MaxUnpool", ["x", "i", "s"], [("x", np.float32, [1, 1, 2, 2]),
                                                                      ("i", np.int64, [1, 1, 2, 2])],
                                        [("s", i64(1, 1, 1 << 20, 1 << 20))], kernel_shape=[2, 2]),
                               "[1, 1, 1048576, 1048576] float32", 1 << 42),
    "DFT length 2^40": (one_node("DFT", ["x", "l"], [("x", np.float32, [1, 4, 1])],
                                 [("l", np.array(1 << 40, np.int64))]), "[1, 1099511627776, 2] float32", 1 << 43),
    "Gather indices x rows": (one_node("Gather", ["d", "i"], [("d", np.float32, [4, 1 << 16]),
                                                              ("i", np.int64, [1 << 20])]),
                              "[1048576, 65536] float32", 1 << 38),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sizes_are_refused_at_prepare(case):
    model, shape, nbytes = HOSTILE[case]
    message = refused(model)
    assert message.startswith("PREPARE/infer_shapes: ")
    if not shape.startswith("input"):
        assert "node 'hostile' (" in message
    assert f"{shape} would take {nbytes:,} bytes, beyond max_tensor_bytes ({LIMIT:,})" in message


def test_dims_whose_int64_product_wraps_are_refused_by_default():
    """2^62 x 2^62 x 4 is 0 in int64 arithmetic: the check multiplies Python ints."""
    model = one_node("Expand", ["x", "s"], [("x", np.float32, [1])], [("s", i64(1 << 62, 1 << 62, 4))])
    message = refused(model, limit=None)
    assert f"[{1 << 62}, {1 << 62}, 4] float32 would take {1 << 128:,} bytes" in message


def test_conv_padded_image_is_refused_before_planning(monkeypatch):
    """Pads 2^30 with strides 2^30 give a 3x3 output, but the padded image the columns are cut
    from would be 2^62 elements: refused when the kernel is prepared, before any tile is planned.
    (As installed: the compiled kernel of few channels never pads the image, and runs it.)"""
    monkeypatch.delenv("NNRUN_JIT", raising=False)
    model = one_node("Conv", ["x", "w"], X4, W3, pads=[1 << 30] * 4, strides=[1 << 30] * 2)
    message = refused(model)
    assert message.startswith("PREPARE/prepare_kernels: node 'hostile' (Conv, #0): ")
    assert "beyond max_tensor_bytes" in message


def test_conv_of_many_taps_and_rows_is_refused_before_planning():
    """65,536 taps over a million output rows: a plan of a tile per few rows would hold 2^32 tap
    slices (hours of PREPARE); tiles grow instead, and their columns are refused at once."""
    model = one_node("Conv", ["x", "w"], [("x", np.float32, [1, 1, 1 << 20, 256])],
                     [("w", np.ones((1, 1, 256, 256), np.float32))])
    message = refused(model)
    assert message.startswith("PREPARE/prepare_kernels: node 'hostile' (Conv, #0): the column buffer of shape ")
    assert "beyond max_tensor_bytes" in message


def test_pool_kernel_of_2_40_is_a_model_error():
    model = one_node("MaxPool", ["x"], X4, kernel_shape=[1 << 40, 1 << 40])
    assert "more than 65536 taps" in refused(model, error=nnrun.ModelError)


def test_loop_trip_count_with_a_scan_output_is_refused():
    """M = 2^40 iterations, each scanning a float: the scan output's shape is known at PREPARE."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["s"], to=TensorProto.FLOAT)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    model = one_node("Loop", ["M", ""], initializers=[("M", np.array(1 << 40, np.int64))], body=body)
    message = refused(model)
    assert "node 'hostile' (Loop, #0): output 'y' of shape [1099511627776] float32" in message


def test_tflite_sparse_tensor_with_huge_dense_dims_is_refused():
    """A sparse weight whose two dense levels span 2^20 x 2^20 elements: the index the densifying
    walk would build is refused before it is made."""
    from nnrun.ops.tflite.quantize import densify

    sparsity = {"traversal_order": [0, 1], "block_map": [],
                "dim_metadata": [{"format": "DENSE", "dense_size": 1 << 20},
                                 {"format": "DENSE", "dense_size": 1 << 20}]}
    started = time.perf_counter()
    # Four stored values for 2^40 entries: refused for what the file lacks, before any index is made.
    with nnrun.size_limit.in_force(LIMIT), pytest.raises(nnrun.ModelError, match="sparsity level 1: the dense "
                                                                               "levels make 1,099,511,627,776"):
        densify(None, np.ones(4, np.float32), sparsity)
    # A sparse dim whose index says 2^31: the dense tensor, 4 x (2^31 + 1) floats, is refused.
    sparsity["dim_metadata"] = [{"format": "DENSE", "dense_size": 4},
                                {"format": "SPARSE_CSR", "array_segments": np.array([0, 1, 1, 1, 1]),
                                 "array_indices": np.array([1 << 31])}]
    with nnrun.size_limit.in_force(LIMIT), pytest.raises(SizeLimitError, match=r"the dense tensor of shape "
                                                                               r"\[4, 2147483649\] float32"):
        densify(None, np.ones(1, np.float32), sparsity)
    assert time.perf_counter() - started < HANG_BOUND_S


def test_onnx_sparse_initializer_beyond_the_limit_is_refused_at_load():
    values = numpy_helper.from_array(np.ones(1, np.float32), "w")
    indices = numpy_helper.from_array(i64(0), "w_indices")
    sparse = helper.make_sparse_tensor(values, indices, [1 << 20, 1 << 20])
    model = one_node("Relu", ["w"])
    model.graph.sparse_initializer.append(sparse)
    message = refused(model)
    assert message.startswith("sparse initializer 'w' of shape [1048576, 1048576] float32 would take")
