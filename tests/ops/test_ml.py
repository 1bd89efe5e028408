"""The ai.onnx.ml ops (LabelEncoder, ArrayFeatureExtractor, Binarizer, TreeEnsemble) against
onnxruntime and onnx's reference evaluator."""

import numpy as np
import pytest
from oracle import (FLOAT16_RTOL, assert_close, check_model, helper, make_model, numpy_helper, rng, run_nnrun,
                    run_onnxruntime)

import nnrun

ML = "ai.onnx.ml"


def ml_node(op_type, inputs, ml_opset, n_outputs=1, **attrs):
    node = helper.make_node(op_type, [n for n, _ in inputs], [f"y{i}" for i in range(n_outputs)], domain=ML, **attrs)
    return make_model([node], inputs, [(f"y{i}", None) for i in range(n_outputs)], opset=21,
                      extra_opsets=[(ML, ml_opset)])


def run_reference(model, feeds):
    """The reference evaluator's outputs, its numpy str arrays as the object arrays ONNX strings are."""
    from onnx.reference import ReferenceEvaluator

    return [a.astype(object) if a.dtype.kind == "U" else a for a in ReferenceEvaluator(model).run(None, feeds)]


def check_reference(model, feeds, **tolerance):
    for actual, expected in zip(run_nnrun(model, feeds), run_reference(model, feeds), strict=True):
        assert_close(actual, expected, **tolerance)


def check_both(model, feeds, **tolerance):
    check_model(model, feeds, oracle="onnxruntime", **tolerance)
    check_reference(model, feeds, **tolerance)


def strings(*values):
    return np.array(list(values), dtype=object)


# LabelEncoder

LABEL_CASES = [  # (input, attributes)
    (strings("a", "b", "d", "c", "g", ""), dict(keys_strings=["a", "b", "c"], values_int64s=[0, 1, 2])),
    (strings("a", "zz", "c"), dict(keys_strings=["c", "a"], values_int64s=[7, -3], default_int64=42)),
    (strings("a", "zz", "c"), dict(keys_strings=["c", "a"], values_strings=["C", "A"])),
    (strings("a", "zz", "c"), dict(keys_strings=["c", "a"], values_strings=["C", "A"], default_string="?")),
    (strings("a", "zz", "c"), dict(keys_strings=["c", "a"], values_floats=[0.5, -1.5], default_float=9.0)),
    (np.array([[3, 1], [-2, 7]], np.int64), dict(keys_int64s=[7, 3, -2], values_strings=["x", "y", "z"])),
    (np.array([3, 1, 5, 0], np.int64), dict(keys_int64s=[5, 3, 0], values_floats=[1.0, 2.5, -1.0])),
    (np.array([3, 1, 5, 0], np.int64), dict(keys_int64s=[5, 3, 0], values_int64s=[10, 30, 0], default_int64=-9)),
    (np.array([0.5, 1.25, -2.0, 7.0], np.float32), dict(keys_floats=[1.25, 0.5], values_int64s=[1, 2])),
    (np.array([0.5, 1.25, -2.0, 7.0], np.float32), dict(keys_floats=[1.25, 0.5], values_floats=[10.0, 20.0])),
    (np.array([], np.int64), dict(keys_int64s=[1], values_int64s=[2])),
]


@pytest.mark.parametrize("x, attrs", LABEL_CASES)
@pytest.mark.parametrize("ml_opset", [2, 4])
def test_label_encoder(ml_opset, x, attrs):
    check_both(ml_node("LabelEncoder", [("x", x)], ml_opset, **attrs), {"x": x})


