"""onnxruntime's com.microsoft contrib ops (runtime/ops/contrib.py, contrib_attention.py,
contrib_quantized.py), on models that onnxruntime's own tools write.

Each test builds a small float model with onnx.helper, runs the tool in tmp_path (quantize_dynamic,
quantize_static in QOperator and QDQ formats, the transformer optimizer, the graph optimizer saving
its ORT_ENABLE_EXTENDED model), asserts the result holds the contrib op under test (so the test
fails if the tool stops writing it), and compares nnrun with onnxruntime on the produced model,
onnxruntime's own optimizations off so that its contrib kernels run. The integer ops are also
checked node by node against exact numpy oracles written from the spec (int64 / float64), fed
with the node's actual inputs: onnxruntime's int8 kernels differ by CPU, so against it a quantized
result may be one step off. The float ops not every tool writes in every form get one-node
models compared with onnxruntime.
"""

import importlib.util
import logging

import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from oracle import assert_close, helper, numpy_helper, run_nnrun

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

TensorProto = onnx.TensorProto
F32 = np.float32
MS = "com.microsoft"
HAS_SYMPY = importlib.util.find_spec("sympy") is not None


# --------------------------------------------------------------------------- helpers


def rng(seed):
    return np.random.default_rng(seed)


def weight(r, *shape, scale=0.3):
    return (r.standard_normal(shape) * scale).astype(F32)


def float_model(nodes, inputs, outputs, initializers, opset=13):
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "model",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, f, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def ops_of(model):
    return {(n.domain, n.op_type) for n in model.graph.node}


def require(model, *op_types, domain=MS):
    found = ops_of(model)
    missing = [op for op in op_types if (domain, op) not in found]
    assert not missing, f"the tool no longer writes {missing}; it wrote {sorted(found)}"


def ort_session(model):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_ort(model, feeds):
    return ort_session(model).run(None, feeds)


def ort_values(model, feeds):
    """Every value onnxruntime computes in `model` for `feeds`, by name, and the initializers."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [o for n in probe.graph.node for o in n.output if o]
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    values = dict(zip(names, run_ort(probe, feeds)))
    values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    values.update(feeds)
    return values


def nodes_of(model, op_type):
    return [n for n in model.graph.node if n.op_type == op_type and n.domain == MS]


def one_node(node, values, opset=13):
    """`node` alone, every input fed with its value; returns (model, feeds)."""
    feeds = {name: values[name] for name in node.input if name}
    graph = helper.make_graph(
        [node], "node",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in node.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model, feeds


def check_quantized_nodes(model, feeds, op_type, oracle):
    """Each `op_type` node of `model`, fed its actual inputs: nnrun exactly equal to `oracle`
    (inputs by position, the node), within one step of onnxruntime."""
    values = ort_values(model, feeds)
    nodes = nodes_of(model, op_type)
    assert nodes, f"no {op_type} in the model"
    for node in nodes:
        single, single_feeds = one_node(node, values)
        (actual,) = run_nnrun(single, single_feeds)
        inputs = [values[name] if name else None for name in node.input]
        expected = oracle(node, *inputs)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, op_type
        np.testing.assert_array_equal(actual, expected, err_msg=f"{op_type} against the spec")
        steps = np.abs(actual.astype(np.int64) - values[node.output[0]].astype(np.int64))
        assert steps.max(initial=0) <= 1, f"{op_type}: {steps.max()} steps from onnxruntime"


def attribute(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def compare_with_ort(model, feeds, rtol=1e-4, quantized_steps=None):
    """nnrun against onnxruntime on a whole model: float outputs relative to their largest
    magnitude; with `quantized_steps`, within that many of the output's quantization step."""
    expected = run_ort(model, feeds)
    actual = run_nnrun(model, feeds)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if quantized_steps is not None:
            assert_close(a, e, atol=quantized_steps, what=f"output {i}")
        else:
            assert_close(a, e, rtol=rtol, what=f"output {i}")


# --------------------------------------------------------------------------- exact oracles


def q_range(dtype):
    info = np.iinfo(dtype)
    return info.min, info.max


def dequantize(q, scale, zero_point):
    zp = 0 if zero_point is None else np.int64(zero_point)
    return (q.astype(np.int64) - zp).astype(np.float64) * np.float64(scale)


def quantize(y, scale, zero_point, dtype):
    zp = 0 if zero_point is None else np.int64(zero_point)
    q = np.rint(np.asarray(y, np.float64) / np.float64(scale)) + zp
    return np.clip(q, *q_range(dtype)).astype(dtype)


def out_dtype(zero_point, x):
    return (zero_point if zero_point is not None else x).dtype


def oracle_binary(formula):
    def oracle(node, a, sa, za, b, sb, zb, sc, zc=None):
        return quantize(formula(dequantize(a, sa, za), dequantize(b, sb, zb)), sc, zc, out_dtype(zc, a))
    return oracle


def oracle_unary(formula):
    def oracle(node, x, sx, zx, sy, zy=None):
        return quantize(formula(node, dequantize(x, sx, zx)), sy, zy, out_dtype(zy, x))
    return oracle


def oracle_global_average(node, x, sx, zx, sy, zy):
    axes = tuple(range(1, x.ndim - 1)) if attribute(node, "channels_last", 0) else tuple(range(2, x.ndim))
    return quantize(dequantize(x, sx, zx).mean(axis=axes, keepdims=True), sy, zy, out_dtype(zy, x))


