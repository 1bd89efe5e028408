"""ONNX normalizations: BatchNormalization (training mode too), LayerNormalization, InstanceNormalization.

BatchNormalization with constant statistics is one multiply-add per element: the
per-channel factor and offset are computed once at PREPARE (the four parameter
inputs are then `packed`, so their mapped pages can be released). Layer and
instance normalization standardize rows of a (rows, reduced size) view in the
output buffer, in the stash type (float32 for half inputs).
"""

import functools
import math

import numpy as np

from . import parallel
from .registry import Inferred, Kernel, TensorInfo, register

# TensorProto element types allowed as LayerNormalization's stash_type.
STASH_TYPES = {1: np.float32, 10: np.float16, 11: np.float64}


class _Normalization(Kernel):
    def check_float(self, x):
        if x is None:
            self.fail("input X is required")
        if x.dtype.kind != "f":
            self.fail(f"input X has type {x.dtype}; expected a floating type")


def _standardize(rows, epsilon, dtype, out=None):
    """Each row of `rows` to zero mean and unit variance, computed in `dtype`.

    Writes into `out` when it has that dtype (else into a new array) and returns
    (standardized, mean, inverse standard deviation), the last two as (rows, 1).
    """
    work = out if out is not None and out.dtype == dtype else np.empty(rows.shape, dtype)
    if rows.dtype == dtype and dtype in _BLAS_TYPES and rows.shape[1]:
        # The row sums as a matrix-vector product with ones: BLAS's, several times faster than
        # numpy's reduction along rows (BERT's 128 x 256: 2.3 against 16 us).
        mean = np.dot(rows, _ones(rows.shape[1], dtype))[:, None]
        mean /= rows.shape[1]
    else:
        mean = np.mean(rows, axis=1, keepdims=True, dtype=dtype)
    np.subtract(rows, mean, out=work)
    return work, mean, divide_by_rms(work, epsilon)


_BLAS_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


@functools.lru_cache(maxsize=64)
def _ones(n, dtype):
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


def divide_by_rms(work, epsilon):
    """Each row of `work` divided, in place, by sqrt(mean of its squares + epsilon); returns the
    inverse of that root as (rows, 1). The sum of squares makes no squared temporary."""
    inv = np.einsum("ij,ij->i", work, work)[:, None]
    inv /= max(work.shape[1], 1)
    inv += epsilon
    np.sqrt(inv, out=inv)
    np.reciprocal(inv, out=inv)
    np.multiply(work, inv, out=work)
    return inv


def _scale_shift(y, x, factor, offset):
    np.multiply(x, factor, out=y)
    np.add(y, offset, out=y)


@register("BatchNormalization", since=1)
class BatchNormalization(_Normalization):
    """Inference mode: Y = (X - mean) / sqrt(var + epsilon) * scale + B.

    Before opset 9, `spatial=0` gives per-activation statistics of shape (C, D1, ...).
    With training_mode=1 (opset 14 on) the statistics are X's own, per channel (the mean and
    the population variance, in double), and the outputs running_mean and running_var blend
    them into the inputs': input * momentum + current * (1 - momentum). Nothing in it is random.
    The outputs of the older training modes (opset 7's and 9's without training_mode) are refused.
    """
    attributes = {"epsilon": 1e-5, "momentum": 0.9, "spatial": 1, "training_mode": 0}

    def decode(self):
        self.training = bool(self.training_mode) and self.opset >= 14
        if not self.training and sum(1 for name in self.node.outputs[1:] if name):
            self.fail("the running statistics outputs exist in training mode only (training_mode=1, opset 14 on)")
        if self.opset >= 9:
            self.spatial = 1

    def infer(self, x, scale, b, mean, var):
        self.check_float(x)
        if len(x.shape) < 2:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, ...)")
        expected = (x.shape[1],) if self.spatial else tuple(x.shape[1:])
        for what, p in (("scale", scale), ("B", b), ("input_mean", mean), ("input_var", var)):
            if p is None:
                self.fail(f"input {what} is required")
            if tuple(p.shape) != expected or p.dtype.kind != "f":
                self.fail(f"{what} has shape {list(p.shape)} {p.dtype}; expected {list(expected)} floating")
        shape = expected + (1,) * (len(x.shape) - 1 - len(expected))
        outputs = [TensorInfo(tuple(x.shape), x.dtype)]
        if self.training:
            outputs += [TensorInfo(expected, mean.dtype), TensorInfo(expected, var.dtype)]
        return Inferred(outputs, shape=shape)

    def coefficients(self, scale, b, mean, var, dtype):
        """Y = X * factor + offset, per channel, computed in double once."""
        factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + self.epsilon)
        offset = b.astype(np.float64) - mean.astype(np.float64) * factor
        return factor.astype(dtype).reshape(self.shape), offset.astype(dtype).reshape(self.shape)

    def prepare(self, x, scale, b, mean, var):
        params = (scale, b, mean, var)
        if not self.training and all(p.value is not None for p in params):
            self.fixed = self.pack({1, 2, 3, 4}, lambda: self.coefficients(*(p.value for p in params), x.dtype))
        return []

    def run(self, x, scale=None, b=None, mean=None, var=None, *, outs, scratch=()):
        if self.training:
            return self.run_training(x, scale, b, mean, var, outs)
        fixed = getattr(self, "fixed", None)
        if fixed is not None:
            factor, offset = fixed
        else:
            factor, offset = self.coefficients(scale, b, mean, var, x.dtype)
        y = outs[0]
        parallel.elementwise(_scale_shift, y, x, factor, offset)  # in shares on the run's threads when large
        return y

    def run_training(self, x, scale, b, mean, var, outs):
        axes = (0,) + tuple(range(2, x.ndim))
        current_mean = x.mean(axis=axes, dtype=np.float64)
        current_var = x.var(axis=axes, dtype=np.float64)
        factor, offset = self.coefficients(scale, b, current_mean, current_var, np.float64)
        np.copyto(outs[0], x * factor + offset, casting="unsafe")
        for out, given, current in ((outs[1], mean, current_mean), (outs[2], var, current_var)):
            if out is not None:
                np.copyto(out, given.astype(np.float64) * self.momentum + current * (1 - self.momentum),
                          casting="unsafe")


