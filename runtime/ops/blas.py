"""The GEMM of the BLAS library numpy links, called directly, for the products numpy's matmul
cannot express: C += A @ B (matmul always overwrites C), the sum of several products in one
output (conv_core's "gemm-shifted" convolution: one per tap, each over a view of the same
padded image shifted by the tap's offset, views that overlap one another).

Only a library whose GEMM symbol says its integer width is used: numpy's wheels link OpenBLAS
built with 64-bit integers and names ending in `64_`. Anything else (Accelerate, MKL, a
distribution's OpenBLAS) gives `kernel(dtype) is None`, and callers keep their numpy path. The
library is one threadpoolctl finds, so threads.py sets its thread count to the session's.
"""

import ctypes

import numpy as np

ROW_MAJOR, NO_TRANS = 101, 111

# (symbol pattern, integer type) in the order tried; the pattern takes "s" or "d".
_SYMBOLS = (("scipy_cblas_{}gemm64_", ctypes.c_int64), ("cblas_{}gemm64_", ctypes.c_int64))
_SCALARS = {np.dtype(np.float32): ("s", ctypes.c_float), np.dtype(np.float64): ("d", ctypes.c_double)}

_kernels = None


class Gemm:
    """One library's ?gemm for one dtype: `gemm(a, b, c, accumulate)` sets c = a @ b, or adds a @ b
    to c; a (M, K), b (K, N), c (M, N), each with unit stride along its rows and any row stride
    at least its row length (checked: the library reads and writes through raw pointers)."""

    __slots__ = ("dtype", "_function")

    def __init__(self, dtype, function):
        self.dtype = dtype
        self._function = function

    def __call__(self, a, b, c, accumulate=False):
        m, k = a.shape
        n = c.shape[1]
        item = self.dtype.itemsize
        matrices = (("a", a, m, k), ("b", b, k, n), ("c", c, m, n))
        for name, matrix, rows, cols in matrices:
            if matrix.dtype != self.dtype or matrix.shape != (rows, cols):
                raise ValueError(f"gemm: {name} {matrix.shape} {matrix.dtype} is not a ({rows}, {cols}) {self.dtype} "
                                 f"matrix")
        if not c.flags.writeable:
            raise ValueError("gemm: c is read-only")
        if m == 0 or n == 0:
            return c
        if k == 0:  # an empty sum (the library would refuse a leading dimension of 0)
            if not accumulate:
                c[...] = 0
            return c
        for name, matrix, rows, cols in matrices:
            if matrix.strides[1] != item or matrix.strides[0] % item or matrix.strides[0] < cols * item:
                raise ValueError(f"gemm: {name} {matrix.shape} {matrix.dtype} strides {matrix.strides} "
                                 f"is not a matrix of unit-stride rows apart")
        self._function(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0,
                       a.ctypes.data, a.strides[0] // item, b.ctypes.data, b.strides[0] // item,
                       1.0 if accumulate else 0.0, c.ctypes.data, c.strides[0] // item)
        return c


def kernel(dtype):
    """The Gemm for `dtype` (float32 or float64), or None where there is no usable library."""
    global _kernels
    if _kernels is None:
        _kernels = _find()
    return _kernels.get(np.dtype(dtype))


def _find():
    # the libraries loaded now (threads.controller, looked up again)
    from ..threads import controller

    found = {}
    for library in controller(refresh=True).lib_controllers:
        if library.user_api != "blas":
            continue
        try:
            handle = ctypes.CDLL(library.filepath)
        except OSError:
            continue
        for dtype, (letter, scalar) in _SCALARS.items():
            for pattern, integer in _SYMBOLS:
                function = getattr(handle, pattern.format(letter), None)
                if function is None or dtype in found:
                    continue
                function.restype = None
                function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer, integer, scalar,
                                     ctypes.c_void_p, integer, ctypes.c_void_p, integer, scalar,
                                     ctypes.c_void_p, integer]
                found[dtype] = Gemm(dtype, function)
    return found
