"""Kernels compiled by numba (`pip install 'nnrun[jit]'`), for plans that ask for them: the one
place that decides whether they are used.

numpy and BLAS are nnrun's kernel language; numba serves the one kernel numpy runs far below the
machine's speed, depthwise convolution (many short passes per tap: see _jit_depthwise.py).

They are opt-in, per session (`SessionOptions.compiled_kernels = True`, `nnrun --jit`) or per
process (`NNRUN_JIT=1`), because numba costs what nnrun exists to save: loading it and the kernel
takes ~0.35 s and ~115 MB of RSS (~45 MB of it anonymous) once per process, more than a whole
ResNet-50 run holds. Plans that do not ask, or a process without numba, take the numpy paths,
which compute the same sums.

A kernel is compiled (or loaded from numba's on-disk cache) when the first plan that uses it is
made, at PREPARE, so a run never compiles. Asked for where numba is missing or fails to compile,
they warn once per process and the numpy paths are used.
"""

import contextlib
import contextvars
import os
import threading
import warnings

import numpy as np

# `mode` of the compiled depthwise kernel's fused activation: a clamp to [lo, hi] (ReLU, Clip;
# +-inf when unbounded), or HardSwish.
CLAMP = 0
HARD_SWISH = 1

_CHOICE = contextvars.ContextVar("nnrun_jit", default=None)
_lock = threading.Lock()
_kernels = {}  # dtype -> the compiled depthwise kernel, or None when it cannot be had
_module = None
_failed = None  # why numba cannot be used in this process, once found


@contextlib.contextmanager
def chosen(on):
    """Plans made inside use compiled kernels if `on` (None: as the environment says)."""
    token = _CHOICE.set(on)
    try:
        yield
    finally:
        _CHOICE.reset(token)


def wanted():
    """Whether plans made now ask for compiled kernels (not whether numba is there)."""
    choice = _CHOICE.get()
    if choice is None:
        return os.environ.get("NNRUN_JIT", "0").lower() in ("1", "true", "yes", "on")
    return bool(choice)


def depthwise_kernel(dtype):
    """The compiled depthwise kernel for `dtype` (float32 or float64), compiled now if need be;
    None when compiled kernels are off or unavailable."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64) or not wanted():
        return None
    with _lock:
        if dtype not in _kernels:
            _kernels[dtype] = _compile_depthwise(dtype)
        return _kernels[dtype]


def _compile_depthwise(dtype):
    global _module, _failed
    if _failed is not None:
        return None
    try:
        if _module is None:
            from . import _jit_depthwise
            _module = _jit_depthwise
        kernel = _module.depthwise
        # A 1x1 image through a 3x3 window: numba compiles (or loads) the kernel for this dtype now.
        x = np.ones((1, 1, 1), dtype)
        out = np.empty((1, 1, 1), dtype)
        fills = np.array([[1, 2, 1, 2, 0, 1, 0, 1]], np.int64)
        kernel(x, np.ones((9, 1), dtype), np.zeros(1, dtype), True, out, np.full(12, np.nan, dtype),
               np.empty(1, dtype), fills, np.arange(9, dtype=np.int64), 3, 12, 3, 1, CLAMP,
               dtype.type(-np.inf), dtype.type(np.inf), 0, 1)
        if out[0, 0, 0] != 1:
            raise RuntimeError(f"the compiled depthwise kernel's self-check gave {out[0, 0, 0]}, not 1")
        return kernel
    except ImportError as e:
        _failed = f"numba is not installed (pip install 'nnrun[jit]'): {e}"
    except Exception as e:  # noqa: BLE001 - a broken numba must not stop a model from running
        _failed = f"{type(e).__name__}: {e}"
    warnings.warn(f"nnrun: compiled kernels were asked for but are unavailable ({_failed}); using numpy's",
                  RuntimeWarning, stacklevel=3)
    return None


def unavailable_reason():
    """Why compiled kernels are not used in this process (None: they are, or none was asked for yet)."""
    return _failed
