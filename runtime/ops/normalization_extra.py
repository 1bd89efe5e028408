"""Less common normalizations: RMSNormalization, GroupNormalization, LpNormalization,
MeanVarianceNormalization and LRN.

Group normalization standardizes rows of an (N * groups, rest) view with the same
core as Layer and Instance normalization (`normalization._standardize`), in the
stash type. RMS normalization divides rows of an (outer, normalized size) view by
their root mean square. LRN sums squares over a window of channels with one
shifted add per window position (the window is a handful of channels), which
keeps float32 sums exact where a running cumulative sum would not be.
"""

import math

import numpy as np

from .normalization import STASH_TYPES, _flat, _Normalization, _standardize, divide_by_rms
from .registry import REQUIRED, Inferred, TensorInfo, register
from .shape import normalize_axes, normalize_axis


@register("RMSNormalization", since=23)
class RMSNormalization(_Normalization):
    """Y = X / sqrt(mean(X^2 over the axes from `axis` on) + epsilon) * Scale."""
    attributes = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def decode(self):
        if self.stash_type not in STASH_TYPES:
            self.fail(f"stash_type {self.stash_type} is not float, float16 or double")
        self.stash = np.dtype(STASH_TYPES[self.stash_type])

    def infer(self, x, scale):
        self.check_float(x)
        if scale is None:
            self.fail("input scale is required")
        axis = normalize_axis(self.node, self.axis, len(x.shape))
        normalized = tuple(x.shape[axis:])
        try:
            if np.broadcast_shapes(tuple(scale.shape), normalized) != normalized:
                raise ValueError
        except ValueError:
            self.fail(f"scale of shape {list(scale.shape)} does not broadcast to {list(normalized)}")
        return Inferred([TensorInfo(tuple(x.shape), x.dtype)], split=axis)

    def run(self, x, scale, *, outs, scratch=()):
        self.normalize(x, scale, outs[0])

    def normalize(self, x, scale, out):
        """Y into `out`; returns the inverse RMS of each row, (rows, 1)."""
        normalized = x.shape[self.split:]
        rows = x.reshape(-1, math.prod(normalized))
        y = out.reshape(rows.shape)
        work, inv_rms = rms_rows(rows, self.epsilon, np.result_type(x.dtype, self.stash), y)
        np.multiply(work, _flat(scale, normalized), out=work)
        if work is not y:
            np.copyto(y, work, casting="unsafe")
        return inv_rms


def rms_rows(rows, epsilon, dtype, out):
    """Each row of `rows` divided by its root mean square, in `dtype` (into `out` when it has that
    dtype); returns (normalized, inverse rms as (rows, 1))."""
    work = out if out is not None and out.dtype == dtype else np.empty(rows.shape, dtype)
    np.copyto(work, rows, casting="unsafe")
    return work, divide_by_rms(work, epsilon)


@register("GroupNormalization", since=18)
class GroupNormalization(_Normalization):
    """Standardize each group of C / num_groups channels of each image, then scale and shift.

    Opset 18 has one scale and bias per group; opset 21 one per channel, and `stash_type`.
    """
    attributes = {"epsilon": 1e-5, "num_groups": REQUIRED}
    per_channel = False

    def decode(self):
        self.stash = np.dtype(np.float32)

    def infer(self, x, scale, bias):
        self.check_float(x)
        if len(x.shape) < 2:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, ...)")
        c = x.shape[1]
        if self.num_groups < 1 or c % self.num_groups:
            self.fail(f"num_groups {self.num_groups} does not divide the {c} channels")
        expected = c if self.per_channel else self.num_groups
        for what, p in (("scale", scale), ("bias", bias)):
            if p is None or tuple(p.shape) != (expected,):
                self.fail(f"input {what} must have shape ({expected},)")
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, scale, bias, *, outs, scratch=()):
        n, c = x.shape[:2]
        g = self.num_groups
        rows = x.reshape(n * g, -1)
        y = outs[0].reshape(rows.shape)
        dtype = np.result_type(x.dtype, self.stash)
        work, _, _ = _standardize(rows, self.epsilon, dtype, out=y)
        if self.per_channel:
            planes = work.reshape(n, c, -1)
            scale, bias = scale.reshape(c, 1), bias.reshape(c, 1)
        else:
            planes = work.reshape(n, g, -1)
            scale, bias = scale.reshape(g, 1), bias.reshape(g, 1)
        np.multiply(planes, scale, out=planes)
        np.add(planes, bias, out=planes)
        if work is not y:
            np.copyto(y, work, casting="unsafe")


