"""The BLAS GEMM called directly (ops/blas.py) against numpy's matmul on copies of the operands."""

import numpy as np
import pytest
from oracle import rng

from nnrun.ops import blas


@pytest.fixture(params=[np.float32, np.float64])
def gemm(request):
    found = blas.kernel(request.param)
    assert found is not None, "numpy's BLAS has no GEMM nnrun can call"
    return found


def test_shifted_views_summed_into_a_block(gemm):
    """b and b2 are views of one buffer, rows 45 apart and 40 long, b2 shifted 2 along (as two taps
    of a shifted convolution); c a block of a larger array: c = a @ b, then c += a2 @ b2, the rest
    of the larger array untouched."""
    dtype = gemm.dtype
    r = rng(3)
    flat = r.standard_normal(5 * 45 + 2).astype(dtype)
    b = np.lib.stride_tricks.as_strided(flat, (5, 40), (45 * dtype.itemsize, dtype.itemsize))
    b2 = np.lib.stride_tricks.as_strided(flat[2:], (5, 40), (45 * dtype.itemsize, dtype.itemsize))
    a, a2 = r.standard_normal((7, 5)).astype(dtype), r.standard_normal((7, 5)).astype(dtype)
    big = np.full((9, 50), 7.0, dtype)
    c = big[1:8, 4:44]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    gemm(a, b, c)
    np.testing.assert_allclose(c, a @ np.array(b), rtol=tol, atol=tol)
    gemm(a2, b2, c, accumulate=True)
    np.testing.assert_allclose(c, a @ np.array(b) + a2 @ np.array(b2), rtol=tol, atol=tol)
    outside = np.ones(big.shape, bool)
    outside[1:8, 4:44] = False
    assert np.all(big[outside] == 7.0)


def test_matrices_it_cannot_pass_by_pointer_are_refused(gemm):
    dtype = gemm.dtype
    a, b, c = np.ones((3, 4), dtype), np.ones((4, 5), dtype), np.zeros((3, 5), dtype)
    bad = [
        ("a", (np.ones((3, 8), dtype)[:, ::2], b, c)),          # rows not of unit stride
        ("b", (a, np.ones((4, 5), np.float16), c)),             # another dtype
        ("b", (a, b, np.zeros((3, 6), dtype))),                 # c 6 wide: b is not (4, 6)
        ("c", (a, b, np.zeros((2, 5), dtype))),                 # c 2 high: a is (3, 4)
    ]
    for name, (x, y, z) in bad:
        with pytest.raises(ValueError, match=f"gemm: {name} "):
            gemm(x, y, z)
    rows_overlap = np.lib.stride_tricks.as_strided(np.zeros(20, dtype), (4, 5), (dtype.itemsize, dtype.itemsize))
    with pytest.raises(ValueError, match="gemm: b "):  # rows that overlap: BLAS wants them apart
        gemm(a, rows_overlap, c)
    readonly = np.zeros((3, 5), dtype)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gemm(a, b, readonly)
    assert blas.kernel(np.float16) is None


def test_an_empty_sum_is_zero_or_nothing_added(gemm):
    c = np.full((2, 3), 5, gemm.dtype)
    gemm(np.ones((2, 0), gemm.dtype), np.ones((0, 3), gemm.dtype), c, accumulate=True)
    assert np.all(c == 5)
    gemm(np.ones((2, 0), gemm.dtype), np.ones((0, 3), gemm.dtype), c)
    np.testing.assert_array_equal(c, np.ones((2, 0)) @ np.ones((0, 3)))