def oracle_average_pool(node, x, sx, zx, sy, zy=None):
    kernel = tuple(attribute(node, "kernel_shape"))
    strides = tuple(attribute(node, "strides", [1] * len(kernel)))
    assert not any(attribute(node, "pads", [0]))  # the oracle of unpadded windows
    windows = sliding_window_view(dequantize(x, sx, zx), kernel, axis=(2, 3))[:, :, ::strides[0], ::strides[1]]
    return quantize(windows.mean(axis=(-2, -1)), sy, zy, out_dtype(zy, x))


def oracle_concat(node, sy, zy, *triples):
    parts = [quantize(dequantize(x, s, z), sy, zy, out_dtype(zy, x))
             for x, s, z in zip(triples[::3], triples[1::3], triples[2::3])]
    return np.concatenate(parts, axis=attribute(node, "axis"))


def oracle_softmax(node, x, sx, zx, sy, zy):
    v = dequantize(x, sx, zx)
    v = np.exp(v - v.max(axis=-1, keepdims=True))
    return quantize(v / v.sum(axis=-1, keepdims=True), sy, zy, out_dtype(zy, x))


def oracle_qgemm(node, a, sa, za, b, sb, zb, c=None, sy=None, zy=None):
    if attribute(node, "transA", 0):
        a = a.T
    if attribute(node, "transB", 0):
        b = b.T
    acc = (a.astype(np.int64) - np.int64(za)) @ (b.astype(np.int64) - zb.astype(np.int64))
    if c is not None:
        acc = acc + c.astype(np.int64)
    y = acc * (np.float64(attribute(node, "alpha", 1.0)) * np.float64(sa) * sb.astype(np.float64))
    if zy is None:
        return (y if sy is None else y / np.float64(sy)).astype(F32)
    return quantize(y, sy, zy, zy.dtype)


def dynamic_quantize_linear(x):
    """DynamicQuantizeLinear's uint8 quantization (its arithmetic in float32, as the spec's
    reference has it; scale 1 for a constant input, as onnxruntime takes it): the integers and
    the scale."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((high - low) / 255) if high != low else np.float32(1)
    zero_point = np.clip(np.rint(np.float32(0) - np.float32(low) / scale), 0, 255)
    q = np.clip(np.rint(x.astype(F32) / scale) + zero_point, 0, 255).astype(np.int64)
    return q - np.int64(zero_point), scale


def float_result(node, acc, a_scale, b_scale, bias):
    y = acc * (np.float64(a_scale) * b_scale.astype(np.float64).reshape(-1))
    return (y if bias is None else y + bias).astype(F32)


def oracle_dynamic_matmul(node, a, b, b_scale, b_zp=None, bias=None):
    qa, a_scale = dynamic_quantize_linear(a)
    acc = qa @ (b.astype(np.int64) - (0 if b_zp is None else b_zp.astype(np.int64)))
    return float_result(node, acc, a_scale, b_scale, bias)


def oracle_integer_to_float(node, a, b, a_scale, b_scale, a_zp=None, b_zp=None, bias=None):
    acc = ((a.astype(np.int64) - (0 if a_zp is None else np.int64(a_zp)))
           @ (b.astype(np.int64) - (0 if b_zp is None else b_zp.astype(np.int64))))
    return float_result(node, acc, a_scale, b_scale, bias)


# --------------------------------------------------------------------------- models


def conv_net():
    """Conv-Relu, Conv-LeakyRelu, a residual Add, Conv-Sigmoid times the residual, two pools
    concatenated, a global pool, Gemm and Softmax."""
    r = rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c2"], ["l2"], alpha=0.1),
        helper.make_node("Add", ["l2", "r1"], ["a"]),
        helper.make_node("Conv", ["a", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c3"], ["s3"]),
        helper.make_node("Mul", ["s3", "a"], ["m"]),
        helper.make_node("AveragePool", ["m"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("MaxPool", ["m"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["p", "mp"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    inits = {"w1": weight(r, 8, 3, 3, 3), "b1": weight(r, 8), "w2": weight(r, 8, 8, 3, 3), "b2": weight(r, 8),
             "w3": weight(r, 8, 8, 3, 3), "b3": weight(r, 8), "wf": weight(r, 5, 16), "bf": weight(r, 5)}
    return float_model(nodes, [("x", TensorProto.FLOAT, [1, 3, 8, 8])], ["y"], inits)


def conv_feeds(seed=1):
    return {"x": rng(seed).standard_normal((1, 3, 8, 8)).astype(F32)}


class Calibration(quantization.CalibrationDataReader):
    def __init__(self, n=4):
        self.batches = iter([conv_feeds(seed) for seed in range(10, 10 + n)])

    def get_next(self):
        return next(self.batches, None)


def saved(model, tmp_path, name):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def graph_optimized(path, tmp_path, name):
    """The model onnxruntime's graph optimizer saves at ORT_ENABLE_EXTENDED."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


