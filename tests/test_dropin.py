"""nnrun as a drop-in for onnxruntime: the surface clients touch, each piece checked against onnxruntime.

onnxruntime is the oracle throughout: each test does the same thing with both modules and
compares what comes back (names, defaults, values, exception classes by name).
"""

import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import nnrun
from nnrun import status
from oracle import assert_close, make_model

MODEL = "models/mobilenet_tiny.onnx"
CPU = ["CPUExecutionProvider"]


def both(path=MODEL, **kwargs):
    return nnrun.InferenceSession(path, **kwargs), ort.InferenceSession(path, providers=CPU)


def image(seed=0):
    return np.random.default_rng(seed).standard_normal((1, 3, 96, 96)).astype(np.float32)


# --- the module surface

MODULE_NAMES = ["InferenceSession", "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode",
                "ExecutionOrder", "OrtValue", "IOBinding", "NodeArg", "ModelMetadata", "get_available_providers",
                "get_all_providers", "get_device", "get_version_string", "get_build_info",
                "disable_telemetry_events", "enable_telemetry_events", "set_default_logger_severity",
                "set_default_logger_verbosity", "set_seed", "capi"]


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_module_has_what_onnxruntime_has(name):
    assert hasattr(ort, name)
    assert hasattr(nnrun, name)


def test_providers_and_device_like_onnxruntime():
    assert "CPUExecutionProvider" in ort.get_available_providers()
    assert nnrun.get_available_providers() == ["CPUExecutionProvider"]
    assert set(ort.get_all_providers()) <= set(nnrun.get_all_providers())
    assert nnrun.get_device() == ort.get_device()
    nnrun.disable_telemetry_events()
    nnrun.set_default_logger_severity(3)
    nnrun.set_default_logger_verbosity(0)


@pytest.mark.parametrize("enum", ["GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder"])
def test_enums_have_onnxruntime_members_and_values(enum):
    theirs, ours = getattr(ort, enum), getattr(nnrun, enum)
    assert list(theirs.__members__) == list(ours.__members__)
    for member in theirs.__members__:
        assert int(getattr(theirs, member)) == int(getattr(ours, member))


SESSION_DEFAULTS = ["intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
                    "execution_order", "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse",
                    "enable_profiling", "use_deterministic_compute", "use_per_session_threads",
                    "log_severity_level", "log_verbosity_level", "logid", "optimized_model_filepath"]


@pytest.mark.parametrize("field", SESSION_DEFAULTS)
def test_session_options_defaults_like_onnxruntime(field):
    theirs, ours = getattr(ort.SessionOptions(), field), getattr(nnrun.SessionOptions(), field)
    if hasattr(theirs, "__int__") and not isinstance(theirs, str):
        assert int(theirs) == int(ours)
    else:
        assert theirs == ours


@pytest.mark.parametrize("field", ["log_severity_level", "log_verbosity_level", "logid", "terminate",
                                   "only_execute_path_to_fetches"])
def test_run_options_defaults_like_onnxruntime(field):
    assert getattr(ort.RunOptions(), field) == getattr(nnrun.RunOptions(), field)


@pytest.mark.parametrize("module", [ort, nnrun], ids=["onnxruntime", "nnrun"])
def test_config_entries_read_back_and_a_missing_one_raises(module):
    options, run_options = module.SessionOptions(), module.RunOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    with pytest.raises(Exception):
        options.get_session_config_entry("never.set")


def test_options_clients_set_are_accepted_and_outputs_match():
    x = image()
    (expected,) = ort.InferenceSession(MODEL, providers=CPU).run(None, {"input": x})
    options = nnrun.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.execution_mode = nnrun.ExecutionMode.ORT_PARALLEL
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for level in nnrun.GraphOptimizationLevel:
        options.graph_optimization_level = level
        (got,) = nnrun.InferenceSession(MODEL, options).run(None, {"input": x})
        assert_close(got, expected, rtol=1e-3, what=level.name)


