"""The graph rewrites that make a model faster without changing what it computes: each one
checked against onnxruntime (the whole model, rewrite on) and for having fired (the plan's
steps or weights), and each switchable off by name.
"""

import numpy as np
import pytest
from compiled import needs_numba
from oracle import assert_close, check_model, helper, make_model, rng, run_onnxruntime

import nnrun
from nnrun.compiler.denormals import SAMPLE, count_subnormal, flushed

TINY = np.finfo(np.float32).tiny

def session(model, disabled=(), path=None):
    """A session of `model`, from its bytes or, given `path`, from that file (its weights mapped)."""
    options = nnrun.SessionOptions()
    options.disabled_passes = set(disabled)
    options.weight_cache_dir = None
    if path is None:
        return nnrun.InferenceSession(model.SerializeToString(), sess_options=options)
    path.write_bytes(model.SerializeToString())
    return nnrun.InferenceSession(str(path), sess_options=options)

def subnormals_read(sess):
    """Subnormal values in the float32 constants the last run's plan read, and in what its kernels
    packed from them (a compiled product's tiles)."""
    arrays = [getattr(v, "array", lambda v=v: v)() for v in sess._last.constants.values()]
    arrays += [v for step in sess._last.steps for v in vars(step.kernel).values() if isinstance(v, np.ndarray)]
    return sum(count_subnormal(np.asarray(a)) for a in arrays if np.asarray(a).dtype == np.float32)


def with_subnormals(array, fraction, seed=0):
    """`array` with `fraction` of its elements replaced by subnormal values of either sign."""
    r = rng(seed)
    out = array.copy().reshape(-1)
    picked = r.choice(out.size, int(out.size * fraction), replace=False)
    out[picked] = r.uniform(-1, 1, picked.size).astype(np.float32) * TINY
    return out.reshape(array.shape)

# --- flush_denormals ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_count_and_flush_match_numpys_classification(dtype):
    tiny = np.finfo(dtype).tiny
    values = np.array([0.0, -0.0, tiny, -tiny, tiny / 2, -tiny / 3, tiny / 2**20, 1.0, -2.5, np.inf, -np.inf,
                       np.nan], dtype)
    values = np.tile(values, 70_000)  # several chunks of the scan
    subnormal = (values != 0) & (np.abs(values) < tiny)
    assert count_subnormal(values) == np.count_nonzero(subnormal)
    out = flushed(values)
    np.testing.assert_array_equal(out[~subnormal], values[~subnormal])
    assert not np.any(out[subnormal]) and np.array_equal(np.signbit(out), np.signbit(values))

def pointwise_model(w):
    return make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", np.zeros((1, w.shape[1], 9, 9),
                                                                              np.float32))],
                      [("y", None)], [("w", w)])

@pytest.mark.parametrize("mapped", [False, True], ids=["bytes", "file"])
@pytest.mark.parametrize("shape, fraction", [((16, 8, 1, 1), 0.4), ((64, 512, 1, 1), 0.01)])
def test_subnormal_weights_are_flushed_and_the_outputs_match_onnxruntime(shape, fraction, mapped, tmp_path):
    # the second weight is above the sample's size: found through the sample (read from the file
    # when the model is mapped), then scanned whole
    w = with_subnormals(rng(1).standard_normal(shape).astype(np.float32), fraction)
    assert count_subnormal(w) > 0 and (w.size > 4 * SAMPLE) == (shape[1] == 512)
    model = pointwise_model(w)
    x = rng(2).standard_normal((1, shape[1], 9, 9)).astype(np.float32)
    check_model(model, {"x": x}, rtol=1e-5)
    path = (lambda name: tmp_path / name) if mapped else (lambda name: None)
    on, off = session(model, path=path("on.onnx")), session(model, {"flush_denormals"}, path("off.onnx"))
    on.run(None, {"x": x})
    off.run(None, {"x": x})
    assert subnormals_read(on) == 0 and subnormals_read(off) == count_subnormal(w)

def test_weights_without_subnormals_are_left_in_the_mapping():
    w = rng(1).standard_normal((64, 512, 1, 1)).astype(np.float32)
    on, off = session(pointwise_model(w)), session(pointwise_model(w), {"flush_denormals"})
    for sess in (on, off):
        sess.run(None, {"x": np.ones((1, 512, 9, 9), np.float32)})
    assert on.report()["plan"]["weights_packed_bytes"] == off.report()["plan"]["weights_packed_bytes"]

# --- constants_as_weights -------------------------------------------------------------------------

def conv_bn_from_constant_nodes():
    """Conv -> BatchNormalization -> Relu with the BN parameters given by Constant nodes, as Paddle writes."""
    w = rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    params = [rng(i).uniform(0.5, 1.5, 4).astype(np.float32) for i in range(1, 5)]
    constants = [helper.make_node("Constant", [], [n], value=helper.make_tensor(n, 1, [4], p))
                 for n, p in zip("sbmv", params)]
    nodes = constants + [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                         helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
                         helper.make_node("Relu", ["n"], ["y"])]
    return make_model(nodes, [("x", np.zeros((1, 3, 6, 6), np.float32))], [("y", None)], [("w", w)])

