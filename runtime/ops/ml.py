"""The ai.onnx.ml ops nnrun runs: LabelEncoder, ArrayFeatureExtractor, Binarizer and TreeEnsemble
(opset 5, the one op that replaces TreeEnsembleRegressor and TreeEnsembleClassifier).

LabelEncoder maps by sorted keys (`searchsorted`) for numbers and by a dict for strings.
TreeEnsemble walks every row down every tree at once: each step moves the rows still at an
interior node one level down, so a run takes as many numpy passes as the deepest tree is deep.
"""

import math
import statistics

import numpy as np

from ..errors import ExecutionError
from ..weights import weight_array
from .registry import REQUIRED, Inferred, Kernel, TensorInfo, register
from .strings import STRING

ML = "ai.onnx.ml"


# LabelEncoder

@register("LabelEncoder", since=1, domain=ML)
class LabelEncoder1(Kernel):
    """Opset 1: strings to their index in `classes_strings`, or int64s back to those strings."""

    attributes = {"classes_strings": (), "default_int64": -1, "default_string": "_Unused"}

    def infer(self, x):
        classes = np.array(list(self.classes_strings), dtype=STRING)
        indices = np.arange(len(classes), dtype=np.int64)
        if x.dtype == STRING:
            mapping = Mapping(classes, indices, self.default_int64)
        elif x.dtype == np.int64:
            mapping = Mapping(indices, classes, self.default_string)
        else:
            self.fail(f"X has type {x.dtype}; expected strings or int64")
        return Inferred([TensorInfo(x.shape, mapping.values.dtype)], mapping=mapping)

    def run(self, x, outs, scratch):
        self.mapping.apply(x, outs[0])


@register("LabelEncoder", since=2, domain=ML)
class LabelEncoder(Kernel):
    """Opset 2 on: keys_* to values_* (floats, int64s, strings; opset 4 adds more types, as
    tensors), anything else to the default of the values' type. A NaN key matches any NaN, and
    of repeated keys the last one counts (opset 4's rules, kept for opset 2)."""

    attributes = {"keys_floats": None, "keys_int64s": None, "keys_strings": None, "keys_tensor": None,
                  "values_floats": None, "values_int64s": None, "values_strings": None, "values_tensor": None,
                  "default_float": -0.0, "default_int64": -1, "default_string": "_Unused",
                  "default_tensor": None}

    def decode(self):
        keys = self.one_of("keys", {"floats": np.float32, "int64s": np.int64, "strings": STRING})
        values = self.one_of("values", {"floats": np.float32, "int64s": np.int64, "strings": STRING})
        if len(keys) != len(values):
            self.fail(f"{len(keys)} keys for {len(values)} values")
        if self.default_tensor is not None:
            default = weight_array(self.default_tensor).reshape(-1)
            if default.size != 1 or default.dtype != values.dtype:
                self.fail(f"default_tensor must hold one {values.dtype}, not {default.size} of {default.dtype}")
            default = default[0]
        elif values.dtype == STRING:
            default = self.default_string
        elif values.dtype.kind == "f":
            default = self.default_float
        else:
            default = self.default_int64
        self.mapping = Mapping(keys, values, default)

    def one_of(self, prefix, kinds):
        given = [k for k in (*kinds, "tensor") if getattr(self, f"{prefix}_{k}") is not None]
        if len(given) != 1:
            self.fail(f"exactly one {prefix}_* attribute must be set, found {given or 'none'}")
        value = getattr(self, f"{prefix}_{given[0]}")
        if given[0] == "tensor":
            return weight_array(value).reshape(-1)
        return np.array(list(value), dtype=kinds[given[0]])

    def infer(self, x):
        if x.dtype != self.mapping.keys.dtype:
            self.fail(f"X has type {x.dtype}; the keys are {self.mapping.keys.dtype}")
        return [TensorInfo(x.shape, self.mapping.values.dtype)]

    def run(self, x, outs, scratch):
        self.mapping.apply(x, outs[0])


class Mapping:
    """keys -> values, others -> default; numbers looked up in sorted keys, strings in a dict;
    of repeated keys, the last."""

    def __init__(self, keys, values, default):
        self.keys, self.values = keys, values
        self.default = np.array(default, dtype=self.values.dtype)
        if keys.dtype == STRING:
            self.table = dict(zip(keys.tolist(), range(len(keys))))
            self.nan_at = None
        else:
            nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(len(keys), bool)
            self.nan_at = int(np.flatnonzero(nan)[-1]) if nan.any() else None
            order = np.argsort(keys[~nan], kind="stable")  # repeated keys stay in their order
            self.sorted = keys[~nan][order]
            self.order = np.flatnonzero(~nan)[order]

    def apply(self, x, out):
        flat = out.reshape(-1)
        if self.keys.dtype == STRING:
            at = np.array([self.table.get(s, -1) for s in x.reshape(-1)], dtype=np.int64)
        else:
            x = x.reshape(-1)
            spot = np.searchsorted(self.sorted, x, side="right") - 1  # the last of repeated keys
            hit = spot >= 0
            hit[hit] = self.sorted[spot[hit]] == x[hit]
            at = np.full(x.shape, -1, dtype=np.int64)
            at[hit] = self.order[spot[hit]]
            if self.nan_at is not None:
                at[np.isnan(x)] = self.nan_at
        found = at >= 0
        flat[...] = self.default
        flat[found] = self.values[at[found]]