def test_disable_all_runs_no_fusion_and_basic_no_pattern_fusion():
    x = image()
    plans = {}
    for level in (nnrun.GraphOptimizationLevel.ORT_DISABLE_ALL, nnrun.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = nnrun.SessionOptions()
        options.graph_optimization_level = level
        sess = nnrun.InferenceSession(MODEL, options)
        sess.run(None, {"input": x})
        plans[level] = sess.plan()
    off, on = ([s.node.op_type for s in plan.steps] for plan in plans.values())
    # The model's BatchNormalization and activations stay nodes of their own with every optimisation off.
    assert "BatchNormalization" in off and "BatchNormalization" not in on
    assert len(off) > len(on)


def test_unavailable_providers_warn_and_fall_back_to_the_cpu_like_onnxruntime():
    asked = [("CUDAExecutionProvider", {"device_id": 0}), ("CPUExecutionProvider", {"arena_extend_strategy": "x"})]
    for module in (ort, nnrun):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sess = module.InferenceSession(MODEL, providers=asked)
        assert any("CUDAExecutionProvider" in str(w.message) for w in caught), module.__name__
        assert sess.get_providers() == ["CPUExecutionProvider"]
        assert sess.get_provider_options().keys() == {"CPUExecutionProvider"}
        sess.set_providers(["CPUExecutionProvider"])


@pytest.mark.parametrize("module", [ort, nnrun], ids=["onnxruntime", "nnrun"])
def test_malformed_provider_arguments_fall_back_to_the_cpu(module):
    for providers, options in (([42], None), (["CPUExecutionProvider"], [{}, {}])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = module.InferenceSession(MODEL, providers=providers, provider_options=options)
        assert sess.get_providers() == ["CPUExecutionProvider"]


# --- metadata and shapes

def test_modelmeta_like_onnxruntime(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (np.float32, [2]))], [("y", None)])
    model.producer_name, model.producer_version, model.domain = "a-producer", "9.1", "org.example"
    model.model_version, model.doc_string = 7, "what the model does"
    model.graph.name, model.graph.doc_string = "the-graph", "what the graph does"
    helper.set_model_props(model, {"labels": "cat,dog", "stride": "32"})
    path = tmp_path / "meta.onnx"
    path.write_bytes(model.SerializeToString())
    ours, theirs = (s.get_modelmeta() for s in both(str(path)))
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
                  "custom_metadata_map"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.custom_metadata_map == {"labels": "cat,dog", "stride": "32"}


def test_inputs_and_outputs_like_onnxruntime_where_inference_fills_a_symbolic_dim(tmp_path):
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["y"], ["z"])],
                       [("x", (np.float32, ["batch", 3, "h", "w"]))], [("z", None)], [("w", w)])
    z = model.graph.output[0]
    z.type.tensor_type.elem_type = TensorProto.FLOAT
    for param in ("n", "c", "hh", "ww"):  # an exporter's names for every dim: inference finds c = 8
        z.type.tensor_type.shape.dim.add().dim_param = param
    path = tmp_path / "conv.onnx"
    path.write_bytes(model.SerializeToString())
    ours, theirs = both(str(path))
    for a, b in zip(ours.get_inputs() + ours.get_outputs(), theirs.get_inputs() + theirs.get_outputs()):
        assert (a.name, a.type, a.shape) == (b.name, b.type, b.shape)
    assert ours.get_outputs()[0].shape[1] == 8


def test_free_dimension_override_like_onnxruntime(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (np.float32, ["batch", 4]))], [("y", None)])
    path = tmp_path / "free.onnx"
    path.write_bytes(model.SerializeToString())
    sessions = []
    for module in (nnrun, ort):
        options = module.SessionOptions()
        options.add_free_dimension_override_by_name("batch", 2)
        sessions.append(module.InferenceSession(str(path), options, providers=CPU))
    assert sessions[0].get_inputs()[0].shape == sessions[1].get_inputs()[0].shape == [2, 4]


# --- errors: the class onnxruntime raises, caught by onnxruntime's name

def _model(nodes, inputs, outputs, domains=()):
    return make_model(nodes, inputs, outputs, extra_opsets=[(d, 1) for d in domains]).SerializeToString()