def test_constant_nodes_become_weights_so_batchnorm_folds():
    model = conv_bn_from_constant_nodes()
    x = rng(5).standard_normal((1, 3, 6, 6)).astype(np.float32)
    check_model(model, {"x": x})
    on, off = session(model), session(model, {"constants_as_weights"})
    for sess in (on, off):
        sess.run(None, {"x": x})
    assert on.report()["plan"]["steps"] == 1  # Conv with BN folded and Relu fused
    assert off.report()["plan"]["steps"] == 3  # Conv, BatchNormalization, Relu

def test_constant_nodes_of_every_numeric_form_and_a_graph_output_keep_their_values():
    nodes = [helper.make_node("Constant", [], ["f"], value_float=2.5),
             helper.make_node("Constant", [], ["fs"], value_floats=[1.0, -1.0, 0.5]),
             helper.make_node("Constant", [], ["i"], value_ints=[3, 1]),
             helper.make_node("Constant", [], ["out"], value=helper.make_tensor("t", 7, [2], [4, 5])),
             helper.make_node("Mul", ["x", "f"], ["a"]),
             helper.make_node("Add", ["a", "fs"], ["b"]),
             helper.make_node("Reshape", ["b", "i"], ["y"])]
    model = make_model(nodes, [("x", np.zeros((3,), np.float32))], [("y", None), ("out", None)])
    check_model(model, {"x": np.array([1.0, 2.0, -4.0], np.float32)})


# --- inline_if ------------------------------------------------------------------------------------

def shape_test_if(inner_if=False):
    """As exporters write it: "is dim 0 of x 1? then Squeeze it, else pass it on", on a known shape.
    The then branch reads the outer weight `w` (an Add); with `inner_if` it holds an If of its own."""
    then_nodes = [helper.make_node("Squeeze", ["x", "axes"], ["sq"]),
                  helper.make_node("Add", ["sq", "w"], ["t"])]
    if inner_if:
        inner = helper.make_graph([helper.make_node("Neg", ["t"], ["n"])], "inner_then", [],
                                  [helper.make_tensor_value_info("n", 1, None)])
        other = helper.make_graph([helper.make_node("Identity", ["t"], ["i"])], "inner_else", [],
                                  [helper.make_tensor_value_info("i", 1, None)])
        then_nodes += [helper.make_node("Size", ["t"], ["size"]),
                       helper.make_node("Greater", ["size", "two"], ["big"]),
                       helper.make_node("If", ["big"], ["t2"], then_branch=inner, else_branch=other)]
    last = "t2" if inner_if else "t"
    then_branch = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info(last, 1, None)],
                                    [helper.make_tensor("axes", 7, [1], [0]), helper.make_tensor("two", 7, [], [2])])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", 1, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["dim"], axis=0),
             helper.make_node("Equal", ["dim", "one"], ["is_one"]),
             helper.make_node("If", ["is_one"], ["y"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Relu", ["y"], ["z"])]
    return make_model(nodes, [("x", np.zeros((1, 3), np.float32))], [("z", None)],
                      [("w", np.array([1.0, -2.0, 3.0], np.float32)), ("zero", np.array(0, np.int64)),
                       ("one", np.array(1, np.int64))])


@pytest.mark.parametrize("inner_if", [False, True])
def test_an_if_whose_condition_is_known_becomes_its_branch(inner_if):
    model = shape_test_if(inner_if)
    x = np.array([[0.5, 1.0, -4.0]], np.float32)
    check_model(model, {"x": x})
    on, off = session(model), session(model, {"inline_if"})
    for sess in (on, off):
        sess.run(None, {"x": x})
    assert "If" not in [s.op_type for s in on._last.steps]
    assert "If" in [s.op_type for s in off._last.steps]


def test_an_inlined_branch_leaves_no_identity_steps():
    # The taken branch makes its first output through an Identity of its own, gives one value as
    # two outputs, and gives an initializer of its own: each If output is written by the node that
    # makes it or handed on, with no step of its own.
    c = helper.make_tensor("c", 1, [2, 3], rng(4).standard_normal(6).astype(np.float32))
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Identity", ["n"], ["i"])],
                               "then", [], [helper.make_tensor_value_info(v, 1, None) for v in ("i", "n", "n", "c")],
                               [c])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["a"])], "else", [],
                              [helper.make_tensor_value_info("a", 1, None)] * 4)
    nodes = [helper.make_node("If", ["yes"], ["p", "q", "r", "s"], then_branch=branch, else_branch=other),
             helper.make_node("Add", ["p", "q"], ["pq"]), helper.make_node("Mul", ["r", "s"], ["rs"]),
             helper.make_node("Sub", ["pq", "rs"], ["z"])]
    model = make_model(nodes, [("x", np.zeros((2, 3), np.float32))], [("z", None), ("q", None), ("s", None)],
                       [("yes", np.array(True))])
    x = rng(3).standard_normal((2, 3)).astype(np.float32)
    check_model(model, {"x": x}, oracle="reference")  # onnxruntime mistakes a branch output given twice
    on, off = session(model), session(model, {"drop_identities"})
    for sess in (on, off):
        sess.run(None, {"x": x})
    assert [s.op_type for s in on._last.steps] == ["Neg", "Add", "Mul", "Sub"]  # s, a constant, is folded
    assert [s.op_type for s in off._last.steps].count("Identity") == 2  # the branch's own, and n given twice


