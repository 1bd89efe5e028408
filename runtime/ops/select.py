"""Ops that select, count or rearrange by value: TopK, NonZero, Unique, CumSum,
Einsum, OneHot, ReverseSequence.

TopK's K, OneHot's depth and CumSum's axis are read at PREPARE (K and depth
decide a shape; unknown, they raise NeedsValueError so the node runs eagerly).
NonZero and Unique have shapes that depend on their input's values: with a
known input, infer returns the values (the node folds); otherwise infer raises
NeedsValueError and `run` returns freshly allocated results.

TopK orders by a key that is ascending in the wanted order (x for the
smallest, -x or ~x for the largest) and keeps the first k of its stable order,
so ties keep the lower index first, as onnxruntime does. A small k of a long
axis avoids the full sort: a few passes of argmin, or a partition when no row
ties at the k-th value. Einsum parses its equation at PREPARE for the
output shape and lets numpy choose the contraction path once.
"""

import numpy as np

from .. import size_limit
from .registry import Inferred, Kernel, TensorInfo, register
from .shape import INT64, int_list, known_value, normalize_axis, sane_shape


# TopK

class TopKBase(Kernel):
    attributes = {"axis": -1}
    largest = 1
    sorted = 1

    def k_of(self, k_info):
        raise NotImplementedError

    def infer(self, x, k_info=None):
        k = self.k_of(k_info)
        rank = len(x.shape)
        axis_n = normalize_axis(self.node, self.axis, rank)
        if not 0 <= k <= x.shape[axis_n]:
            self.fail(f"k {k} is not in [0, {x.shape[axis_n]}] for axis {self.axis} "
                      f"of shape {list(x.shape)}")
        if x.dtype.kind not in "fiu":
            self.fail(f"TopK of {x.dtype} is not supported")
        shape = x.shape[:axis_n] + (k,) + x.shape[axis_n + 1:]
        return Inferred([TensorInfo(shape, x.dtype), TensorInfo(shape, INT64)], axis_n=axis_n, k=k)

    def key(self, x):
        """An array whose ascending stable order is the wanted order."""
        if not self.largest:
            return x
        return np.negative(x) if x.dtype.kind == "f" else np.invert(x)

    def run(self, x, k_in=None, *, outs, scratch):
        values, indices = outs
        key = np.moveaxis(self.key(x), self.axis_n, -1)
        n, k = key.shape[-1], self.k
        chosen = None
        if key.dtype.kind == "f" and np.isnan(key).any():
            # NaN is the largest value, as onnxruntime (and ArgMax, ReduceMax) have it, ties among
            # NaNs by index: first when the largest are wanted (negated, it would sort last),
            # last otherwise. The shortcuts below would take NaNs for ties they cannot see.
            nan = np.isnan(key)
            chosen = (np.lexsort((key, ~nan), axis=-1) if self.largest
                      else np.argsort(key, axis=-1, kind="stable"))[..., :k]
        if chosen is None and 0 < k <= 16 and 4 * k < n:
            chosen = self.few_smallest(key, k)
        if chosen is None and 0 < k and 8 * k < n:
            chosen = self.partial_order(key, k)
        if chosen is None:
            chosen = np.argsort(key, axis=-1, kind="stable")[..., :k]
        np.copyto(np.moveaxis(indices, self.axis_n, -1), chosen)
        np.copyto(values, np.take_along_axis(x, np.moveaxis(chosen, -1, self.axis_n), axis=self.axis_n))

    @staticmethod
    def few_smallest(key, k):
        """The first k of the stable order along the last axis by k passes of argmin, which
        returns the first (lowest-index) minimum; a picked element is masked with +inf. None
        when the key is not a float or holds non-finite values, which the mask would confuse."""
        if key.dtype.kind != "f" or not (np.isfinite(key.min()) and np.isfinite(key.max())):
            return None
        work = np.array(key, order="C").reshape(-1, key.shape[-1])
        rows = np.arange(work.shape[0])
        picks = np.empty((work.shape[0], k), np.int64)
        for j in range(k):
            pick = np.argmin(work, axis=-1)
            picks[:, j] = pick
            work[rows, pick] = np.inf
        return picks.reshape(key.shape[:-1] + (k,))

    @staticmethod
    def partial_order(key, k):
        """The first k of the stable order along the last axis, by partition (O(n), not a sort of
        n); None when a row ties at the k-th value, where the partition may have picked any of
        the tied elements and only the stable sort knows the lower-index ones."""
        part = np.argpartition(key, k - 1, axis=-1)[..., :k]
        picked = np.take_along_axis(key, part, axis=-1)
        kth = picked.max(axis=-1, keepdims=True)
        if np.any(np.count_nonzero(key == kth, axis=-1) != np.count_nonzero(picked == kth, axis=-1)):
            return None
        part.sort(axis=-1)  # by index, so the stable sort below keeps ties lower index first
        order = np.argsort(np.take_along_axis(key, part, axis=-1), axis=-1, kind="stable")
        return np.take_along_axis(part, order, axis=-1)