# ArrayFeatureExtractor and Binarizer

@register("ArrayFeatureExtractor", since=1, domain=ML)
class ArrayFeatureExtractor(Kernel):
    """The elements of the last axis at `Y` (all its indices, flattened); a vector X gives one
    row, [1, len(Y)], as onnxruntime has it."""

    def infer(self, x, y):
        if y.dtype != np.int64:
            self.fail(f"Y has type {y.dtype}; expected int64")
        if not x.shape:
            self.fail("X must have at least one axis")
        rows = x.shape[:-1] if len(x.shape) > 1 else (1,)
        return [TensorInfo(tuple(rows) + (math.prod(y.shape),), x.dtype)]

    def run(self, x, y, outs, scratch):
        index = y.reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= x.shape[-1]):
            raise ExecutionError(f"an index of Y is outside [0, {x.shape[-1]})")
        np.copyto(outs[0], np.take(x, index, axis=-1).reshape(outs[0].shape))


@register("Binarizer", since=1, domain=ML)
class Binarizer(Kernel):
    attributes = {"threshold": 0.0}

    def infer(self, x):
        if x.dtype.kind not in "fi":
            self.fail(f"X has type {x.dtype}; expected a number")
        return [TensorInfo(x.shape, x.dtype)]

    def run(self, x, outs, scratch):
        np.greater(x, self.threshold, out=outs[0], casting="unsafe")


# TreeEnsemble

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)
AVERAGE, SUM, MIN, MAX = range(4)
NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT = range(5)