@register("GroupNormalization", since=21)
class GroupNormalization21(GroupNormalization):
    attributes = {**GroupNormalization.attributes, "stash_type": 1}
    per_channel = True

    def decode(self):
        if self.stash_type not in STASH_TYPES:
            self.fail(f"stash_type {self.stash_type} is not float, float16 or double")
        self.stash = np.dtype(STASH_TYPES[self.stash_type])


@register("LpNormalization", since=1)
class LpNormalization(_Normalization):
    """X divided by its L1 or L2 norm along `axis`; all-zero slices stay zero (22 only adds types)."""
    attributes = {"axis": -1, "p": 2}

    def decode(self):
        if self.p not in (1, 2):
            self.fail(f"p {self.p} is not 1 or 2")

    def infer(self, x):
        self.check_float(x)
        axis_n = normalize_axis(self.node, self.axis, len(x.shape))
        return Inferred([TensorInfo(tuple(x.shape), x.dtype)], axis_n=axis_n)

    def run(self, x, *, outs, scratch=()):
        axis = normalize_axis(self.node, self.axis, x.ndim)
        if self.p == 1:
            norm = np.sum(np.abs(x), axis=axis, keepdims=True)
        else:
            norm = np.sqrt(np.sum(np.square(x), axis=axis, keepdims=True))
        # A zero norm means an all-zero slice, which stays zero (not 0/0), as in onnxruntime.
        norm[norm == 0] = 1
        np.divide(x, norm, out=outs[0])


@register("MeanVarianceNormalization", since=9)
class MeanVarianceNormalization(_Normalization):
    """(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over `axes`, as the spec's function computes it."""
    attributes = {"axes": (0, 2, 3)}
    epsilon = 1e-9

    def infer(self, x):
        self.check_float(x)
        axes_n = tuple(normalize_axes(self.node, self.axes, len(x.shape)))
        return Inferred([TensorInfo(tuple(x.shape), x.dtype)], axes_n=axes_n)

    def run(self, x, *, outs, scratch=()):
        axes = tuple(normalize_axes(self.node, self.axes, x.ndim))
        y = outs[0]
        mean = np.mean(x, axis=axes, keepdims=True)
        mean_square = np.mean(np.square(x), axis=axes, keepdims=True)
        std = np.square(mean)
        np.subtract(mean_square, std, out=std)
        np.sqrt(std, out=std)
        std += self.epsilon
        np.subtract(x, mean, out=y)
        np.divide(y, std, out=y)


@register("LRN", since=1)
class LRN(_Normalization):
    """Y = X / (bias + alpha / size * sum of X^2 over a window of channels) ^ beta."""
    attributes = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": REQUIRED}

    def decode(self):
        if self.size < 1:
            self.fail(f"size {self.size} must be positive")
        # The window around channel c: [c - before, c + after].
        self.before = (self.size - 1) // 2
        self.after = self.size - 1 - self.before

    def infer(self, x):
        self.check_float(x)
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, D1, ...)")
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def prepare(self, x):
        return [(tuple(x.shape), x.dtype)]

    def run(self, x, *, outs, scratch=()):
        y = outs[0]
        squares = scratch[0] if scratch else np.empty_like(x)
        np.square(x, out=squares)
        c = x.shape[1]
        np.copyto(y, squares)
        for shift in range(-self.before, self.after + 1):
            if shift == 0 or abs(shift) >= c:
                continue
            if shift > 0:  # channel i gathers channel i + shift
                np.add(y[:, :c - shift], squares[:, shift:], out=y[:, :c - shift])
            else:
                np.add(y[:, -shift:], squares[:, :c + shift], out=y[:, -shift:])
        y *= self.alpha / self.size
        y += self.bias
        np.power(y, self.beta, out=y)
        np.divide(x, y, out=y)


@register("LRN", since=13)
class LRN13(LRN):
    pass  # adds bfloat16
