"""Compiled kernels in shares at once on numba's team of threads (the `jit` extra): `parallel=True`
functions, each a `prange` over shares of one kernel, on numba's threading layer (jit.py makes it
a thread-safe one, OpenMP's or TBB's, and checks it: jit.team_shares). A session with compiled
kernels on several threads runs on the team alone (ops/parallel.py: `team`), its products, depthwise
convolutions, pools, transposed convolutions' copies, GELU and erf, and BLAS products (matrix
by matrix or by vector) through these.

A module of its own, imported by jit.py only when a plan for several threads asks for the team:
loading a `parallel=True` function starts the threading layer's threads (and ~18 MB of RSS), which
a session on one thread has no use for. The caller sets the team's threads to the shares
(numba.set_num_threads, per calling thread: set inside, the functions would not be cached).

Imported only through `jit.py` (see _jit_depthwise.py for why the leading underscore). numba caches
these against this file only: after editing the kernels they call, clear this module's
__pycache__ as well.
"""

import numpy as np
from numba import njit, prange

from ._jit_activation import erf, gelu
from ._jit_depthwise import depthwise, depthwise_channels_last, max_pool
from ._jit_gemm import LANES, MR, NR, TILES_A_TAIL, blas_call, phase_rows, product, scatter_taps

_gemm32, _gemm64 = blas_call("gemm", 32), blas_call("gemm", 64)
_gemv32, _gemv64 = blas_call("gemv", 32), blas_call("gemv", 64)
_transpose32, _transpose64 = blas_call("omatcopy", 32), blas_call("omatcopy", 64)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_ONE = np.float32(1)


@njit("void(uintp, uintp, int64, boolean, int64, uintp, float32[:, :], uintp, boolean, int64, float32, float32, "
      "int64, int64, float32[:, ::1])", nogil=True, cache=True, boundscheck=False, parallel=True)