def test_casts_and_reshapes_that_change_nothing_leave_no_steps():
    # A Cast to the input's own type and a Reshape to its own shape (known once shapes are: the
    # target read from a Shape) are handed on; one that changes something, or makes a graph
    # output, stays.
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["c"], to=1),
             helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Reshape", ["c", "shape"], ["s"]),
             helper.make_node("Neg", ["s"], ["n"]), helper.make_node("Cast", ["n"], ["d"], to=11),
             helper.make_node("Cast", ["n"], ["e"], to=1)]
    model = make_model(nodes, [("x", np.zeros((2, 3), np.float32))], [("d", None), ("e", None)])
    x = rng(5).standard_normal((2, 3)).astype(np.float32)
    check_model(model, {"x": x})
    on, off = session(model), session(model, {"drop_identities"})
    for sess in (on, off):
        sess.run(None, {"x": x})
    assert [s.op_type for s in on._last.steps] == ["Relu", "Neg", "Cast", "Cast"]
    assert [s.op_type for s in off._last.steps] == ["Relu", "Cast", "Reshape", "Neg", "Cast", "Cast"]


def test_an_if_whose_branch_reuses_a_name_of_the_graph_stays_an_if():
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", 1, None)])
    nodes = [helper.make_node("Neg", ["x"], ["z"]),  # a sibling name, as a careless exporter may write
             helper.make_node("If", ["yes"], ["y"], then_branch=branch, else_branch=branch)]
    model = make_model(nodes, [("x", np.zeros((2,), np.float32))], [("y", None), ("z", None)],
                       [("yes", np.array(True))])
    sess = session(model)
    assert [a.tolist() for a in sess.run(None, {"x": np.array([1.0, 2.0], np.float32)})] == [[-1, -2], [-1, -2]]
    assert "If" in [s.op_type for s in sess._last.steps]


# --- fuse_patterns --------------------------------------------------------------------------------

def scalar(name, value):
    return (name, np.array(value, np.float32))


GELU_FORMS = {
    # x * 0.5 * (1 + erf(x / sqrt 2)): PyTorch and Paddle's order
    "div, x first": ([helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                      helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
                      helper.make_node("Mul", ["m", "half"], ["y"])], [scalar("r2", np.sqrt(2))]),
    # multiply by 1/sqrt 2, halve first
    "mul, half first": ([helper.make_node("Mul", ["x", "ir2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                         helper.make_node("Add", ["one", "e"], ["a"]), helper.make_node("Mul", ["a", "half"], ["m"]),
                         helper.make_node("Mul", ["m", "x"], ["y"])], [scalar("ir2", 1 / np.sqrt(2))]),
    # (x * 0.5) * (1 + erf)
    "halved x": ([helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "half"], ["h"]),
                  helper.make_node("Mul", ["h", "a"], ["y"])], [scalar("r2", np.sqrt(2))]),
    # the tanh form (PyTorch's approximate="tanh" before opset 20, HF's gelu_new), the cube a Pow
    "tanh, pow": ([helper.make_node("Pow", ["x", "three"], ["c"]), helper.make_node("Mul", ["c", "k"], ["m"]),
                   helper.make_node("Add", ["x", "m"], ["a"]), helper.make_node("Mul", ["a", "s2pi"], ["s"]),
                   helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("Add", ["t", "one"], ["u"]),
                   helper.make_node("Mul", ["x", "u"], ["v"]), helper.make_node("Mul", ["v", "half"], ["y"])],
                  [scalar("k", 0.044715), scalar("s2pi", np.sqrt(2 / np.pi))]),
    # ... the cube x * (x * x), operands the other way round, halved first
    "tanh, x*x*x": ([helper.make_node("Mul", ["x", "x"], ["q"]), helper.make_node("Mul", ["x", "q"], ["c"]),
                     helper.make_node("Mul", ["k", "c"], ["m"]), helper.make_node("Add", ["m", "x"], ["a"]),
                     helper.make_node("Mul", ["s2pi", "a"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
                     helper.make_node("Add", ["one", "t"], ["u"]), helper.make_node("Mul", ["u", "half"], ["v"]),
                     helper.make_node("Mul", ["v", "x"], ["y"])],
                    [scalar("k", 0.044715), scalar("s2pi", np.sqrt(2 / np.pi))]),
}
HARD_SWISH_FORMS = {
    "add clip mul div": [helper.make_node("Add", ["x", "three"], ["a"]),
                         helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
                         helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])],
    "hard sigmoid": [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
                     helper.make_node("Mul", ["x", "h"], ["y"])],
}
HARD_SIGMOID_FORMS = {
    "relu6 div": [helper.make_node("Add", ["three", "x"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
                  helper.make_node("Div", ["c", "six"], ["y"])],
    "relu6 times a sixth": [helper.make_node("Add", ["x", "three"], ["a"]),
                            helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
                            helper.make_node("Mul", ["sixth", "c"], ["y"])],
    "keras": [helper.make_node("Mul", ["x", "fifth"], ["m"]), helper.make_node("Add", ["m", "half"], ["a"]),
              helper.make_node("Clip", ["a", "zero", "one"], ["y"])],
}
PATTERNS = ([(f"gelu: {k}", nodes, weights, "Gelu") for k, (nodes, weights) in GELU_FORMS.items()]
            + [(f"hardsigmoid: {k}", nodes, [scalar("sixth", 1 / 6), scalar("fifth", 0.2)], "HardSigmoid")
               for k, nodes in HARD_SIGMOID_FORMS.items()]
            + [(f"hardswish: {k}", nodes, [], "HardSwish") for k, nodes in HARD_SWISH_FORMS.items()]
            + [("silu", [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])],
                [], "Swish")]
            + [("mish", [helper.make_node("Softplus", ["x"], ["p"]), helper.make_node("Tanh", ["p"], ["t"]),
                         helper.make_node("Mul", ["x", "t"], ["y"])], [], "Mish")])