RELU = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", (np.float32, [2, 3]))], [("y", None)])
RESHAPE = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                 [("x", (np.float32, [2, 3])), ("s", (np.int64, [2]))], [("y", None)])
ERROR_CASES = {
    "missing file": (lambda m: m.InferenceSession("no/such/model.onnx"), "NoSuchFile"),
    "not a protobuf": (lambda m: m.InferenceSession(b"\x0f\xff garbage"), "InvalidProtobuf"),
    "unknown operator": (lambda m: m.InferenceSession(_model([helper.make_node("Frobnicate", ["x"], ["y"])],
                                                             [("x", (np.float32, [2]))], [("y", None)])),
                         "InvalidGraph"),
    "operator of an unknown domain": (lambda m: m.InferenceSession(_model(
        [helper.make_node("Frob", ["x"], ["y"], domain="my.domain")], [("x", (np.float32, [2]))], [("y", None)],
        domains=["my.domain"])), "Fail"),
    "wrong rank": (lambda m: m.InferenceSession(RELU).run(None, {"x": np.zeros(2, np.float32)}), "InvalidArgument"),
    "wrong dim": (lambda m: m.InferenceSession(RELU).run(None, {"x": np.zeros((2, 4), np.float32)}),
                  "InvalidArgument"),
    "unknown input": (lambda m: m.InferenceSession(RELU).run(None, {"x": np.zeros((2, 3), np.float32),
                                                                     "z": np.zeros(1)}), "InvalidArgument"),
    "unknown output": (lambda m: m.InferenceSession(RELU).run(["nope"], {"x": np.zeros((2, 3), np.float32)}),
                       "InvalidArgument"),
    "missing input": (lambda m: m.InferenceSession(RELU).run(None, {}), "ValueError"),
    "kernel failure": (lambda m: m.InferenceSession(RESHAPE).run(None, {"x": np.zeros((2, 3), np.float32),
                                                                         "s": np.array([4, 4], np.int64)}),
                       "Fail"),
}


def _status_class(name):
    return ValueError if name == "ValueError" else getattr(status, name)


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_are_caught_by_the_class_onnxruntime_raises(case):
    act, expected = ERROR_CASES[case]
    with pytest.raises(Exception) as theirs:
        act(ort)
    assert expected in [c.__name__ for c in type(theirs.value).__mro__]  # the oracle says so
    with pytest.raises(nnrun.NnrunError) as ours:
        act(nnrun)
    assert isinstance(ours.value, _status_class(expected)), type(ours.value).__mro__


def test_terminate_flag_like_onnxruntime():
    x = {"x": np.zeros((2, 3), np.float32)}
    for module in (ort, nnrun):
        run_options = module.RunOptions()
        run_options.terminate = True
        with pytest.raises(Exception, match="terminate flag"):
            module.InferenceSession(RELU, providers=CPU).run(None, x, run_options)


def test_custom_op_libraries_are_refused_with_fail():
    with pytest.raises(Exception) as theirs:
        ort.SessionOptions().register_custom_ops_library("no/such/library.so")
    assert type(theirs.value).__name__ == "Fail"
    with pytest.raises(status.Fail):
        nnrun.SessionOptions().register_custom_ops_library("no/such/library.so")


CLIENT_IMPORTS = """
import sys, numpy as np, nnrun
sys.modules["onnxruntime"] = nnrun
import onnxruntime
from onnxruntime.capi import _pybind_state as C
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidProtobuf, NoSuchFile
import onnxruntime.capi.onnxruntime_inference_collection as collection
assert C.get_available_providers() == ["CPUExecutionProvider"]
assert collection.InferenceSession is onnxruntime.InferenceSession
try:
    onnxruntime.InferenceSession("no/such/model.onnx")
except NoSuchFile:
    pass
try:
    onnxruntime.InferenceSession(b"\\x0f\\xff garbage")
except InvalidProtobuf:
    pass
sess = onnxruntime.InferenceSession("{model}")
try:
    sess.run(None, {{"input": np.zeros((1, 3, 96, 96), np.float64)}})
except InvalidArgument:
    print("ok")
"""


def test_clients_importing_onnxruntime_paths_get_nnrun_and_catch_its_errors():
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(CLIENT_IMPORTS.format(model=MODEL))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# --- OrtValue and I/O binding

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int8, np.uint8, np.bool_, np.float64])
def test_ortvalue_like_onnxruntime(dtype):
    array = np.arange(6).reshape(2, 3).astype(dtype)
    theirs, ours = ort.OrtValue.ortvalue_from_numpy(array), nnrun.OrtValue.ortvalue_from_numpy(array)
    for method in ("shape", "data_type", "element_type", "device_name", "tensor_size_in_bytes", "has_value",
                   "is_tensor", "is_sparse_tensor", "is_tensor_sequence"):
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    # A CPU OrtValue is the caller's array, not a copy, in both.
    assert np.shares_memory(theirs.numpy(), array) and np.shares_memory(ours.numpy(), array)
    assert ours.data_ptr() == array.ctypes.data


