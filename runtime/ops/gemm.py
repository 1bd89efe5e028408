"""Matrix products: Gemm and MatMul.

Weights are used as they lie in the mapping: a transposed operand is a
transposed view, which BLAS reads with its transpose flag. One exception: a
Gemm of one row by a constant B stored (N, K) (transB: a classifier's head at
batch one) of at least 1 MB packs B as (K, N), which BLAS's matrix-vector
product reads faster from beyond the caches (conv_core.ROW_PRODUCT_MIN). The
product goes straight into the output; alpha, beta * C and a fused activation
(`_activation`, see activation.py) are applied to it in place.
"""

import math

import numpy as np

from ..errors import ModelError
from . import blas, conv_core, parallel
from .activation import apply_activation
from .elementwise import broadcast_shape, check_same_dtype
from .registry import Inferred, Kernel, TensorInfo, register


@register("Gemm", since=7)
class Gemm(Kernel):
    """Y = alpha * A' @ B' + beta * C; C broadcasts to Y one way, optional from opset 11."""

    attributes = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}

    def decode(self):
        self.activation = self.node.attrs.get("_activation")

    def infer(self, a, b, c=None):
        check_same_dtype(self.node, a, b, c)
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise ModelError(f"A and B must be matrices, "
                             f"got shapes {a.shape} and {b.shape}")
        m, k = reversed(a.shape) if self.transA else a.shape
        kb, n = reversed(b.shape) if self.transB else b.shape
        if k != kb:
            raise ModelError(f"inner dimensions differ: A {a.shape} "
                             f"(transA={self.transA}) @ B {b.shape} (transB={self.transB})")
        if c is not None and broadcast_shape(self.node, c.shape, (m, n)) != (m, n):
            raise ModelError(f"C of shape {c.shape} does not broadcast "
                             f"to the output's shape {(m, n)}")
        return [TensorInfo((m, n), a.dtype)]

    b_transposed = None  # a constant B stored (N, K) packed as (K, N), for a product of one row

    def prepare(self, a, b, c=None):
        if (self.transB and not self.transA and a.shape[0] == 1 and b.value is not None and b.shape[0] > 1
                and a.dtype in (np.float32, np.float64)
                and conv_core.packs_row_product(math.prod(b.shape) * np.dtype(a.dtype).itemsize)):
            self.b_transposed = self.pack({1}, lambda: np.ascontiguousarray(np.asarray(b.value).T), "transposed")
        # How C reaches the output: added as it lies when beta is 1; otherwise scaled once here
        # when it is a constant (it is usually a bias of N values), else per run into scratch.
        self.bias = None
        self.scale_c = False
        if c is None or self.beta == 0:
            self.add_c = False
            return []
        self.add_c = True
        if self.beta == 1:
            return []
        if c.value is not None:
            self.bias = self.pack({2}, lambda: np.multiply(c.value, c.dtype.type(self.beta)))
            return []
        self.scale_c = True
        return [(tuple(c.shape), c.dtype)]

    def run(self, a, b, c=None, *, outs, scratch, stream=None):
        """`stream`, under a memory budget, reads B in blocks of its rows (budget.Blocks): each is
        entered before its product and left after, so only a block or two of B is in memory."""
        y = outs[0]
        if self.b_transposed is not None:  # packed: B is not an input of the run, nor streamed
            if parallel.team() > 1:  # in shares on numba's team (blas.Gemm._matrix_vector)
                blas.matmul(a, self.b_transposed, y)
            else:  # (numpy's, 5-10% faster than the library's ?gemv on one thread: 1280 x 1000 249 us / 275)
                np.matmul(a, self.b_transposed, out=y)
        elif stream is None:
            blas.matmul(a.T if self.transA else a, b.T if self.transB else b, y)
        else:
            product_in_blocks(stream, a.T if self.transA else a, b, y, self.transB)
        if self.alpha != 1:
            np.multiply(y, y.dtype.type(self.alpha), out=y)
        if self.add_c:
            if self.bias is not None:
                c = self.bias
            elif self.scale_c:
                c = np.multiply(c, y.dtype.type(self.beta), out=scratch[0])
            np.add(y, c, out=y)
        apply_activation(y, self.activation)




@register("MatMul", since=1)
class MatMul(Kernel):
    """numpy.matmul semantics: 1-D operands are promoted then squeezed, batch dims broadcast."""

    def decode(self):
        self.activation = self.node.attrs.get("_activation")

    def infer(self, a, b):
        check_same_dtype(self.node, a, b)
        if not a.shape or not b.shape:
            raise ModelError(f"operands must have rank >= 1, "
                             f"got shapes {a.shape} and {b.shape}")
        a_shape = (1,) + tuple(a.shape) if len(a.shape) == 1 else tuple(a.shape)
        b_shape = tuple(b.shape) + (1,) if len(b.shape) == 1 else tuple(b.shape)
        if a_shape[-1] != b_shape[-2]:
            raise ModelError(f"inner dimensions differ: "
                             f"{a.shape} @ {b.shape}")
        batch = broadcast_shape(self.node, a_shape[:-2], b_shape[:-2])
        shape = batch + (a_shape[-2],) * (len(a.shape) > 1) + (b_shape[-1],) * (len(b.shape) > 1)
        # A batch of rows against one matrix (every Linear layer of a transformer) is one
        # GEMM over the stacked rows, not one call per batch entry.
        stacked = None
        if len(a.shape) > 2 and len(b.shape) == 2:
            rows = math.prod(a.shape[:-1])
            stacked = ((rows, a.shape[-1]), (rows, b.shape[-1]))
        return Inferred([TensorInfo(shape, a.dtype)], stacked=stacked)

    def run(self, a, b, *, outs, scratch, stream=None):
        """`stream`, under a memory budget, reads a 2-D B in blocks of its rows (budget.Blocks),
        each adding a partial product."""
        y = outs[0]
        if self.stacked is not None:
            a_rows, y_rows = self.stacked
            a, y2 = a.reshape(a_rows), y.reshape(y_rows)
        else:
            y2 = y
        if stream is None:
            blas.matmul(a, b, y2)
        else:
            product_in_blocks(stream, a, b, y2)
        apply_activation(y, self.activation)


def product_in_blocks(stream, a, b, y, trans_b=False):
    """a @ B (or a @ B.T) with B's rows in blocks, entered before their product and left after:
    with trans_b, B is (N, K) and a block of rows makes a block of y's columns; without, B is
    (K, N) and a block of rows adds a partial product."""
    for k, (start, end) in enumerate(stream.rows):
        rows = stream.enter(k)  # b[start:end], read for this product
        if trans_b:
            blas.matmul(a, rows.T, y[:, start:end])
        elif k == 0:
            blas.matmul(a[:, start:end], rows, y)
        else:
            y += a[:, start:end] @ rows
        stream.leave(k)