@pytest.mark.parametrize("what, nodes, weights, fused", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_activations_written_op_by_op_run_as_one_kernel(what, nodes, weights, fused):
    constants = [scalar("one", 1.0), scalar("half", 0.5), scalar("three", 3.0), scalar("zero", 0.0),
                 scalar("six", 6.0)] + weights
    model = make_model(nodes + [helper.make_node("Neg", ["y"], ["z"])], [("x", np.zeros((2, 3, 50), np.float32))],
                       [("z", None)], constants)
    x = (rng(7).standard_normal((2, 3, 50)) * 4).astype(np.float32)
    check_model(model, {"x": x})
    on, off = session(model), session(model, {"fuse_patterns"})
    results = [sess.run(None, {"x": x})[0] for sess in (on, off)]
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)  # the fused kernel, the ops
    assert [s.op_type for s in on._last.steps] == [fused, "Neg"]
    assert len(off._last.steps) > 2  # (fuse_activations may still put a Clip into its Add)


def layer_norm_nodes(axes, opset, bias=True, epsilon="eps"):
    """LayerNormalization as Paddle and PyTorch export it before opset 17."""
    def mean(src, dst):
        if opset >= 18:
            return helper.make_node("ReduceMean", [src, "axes"], [dst])
        return helper.make_node("ReduceMean", [src], [dst], axes=axes)
    nodes = [mean("x", "mu"), helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]), mean("sq", "var"),
             helper.make_node("Add", ["var", epsilon], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]),
             helper.make_node("Mul", ["n", "scale"], ["s" if bias else "y"])]
    return nodes + ([helper.make_node("Add", ["s", "bias"], ["y"])] if bias else [])


LAYER_NORMS = [([-1], 13, True), ([-1], 13, False), ([-2, -1], 13, True), ([-1], 18, True)]


@pytest.mark.parametrize("axes, opset, bias", LAYER_NORMS)
def test_layer_normalization_written_op_by_op_runs_as_one_kernel(axes, opset, bias):
    shape = (2, 6, 40)
    normalized = shape[len(shape) + axes[0]:]
    weights = [scalar("two", 2.0), scalar("eps", 1e-5), ("axes", np.array(axes, np.int64)),
               ("scale", rng(1).uniform(0.5, 1.5, normalized).astype(np.float32)),
               ("bias", rng(2).standard_normal(normalized).astype(np.float32))]
    nodes = layer_norm_nodes(axes, opset, bias) + [helper.make_node("Neg", ["y"], ["z"])]
    model = make_model(nodes, [("x", np.zeros(shape, np.float32))], [("z", None)], weights, opset=opset)
    x = (rng(7).standard_normal(shape) * 3 + 1).astype(np.float32)
    check_model(model, {"x": x})
    on, off = session(model), session(model, {"fuse_patterns"})
    results = [sess.run(None, {"x": x})[0] for sess in (on, off)]
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)  # the fused kernel, the ops
    assert [s.op_type for s in on._last.steps] == ["LayerNormalization", "Neg"]
    assert len(off._last.steps) == len(nodes)


