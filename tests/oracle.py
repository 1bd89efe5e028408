"""Independent oracles for the tests: onnxruntime and onnx's reference evaluator.

`check_node` builds a one-node model, runs it in nnrun and in an oracle on the
same feeds, and compares. Nothing here ever compares nnrun with itself.
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


def run_onnxruntime(model, feeds):
    import onnxruntime as ort

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


def check_model(model, feeds, oracle="onnxruntime", rtol=1e-4, atol=None, **options):
    """Run `model` in nnrun and in the oracle; assert every output matches."""
    run_oracle = run_onnxruntime if oracle == "onnxruntime" else run_reference
    expected = run_oracle(model, feeds)
    actual = run_nnrun(model, feeds, **options)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, rtol=rtol, atol=atol, what=f"output {i}")
    return actual


def check_node(op_type, inputs, attrs=None, initializers=(), n_outputs=1, opset=DEFAULT_OPSET,
               oracle="onnxruntime", rtol=1e-4, atol=None, domain=""):
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


__all__ = ["data", "i64", "make_model", "check_model", "check_node", "assert_close", "run_onnxruntime",
           "run_reference", "run_nnrun", "rng", "TensorProto", "helper", "numpy_helper", "onnx"]


def run_onnxruntime_path(path, feeds):
    """onnxruntime on a model file (external data resolved beside it), default optimisations."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
