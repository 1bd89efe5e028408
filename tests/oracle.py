"""Independent oracles for the tests: onnxruntime and onnx's reference evaluator.

`check_node` builds a one-node model, runs it in nnrun and in an oracle on the
same feeds, and compares. Nothing here ever compares nnrun with itself.

Which oracle (see tests/README.md): integer arithmetic is checked exactly against the
reference evaluator, because onnxruntime's integer kernels differ by CPU (its int8 x int8
MatMulInteger saturates on AVX2 machines without VNNI); everything else against onnxruntime.
`check_model` picks by the model, and `run_onnxruntime` refuses integer arithmetic, so no
test can come to depend on the machine it runs on.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import nnrun

DEFAULT_OPSET = 17


def make_model(nodes, inputs, outputs, initializers=(), opset=DEFAULT_OPSET, extra_opsets=()):
    """A model from nodes and (name, array-or-(dtype, shape)) declarations."""
    def info(name, spec):
        if isinstance(spec, np.ndarray):
            dtype, shape = spec.dtype, spec.shape
        else:
            dtype, shape = spec
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph = helper.make_graph(
        nodes, "test",
        [info(n, s) for n, s in inputs],
        [info(n, s) if s is not None else helper.make_empty_tensor_value_info(n)
         for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 9)
    return model


# Ops whose integer results come from arithmetic whatever their types: the quantized ops, and
# NonMaxSuppression, whose indices follow float IoUs that a compiler may contract into FMAs.
INTEGER_RESULT_OPS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "DynamicQuantizeLinear",
                      "QuantizeLinear", "NonMaxSuppression"}
# Ops that do arithmetic on their inputs: integer arithmetic when they output integers.
ARITHMETIC_OPS = {"Add", "Sub", "Mul", "Div", "Mod", "Pow", "Abs", "Neg", "Sign", "Relu", "PRelu", "Clip",
                  "Max", "Min", "Sum", "Mean", "Shrink", "BitShift", "MatMul", "Gemm", "Einsum", "CumSum",
                  "HannWindow", "HammingWindow", "BlackmanWindow", "Range",
                  "ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                  "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
# Interpolating ops: arithmetic in their linear and cubic modes; nearest only selects.
INTERPOLATING_OPS = {"Resize", "Upsample"}
INTEGER_TYPES = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16,
                 TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64,
                 TensorProto.INT4, TensorProto.UINT4}


def integer_arithmetic(model):
    """The nodes of `model` that compute integers by arithmetic (names), subgraphs included."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    found = []

    def interpolates(node):
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
        return node.op_type in INTERPOLATING_OPS and mode != b"nearest"

    def walk(graph):
        for node in graph.node:
            computes = node.op_type in ARITHMETIC_OPS or interpolates(node)
            if node.domain in ("", "ai.onnx") and (
                    node.op_type in INTEGER_RESULT_OPS
                    or (computes and any(types.get(o) in INTEGER_TYPES for o in node.output))):
                found.append(node.op_type)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub)

    walk(inferred.graph)
    return found


def exact_oracle_for(model):
    return "reference" if integer_arithmetic(model) else "onnxruntime"