@pytest.mark.parametrize("change", ["positive axes", "deviation read elsewhere", "epsilon fed", "not squared"])
def test_what_only_looks_like_a_layer_normalization_is_left_alone(change):
    shape = (2, 6, 40)
    nodes = layer_norm_nodes([2] if change == "positive axes" else [-1], 13,
                             epsilon="fed" if change == "epsilon fed" else "eps")
    weights = [scalar("two", 3.0 if change == "not squared" else 2.0), scalar("eps", 1e-5),
               ("scale", rng(1).uniform(0.5, 1.5, 40).astype(np.float32)),
               ("bias", rng(2).standard_normal(40).astype(np.float32))]
    inputs = [("x", np.zeros(shape, np.float32))] + ([("fed", np.zeros((), np.float32))] if change == "epsilon fed"
                                                     else [])
    outputs = [("y", None)] + ([("d", None)] if change == "deviation read elsewhere" else [])
    model = make_model(nodes, inputs, outputs, weights)
    feeds = {"x": (rng(7).standard_normal(shape) * 3).astype(np.float32)}
    if change == "epsilon fed":
        feeds["fed"] = np.array(1e-5, np.float32)
    check_model(model, feeds)
    sess = session(model)
    sess.run(None, feeds)
    assert "LayerNormalization" not in [s.op_type for s in sess._last.steps]


ATTENTIONS = {
    # BERT as PyTorch exports it: scores divided by sqrt(head size), softmax over the last axis
    "div": (17, [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Div", ["s", "root"], ["d"]),
                 helper.make_node("Softmax", ["d"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])],
            False, (1, 2, 5, 4)),
    # scaled by a Mul, an additive mask fed beside, the softmax's axis left to its default
    "mul and mask": (17, [helper.make_node("MatMul", ["q", "kt"], ["s"]),
                          helper.make_node("Mul", ["eighth", "s"], ["d"]),
                          helper.make_node("Add", ["mask", "d"], ["a"]), helper.make_node("Softmax", ["a"], ["p"]),
                          helper.make_node("MatMul", ["p", "v"], ["y"])], True, (1, 1, 5, 5)),
    # Paddle before opset 13: no scale (it is on q), softmax over axis 3 of 4
    "opset 11": (11, [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=3),
                      helper.make_node("MatMul", ["p", "v"], ["y"])], False, None),
    # before opset 13 a softmax over axis 1 runs over every axis from 1 on
    "opset 11, axis 1": (11, [helper.make_node("MatMul", ["q", "kt"], ["s"]),
                              helper.make_node("Softmax", ["s"], ["p"], axis=1),
                              helper.make_node("MatMul", ["p", "v"], ["y"])], False, None),
    # a mask that widens the scores (a batch of three masks for one query)
    "widening mask": (17, [helper.make_node("MatMul", ["q", "kt"], ["s"]),
                           helper.make_node("Add", ["s", "mask"], ["a"]),
                           helper.make_node("Softmax", ["a"], ["p"], axis=-1),
                           helper.make_node("MatMul", ["p", "v"], ["y"])], True, (3, 1, 5, 5)),
}


@pytest.mark.parametrize("form", list(ATTENTIONS))
def test_attention_written_op_by_op_runs_as_one_kernel(form):
    opset, nodes, masked, mask_shape = ATTENTIONS[form]
    q, kt, v = (rng(1).standard_normal((1, 2, 5, 4)), rng(2).standard_normal((1, 2, 4, 5)),
                rng(3).standard_normal((1, 2, 5, 4)))
    feeds = {"q": q.astype(np.float32), "kt": kt.astype(np.float32), "v": v.astype(np.float32)}
    if masked:
        feeds["mask"] = np.where(rng(4).random(mask_shape) < 0.3, -1e4, 0).astype(np.float32)
    model = make_model(nodes + [helper.make_node("Neg", ["y"], ["z"])],
                       [(n, np.zeros_like(a)) for n, a in feeds.items()], [("z", None)],
                       [scalar("root", 2.0), scalar("eighth", 0.125)], opset=opset)
    check_model(model, feeds)
    on, off = session(model), session(model, {"fuse_patterns"})
    results = [sess.run(None, feeds)[0] for sess in (on, off)]
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)  # the fused kernel, the ops
    assert [s.op_type for s in on._last.steps] == ["ScaledDotProductAttention", "Neg"]
    assert len(off._last.steps) == len(nodes) + 1


def test_attention_whose_scores_are_read_elsewhere_is_left_alone():
    nodes = ATTENTIONS["div"][1]
    feeds = {n: rng(k).standard_normal(shape).astype(np.float32)
             for k, (n, shape) in enumerate((("q", (2, 5, 4)), ("kt", (2, 4, 5)), ("v", (2, 5, 4))))}
    model = make_model(nodes, [(n, np.zeros_like(a)) for n, a in feeds.items()], [("y", None), ("d", None)],
                       [scalar("root", 2.0)])
    check_model(model, feeds)
    sess = session(model)
    sess.run(None, feeds)
    assert "ScaledDotProductAttention" not in [s.op_type for s in sess._last.steps]