@pytest.fixture(scope="module", params=["QInt8", "QUInt8"])
def qoperator_conv_net(request, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("qop")
    out = tmp_path / "conv_qop.onnx"
    logging.disable(logging.WARNING)
    try:
        quantization.quantize_static(saved(conv_net(), tmp_path, "conv"), str(out), Calibration(),
                                     quant_format=quantization.QuantFormat.QOperator,
                                     activation_type=getattr(quantization.QuantType, request.param))
    finally:
        logging.disable(logging.NOTSET)
    return onnx.load(out)


# --------------------------------------------------------------------------- quantized conv net


QLINEAR_ORACLES = {
    "QLinearAdd": oracle_binary(np.add),
    "QLinearMul": oracle_binary(np.multiply),
    "QLinearSigmoid": oracle_unary(lambda node, x: 1 / (1 + np.exp(-x))),
    "QLinearLeakyRelu": oracle_unary(lambda node, x: np.where(x >= 0, x, x * attribute(node, "alpha", 0.01))),
    "QLinearGlobalAveragePool": oracle_global_average,
    "QLinearAveragePool": oracle_average_pool,
    "QLinearConcat": oracle_concat,
    "QLinearSoftmax": oracle_softmax,
    "QGemm": oracle_qgemm,
}


def test_quantize_static_qoperator_model(qoperator_conv_net):
    require(qoperator_conv_net, *QLINEAR_ORACLES)
    # The output is a dequantized softmax: one step of its uint8 scale is at most 1/255.
    compare_with_ort(qoperator_conv_net, conv_feeds(), quantized_steps=1.01 / 255)


@pytest.mark.parametrize("op_type", sorted(QLINEAR_ORACLES))
def test_quantize_static_qoperator_nodes(qoperator_conv_net, op_type):
    check_quantized_nodes(qoperator_conv_net, conv_feeds(), op_type, QLINEAR_ORACLES[op_type])


def test_quantize_static_qdq_then_graph_optimizer(tmp_path):
    logging.disable(logging.WARNING)
    try:
        quantization.quantize_static(saved(conv_net(), tmp_path, "conv"), str(tmp_path / "qdq.onnx"), Calibration(),
                                     quant_format=quantization.QuantFormat.QDQ)
    finally:
        logging.disable(logging.NOTSET)
    model = graph_optimized(str(tmp_path / "qdq.onnx"), tmp_path, "qdq_opt")
    written = ["QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearGlobalAveragePool", "QGemm"]
    require(model, *written)
    compare_with_ort(model, conv_feeds(), quantized_steps=1.01 / 255)
    for op_type in written:
        check_quantized_nodes(model, conv_feeds(), op_type, QLINEAR_ORACLES[op_type])


# --------------------------------------------------------------------------- graph optimizer: float


def test_graph_optimizer_fused_conv(tmp_path):
    model = graph_optimized(saved(conv_net(), tmp_path, "conv"), tmp_path, "conv_opt")
    require(model, "FusedConv")
    activations = {attribute(n, "activation") for n in nodes_of(model, "FusedConv")}
    assert {b"Relu", b"LeakyRelu", b"Sigmoid"} <= activations
    compare_with_ort(model, conv_feeds())


def matmul_gemm_model():
    """MatMul of A and a transposed B, scaled (FusedMatMul); Gemm then Relu (FusedGemm)."""
    r = rng(4)
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["a", "bt"], ["ab"]),
             helper.make_node("Mul", ["ab", "s"], ["y1"]),
             helper.make_node("Gemm", ["g", "w", "c"], ["gm"], transB=1),
             helper.make_node("Relu", ["gm"], ["y2"])]
    f = TensorProto.FLOAT
    return float_model(nodes, [("a", f, [2, 3, 4]), ("b", f, [2, 5, 4]), ("g", f, [3, 8])], ["y1", "y2"],
                       {"s": np.array(0.125, F32), "w": weight(r, 6, 8), "c": weight(r, 6)})


def test_graph_optimizer_fused_matmul_and_gemm(tmp_path):
    model = graph_optimized(saved(matmul_gemm_model(), tmp_path, "mm"), tmp_path, "mm_opt")
    require(model, "FusedMatMul", "FusedGemm")
    r = rng(5)
    feeds = {"a": r.standard_normal((2, 3, 4)).astype(F32), "b": r.standard_normal((2, 5, 4)).astype(F32),
             "g": r.standard_normal((3, 8)).astype(F32)}
    compare_with_ort(model, feeds)


@pytest.mark.parametrize("attrs", [{"transA": 1}, {"transBatchA": 1}, {"transBatchB": 1, "transB": 1},
                                   {"transBatchA": 1, "transA": 1, "alpha": 0.5}])
def test_fused_matmul_transposes(attrs):
    r = rng(6)
    a = r.standard_normal((3, 2, 4, 5)).astype(F32)
    b = r.standard_normal((3, 2, 5, 6)).astype(F32)
    if attrs.get("transA"):
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    if attrs.get("transBatchA"):
        a = np.ascontiguousarray(np.moveaxis(a, -2, 0))
    if attrs.get("transB"):
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    if attrs.get("transBatchB"):
        b = np.ascontiguousarray(np.moveaxis(b, -2, 0))
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, **attrs)
    model, feeds = one_node(node, {"a": a, "b": b})
    compare_with_ort(model, feeds)


# --------------------------------------------------------------------------- dynamic quantization


