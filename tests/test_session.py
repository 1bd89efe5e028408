"""The Python API: onnxruntime's names and behaviour, errors, the report, the switches."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import nnrun
from oracle import WHOLE_MODEL_RTOL, assert_close, check_model, make_model, run_onnxruntime

MODELS = "models"


def conv_relu_model():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    scale, bias = rng.random(8).astype(np.float32) + 0.5, rng.standard_normal(8).astype(np.float32)
    mean, var = rng.standard_normal(8).astype(np.float32), rng.random(8).astype(np.float32) + 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    inits = [("w", w), ("b", b), ("s", scale), ("bb", bias), ("m", mean), ("v", var),
             ("shape", np.array([1, -1], np.int64))]
    return make_model(nodes, [("x", (np.float32, [1, 3, 10, 10]))], [("y", None)], inits)


def test_get_inputs_and_outputs_like_onnxruntime():
    import onnxruntime as ort

    path = f"{MODELS}/bert_tiny.onnx"
    ours = nnrun.InferenceSession(path)
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for a, b in zip(ours.get_inputs() + ours.get_outputs(), theirs.get_inputs() + theirs.get_outputs()):
        assert (a.name, a.type) == (b.name, b.type)
        assert a.shape == b.shape


def test_output_names_select_outputs():
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
                       [("x", x)], [("a", None), ("b", None)])
    sess = nnrun.InferenceSession(model.SerializeToString())
    expected = run_onnxruntime(model, {"x": x})
    (b,) = sess.run(["b"], {"x": x})
    assert_close(b, expected[1])
    with pytest.raises(nnrun.InputError, match="unknown output"):
        sess.run(["nope"], {"x": x})


def test_fold_and_fuse_match_onnxruntime_with_every_switch():
    model = conv_relu_model()
    x = np.random.default_rng(2).standard_normal((1, 3, 10, 10)).astype(np.float32)
    steps = {}
    for switch in (None, "fold_batchnorm", "fuse_activations", "fold_constants", "memory_aware_order",
                   "release_weights"):
        options = nnrun.SessionOptions()
        if switch:
            setattr(options, switch, False)
        check_model(model, {"x": x}, rtol=1e-4, sess_options=options)
        sess = nnrun.InferenceSession(model.SerializeToString(), sess_options=options)
        steps[switch] = sess.report()["plan"]["steps"]
    # Conv+BN+Relu became one step (plus the Reshape view).
    assert steps[None] == 2
    assert steps["fold_batchnorm"] == 4  # Conv, BatchNormalization, Relu, Reshape
    assert steps["fuse_activations"] == 3


def test_input_errors_name_the_input():
    sess = nnrun.InferenceSession(conv_relu_model().SerializeToString())
    good = np.zeros((1, 3, 10, 10), np.float32)
    with pytest.raises(nnrun.InputError, match="'x' is missing"):
        sess.run(None, {})
    with pytest.raises(nnrun.InputError, match="unknown input names"):
        sess.run(None, {"x": good, "z": good})
    with pytest.raises(nnrun.InputError, match="'x'.*tensor\\(float\\).*tensor\\(double\\)"):
        sess.run(None, {"x": good.astype(np.float64)})
    with pytest.raises(nnrun.InputError, match="'x': dimension 2 must be 10"):
        sess.run(None, {"x": np.zeros((1, 3, 11, 10), np.float32)})
    with pytest.raises(nnrun.InputError, match="rank 4"):
        sess.run(None, {"x": np.zeros((3, 10, 10), np.float32)})


def test_unsupported_operators_are_listed_at_once():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("NoSuchOp", ["a"], ["b"]),
             helper.make_node("AlsoMissing", ["b"], ["y"], domain="com.example")]
    model = make_model(nodes, [("x", (np.float32, [2]))], [("y", None)],
                       extra_opsets=[("com.example", 1)])
    with pytest.raises(nnrun.UnsupportedOperatorError) as info:
        nnrun.InferenceSession(model.SerializeToString())
    assert "NoSuchOp" in str(info.value) and "com.example.AlsoMissing" in str(info.value)
    assert isinstance(info.value, nnrun.NnrunError)


def test_unsupported_operators_in_bodies_are_listed_at_session_creation():
    """A body's unsupported op is refused when the session is made (onnxruntime too), not at the
    first run that takes its branch; ops at every depth are listed together."""
    def value(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])

    inner = helper.make_graph([helper.make_node("DeepMissing", ["x"], ["d"])], "inner", [], [value("d")])
    then = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["t"])], "then", [], [value("t")])
    other = helper.make_graph([helper.make_node("If", ["c"], ["e"], then_branch=inner, else_branch=inner)],
                              "else", [], [value("e")])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = make_model(nodes, [("c", (np.bool_, [])), ("x", (np.float32, [2]))], [("y", None)])
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(Exception) as theirs:
        run_onnxruntime(model, {"c": np.array(False), "x": np.zeros(2, np.float32)})
    assert "NoSuchOp" in str(theirs.value) or "DeepMissing" in str(theirs.value)  # refused there too
    with pytest.raises(nnrun.UnsupportedOperatorError) as info:
        nnrun.InferenceSession(model.SerializeToString())
    assert {op for _, op, _ in info.value.ops} == {"NoSuchOp", "DeepMissing"}


def test_report_has_the_contract_fields():
    sess = nnrun.InferenceSession(f"{MODELS}/tiny_cnn.onnx")
    x = np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)
    sess.run(None, {sess.get_inputs()[0].name: x})
    report = sess.report()
    assert report["format"] == "onnx" and report["model"].endswith("tiny_cnn.onnx")
    assert report["baseline"]["rss_kb"] > 0
    for phase in ("MODEL_LOAD", "PREPARE", "EXECUTE"):
        assert report["phases"][phase]["rss_kb"] >= report["baseline"]["rss_kb"] * 0.5
        assert report["phases"][phase]["hwm_kb"] > 0
    assert set(report["phases"]["EXECUTE"]["time_ms"]) == {"min", "max", "mean", "median", "geomean"}
    assert report["phases"]["EXECUTE"]["runs"] == 1
    assert set(report["plan"]) >= {"arena_bytes", "lower_bound_bytes", "weights_mapped_bytes",
                                   "weights_packed_bytes", "weights_released_bytes", "steps"}
    assert report["peak"]["hwm_kb"] == max(p["hwm_kb"] for p in report["phases"].values())
    (name,) = report["outputs"]
    assert report["outputs"][name] == {"shape": [1, 10], "dtype": "float32"}


def test_graph_outputs_are_not_overwritten_by_later_runs():
    path = f"{MODELS}/tiny_cnn.onnx"
    sess = nnrun.InferenceSession(path)
    name = sess.get_inputs()[0].name
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal((1, 1, 28, 28)).astype(np.float32) for _ in range(2))
    first = sess.run(None, {name: x1})[0]
    kept = first.copy()
    sess.run(None, {name: x2})
    np.testing.assert_array_equal(first, kept)


def test_runs_from_threads_agree_with_onnxruntime():
    from concurrent.futures import ThreadPoolExecutor

    import onnxruntime as ort

    path = f"{MODELS}/mobilenet_tiny.onnx"
    sess = nnrun.InferenceSession(path)
    oracle = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    shape = sess.get_inputs()[0].shape
    feeds = [np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda x: sess.run(None, {name: x})[0], feeds))
    for x, y in zip(feeds, results):
        assert_close(y, oracle.run(None, {name: x})[0], rtol=WHOLE_MODEL_RTOL)


def test_residual_add_and_relu_run_as_one_step():
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((2, 8, 5, 5)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [("a", a), ("b", b)], [("y", None)])
    check_model(model, {"a": a, "b": b})
    assert nnrun.InferenceSession(model.SerializeToString()).report()["plan"]["steps"] == 1
    options = nnrun.SessionOptions()
    options.fuse_activations = False
    assert nnrun.InferenceSession(model.SerializeToString(), sess_options=options).report()["plan"]["steps"] == 2


def test_intra_op_num_threads_bounds_blas_during_a_run_only(tmp_path):
    """While a run executes, the BLAS library uses at most intra_op_num_threads threads; after it,
    the process's own setting is back. The libraries are looked up when a session is made, not per run."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import nnrun.ops.blas
    import nnrun.threads

    def blas_threads():  # numpy's (and scipy's); nnrun's own runs on one thread throughout (test_blas.py)
        return [lib["num_threads"] for lib in threadpool_info()
                if lib["user_api"] == "blas" and not nnrun.ops.blas.is_own(lib["filepath"])]

    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", (np.float32, [8, 64]))],
                       [("y", None)], [("w", w)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    options = nnrun.SessionOptions()
    options.intra_op_num_threads = 1
    sess = nnrun.InferenceSession(str(path), sess_options=options)
    seen = []

    class Options:
        @staticmethod
        def trace(step, outputs):
            seen.append(blas_threads())

    x = {"x": np.ones((8, 64), np.float32)}
    with threadpool_limits(limits=2, user_api="blas"):  # the process's own setting, above the session's
        before = blas_threads()
        if not before or max(before) < 2:
            pytest.skip(f"this BLAS library will not use 2 threads here ({before})")
        sess.run(None, x, Options)
        assert seen and all(counts and max(counts) == 1 for counts in seen)
        assert blas_threads() == before
    made = nnrun.threads.controller()
    sess.run(None, x)
    assert nnrun.threads.controller() is made


def test_a_session_bounds_the_blas_libraries_loaded_before_it_was_made():
    # scipy's wheels bring an OpenBLAS of their own; loaded after nnrun first looked (a float64
    # GELU imports scipy.special), a session made afterwards bounds it too.
    from threadpoolctl import threadpool_info

    import nnrun.threads

    nnrun.threads.controller()
    import scipy.linalg  # noqa: F401 - loads scipy's BLAS, if it was not yet

    options = nnrun.SessionOptions()
    options.intra_op_num_threads = 1
    sess = nnrun.InferenceSession(conv_relu_model().SerializeToString(), sess_options=options)
    loaded = {lib["filepath"] for lib in threadpool_info()}
    assert {library.filepath for library in sess._threads.libraries} == loaded


def test_execute_figures_stay_bounded_and_memory_is_read_on_the_first_runs(monkeypatch):
    import nnrun.report

    monkeypatch.setattr(nnrun.report, "RECENT_RUNS", 5)
    sess = nnrun.InferenceSession(conv_relu_model().SerializeToString())
    x = np.zeros((1, 3, 10, 10), np.float32)
    for _ in range(12):
        sess.run(None, {"x": x})
    execute = sess.report()["phases"]["EXECUTE"]
    assert execute["runs"] == 12 and len(sess._recorder.times["EXECUTE"]) == 5
    assert execute["rss_kb"] > 0 and execute["hwm_kb"] >= execute["rss_kb"]
