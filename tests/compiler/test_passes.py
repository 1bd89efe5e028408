"""The passes of PREPARE (runtime/compiler/passes.py, build.py) one by one on small graphs, the
switches that turn them off by name, and the one error format they report in.

Graphs are ir.Graphs made here; where a pass's result is numeric, the whole model is checked
against onnxruntime.
"""

import numpy as np
import pytest
from oracle import assert_close, check_model, helper, make_model, rng, run_onnxruntime

import nnrun
from nnrun import ir, ops
from nnrun.compiler import build
from nnrun.compiler.passes import PASSES, SWITCHABLE, PassRunner, check_disabled
from nnrun.compiler.plan import ARENA, CONSTANT, FEED, FRESH, MAPPED, MEMORY
from nnrun.compiler.release import EagerRelease
from nnrun.compiler.stages import Context, NodeList, frozen_map
from nnrun.executor import Executor
from nnrun.loader import load_model

F32 = np.dtype(np.float32)


def graph(nodes, inputs, outputs, weights=()):
    """An ir.Graph: nodes (name, op, inputs, outputs, attrs), inputs (name, shape), weights (name, array)."""
    made = [ir.Node(name, op, "", list(i), list(o), dict(a), index)
            for index, (name, op, i, o, a) in enumerate(nodes)]
    return ir.Graph("g", made, [ir.ValueInfo(n, F32, tuple(s)) for n, s in inputs],
                    [ir.ValueInfo(n, None, None) for n in outputs], dict(weights), opsets={"": 17})


def context(g, feeds):
    return Context(g, frozen_map(feeds), tuple(v.name for v in g.outputs), EagerRelease([]))


def shaped(g, feeds, fold=True):
    ops.load_all()
    ctx = context(g, feeds)
    nodes = build.topological_order(NodeList(tuple(g.nodes), frozen_map(g.initializers)), ctx)
    return build.infer_shapes(nodes, ctx, fold), ctx


def conv_bn_relu():
    w = rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    params = [rng(i).uniform(0.5, 1.5, 4).astype(np.float32) for i in range(1, 5)]
    return graph([("conv", "Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}),
                  ("bn", "BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], {}),
                  ("relu", "Relu", ["n"], ["y"], {})],
                 [("x", (1, 3, 6, 6))], ["y"], [("w", w)] + list(zip("sbmv", params)))


# --- the list and the switches ---------------------------------------------------------------------

def test_every_pass_is_named_once_and_the_switchable_ones_are_known():
    names = [p.name for p in PASSES]
    assert len(names) == len(set(names))
    assert set(SWITCHABLE) == {"drop_identities", "constants_as_weights", "fold_batchnorm", "fold_conv_bias",
                               "flush_denormals",
                               "fuse_activations", "fuse_residual", "fold_constants", "memory_aware_order",
                               "inline_if", "fuse_patterns", "release_weights"}


def test_unknown_or_required_passes_cannot_be_disabled():
    with pytest.raises(nnrun.ModelError, match=r"unknown passes \['no_such_pass'\].*fold_batchnorm"):
        check_disabled({"no_such_pass"})
    with pytest.raises(nnrun.ModelError, match=r"\['infer_shapes'\] cannot be turned off"):
        check_disabled({"infer_shapes"})
    options = nnrun.SessionOptions()
    options.disabled_passes = {"no_such_pass"}
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", np.zeros(2, np.float32))],
                       [("y", None)])
    with pytest.raises(nnrun.ModelError, match="unknown passes"):
        nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


def test_a_disabled_pass_is_skipped_and_the_answer_still_matches_onnxruntime():
    w = rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    bn = [(n, rng(i).uniform(0.5, 1.5, 4).astype(np.float32)) for i, n in enumerate("sbmv")]
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
                        helper.make_node("Relu", ["n"], ["y"])],
                       [("x", np.zeros((1, 3, 6, 6), np.float32))], [("y", None)], [("w", w)] + bn)
    x = rng(5).standard_normal((1, 3, 6, 6)).astype(np.float32)
    for name in SWITCHABLE:
        options = nnrun.SessionOptions()
        options.disabled_passes = {name}
        check_model(model, {"x": x}, sess_options=options)
        sess = nnrun.InferenceSession(model.SerializeToString(), sess_options=options)
        ran = sess.plan().stats["passes_ms"]
        assert name not in ran and "infer_shapes" in ran


# --- the passes one by one ---------------------------------------------------------------------------

def test_topological_order_puts_producers_first():
    g = graph([("b", "Relu", ["a"], ["y"], {}), ("a", "Neg", ["x"], ["a"], {})], [("x", (2,))], ["y"])
    nodes = build.topological_order(NodeList(tuple(g.nodes), frozen_map({})), context(g, {"x": ((2,), F32)}))
    assert [n.name for n in nodes.nodes] == ["a", "b"]


