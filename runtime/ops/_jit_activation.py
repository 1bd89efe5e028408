"""A convolution's bias and activation compiled by numba (the `jit` extra): one pass over the
output where numpy takes one for the bias and one to five for the activation (HardSwish: scale,
shift, clip, multiply, each a pass, in blocks).

`activate` is the activations' formulas as activation.py computes them, operation for operation
in the output's type (no fused multiply-add: numba does not contract without fastmath), so a
compiled kernel's output is the numpy path's to the bit; the compiled depthwise convolution
applies it too. numba caches each kernel against its own file only: after editing `activate`,
clear the __pycache__ of _jit_depthwise as well.

Imported only through `jit.py` (see _jit_depthwise.py for why the leading underscore).
"""

from numba import njit

from .jit import CLAMP, HARD_SWISH, LEAKY


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
def bias_activation(out, bias, has_bias, per_row, mode, p0, p1, r0, r1):
    """Rows [r0, r1) of `out` (rows, columns; C order) += the bias, then the activation, in place.

    `per_row`: row r's bias is bias[r % len(bias)] (channels first: rows are (image, channel));
    else column k's is bias[k] (channels last: rows are pixels). `has_bias` False: no bias (then
    `bias` is any array of the type)."""
    cols = out.shape[1]
    channels = bias.shape[0]
    zero = out.dtype.type(0)
    one = out.dtype.type(1)
    for r in range(r0, r1):
        row = out[r]
        if not has_bias:
            for k in range(cols):
                row[k] = activate(row[k], mode, p0, p1, zero, one)
        elif per_row:
            b = bias[r % channels]
            for k in range(cols):
                row[k] = activate(row[k] + b, mode, p0, p1, zero, one)
        else:
            for k in range(cols):
                row[k] = activate(row[k] + bias[k], mode, p0, p1, zero, one)