def run_onnxruntime(model, feeds):
    import onnxruntime as ort

    integer_ops = integer_arithmetic(model)
    assert not integer_ops, (
        f"onnxruntime is no oracle for integer arithmetic ({', '.join(sorted(set(integer_ops)))}): "
        "its integer kernels differ by CPU; use the reference evaluator")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_reference(model, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def run_nnrun(model, feeds, **options):
    sess = nnrun.InferenceSession(model.SerializeToString(), **options)
    return sess.run(None, feeds)


# Tolerances, relative to the largest magnitude of the expected output. The default, 1e-4, holds
# for float32 ops on any CPU: kernels sum in another order or use FMA, a few ulps apart.
# float16 keeps 11 significant bits (spacing 9.8e-4 near 1), and the two sides round
# intermediates to float16 at different points: three spacings.
FLOAT16_RTOL = 3e-3
# A whole model: rounding differences of every layer compound, and onnxruntime's default
# optimizations fuse and block its GEMMs its own way.
WHOLE_MODEL_RTOL = 1e-3


def assert_close(actual, expected, rtol=1e-4, atol=None, what=""):
    """Elementwise closeness relative to the largest magnitude of the expected output."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.kind in "biuU" or expected.dtype == object:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    finite_values = expected[np.isfinite(expected)]
    scale = float(np.max(np.abs(finite_values))) if finite_values.size else 0.0
    tol = atol if atol is not None else rtol * max(scale, 1e-6)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=f"{what}: NaN mismatch")
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(actual[~finite], expected[~finite], err_msg=f"{what}: inf mismatch")
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=0, atol=tol, err_msg=what)


def check_model(model, feeds, oracle="auto", rtol=1e-4, atol=None, **options):
    """Run `model` in nnrun and in the oracle; assert every output matches.

    `oracle="auto"` takes the reference evaluator for integer arithmetic (compared exactly)
    and onnxruntime for the rest; "reference" names the evaluator where onnxruntime lacks an
    opset, a type or the spec's behaviour.
    """
    if oracle == "auto":
        oracle = exact_oracle_for(model)
    run_oracle = run_onnxruntime if oracle == "onnxruntime" else run_reference
    expected = run_oracle(model, feeds)
    actual = run_nnrun(model, feeds, **options)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, rtol=rtol, atol=atol, what=f"output {i}")
    return actual


def check_node(op_type, inputs, attrs=None, initializers=(), n_outputs=1, opset=DEFAULT_OPSET,
               oracle="auto", rtol=1e-4, atol=None, domain=""):
    """One node: `inputs` is a list of (name, array); `initializers` a list of (name, array).

    Inputs named in `initializers` are weights in the model; the others are fed.
    Pass "" as a name for an omitted optional input.
    """
    names = [n for n, _ in inputs]
    feeds = {n: a for n, a in inputs if n}
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names + [n for n, _ in initializers], outs,
                            domain=domain, **(attrs or {}))
    model = make_model([node], [(n, a) for n, a in inputs if n], [(o, None) for o in outs],
                       initializers, opset=opset)
    return check_model(model, feeds, oracle=oracle, rtol=rtol, atol=atol)


def rng(seed=0):
    return np.random.default_rng(seed)


def data(shape, dtype=np.float32, seed=0):
    """Random test data: N(0, 10) cast to `dtype` (bools: the positive ones)."""
    values = np.asarray(rng(seed).standard_normal(shape) * 10)
    if np.dtype(dtype) == np.bool_:
        return np.asarray(values > 0)
    return np.asarray(values.astype(dtype))


def i64(*values):
    return np.array(values, dtype=np.int64)


__all__ = ["FLOAT16_RTOL", "WHOLE_MODEL_RTOL", "data", "i64", "make_model", "check_model", "check_node",
           "assert_close", "run_onnxruntime", "run_reference", "run_nnrun", "rng", "TensorProto", "helper",
           "numpy_helper", "onnx"]


def run_onnxruntime_path(path, feeds):
    """onnxruntime on a float model file (external data resolved beside it), default optimisations."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close_values(actual, expected, rtol=1e-4, what=""):
    """assert_close for any ONNX value: a sequence (a list, compared element by element, as
    onnxruntime and the reference evaluator return it), an empty optional (None) or a tensor."""
    if expected is None:
        assert actual is None, f"{what}: expected an empty optional, got {type(actual).__name__}"
        return
    if isinstance(expected, list):
        assert isinstance(actual, list), f"{what}: expected a sequence (a list), got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{what}: {len(actual)} tensors, expected {len(expected)}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_close_values(a, e, rtol, f"{what}[{k}]")
        return
    assert_close(actual, expected, rtol=rtol, what=what)


def check_values(model, feeds, oracle="reference", rtol=1e-4):
    """check_model for a model whose inputs or outputs may be sequences (lists) or optionals (None)."""
    expected = (run_onnxruntime if oracle == "onnxruntime" else run_reference)(model, feeds)
    actual = run_nnrun(model, feeds)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close_values(a, e, rtol, what=f"output {i}")
    return actual