@register("TopK", since=1)
class TopK1(TopKBase):
    attributes = {"axis": -1, "k": None}

    def decode(self):
        if self.k is None:
            self.fail("attribute 'k' is required")
        self.k_attr = int(self.k)

    def k_of(self, k_info):
        return self.k_attr


@register("TopK", since=10)
class TopK10(TopKBase):
    def k_of(self, k_info):
        ks = int_list(self.node, k_info, "K")
        if len(ks) != 1:
            self.fail(f"K must hold one value, got {ks}")
        return ks[0]


@register("TopK", since=11)
class TopK11(TopK10):
    attributes = {"axis": -1, "largest": 1, "sorted": 1}
    # sorted=0 leaves the order to the runtime: the sorted order is one of them.


# NonZero and Unique: shapes from values

def nonzero(x):
    # A scalar counts as one element, as onnxruntime has it.
    return np.array(np.nonzero(x.reshape(-1) if x.ndim == 0 else x), dtype=INT64).reshape(
        max(x.ndim, 1), -1)


@register("NonZero", since=9)
class NonZero(Kernel):
    def infer(self, x):
        if x.value is None:
            self.needs_value("X")
        value = np.asarray(x.value)
        # A rank-r input makes r int64 indices per nonzero element: counted before they are made.
        size_limit.tensor_bytes((max(value.ndim, 1), np.count_nonzero(value)), INT64,
                                f"output {self.node.outputs[0]!r}")
        return [TensorInfo.of(nonzero(value))]

    def run(self, x, outs, scratch):
        return nonzero(x)


@register("Unique", since=11)
class Unique(Kernel):
    attributes = {"axis": None, "sorted": 1}

    def infer(self, x):
        if x.value is None:
            self.needs_value("X")
        value = np.asarray(x.value)
        # An int64 index per element (or slice along the axis): counted before it is made.
        axis = None if self.axis is None else normalize_axis(self.node, self.axis, value.ndim)
        size_limit.tensor_bytes((value.size if axis is None else value.shape[axis],), INT64, "the indices")
        return [TensorInfo.of(v) for v in self.unique(value)]

    def unique(self, x):
        axis = None if self.axis is None else normalize_axis(self.node, self.axis, x.ndim)
        values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                                   return_counts=True, axis=axis)
        inverse = inverse.reshape(-1)
        if not self.sorted:
            # Order of first occurrence: renumber the sorted uniques by where they first appear.
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            values = np.take(values, order, axis=0 if axis is None else axis)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        return (values, first.astype(INT64), inverse.astype(INT64), counts.astype(INT64))

    def run(self, x, outs, scratch):
        return self.unique(x)


# CumSum