def test_ortvalue_from_shape_and_type_like_onnxruntime():
    for element in (np.float32, TensorProto.INT64):
        theirs = ort.OrtValue.ortvalue_from_shape_and_type([2, 5], element)
        ours = nnrun.OrtValue.ortvalue_from_shape_and_type([2, 5], element)
        assert (ours.shape(), ours.data_type()) == (theirs.shape(), theirs.data_type())
    with pytest.raises(status.NotImplemented):
        nnrun.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32), "cuda", 0)


def test_run_with_ort_values_like_onnxruntime():
    x = image(1)
    ours, theirs = both()
    expected = theirs.run_with_ort_values(None, {"input": ort.OrtValue.ortvalue_from_numpy(x)})
    got = ours.run_with_ort_values(None, {"input": nnrun.OrtValue.ortvalue_from_numpy(x)})
    assert [v.shape() for v in got] == [v.shape() for v in expected]
    assert_close(got[0].numpy(), expected[0].numpy(), rtol=1e-3)


def test_io_binding_like_onnxruntime():
    x = image(2)
    ours, theirs = both()
    name = theirs.get_outputs()[0].name
    results = []
    for sess in (theirs, ours):
        binding = sess.io_binding()
        binding.bind_cpu_input("input", x)
        binding.bind_output(name)
        sess.run_with_iobinding(binding)
        results.append(binding.copy_outputs_to_cpu()[0])
        assert binding.get_outputs()[0].shape() == list(results[-1].shape)
    assert_close(results[1], results[0], rtol=1e-3)


@pytest.mark.parametrize("how", ["ortvalue", "buffer_ptr"])
def test_bound_outputs_are_written_into_the_callers_array(how):
    x = image(3)
    ours, theirs = both()
    output = theirs.get_outputs()[0].name
    (expected,) = theirs.run(None, {"input": x})
    target = np.full(expected.shape, np.nan, np.float32)
    binding = ours.io_binding()
    binding.bind_ortvalue_input("input", nnrun.OrtValue.ortvalue_from_numpy(x))
    if how == "ortvalue":
        binding.bind_ortvalue_output(output, nnrun.OrtValue.ortvalue_from_numpy(target))
    else:
        binding.bind_output(output, "cpu", 0, np.float32, list(target.shape), target.ctypes.data)
    ours.run_with_iobinding(binding)
    assert_close(target, expected, rtol=1e-3)
    assert np.shares_memory(binding.get_outputs()[0].numpy(), target)


def test_a_bound_output_the_plan_writes_straight_is_not_copied():
    x = image(4)
    sess = nnrun.InferenceSession(MODEL)
    sess.run(None, {"input": x})
    plan = sess.plan()
    name, slot = plan.outputs[0]
    assert slot in plan.fresh  # the last kernel writes this output: the case meant here
    executor = sess._executor_for((("input", x.shape, x.dtype),))
    target = np.empty(*plan.fresh[slot])
    results = executor.run({"input": x}, into={name: target})
    assert results[name] is target


def test_run_async_calls_back_with_outputs_like_onnxruntime():
    x = image(5)
    ours, theirs = both()
    (expected,) = theirs.run(None, {"input": x})
    done, got = threading.Event(), {}

    def callback(outputs, user_data, error):
        got.update(outputs=outputs, user_data=user_data, error=error)
        done.set()

    ours.run_async(None, {"input": x}, callback, "data")
    assert done.wait(60)
    assert got["error"] == "" and got["user_data"] == "data"
    assert_close(got["outputs"][0], expected, rtol=1e-3)


def test_session_methods_clients_call_exist_like_onnxruntime():
    ours, theirs = both()
    for method in ("get_inputs", "get_outputs", "get_overridable_initializers", "get_modelmeta", "get_providers",
                   "get_provider_options", "get_session_options", "set_providers", "end_profiling",
                   "get_profiling_start_time_ns", "run", "run_with_ort_values", "io_binding", "run_with_iobinding",
                   "run_async", "disable_fallback", "enable_fallback"):
        assert callable(getattr(theirs, method)) and callable(getattr(ours, method)), method
    assert ours.get_overridable_initializers() == theirs.get_overridable_initializers() == []
    assert isinstance(ours.get_session_options(), nnrun.SessionOptions)