def matmul_net(shared_input):
    """Two MatMuls (with a bias Add, a Relu between) or, `shared_input`, two reading one input."""
    r = rng(2)
    if shared_input:
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"]), helper.make_node("MatMul", ["x", "w2"], ["h2"]),
                 helper.make_node("Add", ["h1", "b1"], ["y1"]), helper.make_node("Add", ["h2", "h1"], ["y"])]
        inits = {"w1": weight(r, 8, 32), "b1": weight(r, 32), "w2": weight(r, 8, 32)}
        outputs = ["y", "y1"]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
                 helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
        inits = {"w1": weight(r, 8, 32), "b1": weight(r, 32), "w2": weight(r, 32, 4)}
        outputs = ["y"]
    return float_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 8])], outputs, inits)


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("shared_input,op_type,oracle", [
    (False, "DynamicQuantizeMatMul", oracle_dynamic_matmul),
    (True, "MatMulIntegerToFloat", oracle_integer_to_float)])
def test_quantize_dynamic_matmul(tmp_path, weight_type, per_channel, shared_input, op_type, oracle):
    quantized = tmp_path / "q.onnx"
    logging.disable(logging.WARNING)
    try:
        quantization.quantize_dynamic(saved(matmul_net(shared_input), tmp_path, "mm"), str(quantized),
                                      weight_type=getattr(quantization.QuantType, weight_type),
                                      per_channel=per_channel)
    finally:
        logging.disable(logging.NOTSET)
    model = graph_optimized(str(quantized), tmp_path, "q_opt")
    require(model, op_type)
    feeds = {"x": rng(3).standard_normal((2, 3, 8)).astype(F32) * 2}
    compare_with_ort(model, feeds, rtol=1e-5)
    values = ort_values(model, feeds)
    for node in nodes_of(model, op_type):
        single, single_feeds = one_node(node, values)
        (actual,) = run_nnrun(single, single_feeds)
        expected = oracle(node, *(values[n] if n else None for n in node.input))
        assert_close(actual, expected, rtol=1e-6, what=f"{op_type} against the spec")


def lstm_model(direction):
    r = rng(7)
    hidden, size, dirs = 16, 8, 2 if direction == "bidirectional" else 1
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=hidden,
                              direction=direction)]
    inits = {"W": weight(r, dirs, 4 * hidden, size), "R": weight(r, dirs, 4 * hidden, hidden),
             "B": weight(r, dirs, 8 * hidden)}
    return float_model(nodes, [("x", TensorProto.FLOAT, [5, 2, size])], ["y", "yh", "yc"], inits)


