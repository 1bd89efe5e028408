"""Weight identity from the loader to the plan (runtime/weights.py, compiler/release.py): every
file weight has an id, a step's WeightRead names it, and release keeps exactly the weights the
plan reads as mapped bytes, by id, through folded reshapes of them too. Outputs are checked
against onnxruntime."""

import numpy as np
from oracle import assert_close, check_model, helper, make_model, rng, run_onnxruntime

import nnrun
from nnrun.compiler.plan import CACHED, MAPPED
from nnrun.compiler.release import mapped_weights
from nnrun.loader import load_model


def saved(tmp_path, model):
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def two_matmuls():
    """y = relu(x @ w1) @ reshape(w2): w1 read as it lies, w2 through a folded Reshape."""
    w1 = rng(0).standard_normal((16, 32)).astype(np.float32)
    w2 = rng(1).standard_normal((4, 8, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Reshape", ["w2", "shape"], ["w2r"], name="reshape"),
             helper.make_node("MatMul", ["r", "w2r"], ["y"], name="mm2")]
    return make_model(nodes, [("x", np.zeros((2, 16), np.float32))], [("y", None)],
                      [("w1", w1), ("w2", w2), ("shape", np.array([32, 16], np.int64))])


def test_the_loader_numbers_every_file_weight_once(tmp_path):
    graph = load_model(saved(tmp_path, two_matmuls()))
    ids = [w.id for w in mapped_weights(graph)]
    assert sorted(ids) == list(range(len(ids))) and len(ids) >= 2


def test_steps_name_the_weights_they_read_and_release_keeps_exactly_those(tmp_path):
    model = two_matmuls()
    path = saved(tmp_path, model)
    sess = nnrun.InferenceSession(path)
    plan = sess.plan()
    by_name = {w.name: w for s in plan.steps for w in s.weights}
    file_ids = {w.name: w.id for w in mapped_weights(sess.graph)}
    assert by_name["w1"].id == file_ids["w1"]
    assert by_name["w2r"].id == file_ids["w2"]  # a folded reshape is still weight w2
    kept = {w.id for w in plan.mapped_weights}
    for read in (by_name["w1"], by_name["w2r"]):
        assert (read.where == MAPPED) == (read.id in kept)
    assert kept <= set(file_ids.values())
    x = rng(2).standard_normal((2, 16)).astype(np.float32)
    assert_close(sess.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0])


def test_a_weight_folded_into_another_is_released_and_the_answer_holds(tmp_path):
    w = rng(0).standard_normal((64, 32, 3, 3)).astype(np.float32)  # 72 KiB: whole pages to release
    bn = [(n, rng(i).uniform(0.5, 1.5, 64).astype(np.float32)) for i, n in enumerate("sbmv")]
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]),
                        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])],
                       [("x", np.zeros((1, 32, 8, 8), np.float32))], [("y", None)], [("w", w)] + bn)
    sess = nnrun.InferenceSession(saved(tmp_path, model))
    plan = sess.plan()
    assert plan.mapped_weights == ()  # every weight went into the folded Conv
    # made at PREPARE: in the weight cache file, on by default for a model read from a file
    assert {w.where for s in plan.steps for w in s.weights} == {CACHED}
    assert sess.report()["plan"]["weights_released_bytes"] >= w.nbytes - 2 * 4096
    check_model(model, {"x": rng(3).standard_normal((1, 32, 8, 8)).astype(np.float32)})


def test_a_weight_that_is_a_graph_output_stays_mapped(tmp_path):
    w = rng(0).standard_normal((64, 64)).astype(np.float32)
    model = make_model([helper.make_node("Identity", ["w"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
                       [("x", np.zeros((2,), np.float32))], [("y", None), ("z", None)], [("w", w)])
    sess = nnrun.InferenceSession(saved(tmp_path, model))
    file_ids = {w.name: w.id for w in mapped_weights(sess.graph)}
    assert file_ids["w"] in {k.id for k in sess.plan().mapped_weights}
    assert sess.report()["plan"]["weights_released_bytes"] == 0
    x = rng(1).standard_normal(2).astype(np.float32)
    for got, want in zip(sess.run(None, {"x": x}), run_onnxruntime(model, {"x": x})):
        assert_close(got, want)