def test_a_pattern_whose_inner_value_is_read_elsewhere_is_left_alone():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    model = make_model(nodes, [("x", np.zeros((4,), np.float32))], [("y", None), ("s", None)])
    sess = session(model)
    check_model(model, {"x": np.linspace(-3, 3, 4).astype(np.float32)})
    sess.run(None, {"x": np.zeros(4, np.float32)})
    assert [s.op_type for s in sess._last.steps] == ["Sigmoid", "Mul"]


def test_hard_swish_after_a_convolution_runs_inside_it():
    w = rng(3).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1])] + [
        helper.make_node(n.op_type, [{"x": "conv"}.get(i, i) for i in n.input], list(n.output), name=n.name)
        for n in HARD_SWISH_FORMS["add clip mul div"]]
    model = make_model(nodes, [("x", np.zeros((1, 3, 8, 8), np.float32))], [("y", None)],
                       [("w", w), scalar("zero", 0.0), scalar("three", 3.0), scalar("six", 6.0)])
    x = rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    check_model(model, {"x": x})
    sess = session(model)
    sess.run(None, {"x": x})
    assert [s.op_type for s in sess._last.steps] == ["Conv"]


# --- fold_conv_bias -------------------------------------------------------------------------------

def conv_add_model(constant, bias=False, constant_first=False, then="Relu", conv_read_twice=False):
    """Conv (4 output channels), Add of `constant` as Paddle writes a bias, then `then`."""
    r = rng(7)
    w = r.standard_normal((4, 3, 3, 3)).astype(np.float32)
    inits = [("w", w), ("c", constant)] + ([("b", r.standard_normal(4).astype(np.float32))] if bias else [])
    add_inputs = ["c", "conv"] if constant_first else ["conv", "c"]
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", add_inputs, ["s"]),
             helper.make_node(then, ["s"], ["y"])]
    outputs = [("y", None)]
    if conv_read_twice:
        nodes.append(helper.make_node("Neg", ["conv"], ["n"]))
        outputs.append(("n", None))
    return make_model(nodes, [("x", np.zeros((1, 3, 6, 5), np.float32))], outputs, inits)


PER_CHANNEL = rng(8).standard_normal((1, 4, 1, 1)).astype(np.float32)


@pytest.mark.parametrize("constant, bias, constant_first, then", [
    (PER_CHANNEL, False, False, "Relu"),
    (PER_CHANNEL, True, True, "HardSigmoid"),             # a bias of its own, and the constant first
    (PER_CHANNEL[0], False, False, "Sigmoid"),           # (C, 1, 1): without the leading 1
    (np.array([0.25], np.float32), True, False, "Relu"),  # one value for all channels
])
def test_a_bias_written_as_an_add_becomes_the_convs_and_its_activation_fuses(constant, bias, constant_first, then):
    model = conv_add_model(constant, bias, constant_first, then)
    x = rng(9).standard_normal((1, 3, 6, 5)).astype(np.float32)
    check_model(model, {"x": x}, rtol=1e-5)
    # (fuse_residual, off here, would otherwise take the Add as a residual of a broadcast constant)
    on, off = session(model), session(model, {"fold_conv_bias", "fuse_residual"})
    for sess in (on, off):
        sess.run(None, {"x": x})
    assert [s.op_type for s in on._last.steps] == ["Conv"]
    assert len(on._last.steps[0].node.inputs) == 3  # X, W and the bias: no residual left to add
    assert [s.op_type for s in off._last.steps] == ["Conv", "Add"]  # the activation inside the Add


@pytest.mark.parametrize("change", ["along the width", "a whole image", "a second reader", "a batch of two"])
def test_what_only_looks_like_a_bias_add_is_left_alone(change):
    constant = {"along the width": rng(8).standard_normal(5).astype(np.float32),
                "a whole image": rng(8).standard_normal((1, 4, 6, 5)).astype(np.float32),
                "a batch of two": rng(8).standard_normal((2, 4, 1, 1)).astype(np.float32)}.get(change, PER_CHANNEL)
    model = conv_add_model(constant, conv_read_twice=change == "a second reader")
    x = rng(9).standard_normal((1, 3, 6, 5)).astype(np.float32)
    check_model(model, {"x": x}, rtol=1e-5)
    sess = session(model, {"fuse_residual"})  # which would take the Add as a residual
    sess.run(None, {"x": x})
    assert "Add" in [s.op_type for s in sess._last.steps]


@pytest.mark.parametrize("shape, folds", [
    ([1, 4, 1, 1], True),      # Paddle's squeeze-excite bias: (C,) reshaped as the output's channels
    ([1, -1, 1, 1], True),     # the same, the channels inferred
    ([0, 4, 1, 1], False),     # a 0 copies the input's dimension: left to the Reshape kernel
    ([4, 1, 1], True),         # (C, 1, 1)
])
def test_a_bias_reshaped_from_a_constant_is_folded_too(shape, folds):
    r = rng(7)
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["offset", "shape"], ["bias"]),
             helper.make_node("Add", ["conv", "bias"], ["s"]),
             helper.make_node("HardSigmoid", ["s"], ["y"], alpha=0.2, beta=0.5)]
    offset = r.standard_normal(4).astype(np.float32) if shape[0] != 0 else r.standard_normal((1, 4)).astype(np.float32)
    inits = [("w", r.standard_normal((4, 3, 3, 3)).astype(np.float32)), ("offset", offset),
             ("shape", np.array(shape, np.int64))]
    model = make_model(nodes, [("x", np.zeros((1, 3, 6, 5), np.float32))], [("y", None)], inits)
    x = rng(9).standard_normal((1, 3, 6, 5)).astype(np.float32)
    check_model(model, {"x": x}, rtol=1e-5)
    sess = session(model, {"fuse_residual"})  # which would take an Add left unfolded as a residual
    sess.run(None, {"x": x})
    assert [s.op_type for s in sess._last.steps] == (["Conv"] if folds else ["Conv", "Add"])