@register("LayerNormalization", since=17)
class LayerNormalization(_Normalization):
    """Standardize over the axes from `axis` on; Mean and InvStdDev are optional outputs."""
    attributes = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def decode(self):
        if self.stash_type not in STASH_TYPES:
            self.fail(f"stash_type {self.stash_type} is not float, float16 or double")
        self.stash = np.dtype(STASH_TYPES[self.stash_type])

    def infer(self, x, scale, b=None):
        self.check_float(x)
        rank = len(x.shape)
        if not -rank <= self.axis < rank:
            self.fail(f"axis {self.axis} is out of range for rank {rank}")
        axis = self.axis % rank
        normalized = tuple(x.shape[axis:])
        for what, p in (("Scale", scale), ("B", b)):
            if p is None:
                if what == "Scale":
                    self.fail("input Scale is required")
                continue
            try:
                if np.broadcast_shapes(tuple(p.shape), normalized) != normalized:
                    raise ValueError
            except ValueError:
                self.fail(f"{what} of shape {list(p.shape)} does not broadcast to {list(normalized)}")
        stats = TensorInfo(tuple(x.shape[:axis]) + (1,) * (rank - axis), self.stash)
        outputs = [TensorInfo(tuple(x.shape), x.dtype), stats, stats][:max(1, len(self.node.outputs))]
        return Inferred(outputs, split=axis)

    def run(self, x, scale, b=None, *, outs, scratch=()):
        normalized = x.shape[self.split:]
        size = math.prod(normalized)
        rows = x.reshape(-1, size)
        y = outs[0].reshape(rows.shape)
        stats = [out.reshape(rows.shape[0], 1) if out is not None else None for out in outs[1:]]
        scale = _flat(scale, normalized)
        b = _flat(b, normalized) if b is not None else None
        dtype = np.result_type(x.dtype, self.stash)

        def rows_from(cut):  # the rows `cut` selects: a large input in ranges on the run's threads
            target = y[cut]
            work, mean, inv_std = _standardize(rows[cut], self.epsilon, dtype, out=target)
            np.multiply(work, scale, out=work)
            if b is not None:
                np.add(work, b, out=work)
            if work is not target:
                np.copyto(target, work, casting="unsafe")
            for out, stat in zip(stats, (mean, inv_std)):
                if out is not None:
                    np.copyto(out[cut], stat, casting="unsafe")
        parallel.over_leading(rows.shape, rows_from, kept={0})


def _flat(p, shape):
    """A parameter broadcast to `shape`, flattened (a view unless it really broadcasts)."""
    if tuple(p.shape) != tuple(shape):
        p = np.broadcast_to(p, shape)
    return p.reshape(-1)


@register("InstanceNormalization", since=1)
class InstanceNormalization(_Normalization):
    """Standardize each (n, c) plane over its spatial dims, then scale and shift per channel."""
    attributes = {"epsilon": 1e-5}

    def infer(self, x, scale, b):
        self.check_float(x)
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, D1, ...)")
        for what, p in (("scale", scale), ("B", b)):
            if p is None or tuple(p.shape) != (x.shape[1],):
                self.fail(f"input {what} must have shape ({x.shape[1]},)")
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, scale, b, *, outs, scratch=()):
        n, c = x.shape[:2]
        rows = x.reshape(n * c, -1)
        y = outs[0].reshape(rows.shape)
        dtype = np.result_type(x.dtype, np.float32)

        def rows_from(cut):  # the (image, channel) rows `cut` selects, in ranges when large
            target = y[cut]
            work, _, _ = _standardize(rows[cut], self.epsilon, dtype, out=target)
            channel = np.arange(n * c)[cut] % c
            np.multiply(work, scale[channel][:, None], out=work)
            np.add(work, b[channel][:, None], out=work)
            if work is not target:
                np.copyto(target, work, casting="unsafe")
        parallel.over_leading(rows.shape, rows_from, kept={0})