@register("TreeEnsemble", since=5, domain=ML)
class TreeEnsemble(Kernel):
    """Each row of X ([N, F]) goes down each tree from its root (`tree_roots`); the leaves it
    reaches add their weight to their target (SUM, AVERAGE over trees) or keep the least or
    largest (MIN, MAX; a target no leaf reached stays 0). Then `post_transform` by row.

    A NaN feature takes the true branch where `nodes_missing_value_tracks_true` says so, else
    the comparison's result (false, but true for NEQ). The sets of BRANCH_MEMBER nodes are
    read from `membership_values` in the order of the nodes, as the spec says.
    """

    attributes = {"aggregate_function": SUM, "leaf_targetids": REQUIRED, "leaf_weights": REQUIRED,
                  "membership_values": None, "n_targets": REQUIRED, "nodes_falseleafs": REQUIRED,
                  "nodes_falsenodeids": REQUIRED, "nodes_featureids": REQUIRED, "nodes_hitrates": None,
                  "nodes_missing_value_tracks_true": None, "nodes_modes": REQUIRED, "nodes_splits": REQUIRED,
                  "nodes_trueleafs": REQUIRED, "nodes_truenodeids": REQUIRED, "post_transform": NONE,
                  "tree_roots": REQUIRED}

    def decode(self):
        ints = lambda v: np.asarray(list(v), dtype=np.int64)  # noqa: E731
        self.modes = weight_array(self.nodes_modes).reshape(-1).astype(np.int64)
        self.splits = weight_array(self.nodes_splits).reshape(-1)
        self.features = ints(self.nodes_featureids)
        self.next_ids = np.stack([ints(self.nodes_falsenodeids), ints(self.nodes_truenodeids)])
        self.next_leaf = np.stack([ints(self.nodes_falseleafs), ints(self.nodes_trueleafs)]).astype(bool)
        self.leaf_weights_ = weight_array(self.leaf_weights).reshape(-1)
        self.targets = ints(self.leaf_targetids)
        self.roots = ints(self.tree_roots)
        missing = self.nodes_missing_value_tracks_true
        self.missing_true = ints(missing).astype(bool) if missing is not None else np.zeros(len(self.modes), bool)
        n_nodes, n_leaves = len(self.modes), len(self.leaf_weights_)
        if any(len(a) != n_nodes for a in (self.splits, self.features, self.next_ids[0], self.next_ids[1],
                                            self.next_leaf[0], self.next_leaf[1], self.missing_true)):
            self.fail("the nodes_* attributes differ in length")
        if len(self.targets) != n_leaves:
            self.fail("leaf_targetids and leaf_weights differ in length")
        if self.modes.size and (self.modes.min() < LEQ or self.modes.max() > MEMBER):
            self.fail("nodes_modes holds a mode outside 0..6")
        bound = np.where(self.next_leaf, n_leaves, n_nodes)
        if self.next_ids.size and ((self.next_ids < 0) | (self.next_ids >= bound)).any():
            self.fail("a branch of nodes_truenodeids or nodes_falsenodeids points outside the nodes or leaves")
        if self.roots.size and (self.roots.min() < 0 or self.roots.max() >= n_nodes):
            self.fail("a tree root is outside the nodes")
        if self.targets.size and (self.targets.min() < 0 or self.targets.max() >= self.n_targets):
            self.fail(f"a leaf target is outside [0, {self.n_targets})")
        if self.aggregate_function not in (AVERAGE, SUM, MIN, MAX):
            self.fail(f"aggregate_function {self.aggregate_function} is not one of 0..3")
        if self.post_transform not in (NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT):
            self.fail(f"post_transform {self.post_transform} is not one of 0..4")
        self.members = {}  # node -> the sorted values of its set
        values = [] if self.membership_values is None else weight_array(self.membership_values).reshape(-1)
        groups = np.split(values, np.flatnonzero(np.isnan(values))) if len(values) else []
        groups = [g[~np.isnan(g)] for g in groups]
        member_nodes = np.flatnonzero(self.modes == MEMBER)
        if len(groups) < len(member_nodes):
            self.fail(f"membership_values holds {len(groups)} sets for {len(member_nodes)} BRANCH_MEMBER nodes")
        for node, group in zip(member_nodes, groups):
            self.members[int(node)] = np.sort(group)

    def infer(self, x):
        if x.dtype.kind != "f":
            self.fail(f"X has type {x.dtype}; expected a floating type")
        if len(x.shape) != 2:
            self.fail(f"X has shape {list(x.shape)}; expected [N, F]")
        if self.features.size and self.features.max() >= x.shape[1]:
            self.fail(f"a node reads feature {self.features.max()} of {x.shape[1]}")
        return [TensorInfo((x.shape[0], self.n_targets), x.dtype)]

    def leaves(self, x):
        """[N, trees]: the leaf each row reaches in each tree."""
        n = x.shape[0]
        splits = self.splits.astype(x.dtype)
        node = np.broadcast_to(self.roots, (n, len(self.roots))).copy()
        done = np.zeros(node.shape, bool)
        rows = np.broadcast_to(np.arange(n)[:, None], node.shape)
        for _ in range(len(self.modes) + 1):
            active = ~done
            if not active.any():
                return node
            at, r = node[active], rows[active]
            value = x[r, self.features[at]]
            threshold, mode = splits[at], self.modes[at]
            result = np.select([mode == LEQ, mode == LT, mode == GTE, mode == GT, mode == EQ, mode == NEQ],
                               [value <= threshold, value < threshold, value >= threshold, value > threshold,
                                value == threshold, value != threshold], False)
            for k in np.flatnonzero(mode == MEMBER):
                result[k] = value[k] in self.members[int(at[k])]
            result |= np.isnan(value) & self.missing_true[at]
            branch = result.astype(np.int64)
            node[active] = self.next_ids[branch, at]
            done[active] = self.next_leaf[branch, at]
        self.fail("the trees have a cycle")

    def run(self, x, outs, scratch):
        leaves = self.leaves(x)
        weights, targets = self.leaf_weights_[leaves].astype(np.float64), self.targets[leaves]
        n = x.shape[0]
        rows = np.broadcast_to(np.arange(n)[:, None], leaves.shape)
        score = np.zeros((n, self.n_targets))
        if self.aggregate_function in (SUM, AVERAGE):
            np.add.at(score, (rows, targets), weights)
            if self.aggregate_function == AVERAGE:
                score /= max(len(self.roots), 1)
        else:
            extreme = np.minimum if self.aggregate_function == MIN else np.maximum
            score[...] = np.inf if self.aggregate_function == MIN else -np.inf
            extreme.at(score, (rows, targets), weights)
            reached = np.zeros(score.shape, bool)
            reached[rows, targets] = True
            score[~reached] = 0
        np.copyto(outs[0], post_transform(score, self.post_transform), casting="unsafe")


def post_transform(score, transform):
    """The spec's post transforms of [N, targets] scores (float64)."""
    if transform == SOFTMAX:
        e = np.exp(score - score.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if transform == LOGISTIC:
        return 1 / (1 + np.exp(-score))
    if transform == SOFTMAX_ZERO:
        # The softmax of the scores that are not zero; zeros stay zero.
        nonzero = score != 0
        top = np.where(nonzero, score, -np.inf).max(axis=1, keepdims=True)
        e = np.where(nonzero, np.exp(score - np.where(np.isfinite(top), top, 0)), 0)
        total = e.sum(axis=1, keepdims=True)
        return np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    if transform == PROBIT:
        inverse_cdf = np.frompyfunc(statistics.NormalDist().inv_cdf, 1, 1)
        inside = (score > 0) & (score < 1)
        out = np.where(score <= 0, -np.inf, np.where(score >= 1, np.inf, np.nan))
        out[inside] = inverse_cdf(score[inside]).astype(np.float64)
        return out
    return score
