"""Softmax, LogSoftmax and Hardmax.

Before opset 13 the input is coerced to a matrix around `axis` (default 1): the
function runs over all the dimensions from `axis` on. From opset 13 it runs over
the one dimension `axis` (default -1). Both become a reduction over axis 1 of a
view of shape (outer, n) or (outer, n, inner), so one kernel serves both. The
results go into the output; the per-slice max and sum live in arena scratch of
the reduced size. The max is subtracted first, so exp never overflows.
"""

import math

import numpy as np

from ..errors import ModelError
from .registry import Inferred, Kernel, TensorInfo, register


class SoftmaxFamily(Kernel):
    attributes = {"axis": 1}
    coerce_2d = True  # opset < 13
    n_scratch = 1

    def infer(self, x):
        rank = len(x.shape)
        if not -rank <= self.axis < rank:
            raise ModelError(f"axis {self.axis} is out of range "
                             f"for rank {rank}")
        axis = self.axis % rank
        outer = math.prod(x.shape[:axis])
        if self.coerce_2d:
            view = (outer, math.prod(x.shape[axis:]))
        else:
            inner = math.prod(x.shape[axis + 1:])
            view = (outer, x.shape[axis]) + ((inner,) if inner != 1 else ())
        reduced = (outer, 1) + view[2:]
        return Inferred([TensorInfo(tuple(x.shape), x.dtype)], reduced=reduced, view=view)

    def prepare(self, x):
        # Sums along the last axis as a BLAS matrix-vector product with ones: several times
        # faster than numpy's reduction along short contiguous rows.
        self.ones = None
        if len(self.view) == 2 and x.dtype in (np.float32, np.float64):
            self.ones = np.ones(self.view[1], x.dtype)
        return [(self.reduced, x.dtype)] * self.n_scratch

    def run(self, x, *, outs, scratch):
        if outs[0].size == 0:
            return
        self.compute(x.reshape(self.view), outs[0].reshape(self.view), scratch)

    def sum(self, y, total):
        if self.ones is not None:
            np.dot(y, self.ones, out=total.reshape(-1))
        else:
            np.add.reduce(y, axis=1, keepdims=True, out=total)


class Softmax(SoftmaxFamily):
    def compute(self, x, y, scratch):
        (total,) = scratch
        np.maximum.reduce(x, axis=1, keepdims=True, out=total)
        np.subtract(x, total, out=y)
        np.exp(y, out=y)
        self.sum(y, total)
        np.divide(y, total, out=y)


class LogSoftmax(SoftmaxFamily):
    n_scratch = 2

    def compute(self, x, y, scratch):
        # x - (max + log(sum(exp(x - max)))): y holds exp(x - max) only until the sum is taken.
        peak, total = scratch
        np.maximum.reduce(x, axis=1, keepdims=True, out=peak)
        np.subtract(x, peak, out=y)
        np.exp(y, out=y)
        self.sum(y, total)
        np.log(total, out=total)
        np.add(total, peak, out=total)
        np.subtract(x, total, out=y)


class Hardmax(SoftmaxFamily):
    """1 at the first maximum of each slice, 0 elsewhere."""

    n_scratch = 0

    def compute(self, x, y, scratch):
        y.fill(0)
        np.put_along_axis(y, np.argmax(x, axis=1, keepdims=True), 1, axis=1)


for _family in (Softmax, LogSoftmax, Hardmax):
    _name = _family.__name__
    register(_name, since=1)(_family)
    register(_name, since=13)(type(_name, (_family,), {"attributes": {"axis": -1},
                                                        "coerce_2d": False}))