@pytest.mark.parametrize("x, attrs", [
    (np.array([1, 2, 3], np.int64), dict(keys_int64s=[2, 1, 2], values_int64s=[5, 6, 7])),
    (strings("b", "a"), dict(keys_strings=["a", "b", "a"], values_int64s=[5, 6, 7])),
    (np.array([1.0, 2.0, 3.0], np.float32), dict(keys_floats=[2.0, 2.0, 2.0], values_strings=["p", "q", "r"])),
])
def test_label_encoder_repeated_keys(x, attrs):
    # The spec: "If a key is repeated, the last key takes precedence"; onnxruntime takes the first.
    check_reference(ml_node("LabelEncoder", [("x", x)], 4, **attrs), {"x": x})


def _tensor(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


@pytest.mark.parametrize("keys, values, default, x", [
    (strings("a", "b", "c"), np.array([0, 1, 2], np.int16), np.array([42], np.int16), strings("a", "b", "d", "c")),
    (np.array([1, 5, 9], np.int32), np.array([0.5, 1.5, 2.5], np.float64), np.array([-1.0]),
     np.array([9, 2, 1], np.int32)),
    (np.array([1.0, 2.0], np.float64), strings("one", "two"), strings("none"), np.array([2.0, 3.0, 1.0])),
])
def test_label_encoder_tensor_attributes(keys, values, default, x):
    model = ml_node("LabelEncoder", [("x", x)], 4, keys_tensor=_tensor("keys", keys),
                    values_tensor=_tensor("values", values), default_tensor=_tensor("default", default))
    # onnxruntime implements string and int64 keys to string, int16, int64 and float values only.
    check_reference(model, {"x": x})
    if keys.dtype in (object, np.int64) and values.dtype in (object, np.int16, np.int64, np.float32):
        check_model(model, {"x": x}, oracle="onnxruntime")


def test_label_encoder_nan_key_matches_nan():
    # Opset 4: a NaN key matches any NaN; the reference evaluator's dict lookup misses it.
    x = np.array([np.nan, 1.0, 2.0, -np.nan], np.float32)
    model = ml_node("LabelEncoder", [("x", x)], 4, keys_floats=[1.0, float("nan")], values_int64s=[10, 20])
    check_model(model, {"x": x}, oracle="onnxruntime")


def test_label_encoder_opset_1():
    # onnxruntime has opset 1; the reference evaluator does not implement its attributes.
    classes = ["a", "b", "c"]
    x = strings("b", "z", "a")
    check_model(ml_node("LabelEncoder", [("x", x)], 1, classes_strings=classes, default_int64=-7), {"x": x},
                oracle="onnxruntime")
    i = np.array([2, 5, 0], np.int64)
    check_model(ml_node("LabelEncoder", [("x", i)], 1, classes_strings=classes, default_string="?"), {"x": i},
                oracle="onnxruntime")


def test_label_encoder_refuses_keys_of_another_type():
    x = np.array([1, 2], np.int64)
    with pytest.raises(nnrun.NnrunError, match="keys are"):
        run_nnrun(ml_node("LabelEncoder", [("x", x)], 2, keys_strings=["a"], values_int64s=[1]), {"x": x})


# ArrayFeatureExtractor and Binarizer

@pytest.mark.parametrize("x, indices", [
    (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([0, 1], np.int64)),
    (np.arange(24, dtype=np.float64).reshape(2, 3, 4), np.array([[3, 0, 3]], np.int64)),
    (np.arange(5, dtype=np.int64), np.array([4, 1], np.int64)),  # a vector: one row
    (np.arange(6, dtype=np.int32).reshape(2, 3), np.array([2], np.int64)),
    (strings("a", "b", "c", "d").reshape(2, 2), np.array([1, 1, 0], np.int64)),
])
def test_array_feature_extractor(x, indices):
    check_both(ml_node("ArrayFeatureExtractor", [("x", x), ("i", indices)], 1), {"x": x, "i": indices})


def test_array_feature_extractor_refuses_an_index_out_of_range():
    x, i = np.zeros((2, 3), np.float32), np.array([3], np.int64)
    with pytest.raises(nnrun.NnrunError, match="outside"):
        run_nnrun(ml_node("ArrayFeatureExtractor", [("x", x), ("i", i)], 1), {"x": x, "i": i})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("threshold", [0.0, 1.0, -0.5])
def test_binarizer(threshold, dtype):
    x = (rng(0).standard_normal((3, 4, 5)) * 2).astype(dtype)
    # onnxruntime's Binarizer takes float32 only.
    oracles = ["reference", "onnxruntime"] if dtype == np.float32 else ["reference"]
    for oracle in oracles:
        check_model(ml_node("Binarizer", [("x", x)], 1, threshold=threshold), {"x": x}, oracle=oracle)


# TreeEnsemble

def tree_ensemble(dtype, n_targets, nodes, leaves, roots, **attrs):
    """nodes: (feature, split, mode, true id, true is leaf, false id, false is leaf[, missing true]);
    leaves: (target, weight)."""
    fields = list(zip(*nodes))
    splits, modes = np.array(fields[1], dtype), np.array(fields[2], np.uint8)
    extra = {}
    if len(fields) > 7:
        extra["nodes_missing_value_tracks_true"] = list(fields[7])
    if "membership_values" in attrs:
        attrs["membership_values"] = _tensor("members", np.array(attrs["membership_values"], dtype))
    node_attrs = dict(
        n_targets=n_targets, nodes_featureids=list(fields[0]), nodes_splits=_tensor("splits", splits),
        nodes_modes=_tensor("modes", modes), nodes_truenodeids=list(fields[3]), nodes_trueleafs=list(fields[4]),
        nodes_falsenodeids=list(fields[5]), nodes_falseleafs=list(fields[6]),
        leaf_targetids=[t for t, _ in leaves], leaf_weights=_tensor("weights", np.array([w for _, w in leaves], dtype)),
        tree_roots=list(roots), **extra, **attrs)
    return node_attrs


def random_forest(dtype, n_features, n_targets, n_trees, depth, seed, modes=(0, 1, 2, 3, 4, 5)):
    """Full binary trees of `depth` levels with random features, splits and modes."""
    g = rng(seed)
    nodes, leaves, roots = [], [], []
    for _ in range(n_trees):
        roots.append(len(nodes))
        level = [len(nodes)]
        nodes.append(None)
        for d in range(depth):
            next_level = []
            for at in level:
                children = []
                for _ in range(2):
                    if d == depth - 1:
                        children.append((len(leaves), 1))
                        leaves.append((int(g.integers(n_targets)), float(g.normal())))
                    else:
                        children.append((len(nodes), 0))
                        next_level.append(len(nodes))
                        nodes.append(None)
                feature = int(g.integers(n_features))
                split = float(np.round(g.normal(), 1))
                nodes[at] = (feature, split, int(g.choice(modes)), *children[0], *children[1], int(g.integers(2)))
            level = next_level
    return tree_ensemble(dtype, n_targets, nodes, leaves, roots)


def _features(shape, dtype, seed=1):
    x = np.round(rng(seed).normal(size=shape), 1).astype(dtype)  # some equal to a split, for EQ and LEQ
    x.reshape(-1)[::7] = np.nan
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_ensemble_random_forest(seed, aggregate, dtype):
    attrs = random_forest(dtype, n_features=4, n_targets=3, n_trees=5, depth=4, seed=seed)
    x = _features((40, 4), dtype)
    model = ml_node("TreeEnsemble", [("x", x)], 5, aggregate_function=aggregate, **attrs)
    check_model(model, {"x": x}, oracle="onnxruntime")
    if aggregate in (0, 1):  # MIN and MAX: the reference leaves unreached targets at the type's extreme
        check_reference(model, {"x": x})


def _softmax(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("transform", [1, 2, 3, 4])
def test_tree_ensemble_post_transform(transform):
    # The reference evaluator ignores post_transform. onnxruntime reads 1 as LOGISTIC and 2 as
    # SOFTMAX, the numbering of its older tree ops; the spec of TreeEnsemble says 1 is SOFTMAX and
    # 2 LOGISTIC, and nnrun follows the spec: for those two the oracle is the spec's formula
    # applied to onnxruntime's scores without a transform.
    attrs = random_forest(np.float32, n_features=3, n_targets=4, n_trees=3, depth=3, seed=4)
    if transform == 4:  # PROBIT of a score in (0, 1)
        attrs["leaf_weights"] = _tensor("weights", rng(5).uniform(0.01, 0.32, 24).astype(np.float32))
    x = _features((30, 3), np.float32)
    model = ml_node("TreeEnsemble", [("x", x)], 5, post_transform=transform, **attrs)
    if transform in (1, 2):
        raw = run_onnxruntime(ml_node("TreeEnsemble", [("x", x)], 5, **attrs), {"x": x})[0].astype(np.float64)
        expected = _softmax(raw) if transform == 1 else 1 / (1 + np.exp(-raw))
        assert_close(run_nnrun(model, {"x": x})[0], expected.astype(np.float32))
    else:
        # onnxruntime's PROBIT approximates the inverse normal CDF, to 1e-3 or so.
        check_model(model, {"x": x}, oracle="onnxruntime", rtol=3e-3 if transform == 4 else 1e-4)


def test_tree_ensemble_set_membership_in_node_order():
    # Two BRANCH_MEMBER nodes whose order in the nodes differs from the order a walk meets them:
    # their sets are taken in the order of the nodes, as the spec says.
    nodes = [(0, 0.0, 0, 2, 0, 1, 0),    # root: x0 <= 0 -> node 2, else node 1
             (1, 0.0, 6, 0, 1, 1, 1),    # x1 in {1, 2}
             (1, 0.0, 6, 2, 1, 3, 1)]    # x1 in {3}
    leaves = [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0)]
    attrs = tree_ensemble(np.float32, 4, nodes, leaves, [0], membership_values=[1, 2, np.nan, 3])
    x = np.array([[1, 1], [1, 3], [-1, 3], [-1, 2], [1, np.nan], [-1, 1]], np.float32)
    check_model(ml_node("TreeEnsemble", [("x", x)], 5, **attrs), {"x": x}, oracle="onnxruntime")


def test_tree_ensemble_single_leaf_tree_and_missing_values():
    nodes = [(0, 0.5, 1, 0, 1, 0, 1),       # a tree that is one leaf: both branches to leaf 0
             (1, 0.0, 3, 1, 1, 2, 1, 1)]    # x1 > 0, NaN to true
    leaves = [(0, 5.0), (1, 1.0), (1, -1.0)]
    attrs = tree_ensemble(np.float64, 2, [n[:7] + ((n[7],) if len(n) > 7 else (0,)) for n in nodes], leaves, [0, 1])
    x = np.array([[0.0, 1.0], [9.0, -1.0], [np.nan, np.nan]])
    check_both(ml_node("TreeEnsemble", [("x", x)], 5, **attrs), {"x": x})


def test_tree_ensemble_float16():
    # onnxruntime refuses float16 splits; the reference evaluator takes them.
    attrs = random_forest(np.float16, n_features=2, n_targets=2, n_trees=2, depth=3, seed=7)
    x = _features((10, 2), np.float16)
    check_reference(ml_node("TreeEnsemble", [("x", x)], 5, **attrs), {"x": x}, rtol=FLOAT16_RTOL)


def test_tree_ensemble_refuses_a_branch_outside_the_nodes():
    attrs = tree_ensemble(np.float32, 1, [(0, 0.0, 0, 5, 0, 0, 1)], [(0, 1.0)], [0])
    x = np.zeros((1, 1), np.float32)
    with pytest.raises(nnrun.NnrunError, match="outside the nodes or leaves"):
        run_nnrun(ml_node("TreeEnsemble", [("x", x)], 5, **attrs), {"x": x})