def oracle_dynamic_lstm(node, x, w, r, b, w_scale, w_zp, r_scale, r_zp):
    """The LSTM of the spec in float64, each product as onnxruntime quantizes it: its float operand
    by DynamicQuantizeLinear (X once, each direction's h per step), then an exact integer product."""
    hidden = attribute(node, "hidden_size")
    dirs = w.shape[0]
    seq, batch, _ = x.shape

    def product(a, q, scale, zp, d):
        qa, a_scale = dynamic_quantize_linear(a)
        shifted = q[d].astype(np.int64) - np.broadcast_to(np.asarray(zp).reshape(dirs, -1)[d], (q.shape[2],))
        per_column = np.broadcast_to(np.asarray(scale, np.float64).reshape(dirs, -1)[d], (q.shape[2],))
        return (qa @ shifted) * (np.float64(a_scale) * per_column)

    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    y = np.zeros((seq, dirs, batch, hidden))
    y_h, y_c = np.zeros((dirs, batch, hidden)), np.zeros((dirs, batch, hidden))
    for d in range(dirs):
        projected = product(x.reshape(-1, x.shape[2]), w, w_scale, w_zp, d).reshape(seq, batch, -1)
        bias = b[d, :4 * hidden].astype(np.float64) + b[d, 4 * hidden:]
        h, c = np.zeros((batch, hidden)), np.zeros((batch, hidden))
        steps = range(seq - 1, -1, -1) if d == 1 else range(seq)
        for t in steps:
            gates = projected[t] + product(h.astype(F32), r, r_scale, r_zp, d) + bias
            i, o, f, g = (gates[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            y[t, d] = h
        y_h[d], y_c[d] = h, c
    return y, y_h, y_c


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_quantize_dynamic_lstm(tmp_path, direction):
    quantized = tmp_path / "lstm_q.onnx"
    logging.disable(logging.WARNING)
    try:
        quantization.quantize_dynamic(saved(lstm_model(direction), tmp_path, "lstm"), str(quantized),
                                      op_types_to_quantize=["LSTM"])
    finally:
        logging.disable(logging.NOTSET)
    model = onnx.load(quantized)
    require(model, "DynamicQuantizeLSTM")
    feeds = {"x": rng(8).standard_normal((5, 2, 8)).astype(F32)}
    compare_with_ort(model, feeds, rtol=1e-4)
    (node,) = nodes_of(model, "DynamicQuantizeLSTM")
    values = ort_values(model, feeds)
    given = dict(zip(["x", "w", "r", "b", "", "", "", "", "w_scale", "w_zp", "r_scale", "r_zp"], node.input))
    expected = oracle_dynamic_lstm(node, *(values[given[k]] for k in
                                           ("x", "w", "r", "b", "w_scale", "w_zp", "r_scale", "r_zp")))
    # The oracle's h is float64, nnrun's float32: an h at a rounding boundary of its quantization
    # could round the other way (moving the outputs by about a step of h's scale); on these
    # inputs none does, and the two agree to float32 rounding.
    for actual, want in zip(run_nnrun(model, feeds), expected):
        assert_close(actual, want.astype(F32), atol=1e-5, what="DynamicQuantizeLSTM against the spec")


# --------------------------------------------------------------------------- transformer optimizer


def bert_encoder(layers=2, embed=False, hidden=16, heads=2, ff=32, vocab=30, max_positions=16):
    """A BERT-like encoder written op by op in the forms onnxruntime's transformer optimizer fuses
    (fusion_attention, fusion_layernorm, fusion_gelu, fusion_skiplayernorm, fusion_embedlayer):
    attention with the mask term (1 - mask) * -10000, LayerNorm as ReduceMean / Sub / Pow / Sqrt /
    Div, GELU as x * (1 + erf(x / sqrt 2)) * 0.5, residual Adds; with `embed`, word + segment +
    position embeddings (positions sliced by the length of input_ids)."""
    r = rng(9)
    nodes, inits = [], {}

    def const(name, value):
        inits[name] = np.asarray(value)
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def w(name, *shape):
        return const(name, weight(r, *shape, scale=0.2))

    head = hidden // heads
    for name, value in (("one", 1.0), ("two", 2.0), ("half", 0.5), ("eps", 1e-5), ("neg", -10000.0),
                        ("sqrt2", np.sqrt(2.0)), ("sqrt_d", np.sqrt(head))):
        const(name, np.array(value, F32))
    const("heads_shape", np.array([0, 0, heads, head], np.int64))
    const("merge_shape", np.array([0, 0, hidden], np.int64))
    const("ax1", np.array([1], np.int64))
    const("ax2", np.array([2], np.int64))

    def layer_norm(x, p):
        mean = node("ReduceMean", [x], p + "_mean", axes=[-1])
        d = node("Sub", [x, mean], p + "_d")
        var = node("ReduceMean", [node("Pow", [d, "two"], p + "_sq")], p + "_var", axes=[-1])
        std = node("Sqrt", [node("Add", [var, "eps"], p + "_ve")], p + "_std")
        scaled = node("Mul", [node("Div", [d, std], p + "_n"), w(p + "_g", hidden)], p + "_s")
        return node("Add", [scaled, w(p + "_b", hidden)], p + "_out")

    def heads_of(x, p, perm):
        y = node("Add", [node("MatMul", [x, w(p + "_w", hidden, hidden)], p + "_mm"), w(p + "_bias", hidden)],
                 p + "_add")
        return node("Transpose", [node("Reshape", [y, "heads_shape"], p + "_r")], p + "_t", perm=perm)

    mask = node("Cast", [node("Unsqueeze", [node("Unsqueeze", ["mask", "ax1"], "mask_u1"), "ax2"], "mask_u2")],
                "mask_f", to=TensorProto.FLOAT)
    mask_term = node("Mul", [node("Sub", ["one", mask], "mask_inv"), "neg"], "mask_term")
    x = "x"
    if embed:
        const("positions", np.arange(max_positions, dtype=np.int64)[None])
        const("zero", np.array([0], np.int64))
        const("index1", np.array(1, np.int64))
        const("ax0", np.array([0], np.int64))
        words = node("Gather", [w("word_embedding", vocab, hidden), "input_ids"], "words")
        segments = node("Gather", [w("segment_embedding", 2, hidden), "segment_ids"], "segments")
        length = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), "index1"], "length")
        ids = node("Slice", ["positions", "zero", node("Unsqueeze", [length, "ax0"], "length1"), "ax1", "ax1"],
                   "position_ids")
        positions = node("Gather", [w("position_embedding", max_positions, hidden), ids], "position_vectors")
        x = layer_norm(node("Add", [node("Add", [words, segments], "ws"), positions], "embedded"), "embed_ln")
    for i in range(layers):
        p = f"l{i}"
        q, k, v = heads_of(x, p + "q", [0, 2, 1, 3]), heads_of(x, p + "k", [0, 2, 3, 1]), heads_of(x, p + "v",
                                                                                                 [0, 2, 1, 3])
        scores = node("Div", [node("MatMul", [q, k], p + "_qk"), "sqrt_d"], p + "_scaled")
        probs = node("Softmax", [node("Add", [scores, mask_term], p + "_masked")], p + "_probs", axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v], p + "_ctx")], p + "_ctx_t", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, "merge_shape"], p + "_ctx_r")
        out = node("Add", [node("MatMul", [context, w(p + "_o_w", hidden, hidden)], p + "_o_mm"),
                           w(p + "_o_b", hidden)], p + "_o")
        attended = layer_norm(node("Add", [out, x], p + "_res1"), p + "_ln1")
        h = node("Add", [node("MatMul", [attended, w(p + "_f1_w", hidden, ff)], p + "_f1_mm"), w(p + "_f1_b", ff)],
                 p + "_f1")
        erf = node("Add", [node("Erf", [node("Div", [h, "sqrt2"], p + "_hd")], p + "_erf"), "one"], p + "_erf1")
        gelu = node("Mul", [node("Mul", [h, erf], p + "_ge"), "half"], p + "_gelu")
        out = node("Add", [node("MatMul", [gelu, w(p + "_f2_w", ff, hidden)], p + "_f2_mm"), w(p + "_f2_b", hidden)],
                   p + "_f2")
        x = layer_norm(node("Add", [out, attended], p + "_res2"), p + "_ln2")
    i64, f = TensorProto.INT64, TensorProto.FLOAT
    inputs = ([("input_ids", i64, ["batch", "seq"]), ("segment_ids", i64, ["batch", "seq"])] if embed
              else [("x", f, ["batch", "seq", hidden])]) + [("mask", i64, ["batch", "seq"])]
    return float_model(nodes, inputs, [x], inits)