def product_on_threads(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, n, parts, tails):
    """_jit_gemm.product of all of out's rows and columns [0, n), in `parts` shares at once: columns
    in runs of whole vectors where there are enough for each share to take two tiles' widths, else
    the weight's tiles in groups of TILES_A_TAIL (few columns: a 7x7 image's 49). `tails`: (parts,
    TAIL_SCRATCH), one a share."""
    tiles = -(-out.shape[0] // MR)
    groups = -(-tiles // TILES_A_TAIL)
    by_columns = n >= parts * 2 * NR or groups < 2 * parts
    vectors = n // LANES
    for p in prange(parts):
        if by_columns:
            c0 = vectors * p // parts * LANES
            c1 = n if p == parts - 1 else vectors * (p + 1) // parts * LANES
            if c1 > c0:
                product(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, 0, tiles, c0, c1,
                        tails[p])
        else:
            t0, t1 = groups * p // parts * TILES_A_TAIL, groups * (p + 1) // parts * TILES_A_TAIL
            if t1 > t0:
                product(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, t0, t1, 0, n,
                        tails[p])


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def phase_rows_on_threads(w, planes, image, fills, plane_w, plane_size, rows_at, k, bias, out, mode, p0, p1, first,
                          start, end, tails, parts):
    """_jit_gemm.phase_rows of out's rows [start, end) in `parts` ranges at once, each share filling
    the plane rows its rows read (those two shares read, both: the same values), with its own tail
    scratch tails[p]."""
    rows = end - start
    for p in prange(parts):
        r0, r1 = start + rows * p // parts, start + rows * (p + 1) // parts
        if r1 > r0:
            phase_rows(w, planes, image, fills, plane_w, plane_size, rows_at, k, bias, out, mode, p0, p1, first, r0,
                       r1, tails[p])


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def depthwise_on_threads(x, w2, bias, has_bias, out, planes, fills, offsets, plane_w, plane_size, q_stride,
                         multiplier, mode, p0, p1, parts):
    """`depthwise` of all of out's channels in `parts` ranges at once, share p with its own phase
    planes planes[p] (planes: (parts, phases * plane_size))."""
    channels = out.shape[0]
    for p in prange(parts):
        o0, o1 = channels * p // parts, channels * (p + 1) // parts
        if o1 > o0:
            depthwise(x, w2, bias, has_bias, out, planes[p], fills, offsets, plane_w, plane_size, q_stride,
                      multiplier, mode, p0, p1, o0, o1)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def max_pool_on_threads(x, out, planes, acc, fills, offsets, plane_w, plane_size, q_stride, parts):
    """`max_pool` of all of out's channels in `parts` ranges at once, share p with its own phase
    planes planes[p] and sums acc[p]."""
    channels = out.shape[0]
    for p in prange(parts):
        c0, c1 = channels * p // parts, channels * (p + 1) // parts
        if c1 > c0:
            max_pool(x, out, planes[p], acc[p], fills, offsets, plane_w, plane_size, q_stride, c0, c1)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def channels_last_on_threads(x, w, bias, has_bias, out, padded, result, padded_h, padded_w, kernel_h, kernel_w,
                             stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left, mode, p0, p1, transpose,
                             wide, block, parts):
    """`depthwise_channels_last` of all of x's channels in `parts` ranges of whole `block`s of
    channels at once, float32, each share with scratch of its own: its channels' part of `padded`
    and of `result` (the kernel's scratch of all the channels, laid out one range after another).
    `transpose`: the address of a BLAS library's cblas_somatcopy (integers of 64 bits where `wide`),
    by which each share copies its channels channels last into its result's room and the result
    back (0: the kernel's own copies)."""
    channels, height, width = x.shape
    pixels_in, pixels_out = height * width, out.shape[1] * out.shape[2]
    pixels, plane = max(pixels_in, pixels_out), padded_h * padded_w
    staged = transpose != 0
    blocks = -(-channels // block)
    for p in prange(parts):
        c0 = blocks * p // parts * block
        c1 = min(channels, blocks * (p + 1) // parts * block)
        n = c1 - c0
        if n > 0:
            own_padded, own_result = padded[plane * c0:plane * c1], result[pixels * c0:pixels * c1]
            if staged:
                at_x, at_result = x.ctypes.data + 4 * c0 * pixels_in, own_result.ctypes.data
                if wide:
                    _transpose64(transpose, _ROW_MAJOR, _TRANS, n, pixels_in, _ONE, at_x, pixels_in, at_result, n)
                else:
                    _transpose32(transpose, _ROW_MAJOR, _TRANS, n, pixels_in, _ONE, at_x, pixels_in, at_result, n)
            depthwise_channels_last(x, w, bias, has_bias, out, own_padded, own_result, padded_h, padded_w, kernel_h,
                                    kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left, mode,
                                    p0, p1, c0, c1, staged)
            if staged:
                at_out = out.ctypes.data + 4 * c0 * pixels_out
                if wide:
                    _transpose64(transpose, _ROW_MAJOR, _TRANS, pixels_out, n, _ONE, at_result, n, at_out, pixels_out)
                else:
                    _transpose32(transpose, _ROW_MAJOR, _TRANS, pixels_out, n, _ONE, at_result, n, at_out, pixels_out)


@njit("void(uintp, boolean, int64, int64, int64, int64, int64, uintp, int64, uintp, int64, float32, uintp, int64, "
      "int64)", nogil=True, cache=True, parallel=True)
def gemm_on_threads(function, wide, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, parts):
    """C (M, N, rows ldc apart) = A @ B + beta * C by a BLAS library's cblas_sgemm at `function`
    (row-major; A (M, K) or, where trans_a is TRANS, stored (K, M); B likewise), in `parts` shares at
    once, each a single-threaded call: the larger of C's dimensions split, columns in runs of 16 (a
    cache line of floats) or rows. `wide`: the library's integers are 64-bit (numpy's), else 32
    (nnrun's own)."""
    by_columns = n >= m
    units = n // 16 if by_columns else m
    for p in prange(parts):
        u0, u1 = units * p // parts, units * (p + 1) // parts
        if by_columns:
            c0, c1 = u0 * 16, (n if p == parts - 1 else u1 * 16)
            at_b = b + 4 * (c0 if trans_b == _NO_TRANS else c0 * ldb)
            if c1 > c0:
                if wide:
                    _gemm64(function, _ROW_MAJOR, trans_a, trans_b, m, c1 - c0, k, _ONE, a, lda, at_b, ldb, beta,
                            c + 4 * c0, ldc)
                else:
                    _gemm32(function, _ROW_MAJOR, trans_a, trans_b, m, c1 - c0, k, _ONE, a, lda, at_b, ldb, beta,
                            c + 4 * c0, ldc)
        else:
            at_a = a + 4 * (u0 * lda if trans_a == _NO_TRANS else u0)
            if u1 > u0:
                if wide:
                    _gemm64(function, _ROW_MAJOR, trans_a, trans_b, u1 - u0, n, k, _ONE, at_a, lda, b, ldb, beta,
                            c + 4 * u0 * ldc, ldc)
                else:
                    _gemm32(function, _ROW_MAJOR, trans_a, trans_b, u1 - u0, n, k, _ONE, at_a, lda, b, ldb, beta,
                            c + 4 * u0 * ldc, ldc)


@njit("void(uintp, boolean, int64, int64, int64, uintp, int64, uintp, int64, float32, uintp, int64, int64)",
      nogil=True, cache=True, parallel=True)
def gemv_on_threads(function, wide, trans, rows, cols, a, lda, x, incx, beta, y, incy, parts):
    """y = op(A) x + beta * y by a BLAS library's cblas_sgemv at `function` (row-major; A stored
    (rows, cols), op(A) = A, or its transpose where trans is TRANS), in `parts` shares of y at once,
    each a single-threaded call: where A is not transposed, ranges of its rows (each share reads its
    own part of A); else of its columns. `wide`: the library's integers are 64-bit."""
    length = cols if trans == _TRANS else rows
    lines = -(-length // 16)
    for p in prange(parts):
        u0, u1 = lines * p // parts * 16, min(length, lines * (p + 1) // parts * 16)
        if u1 > u0:
            if trans == _TRANS:
                at_a, share_rows, share_cols = a + 4 * u0, rows, u1 - u0
            else:
                at_a, share_rows, share_cols = a + 4 * u0 * lda, u1 - u0, cols
            at_y = y + 4 * u0 * incy
            if wide:
                _gemv64(function, _ROW_MAJOR, trans, share_rows, share_cols, _ONE, at_a, lda, x, incx, beta, at_y,
                        incy)
            else:
                _gemv32(function, _ROW_MAJOR, trans, share_rows, share_cols, _ONE, at_a, lda, x, incx, beta, at_y,
                        incy)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True)
def scatter_taps_on_threads(cols, bias, has_bias, out, row0, parts):
    """_jit_gemm.scatter_taps of all of cols' channels in `parts` ranges at once."""
    channels = cols.shape[0]
    for p in prange(parts):
        c0, c1 = channels * p // parts, channels * (p + 1) // parts
        if c1 > c0:
            scatter_taps(cols, bias, has_bias, out, row0, c0, c1)


# Elements of an elementwise kernel's share: whole cache lines of float32.
_LINE = 16


@njit(nogil=True, cache=True, boundscheck=False, parallel=True, error_model="numpy")
def erf_on_threads(x, out, parts):
    """_jit_activation.erf of all of flat x into out, in `parts` ranges at once."""
    lines = -(-x.shape[0] // _LINE)
    for p in prange(parts):
        start, end = lines * p // parts * _LINE, min(x.shape[0], lines * (p + 1) // parts * _LINE)
        if end > start:
            erf(x, out, start, end)


@njit(nogil=True, cache=True, boundscheck=False, parallel=True, error_model="numpy")
def gelu_on_threads(x, out, parts):
    """_jit_activation.gelu of all of flat x into out, in `parts` ranges at once."""
    lines = -(-x.shape[0] // _LINE)
    for p in prange(parts):
        start, end = lines * p // parts * _LINE, min(x.shape[0], lines * (p + 1) // parts * _LINE)
        if end > start:
            gelu(x, out, start, end)
