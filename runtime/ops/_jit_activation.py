"""Activations compiled by numba (the `jit` extra): a convolution's bias and activation in one pass
over the output where numpy takes one for the bias and one to five for the activation (HardSwish:
scale, shift, clip, multiply, each a pass, in blocks); and erf and GELU, whose rational
approximation numpy runs as some twenty passes.

`activate` is the activations' formulas as activation.py computes them, operation for operation
in the output's type (no fused multiply-add: numba does not contract without fastmath), so a
compiled kernel's output is the numpy path's to the bit; the compiled depthwise convolution
applies it too. numba caches each kernel against its own file only: after editing `activate`,
clear the __pycache__ of _jit_depthwise as well.

Imported only through `jit.py` (see _jit_depthwise.py for why the leading underscore).
"""

import math

import numpy as np
from numba import njit

from .elementwise import ERF_P, ERF_Q
from .jit import CLAMP, HARD_SWISH, LEAKY

# The erf approximation's coefficients (elementwise.py), as float32 constants numba compiles in.
P0, P1, P2, P3, P4, P5, P6 = ERF_P
Q0, Q1, Q2, Q3, Q4 = ERF_Q
FOUR, HALF, ONE = np.float32(4), np.float32(0.5), np.float32(1)
SQRT_HALF = np.float32(1 / math.sqrt(2))


@njit(nogil=True, cache=True, inline="always")
def activate(v, mode, p0, p1, zero, one):
    """v through activation `mode` (jit.py) with parameters p0, p1; `zero` and `one` of v's type,
    so that no step widens to float64."""
    if mode == CLAMP:
        if v < p0:  # NaN stays NaN, as numpy's clip keeps it
            v = p0
        if v > p1:
            v = p1
        return v
    if mode == LEAKY:
        return v if v >= zero else v * p0
    f = v * p0 + p1
    if f < zero:
        f = zero
    if f > one:
        f = one
    return v * f if mode == HARD_SWISH else f


@njit(nogil=True, cache=True, boundscheck=False)
def bias_activation(out, bias, has_bias, per_row, mode, p0, p1, r0, r1, residual, has_residual):
    """Rows [r0, r1) of `out` (rows, columns; C order) += the bias, then the residual, then the
    activation, in place: (v + b) + r, each sum rounded to the type, as the Conv and the Add it
    fused would give.

    `per_row`: row r's bias is bias[r % len(bias)] (channels first: rows are (image, channel));
    else column k's is bias[k] (channels last: rows are pixels). `has_bias` False: no bias (then
    `bias` is any array of the type). `residual`: rows like out's, added when `has_residual`
    (else any array of out's type and layout)."""
    cols = out.shape[1]
    channels = bias.shape[0]
    zero = out.dtype.type(0)
    one = out.dtype.type(1)
    for r in range(r0, r1):
        row = out[r]
        if has_residual:
            _residual_row(row, residual[r], bias, has_bias, per_row, r % channels, mode, p0, p1, zero, one)
        elif not has_bias:
            for k in range(cols):
                row[k] = activate(row[k], mode, p0, p1, zero, one)
        elif per_row:
            b = bias[r % channels]
            for k in range(cols):
                row[k] = activate(row[k] + b, mode, p0, p1, zero, one)
        else:
            for k in range(cols):
                row[k] = activate(row[k] + bias[k], mode, p0, p1, zero, one)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _residual_row(row, res, bias, has_bias, per_row, channel, mode, p0, p1, zero, one):
    cols = row.shape[0]
    if not has_bias:
        for k in range(cols):
            row[k] = activate(row[k] + res[k], mode, p0, p1, zero, one)
    elif per_row:
        b = bias[channel]
        for k in range(cols):
            row[k] = activate((row[k] + b) + res[k], mode, p0, p1, zero, one)
    else:
        for k in range(cols):
            row[k] = activate((row[k] + bias[k]) + res[k], mode, p0, p1, zero, one)


# error_model="numpy": a float division by zero gives inf or NaN, as numpy's, instead of a check
# that raises ZeroDivisionError, which keeps LLVM from vectorising the loop (measured: 516 -> 45 us
# for GELU over 110K elements).
@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _erf(z):
    """erf of float32 z as elementwise.erf_float32 computes it, step for step."""
    if z < -FOUR:
        z = -FOUR
    if z > FOUR:
        z = FOUR
    x2 = z * z
    p = ((((((x2 * P0 + P1) * x2 + P2) * x2 + P3) * x2 + P4) * x2 + P5) * x2 + P6)
    q = ((((x2 * Q0 + Q1) * x2 + Q2) * x2 + Q3) * x2 + Q4)
    return z * p / q


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def erf(x, out, start, end):
    """out[start:end] = erf(x[start:end]); float32, flat."""
    xs, outs = x[start:end], out[start:end]
    for k in range(end - start):
        outs[k] = _erf(xs[k])


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def gelu(x, out, start, end):
    """out[start:end] = x/2 * (1 + erf(x / sqrt(2))) as elementwise.Gelu's erf form computes it."""
    xs, outs = x[start:end], out[start:end]
    for k in range(end - start):
        v = xs[k]
        outs[k] = (_erf(v * SQRT_HALF) + ONE) * v * HALF