def bert_feeds(model, seed=10):
    """Feeds of the types the optimized model wants (it may turn int64 ids into int32)."""
    r = rng(seed)
    types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    feeds = {}
    for name, dtype in types.items():
        if name == "mask":
            feeds[name] = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype)
        elif name == "x":
            feeds[name] = r.standard_normal((2, 5, 16)).astype(dtype)
        else:
            feeds[name] = r.integers(0, 2 if name == "segment_ids" else 30, (2, 5)).astype(dtype)
    return feeds


def transformer_optimized(model, tmp_path, shape_inference=False, **options):
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    fusion = FusionOptions("bert")
    # Without sympy the optimizer's symbolic shape inference is missing: it runs only when asked.
    fusion.enable_shape_inference = shape_inference
    for name, value in options.items():
        setattr(fusion, name, value)
    logging.disable(logging.WARNING)
    try:
        optimized = optimize_model(saved(model, tmp_path, "float"), model_type="bert", num_heads=2, hidden_size=16,
                                   optimization_options=fusion, opt_level=0)
    finally:
        logging.disable(logging.NOTSET)
    return optimized.model


@pytest.mark.parametrize("embed", [False, True])
@pytest.mark.parametrize("mask_format,multi_head", [("MaskIndexEnd", False), ("AttentionMask", False),
                                                    ("AttentionMask", True)])
def test_transformer_optimizer_bert(tmp_path, embed, mask_format, multi_head):
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat

    model = transformer_optimized(bert_encoder(embed=embed), tmp_path,
                                  attention_mask_format=getattr(AttentionMaskFormat, mask_format),
                                  use_multi_head_attention=multi_head)
    require(model, "MultiHeadAttention" if multi_head else "Attention", "SkipLayerNormalization", "BiasGelu")
    if embed:
        require(model, "EmbedLayerNormalization")
    compare_with_ort(model, bert_feeds(model))


@pytest.mark.skipif(not HAS_SYMPY, reason="the transformer optimizer's default symbolic shape inference "
                                          "needs sympy, which is not installed")
def test_transformer_optimizer_bert_default_options(tmp_path):
    model = transformer_optimized(bert_encoder(embed=True), tmp_path, shape_inference=True)
    require(model, "Attention", "SkipLayerNormalization", "EmbedLayerNormalization")
    compare_with_ort(model, bert_feeds(model))


def activations_model(hidden=16):
    """A LayerNorm with no residual before it, MatMul + bias + tanh GELU, QuickGelu, an erf GELU of
    a non-Add input, an RMSNorm, and a residual Add + RMSNorm."""
    r = rng(11)
    nodes, inits = [], {}

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def w(name, *shape):
        inits[name] = weight(r, *shape)
        return name

    for name, value in (("one", 1.0), ("half", 0.5), ("two", 2.0), ("three", 3.0), ("eps", 1e-6),
                        ("c1", 0.044715), ("c2", np.sqrt(2 / np.pi)), ("sqrt2", np.sqrt(2.0)), ("q", 1.702)):
        inits[name] = np.array(value, F32)
    d = node("Sub", ["x", node("ReduceMean", ["x"], "m", axes=[-1])], "d")
    var = node("ReduceMean", [node("Pow", [d, "two"], "sq")], "var", axes=[-1])
    std = node("Sqrt", [node("Add", [var, "eps"], "ve")], "std")
    ln = node("Add", [node("Mul", [node("Div", [d, std], "n"), w("g", hidden)], "s"), w("b", hidden)], "ln")
    h = node("Add", [node("MatMul", [ln, w("w1", hidden, hidden)], "h_mm"), w("b1", hidden)], "h")
    inner = node("Mul", [node("Add", [h, node("Mul", [node("Pow", [h, "three"], "h3"), "c1"], "h3c")], "hp"), "c2"],
                 "hpc")
    fast = node("Mul", [node("Mul", [h, "half"], "hh"), node("Add", [node("Tanh", [inner], "th"), "one"], "th1")],
                "fast_gelu")
    quick = node("Mul", [fast, node("Sigmoid", [node("Mul", [fast, "q"], "fq")], "fs")], "quick_gelu")
    erf = node("Add", [node("Erf", [node("Div", [quick, "sqrt2"], "gd")], "ge"), "one"], "ge1")
    gelu = node("Mul", [node("Mul", [quick, erf], "gm"), "half"], "gelu")

    def rms(x, p):
        mean_square = node("ReduceMean", [node("Pow", [x, "two"], p + "sq")], p + "ms", axes=[-1], keepdims=1)
        inverse = node("Div", ["one", node("Sqrt", [node("Add", [mean_square, "eps"], p + "e")], p + "r")],
                       p + "inv")
        return node("Mul", [node("Mul", [x, inverse], p + "n"), w(p + "g", hidden)], p + "out")

    r1 = rms(gelu, "r1")
    out = rms(node("Add", [node("MatMul", [r1, w("w2", hidden, hidden)], "mm2"), r1], "res"), "r2")
    return float_model(nodes, [("x", TensorProto.FLOAT, ["batch", "seq", hidden])], [out], inits)


def test_transformer_optimizer_activations_and_norms(tmp_path):
    model = transformer_optimized(activations_model(), tmp_path)
    require(model, "FastGelu", "QuickGelu", "Gelu")
    require(model, "LayerNormalization", "SimplifiedLayerNormalization", domain="")
    assert model.opset_import[0].version < 17  # ONNX's own LayerNormalization is not there yet
    compare_with_ort(model, {"x": rng(12).standard_normal((2, 5, 16)).astype(F32)})


