"""Whether numba (the `jit` extra, for compiled kernels) is installed: it is in the test extra, so CI
runs both kinds of kernel; without it the compiled cases say so as skips."""

import pytest


def has_numba():
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


needs_numba = pytest.mark.skipif(not has_numba(), reason="numba (the jit extra) is not installed")