# --- drop_identities ------------------------------------------------------------------------------

def pass_through_model():
    """Identity and Dropout between ops, one Identity a graph output, one Dropout asked for its mask,
    and an If whose branch reads an Identity's output from the outer scope."""
    then_branch = helper.make_graph([helper.make_node("Neg", ["i2"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", 1, None)])
    else_branch = helper.make_graph([helper.make_node("Abs", ["i2"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", 1, None)])
    nodes = [helper.make_node("Identity", ["x"], ["i1"]),
             helper.make_node("Relu", ["i1"], ["r"]),
             helper.make_node("Dropout", ["r"], ["d"]),
             helper.make_node("Identity", ["d"], ["i2"]),
             helper.make_node("Add", ["i2", "i1"], ["s"]),
             helper.make_node("Identity", ["s"], ["out"]),
             helper.make_node("Dropout", ["s"], ["d2", "mask"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    return make_model(nodes, [("x", np.zeros((2, 3), np.float32)), ("c", np.array(True))],
                      [("y", None), ("out", None), ("d2", None), ("mask", None)])


@pytest.mark.parametrize("condition", [True, False])
def test_identity_and_dropout_are_dropped_and_the_outputs_hold(condition):
    model = pass_through_model()
    feeds = {"x": rng(0).standard_normal((2, 3)).astype(np.float32), "c": np.array(condition)}
    check_model(model, feeds)
    on, off = session(model), session(model, ["drop_identities"])
    on.run(None, feeds)
    off.run(None, feeds)
    kinds_on = [s.op_type for s in on._last.steps]
    kinds_off = [s.op_type for s in off._last.steps]
    # The graph output "out" keeps its Identity, the masked Dropout stays; the others go.
    assert kinds_on.count("Identity") == 1 and kinds_on.count("Dropout") == 1
    assert kinds_off.count("Identity") == 3 and kinds_off.count("Dropout") == 2
    for a, b in zip(on.run(None, feeds), off.run(None, feeds)):
        np.testing.assert_array_equal(a, b)


def test_a_dropout_given_training_mode_stays_and_checks_it():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])]
    model = make_model(nodes, [("x", np.zeros((4,), np.float32))], [("y", None)],
                       [("ratio", np.array(0.5, np.float32)), ("training", np.array(True))])
    with pytest.raises(nnrun.ModelError, match="training_mode is true"):
        session(model).run(None, {"x": np.ones(4, np.float32)})


# --- fuse_residual --------------------------------------------------------------------------------

def residual_session(model, disabled=(), compiled=False):
    options = nnrun.SessionOptions()
    options.disabled_passes = set(disabled)
    options.weight_cache_dir = None
    options.compiled_kernels = compiled
    return nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


def residual_model(kernel=1, group=1, strides=1, then="Relu", conv_first=True, skip_shape=None, image=(9, 7),
                   channels=16, bias=True):
    """Conv (`channels` out, `kernel` square, `group`), then Add of the input `s`, then `then`."""
    r = rng(21)
    w = r.standard_normal((channels, channels // group, kernel, kernel)).astype(np.float32)
    inits = [("w", w)] + ([("b", r.standard_normal(channels).astype(np.float32))] if bias else [])
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["conv"], pads=[kernel // 2] * 4,
                              strides=[strides] * 2, group=group),
             helper.make_node("Add", ["conv", "s"] if conv_first else ["s", "conv"], ["sum" if then else "y"])]
    if then == "Clip":
        nodes.append(helper.make_node("Clip", ["sum", "lo", "hi"], ["y"]))
        inits += [scalar("lo", 0.0), scalar("hi", 6.0)]
    elif then:
        nodes.append(helper.make_node(then, ["sum"], ["y"]))
    out = tuple(-(-d // strides) for d in image)
    inputs = [("x", np.zeros((1, channels, *image), np.float32)),
              ("s", np.zeros(skip_shape or (1, channels, *out), np.float32))]
    return make_model(nodes, inputs, [("y", None)], inits)


def residual_feeds(model, seed=22):
    r = rng(seed)
    return {i.name: r.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


RESIDUAL_CASES = {  # the convolution's kernel paths: each adds the residual in its own pass or after
    "pointwise": {"kernel": 1},
    "im2col": {"kernel": 3},
    "strided im2col": {"kernel": 3, "strides": 2},
    "depthwise": {"kernel": 3, "group": 16},
    "grouped": {"kernel": 3, "group": 4},
    "no bias, the input first, Clip": {"bias": False, "conv_first": False, "then": "Clip"},
    "no activation": {"then": None},
    "HardSwish": {"kernel": 3, "then": "HardSwish"},
    "Sigmoid (applied after the compiled pass)": {"then": "Sigmoid"},
    "a large output (split on threads)": {"kernel": 1, "image": (96, 96)},
}


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)], ids=["numpy", "compiled"])
@pytest.mark.parametrize("case", list(RESIDUAL_CASES))
def test_a_residual_add_after_a_convolution_runs_inside_it(case, compiled):
    model = residual_model(**RESIDUAL_CASES[case])
    feeds = residual_feeds(model)
    expected = run_onnxruntime(model, feeds)[0]
    on, off = residual_session(model, compiled=compiled), residual_session(model, ["fuse_residual"], compiled)
    got, unfused = on.run(None, feeds)[0], off.run(None, feeds)[0]
    assert_close(got, expected)
    np.testing.assert_array_equal(got, unfused)  # the same sums in the same order
    assert [s.op_type for s in on._last.steps] == ["Conv"]
    assert [s.op_type for s in off._last.steps] == ["Conv", "Add"]  # the activation inside the Add


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)], ids=["numpy", "compiled"])
@pytest.mark.parametrize("skip_shape, image", [
    ((1, 16, 1, 1), (9, 7)),   # the residual broadcasts to the convolution's output
    ((1, 1, 9, 7), (9, 7)),    # along the channels
    ((1, 16, 5, 4), (1, 1)),   # the convolution's output broadcasts up to the residual's shape
])
def test_a_residual_that_broadcasts_is_added_as_the_add_would(skip_shape, image, compiled):
    model = residual_model(kernel=3, skip_shape=skip_shape, image=image)
    feeds = residual_feeds(model)
    sess = residual_session(model, compiled=compiled)
    got = sess.run(None, feeds)[0]
    assert_close(got, run_onnxruntime(model, feeds)[0])
    assert [s.op_type for s in sess._last.steps] == ["Conv"]


def test_of_two_convolutions_added_the_later_one_takes_the_add():
    """ResNet's block with a projected shortcut: Add(conv3, downsample), then Relu."""
    r = rng(23)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="main"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="shortcut"),
             helper.make_node("Add", ["a", "b"], ["sum"]),
             helper.make_node("Relu", ["sum"], ["y"])]
    model = make_model(nodes, [("x", np.zeros((1, 8, 6, 6), np.float32))], [("y", None)],
                       [("w1", r.standard_normal((16, 8, 1, 1)).astype(np.float32)),
                        ("w2", r.standard_normal((16, 8, 1, 1)).astype(np.float32))])
    feeds = {"x": r.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    check_model(model, feeds)
    sess = residual_session(model)
    sess.run(None, feeds)
    assert [(s.op_type, s.name) for s in sess._last.steps] == [("Conv", "main"), ("Conv", "shortcut")]
    assert len(sess._last.steps[1].node.inputs) == 4  # the later convolution adds the earlier one's output


@pytest.mark.parametrize("change", ["a second reader", "the convolution's output is a graph output",
                                    "the add of the output to itself"])
def test_what_only_looks_like_a_residual_add_is_left_alone(change):
    r = rng(24)
    second = {"the add of the output to itself": "conv"}.get(change, "s")
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["conv", second], ["y"])]
    outputs = [("y", None)]
    if change == "a second reader":
        nodes.append(helper.make_node("Neg", ["conv"], ["n"]))
        outputs.append(("n", None))
    elif change == "the convolution's output is a graph output":
        outputs.append(("conv", None))
    model = make_model(nodes, [("x", np.zeros((1, 4, 5, 5), np.float32)), ("s", np.zeros((1, 4, 5, 5), np.float32))],
                       outputs, [("w", r.standard_normal((4, 4, 3, 3)).astype(np.float32))])
    feeds = residual_feeds(model)
    check_model(model, feeds)
    sess = residual_session(model)
    sess.run(None, feeds)
    assert "Add" in [s.op_type for s in sess._last.steps]


def test_a_conv_of_four_inputs_in_a_file_is_refused_by_name():
    r = rng(25)
    nodes = [helper.make_node("Conv", ["x", "w", "b", "s"], ["y"], name="conv")]
    model = make_model(nodes, [("x", np.zeros((1, 4, 5, 5), np.float32)), ("s", np.zeros((1, 4, 5, 5), np.float32))],
                       [("y", None)], [("w", r.standard_normal((4, 4, 1, 1)).astype(np.float32)),
                                       ("b", np.zeros(4, np.float32))])
    with pytest.raises(nnrun.ModelError, match="'conv'.*Conv takes 2 to 3 inputs, the node has 4"):
        residual_session(model)