@pytest.mark.skipif(not HAS_SYMPY, reason="the transformer optimizer fuses SkipSimplifiedLayerNormalization "
                                          "only with symbolic shape inference, which needs sympy")
def test_transformer_optimizer_skip_simplified_layer_norm(tmp_path):
    model = transformer_optimized(activations_model(), tmp_path, shape_inference=True)
    require(model, "SkipSimplifiedLayerNormalization")
    compare_with_ort(model, {"x": rng(12).standard_normal((2, 5, 16)).astype(F32)})


# --------------------------------------------------------------------------- one-node forms


def check_one_node(op_type, inputs, attrs=None, n_outputs=1, rtol=1e-4):
    """A one-node com.microsoft model: nnrun against onnxruntime."""
    node = helper.make_node(op_type, [n for n, _ in inputs], [f"y{i}" for i in range(n_outputs)], domain=MS,
                            **(attrs or {}))
    model, feeds = one_node(node, {n: a for n, a in inputs if n})
    compare_with_ort(model, feeds, rtol=rtol)


def floats(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(F32)


@pytest.mark.parametrize("mask,unidirectional", [
    (mask, unidirectional) for mask in ["none", "end", "end_start", "raw2d", "raw3d"] for unidirectional in (0, 1)
    # Left padding with unidirectional leaves a query no key: onnxruntime's answer for that row
    # is its own (nnrun's masks add up, -10000 each, as they do for the other formats).
    if (mask, unidirectional) != ("end_start", 1)])
def test_attention_masks(mask, unidirectional):
    r = rng(13)
    batch, seq, hidden = 2, 5, 16
    masks = {"none": None, "end": np.array([5, 3], np.int32), "end_start": np.array([5, 4, 0, 1], np.int32),
             "raw2d": np.array([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]], np.int32),
             "raw3d": (r.random((batch, seq, seq)) > 0.3).astype(np.int32)}
    inputs = [("x", floats(r, batch, seq, hidden)), ("w", floats(r, hidden, 3 * hidden, scale=0.3)),
              ("b", floats(r, 3 * hidden, scale=0.3))]
    if masks[mask] is not None:
        inputs.append(("mask", masks[mask]))
    check_one_node("Attention", inputs, {"num_heads": 2, "unidirectional": unidirectional})