def test_fold_batchnorm_keeps_the_convs_name_and_index_and_adds_packed_weights():
    g = conv_bn_relu()
    ctx = context(g, {"x": ((1, 3, 6, 6), F32)})
    folded = build.fold_batchnorm_pass(NodeList(tuple(g.nodes), frozen_map(g.initializers)), ctx)
    assert [(n.name, n.op_type, n.index) for n in folded.nodes] == [("conv", "Conv", 0), ("relu", "Relu", 2)]
    conv = folded.nodes[0]
    assert conv.outputs == ["n"] and all(name in folded.weights for name in conv.inputs[1:])
    assert "w" in g.initializers and len(g.nodes) == 3  # the loader's graph is not touched


def test_fuse_activations_moves_the_activation_into_its_producer():
    g = conv_bn_relu()
    ctx = context(g, {"x": ((1, 3, 6, 6), F32)})
    nodes = NodeList(tuple(g.nodes), frozen_map(g.initializers))
    fused = build.fuse_activations_pass(build.fold_batchnorm_pass(nodes, ctx), ctx)
    (conv,) = fused.nodes
    assert (conv.name, conv.index, conv.outputs, conv.attrs["_activation"][0]) == ("conv", 0, ["y"], "Relu")


def test_infer_shapes_folds_known_values_and_leaves_run_time_shapes_to_eager_steps():
    g = graph([("shape", "Shape", ["x"], ["s"], {}), ("r", "Reshape", ["x", "s"], ["y"], {}),
               ("r2", "Reshape", ["x", "t"], ["z"], {})], [("x", (2, 3)), ("t", (2,))], ["y", "z"])
    g.inputs[1] = ir.ValueInfo("t", np.dtype(np.int64), (2,))
    result, _ = shaped(g, {"x": ((2, 3), F32), "t": ((2,), np.dtype(np.int64))})
    by_name = {s.node.name: s for s in result.steps}
    assert "shape" not in by_name  # folded: its value is known
    assert list(result.infos["s"].value) == [2, 3]
    assert by_name["r"].outputs[0].shape == (2, 3)
    assert by_name["r2"].outputs is None and result.infos["z"] is None  # eager


def test_infer_shapes_without_folding_keeps_the_step():
    g = graph([("shape", "Shape", ["x"], ["s"], {}), ("neg", "Neg", ["s"], ["y"], {})], [("x", (2, 3))],
              ["y"])
    folded, _ = shaped(g, {"x": ((2, 3), F32)}, fold=True)
    kept, _ = shaped(g, {"x": ((2, 3), F32)}, fold=False)
    assert [s.node.name for s in folded.steps] == []
    assert [s.node.name for s in kept.steps] == ["neg"]  # Shape fills its value itself; Neg would fold


def test_drop_dead_keeps_only_what_outputs_need():
    g = graph([("a", "Relu", ["x"], ["y"], {}), ("dead", "Neg", ["x"], ["unused"], {})], [("x", (2,))], ["y"])
    result, ctx = shaped(g, {"x": ((2,), F32)})
    assert [s.node.name for s in build.drop_dead(result, ctx).steps] == ["a"]


def test_prepare_kernels_sizes_each_steps_scratch():
    w = rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    g = graph([("conv", "Conv", ["x", "w"], ["y"], {})], [("x", (1, 3, 16, 16))], ["y"], [("w", w)])
    result, ctx = shaped(g, {"x": ((1, 3, 16, 16), F32)})
    (step,) = build.prepare_kernels(result, ctx).steps
    assert all(len(shape) >= 1 and dtype == F32 for shape, dtype in step.scratch)


def test_the_arena_passes_reach_the_lower_bound_on_a_chain():
    g = graph([(f"n{i}", "Relu", [f"v{i}"], [f"v{i + 1}"], {}) for i in range(5)],
              [("v0", (64, 64))], ["v5"])
    result, ctx = shaped(g, {"v0": ((64, 64), F32)})
    prepared = build.prepare_kernels(result, ctx)
    buffers = build.arena_buffers(prepared, ctx)
    order = build.memory_aware_order(buffers).order
    spans = build.buffer_lifetimes(buffers, order)
    placement = build.place(order, spans, buffers)
    assert placement.arena_bytes == 2 * 64 * 64 * 4  # two intermediates at a time
    plan = build.build_plan(prepared, buffers, placement, ctx)
    assert max(plan.live_bytes) == plan.lower_bound_bytes == placement.arena_bytes


# --- what a PlannedStep says --------------------------------------------------------------------------

def test_planned_steps_name_their_values_weights_and_scratch(tmp_path):
    w = rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                        helper.make_node("Relu", ["c"], ["r"], name="relu"),
                        helper.make_node("Add", ["r", "bias"], ["y"], name="add")],
                       [("x", np.zeros((1, 3, 8, 8), np.float32))], [("y", None)],
                       [("w", w), ("bias", np.ones((1, 8, 6, 6), np.float32))])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    options = nnrun.SessionOptions()
    options.disabled_passes = {"fuse_activations"}
    plan = nnrun.InferenceSession(str(path), sess_options=options).plan()
    conv, relu, add = plan.steps
    assert (conv.name, conv.op_type, conv.index) == ("conv", "Conv", 0)
    assert [v.kind for v in conv.input_values] == [FEED, CONSTANT]
    assert conv.output_values[0].kind == ARENA and conv.output_values[0].shape == (1, 8, 6, 6)
    assert conv.output_values[0].offset >= 0
    assert [(w.name, w.nbytes) for w in conv.weights] == [("w", w.nbytes)]
    assert add.output_values[0].kind == FRESH
    assert add.weights[0].name == "bias" and add.weights[0].where in (MAPPED, MEMORY)
    assert relu.weights == () and relu.weight_bytes == 0
    assert len(plan.live_bytes) == 3 and max(plan.live_bytes) == plan.lower_bound_bytes
    assert {b.name for b in plan.buffers} >= {"c", "r"}