@register("CumSum", since=11)
class CumSum(Kernel):
    attributes = {"exclusive": 0, "reverse": 0}

    def infer(self, x, axis):
        rank = len(x.shape)
        if axis.dtype.kind not in "iu" or axis.size != 1:
            self.fail(f"axis must be one integer, got {axis.dtype} of shape {list(axis.shape)}")
        # The axis does not decide a shape: when it is only known per run, run reads it.
        axis_n = None if axis.value is None else self.normalize(axis.value, rank)
        if rank == 0:
            self.fail("input must have rank >= 1")
        return Inferred([TensorInfo(x.shape, x.dtype)], axis_n=axis_n)

    def normalize(self, axis, rank):
        return normalize_axis(self.node, int(np.asarray(axis).reshape(-1)[0]), rank)

    accumulate = staticmethod(np.cumsum)
    identity = 0  # the first element of an exclusive scan

    def run(self, x, axis, outs, scratch):
        out = outs[0]
        n = self.normalize(axis, x.ndim) if self.axis_n is None else self.axis_n
        if self.reverse:
            flip = (slice(None),) * n + (slice(None, None, -1),)
            x, out = x[flip], out[flip]
        if not self.exclusive:
            self.accumulate(x, axis=n, dtype=out.dtype, out=out)
            return None
        head = (slice(None),) * n
        out[head + (slice(0, 1),)] = self.identity
        self.accumulate(x[head + (slice(0, -1),)], axis=n, dtype=out.dtype,
                        out=out[head + (slice(1, None),)])
        return None


@register("CumSum", since=14)
class CumSum14(CumSum):
    pass  # adds bfloat16 and float16 to the types


# Einsum