def test_attention_past_and_present():
    r = rng(14)
    batch, seq, past, heads, hidden = 2, 3, 4, 2, 16
    mask = np.ones((batch, past + seq), np.int32)
    mask[1, :2] = 0
    inputs = [("x", floats(r, batch, seq, hidden)), ("w", floats(r, hidden, 3 * hidden, scale=0.3)),
              ("b", floats(r, 3 * hidden, scale=0.3)), ("mask", mask),
              ("past", floats(r, 2, batch, heads, past, hidden // heads))]
    check_one_node("Attention", inputs, {"num_heads": heads, "unidirectional": 1}, n_outputs=2)


@pytest.mark.parametrize("bias_shape", [(1, 2, 5, 5), (2, 1, 5, 5), (2, 2, 5, 5)])
def test_attention_bias(bias_shape):
    r = rng(23)
    inputs = [("x", floats(r, 2, 5, 16)), ("w", floats(r, 16, 48, scale=0.3)), ("b", floats(r, 48, scale=0.3)),
              ("mask", np.array([5, 3], np.int32)), ("", None), ("attention_bias", floats(r, *bias_shape))]
    check_one_node("Attention", inputs, {"num_heads": 2})


def test_attention_sizes_and_scale():
    r = rng(15)
    inputs = [("x", floats(r, 2, 4, 12)), ("w", floats(r, 12, 8 + 8 + 12, scale=0.3)),
              ("b", floats(r, 28, scale=0.3))]
    check_one_node("Attention", inputs, {"num_heads": 4, "qkv_hidden_sizes": [8, 8, 12], "scale": 0.3})


@pytest.mark.parametrize("with_past", [False, True])
def test_multi_head_attention_cross_and_past(with_past):
    r = rng(16)
    batch, seq, kv, heads, hidden = 2, 3, 6, 2, 16
    inputs = [("q", floats(r, batch, seq, hidden)), ("k", floats(r, batch, kv, hidden)),
              ("v", floats(r, batch, kv, hidden)), ("bias", floats(r, 3 * hidden, scale=0.3)),
              ("mask", np.array([6, 4], np.int32) + (2 if with_past else 0)), ("", None)]
    if with_past:
        inputs += [("past_key", floats(r, batch, heads, 2, hidden // heads)),
                   ("past_value", floats(r, batch, heads, 2, hidden // heads))]
    check_one_node("MultiHeadAttention", inputs, {"num_heads": heads}, n_outputs=3 if with_past else 1)


@pytest.mark.parametrize("optional", ["none", "beta", "beta_bias", "outputs"])
def test_skip_layer_normalization(optional):
    r = rng(17)
    inputs = [("x", floats(r, 2, 5, 16)), ("skip", floats(r, 2, 5, 16)), ("gamma", floats(r, 16))]
    if optional != "none":
        inputs.append(("beta", floats(r, 16)))
    if optional in ("beta_bias", "outputs"):
        inputs.append(("bias", floats(r, 16)))
    n_outputs = 4 if optional == "outputs" else 1
    check_one_node("SkipLayerNormalization", inputs, {"epsilon": 1e-5}, n_outputs=n_outputs)


@pytest.mark.parametrize("skip_shape", [(2, 5, 16), (1, 5, 16), (5, 16)])
def test_skip_simplified_layer_normalization(skip_shape):
    r = rng(18)
    inputs = [("x", floats(r, 2, 5, 16)), ("skip", floats(r, *skip_shape)), ("gamma", floats(r, 16)),
              ("bias", floats(r, 16))]
    check_one_node("SkipSimplifiedLayerNormalization", inputs, {"epsilon": 1e-6}, n_outputs=4)


def test_embed_layer_normalization_without_segments_or_mask():
    r = rng(19)
    inputs = [("ids", r.integers(0, 30, (2, 5)).astype(np.int32)), ("", None), ("word", floats(r, 30, 16)),
              ("position", floats(r, 8, 16)), ("", None), ("gamma", floats(r, 16)), ("beta", floats(r, 16))]
    check_one_node("EmbedLayerNormalization", inputs, {"epsilon": 1e-5}, n_outputs=3)


@pytest.mark.parametrize("op_type,n_inputs", [("FastGelu", 1), ("FastGelu", 2), ("BiasGelu", 2), ("Gelu", 1),
                                              ("QuickGelu", 1)])
def test_gelu_family(op_type, n_inputs):
    r = rng(20)
    inputs = [("x", floats(r, 2, 5, 16, scale=3)), ("bias", floats(r, 16))][:n_inputs]
    check_one_node(op_type, inputs, {"alpha": 1.5} if op_type == "QuickGelu" else None)


def test_bias_add():
    """onnxruntime has BiasAdd on CUDA only: against its formula, summed in its order."""
    r = rng(21)
    x, bias, skip = floats(r, 2, 5, 16), floats(r, 16), floats(r, 2, 5, 16)
    node = helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain=MS)
    model, feeds = one_node(node, {"x": x, "bias": bias, "skip": skip})
    (actual,) = run_nnrun(model, feeds)
    np.testing.assert_array_equal(actual, (x + bias) + skip)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_average_pool_padded(channels_last, dtype):
    """Padding (counted or not) and channels_last, which the tools did not write: against the spec
    oracle on the dequantized values, padding as zeros, and within one step of onnxruntime."""
    r = rng(22)
    info = np.iinfo(dtype)
    x = r.integers(info.min, info.max + 1, (1, 3, 6, 6)).astype(dtype)
    params = {"xs": np.array(0.05, F32), "xz": np.array(3, dtype), "ys": np.array(0.04, F32),
              "yz": np.array(-2 if dtype == np.int8 else 5, dtype)}
    for count_include_pad in (0, 1):
        attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=count_include_pad,
                     channels_last=channels_last)
        node = helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, **attrs)
        fed = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if channels_last else x
        model, feeds = one_node(node, {"x": fed, **params})
        (actual,) = run_nnrun(model, feeds)
        planes = np.pad(dequantize(x, params["xs"], params["xz"]), ((0, 0), (0, 0), (1, 1), (1, 1)))
        counted = np.pad(np.ones((6, 6)), 1) if not count_include_pad else np.ones((8, 8))
        sums = sliding_window_view(planes, (3, 3), axis=(2, 3))[:, :, ::2, ::2].sum(axis=(-2, -1))
        counts = sliding_window_view(counted, (3, 3))[::2, ::2].sum(axis=(-2, -1))
        expected = quantize(sums / counts, params["ys"], params["yz"], dtype)
        if channels_last:
            expected = expected.transpose(0, 2, 3, 1)
        np.testing.assert_array_equal(actual, expected)
        (from_ort,) = run_ort(model, feeds)
        assert np.abs(actual.astype(np.int64) - from_ort.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("quantized_output", [False, True])
def test_qgemm_alpha_transposes_and_float_output(quantized_output):
    """alpha, transA and a float output, which the quantizer did not write: against the spec oracle
    exactly, and within one step (or float rounding) of onnxruntime."""
    r = rng(24)
    values = {"a": r.integers(0, 256, (6, 3)).astype(np.uint8), "sa": np.array(0.02, F32), "za": np.array(7, np.uint8),
              "b": r.integers(-128, 128, (5, 6)).astype(np.int8), "sb": r.uniform(0.01, 0.03, 5).astype(F32),
              "zb": np.zeros(5, np.int8), "c": r.integers(-500, 500, 5).astype(np.int32), "sy": np.array(0.05, F32),
              "zy": np.array(120, np.uint8)}
    names = ["a", "sa", "za", "b", "sb", "zb", "c", "sy"] + (["zy"] if quantized_output else [])
    node = helper.make_node("QGemm", names, ["y"], domain=MS, alpha=0.75, transA=1, transB=1)
    model, feeds = one_node(node, {n: values[n] for n in names})
    (actual,) = run_nnrun(model, feeds)
    expected = oracle_qgemm(node, *(values[n] for n in names))
    (from_ort,) = run_ort(model, feeds)
    if quantized_output:
        np.testing.assert_array_equal(actual, expected)
        assert np.abs(actual.astype(np.int64) - from_ort.astype(np.int64)).max() <= 1
    else:
        assert_close(actual, expected, rtol=1e-6)
        assert_close(actual, from_ort, rtol=1e-6)