# --- one error format ---------------------------------------------------------------------------------

def test_an_error_names_phase_pass_and_the_original_node_after_a_rewrite():
    w = rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    bn = [(n, np.ones(4, np.float32)) for n in "sbmv"]
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv3", kernel_shape=[2, 2]),
                        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn3")],
                       [("x", np.zeros((1, 3, 6, 6), np.float32))], [("y", None)], [("w", w)] + bn)
    for disabled in (set(), {"fold_batchnorm"}):
        options = nnrun.SessionOptions()
        options.disabled_passes = disabled
        with pytest.raises(nnrun.ModelError, match=r"^PREPARE/infer_shapes: node 'conv3' \(Conv, #0\): "
                                                   r"kernel_shape \[2, 2\] does not match"):
            nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


def test_a_run_time_error_names_the_node_and_keeps_its_class():
    x = np.zeros((2, 3), np.float32)
    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd")
    model = make_model([node], [("x", x), ("i", np.zeros((1, 2), np.int64))], [("y", None)], opset=13)
    sess = nnrun.InferenceSession(model.SerializeToString())
    with pytest.raises(nnrun.ExecutionError, match=r"^EXECUTE: node 'gnd' \(GatherND, #0\): "):
        sess.run(None, {"x": x, "i": np.array([[0, 3]], np.int64)})


def test_located_errors_keep_their_class_and_attributes():
    from nnrun.errors import UnsupportedOperatorError, located

    error = located(UnsupportedOperatorError([("", "NoSuchOp", 17)]), "PREPARE", "check_supported")
    assert isinstance(error, UnsupportedOperatorError) and error.ops == [("", "NoSuchOp", 17)]
    assert str(error) == "PREPARE/check_supported: unsupported operators: NoSuchOp (opset 17)"
    assert located(error, "EXECUTE") is error  # located once
    foreign = located(ValueError("bad"), "EXECUTE", None, ir.Node("n", "Relu", "", [], [], {}, 4))
    assert isinstance(foreign, nnrun.ExecutionError)
    assert str(foreign) == "EXECUTE: node 'n' (Relu, #4): ValueError: bad"


def test_pass_runner_times_passes_and_locates_errors_without_a_node():
    run = PassRunner()
    assert run("drop_dead", lambda x: x + 1, 1) == 2 and "drop_dead" in run.ms

    def broken():
        raise ValueError("nothing here")

    with pytest.raises(nnrun.ModelError, match=r"^PREPARE/lifetimes: ValueError: nothing here$"):
        run("lifetimes", broken)
    skipped = PassRunner({"fold_batchnorm"})
    assert skipped("fold_batchnorm", broken, "as it was") == "as it was"


class RecordingPacker:
    """A packer that keeps every packed value by name; with `held`, it returns those instead."""

    def __init__(self, held=None):
        self.held = held
        self.kept, self.made = {}, []

    def pack(self, name, make):
        if self.held is not None:
            return self.held[name]
        value = make() if callable(make) else make
        self.made.append(name)
        self.kept[name] = value
        return value


def test_packed_values_go_through_the_packer_by_stable_names_and_a_hit_makes_nothing():
    """The hook a weight cache uses: Gemm's scaled C reaches the packer under a name that is the
    same in every compile; a packer that holds it is not asked to make it, and the plan runs on
    its copy (checked against onnxruntime)."""
    w = rng(0).standard_normal((6, 4)).astype(np.float32)
    c = rng(1).standard_normal(4).astype(np.float32)
    model = make_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], beta=0.5)],
                       [("x", (np.float32, [3, 6]))], [("y", None)], [("w", w), ("c", c)])
    graph_ = load_model(model.SerializeToString())
    ops.load_all()
    feeds = {"x": ((3, 6), F32)}
    first = RecordingPacker()
    build.compile_graph(graph_, feeds, packer=first)
    assert len(first.made) == 1
    second = RecordingPacker()
    build.compile_graph(load_model(model.SerializeToString()), feeds, packer=second)
    assert second.made == first.made  # the same names in another compile
    held = {name: np.array(v, copy=True) for name, v in first.kept.items()}
    hit = RecordingPacker(held)
    plan = build.compile_graph(load_model(model.SerializeToString()), feeds, packer=hit)
    assert hit.made == [] and plan.steps[0].kernel.bias is held[first.made[0]]
    x = rng(2).standard_normal((3, 6)).astype(np.float32)
    assert_close(Executor(plan).run({"x": x})["y"], run_onnxruntime(model, {"x": x})[0])