@register("Einsum", since=12)
class Einsum(Kernel):
    attributes = {"equation": ""}

    def decode(self):
        equation = self.equation.decode() if isinstance(self.equation, bytes) else self.equation
        self.equation = equation.replace(" ", "")
        if "->" in self.equation:
            self.lhs, self.rhs = self.equation.split("->", 1)
        else:
            self.lhs, self.rhs = self.equation, None
        self.terms = self.lhs.split(",")
        for term in self.terms + ([self.rhs] if self.rhs is not None else []):
            letters = term.replace("...", "", 1)
            if not all(c.isalpha() for c in letters):
                self.fail(f"equation {equation!r}: term {term!r} is not letters and at most one '...'")

    def infer(self, *inputs):
        if len(inputs) != len(self.terms):
            self.fail(f"equation {self.equation!r} has {len(self.terms)} operands, "
                      f"the node {len(inputs)} inputs")
        dtype = inputs[0].dtype
        if any(i.dtype != dtype for i in inputs):
            self.fail(f"inputs have different types {[str(i.dtype) for i in inputs]}")
        sizes = {}
        counts = {}
        ellipses = []
        for term, info in zip(self.terms, inputs):
            shape = tuple(info.shape)
            before, dots, after = term.partition("...")
            if dots:
                n_ellipsis = len(shape) - len(before) - len(after)
                if n_ellipsis < 0:
                    self.fail(f"term {term!r} does not fit shape {list(shape)}")
                ellipses.append(shape[len(before):len(before) + n_ellipsis])
                labelled = shape[:len(before)] + shape[len(shape) - len(after):]
            else:
                if len(term) != len(shape):
                    self.fail(f"term {term!r} does not fit shape {list(shape)}")
                labelled = shape
            for letter, size in zip(before + after, labelled):
                counts[letter] = counts.get(letter, 0) + 1
                if sizes.get(letter, size) != size:
                    self.fail(f"label {letter!r} is {sizes[letter]} in one place and {size} in another")
                sizes[letter] = size
        try:
            ellipsis = tuple(int(d) for d in np.broadcast_shapes(*ellipses)) if ellipses else ()
        except ValueError:
            self.fail(f"the '...' dimensions {[list(e) for e in ellipses]} do not broadcast")
        rhs = self.rhs
        if rhs is None:
            # Implicit output: the ellipsis, then the labels seen once, in alphabetical order.
            rhs = ("..." if ellipses else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
        before, dots, after = rhs.partition("...")
        if dots and not ellipses:
            ellipsis = ()
        for letter in before + after:
            if letter not in sizes:
                self.fail(f"output label {letter!r} appears in no input")
        shape = tuple(sizes[c] for c in before) + (ellipsis if dots else ()) + tuple(sizes[c] for c in after)
        return [TensorInfo(sane_shape(self.node, shape, dtype), dtype)]

    def prepare(self, *inputs):
        # numpy's einsum has no loops for bfloat16 (ml_dtypes): those go through float32.
        self.compute = inputs[0].dtype if inputs[0].dtype.kind in "biufc" else np.dtype(np.float32)
        # The contraction order depends only on the shapes: choose it once, on zero-byte stand-ins.
        stand_ins = [np.broadcast_to(np.zeros((), self.compute), i.shape) for i in inputs]
        try:
            self.path = np.einsum_path(self.equation, *stand_ins, optimize="optimal")[0]
        except ValueError as e:
            self.fail(f"equation {self.equation!r}: {e}")
        return []

    def run(self, *inputs, outs, scratch):
        out = outs[0]
        if out.dtype == self.compute:
            np.einsum(self.equation, *inputs, optimize=self.path, out=out)
        else:
            result = np.einsum(self.equation, *(x.astype(self.compute) for x in inputs), optimize=self.path)
            np.copyto(out, result, casting="unsafe")


# OneHot

class OneHot9(Kernel):
    attributes = {"axis": -1}

    def infer(self, indices, depth, values):
        depth_value = known_value(self.node, depth, "depth")
        if depth_value.size != 1:
            self.fail(f"depth must hold one value, got shape {list(depth_value.shape)}")
        n = int(np.asarray(depth_value).reshape(-1)[0])
        if n < 1:
            self.fail(f"depth {n} must be positive")
        if values.size != 2:
            self.fail(f"values must hold [off, on], got shape {list(values.shape)}")
        rank = len(indices.shape) + 1
        axis_n = normalize_axis(self.node, self.axis, rank)
        shape = indices.shape[:axis_n] + (n,) + indices.shape[axis_n:]
        return Inferred([TensorInfo(sane_shape(self.node, shape, values.dtype), values.dtype)], depth=n,
                        axis_n=axis_n)

    def run(self, indices, depth, values, outs, scratch):
        out = outs[0]
        values = np.asarray(values).reshape(-1)
        out.fill(values[0])
        index = np.asarray(indices)
        if index.dtype.kind == "f":
            index = np.trunc(index)
        index = index.astype(np.int64)
        # Negative indices count from the end; indices outside [-depth, depth) leave the row off.
        index = np.where(index < 0, index + self.depth, index)
        valid = np.nonzero((index >= 0) & (index < self.depth))
        hot = np.moveaxis(out, self.axis_n, -1)
        hot[valid + (index[valid],)] = values[1]


register("OneHot", since=9)(OneHot9)
register("OneHot", since=11)(type("OneHot11", (OneHot9,), {}))


# ReverseSequence

@register("ReverseSequence", since=10)
class ReverseSequence(Kernel):
    attributes = {"batch_axis": 1, "time_axis": 0}

    def infer(self, x, sequence_lens):
        if len(x.shape) < 2:
            self.fail(f"input must have rank >= 2, got shape {list(x.shape)}")
        axes = sorted((self.batch_axis, self.time_axis))
        if axes != [0, 1]:
            self.fail(f"batch_axis {self.batch_axis} and time_axis {self.time_axis} must be 0 and 1")
        if tuple(sequence_lens.shape) != (x.shape[self.batch_axis],):
            self.fail(f"sequence_lens has shape {list(sequence_lens.shape)}; expected "
                      f"[{x.shape[self.batch_axis]}]")
        return [TensorInfo(x.shape, x.dtype)]

    def run(self, x, sequence_lens, outs, scratch):
        out = outs[0]
        # Batch-major views: row b is x[b] or x[:, b], its time axis first.
        rows_in = x if self.batch_axis == 0 else np.swapaxes(x, 0, 1)
        rows_out = out if self.batch_axis == 0 else np.swapaxes(out, 0, 1)
        time = rows_in.shape[1]
        np.copyto(rows_out, rows_in)
        for b, n in enumerate(np.asarray(sequence_lens).reshape(-1)):
            n = min(max(int(n), 0), time)
            if n > 1:
                rows_out[b, :n] = rows_in[b, n - 1::-1]
        return None
