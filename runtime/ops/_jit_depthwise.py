"""Depthwise convolution compiled by numba (the `jit` extra): two kernels, by the image's size.

`depthwise`, channels first (most layers): the phase planes of `conv_core.PhaseGrid`, summed over
the taps in one loop per group of taps instead of two numpy passes per tap. numpy runs a
depthwise tap as a multiply into scratch and an add into the accumulator, each a pass over the
output at memory speed (3-8 GFLOP/s here). This kernel fills one channel's phase planes, then adds
up to nine shifted rows per pass with the channel's weights held in registers (LLVM vectorises the
loop over the flat plane), and writes the bias and the activation (_jit_activation.activate) with
the copy into the output. A 3x3 window's output rows are written straight from the planes
(_jit_vector.nine_taps_row: the CPU's widest vectors and fused multiply-adds, which numba's loop
gets neither of on x86 with AVX-512; 7-21% faster at stride 1 on a Xeon, even at stride 2).

`depthwise_channels_last`, small images of many channels (MobileNet's 14x14 and 7x7 layers): there
a channel's rows are too short to vectorise (a loop of 14 runs scalar), so the image is copied
channels last and each output pixel sums its taps vectorised along the channels; 3x3 windows by
_jit_vector.nine_taps_pixels (the CPU's widest vectors, fused multiply-adds, a vector's nine
weights held across the row: 3-46% faster than numba's loop on a Xeon with AVX-512).

`depthwise_nhwc`, an image that is channels last already (TFLite's layout): the same sums, no
copies but the padding's (`pad_channels_last`).

`max_pool`, channels first: the phase planes of `depthwise`, padded with -inf, and the largest of
each window's taps instead of their weighted sum (an average pool is `depthwise` with weights of
one, divided after).

`few_channels`, a convolution of one group with few taps over all its input channels (a network's
3x3 stem on RGB): every input channel's phase planes filled once, then each output channel the
weighted sum of all their taps, as `depthwise` sums one channel's (two output channels a pass,
each plane value loaded once for both); im2col's GEMM is only that deep
(27), where BLAS runs at a fraction of its speed.

All release the GIL, so the kernels' pool runs channel ranges of one convolution on several
threads; _jit_team.py runs them at once on numba's team of threads instead, where a session runs
on it (parallel.team).

Imported only through `jit.py`, which checks that numba is there and compiles this once per
process (`cache=True`: later processes load the machine code from numba's cache); its leading
underscore keeps `ops.load_all`, which imports every op family, from importing it.
"""

import numpy as np
from numba import njit

from ._jit_activation import activate
from ._jit_vector import nine_taps_pixels, nine_taps_row, nine_taps_two_rows, taps_row


@njit(nogil=True, cache=True, boundscheck=False)
def depthwise(x, w2, bias, has_bias, out, planes, fills, offsets, plane_w, plane_size, q_stride,
              multiplier, mode, p0, p1, o0, o1):
    """out[o0:o1] of one image. x (C, H, W); w2 (taps, C*M); out (C*M, OH, OW); `planes`: scratch of
    phases * plane_size elements.

    `fills` (phases, 8), per phase plane (rows `plane_w` wide, `plane_size` long): the plane rows
    and columns [dh0, dh1) x [dw0, dw1) it takes from input rows sh0 + r*shs and columns
    sw0 + m*sws (the rest stays zero: the padding); `offsets` (taps,): each tap's flat start in
    the planes. Output row r sums the taps' rows from r*q_stride (_jit_vector.taps_row).
    `mode`, `p0`, `p1`: the activation (jit.activation_mode).
    """
    for k in range(planes.shape[0]):  # the padding; scratch is shared with other steps
        planes[k] = 0
    zero = x.dtype.type(0)
    nine = offsets.shape[0] == 9
    # A 3x3 window at stride 1: the row below's taps 0-5 read what this row's taps 3-8 do, and two
    # rows are summed at once (_jit_vector.nine_taps_two_rows: 1.17-1.35x faster on a Xeon).
    pairs = nine
    for t in range(6 if nine else 0):
        pairs = pairs and offsets[t + 3] == offsets[t] + q_stride
    rows = out.shape[1]
    filled = -1
    for oc in range(o0, o1):
        c = oc // multiplier
        if c != filled:
            _fill(planes, x[c], fills, plane_w, plane_size)
            filled = c
        b = bias[oc] if has_bias else zero
        r = 0  # each output row straight from the planes (_jit_vector's taps_row, nine_taps_row)
        if not nine:
            for r in range(rows):
                taps_row(planes, offsets, w2[:, oc], out[oc, r], r * q_stride, b, mode, p0, p1)
            continue
        while pairs and r + 2 <= rows:
            nine_taps_two_rows(planes, offsets, w2[:, oc], out[oc, r], out[oc, r + 1], r * q_stride, q_stride, b,
                               mode, p0, p1)
            r += 2
        while r < rows:
            nine_taps_row(planes, offsets, w2[:, oc], out[oc, r], r * q_stride, b, mode, p0, p1)
            r += 1


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _rows_out(out_c, acc, q_stride, b, mode, p0, p1, zero, one):
    """One output channel (OH, OW) from the sums, row r at acc[r * q_stride:], with the bias b and
    the activation."""
    rows, width = out_c.shape
    for r in range(rows):
        dst = out_c[r]
        src = acc[r * q_stride:r * q_stride + width]
        for m in range(width):
            dst[m] = activate(src[m] + b, mode, p0, p1, zero, one)


@njit(nogil=True, cache=True, boundscheck=False)
def few_channels(x, w2, bias, has_bias, out, planes, acc, fills, offsets, plane_w, plane_size, q_stride,
                 phases_size, fill, mode, p0, p1, o0, o1):
    """out[o0:o1] of one image. x (C, H, W); w2 (C * taps, Cout), row c * taps + t channel c's tap t;
    out (Cout, OH, OW); `planes`: scratch of C * phases_size, channel c's phase planes from
    c * phases_size, made first when `fill` (a call over no output channel only makes them; threads
    summing ranges of output channels then share them, each with its own `acc`, room for two
    output channels' sums: with 3x3 windows two are summed a pass); `offsets` (C * taps,): each
    channel's taps' flat starts in them; the rest as `depthwise`'s."""
    if fill:
        for k in range(planes.shape[0]):  # the padding; scratch is shared with other steps
            planes[k] = 0
        for c in range(x.shape[0]):
            _fill(planes[c * phases_size:(c + 1) * phases_size], x[c], fills, plane_w, plane_size)
    zero = x.dtype.type(0)
    one = x.dtype.type(1)
    nines = offsets.shape[0] % 9 == 0
    half = acc.shape[0] // 2
    first, second = acc[:half], acc[half:2 * half]
    oc = o0
    while nines and oc + 2 <= o1:  # two output channels a pass: each plane value loaded once for both
        _sum_nines_two(planes, w2[:, oc], w2[:, oc + 1], offsets, first, second)
        _rows_out(out[oc], first, q_stride, bias[oc] if has_bias else zero, mode, p0, p1, zero, one)
        _rows_out(out[oc + 1], second, q_stride, bias[oc + 1] if has_bias else zero, mode, p0, p1, zero, one)
        oc += 2
    for oc in range(oc, o1):
        if nines:
            _sum_nines(planes, w2[:, oc], offsets, first)
        else:
            _sum_taps(planes, w2[:, oc], offsets, first)
        _rows_out(out[oc], first, q_stride, bias[oc] if has_bias else zero, mode, p0, p1, zero, one)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _nine_from(planes, offsets, t):
    """The planes from taps t .. t + 8's flat starts (slices from 0, which LLVM vectorises over)."""
    return (planes[offsets[t]:], planes[offsets[t + 1]:], planes[offsets[t + 2]:], planes[offsets[t + 3]:],
            planes[offsets[t + 4]:], planes[offsets[t + 5]:], planes[offsets[t + 6]:], planes[offsets[t + 7]:],
            planes[offsets[t + 8]:])


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _nine_weights(w, t):
    """Taps t .. t + 8's weights."""
    return w[t], w[t + 1], w[t + 2], w[t + 3], w[t + 4], w[t + 5], w[t + 6], w[t + 7], w[t + 8]


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _sum_nines_two(planes, wa, wb, offsets, acc_a, acc_b):
    """_sum_nines for two output channels (weights wa, wb) at once: each group's nine plane values
    are loaded once for both sums; each sum is added in _sum_nines' order (the same to the bit)."""
    n = acc_a.shape[0]
    for t in range(0, offsets.shape[0], 9):
        p0, p1, p2, p3, p4, p5, p6, p7, p8 = _nine_from(planes, offsets, t)
        a0, a1, a2, a3, a4, a5, a6, a7, a8 = _nine_weights(wa, t)
        b0, b1, b2, b3, b4, b5, b6, b7, b8 = _nine_weights(wb, t)
        if t == 0:
            for k in range(n):
                x0, x1, x2, x3, x4, x5, x6, x7, x8 = p0[k], p1[k], p2[k], p3[k], p4[k], p5[k], p6[k], p7[k], p8[k]
                acc_a[k] = (x0 * a0 + x1 * a1 + x2 * a2 + x3 * a3 + x4 * a4 + x5 * a5 + x6 * a6 + x7 * a7
                            + x8 * a8)
                acc_b[k] = (x0 * b0 + x1 * b1 + x2 * b2 + x3 * b3 + x4 * b4 + x5 * b5 + x6 * b6 + x7 * b7
                            + x8 * b8)
        else:
            for k in range(n):
                x0, x1, x2, x3, x4, x5, x6, x7, x8 = p0[k], p1[k], p2[k], p3[k], p4[k], p5[k], p6[k], p7[k], p8[k]
                acc_a[k] += (x0 * a0 + x1 * a1 + x2 * a2 + x3 * a3 + x4 * a4 + x5 * a5 + x6 * a6 + x7 * a7
                             + x8 * a8)
                acc_b[k] += (x0 * b0 + x1 * b1 + x2 * b2 + x3 * b3 + x4 * b4 + x5 * b5 + x6 * b6 + x7 * b7
                             + x8 * b8)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _sum_nines(planes, w, offsets, acc):
    """_sum_taps of a multiple of nine taps (3x3 windows over several channels): nine a pass."""
    n = acc.shape[0]
    for t in range(0, offsets.shape[0], 9):
        p0, p1, p2, p3, p4, p5, p6, p7, p8 = _nine_from(planes, offsets, t)
        w0, w1, w2, w3, w4, w5, w6, w7, w8 = _nine_weights(w, t)
        if t == 0:
            for k in range(n):
                acc[k] = (p0[k] * w0 + p1[k] * w1 + p2[k] * w2 + p3[k] * w3 + p4[k] * w4 + p5[k] * w5
                          + p6[k] * w6 + p7[k] * w7 + p8[k] * w8)
        else:
            for k in range(n):
                acc[k] += (p0[k] * w0 + p1[k] * w1 + p2[k] * w2 + p3[k] * w3 + p4[k] * w4 + p5[k] * w5
                           + p6[k] * w6 + p7[k] * w7 + p8[k] * w8)


@njit(nogil=True, cache=True, boundscheck=False)
def max_pool(x, out, planes, acc, fills, offsets, plane_w, plane_size, q_stride, o0, o1):
    """out[o0:o1] of one image, each output the largest of its window's taps (NaN if any is NaN, as
    numpy's maximum); x (C, H, W), out (C, OH, OW), the rest as `depthwise`'s. The planes' padding
    is -inf: a window that reads only padding gives -inf."""
    rows, width = out.shape[1], out.shape[2]
    low = x.dtype.type(-np.inf)
    for k in range(planes.shape[0]):  # the padding; scratch is shared with other steps
        planes[k] = low
    n = acc.shape[0]
    taps = offsets.shape[0]
    for c in range(o0, o1):
        _fill(planes, x[c], fills, plane_w, plane_size)
        t = 1
        if taps >= 3:  # the first three taps in one pass, then three more a pass
            p0, p1, p2 = planes[offsets[0]:], planes[offsets[1]:], planes[offsets[2]:]
            for k in range(n):
                acc[k] = _larger(_larger(p0[k], p1[k]), p2[k])
            t = 3
        else:
            p0 = planes[offsets[0]:]
            for k in range(n):
                acc[k] = p0[k]
        while t + 3 <= taps:
            p0, p1, p2 = planes[offsets[t]:], planes[offsets[t + 1]:], planes[offsets[t + 2]:]
            for k in range(n):
                acc[k] = _larger(_larger(_larger(acc[k], p0[k]), p1[k]), p2[k])
            t += 3
        while t < taps:
            p0 = planes[offsets[t]:]
            for k in range(n):
                acc[k] = _larger(acc[k], p0[k])
            t += 1
        for r in range(rows):
            dst = out[c, r]
            src = acc[r * q_stride:r * q_stride + width]
            for m in range(width):
                dst[m] = src[m]


@njit(nogil=True, cache=True, inline="always")
def _larger(a, b):
    """The larger of a and b, NaN if either is (numpy's maximum)."""
    return b if (b > a or b != b) else a


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _fill(planes, image, fills, plane_w, plane_size):
    """One channel's phase planes from its image (H, W): _fill_rows of all the planes' rows."""
    _fill_rows(planes, image, fills, plane_w, plane_size, 0, plane_size // plane_w)


@njit(nogil=True, cache=True, boundscheck=False)
def fill_rows_zeroed(planes, image, fills, plane_w, plane_size, lo, hi):
    """Rows [lo, hi) of one channel's phase planes: the image's parts (_fill_rows) and the padding
    around them zero, each cell written once with its value, so that shares of other rows on other
    threads may write the rows both read (the same values) at once."""
    zero = planes.dtype.type(0)
    for p in range(fills.shape[0]):
        dh0, dh1, dw0, dw1 = fills[p, 0], fills[p, 1], fills[p, 2], fills[p, 3]
        for r in range(lo, hi):
            row = planes[p * plane_size + r * plane_w:p * plane_size + (r + 1) * plane_w]
            if dh0 <= r < dh1:
                for m in range(dw0):
                    row[m] = zero
                for m in range(dw1, plane_w):
                    row[m] = zero
            else:
                for m in range(plane_w):
                    row[m] = zero
    _fill_rows(planes, image, fills, plane_w, plane_size, lo, hi)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _fill_rows(planes, image, fills, plane_w, plane_size, lo, hi):
    """Rows [lo, hi) of one channel's phase planes from its image (H, W); only the parts the image
    covers are written.

    A stride-2 window's phases come in pairs that read the same input rows, one the even columns
    and one the odd: those are filled together, a row of the image split in one pass (LLVM
    vectorises that; a strided read of every other column it does not, and it took most of a
    stride-2 convolution's time). A stride-1 row is sliced without a step: with one (even 1) numba
    types the slice as strided, the copy ran scalar, and it took half a stride-1 convolution's time
    (32 channels of 112x112, 3x3: the fill 187 -> 62 us, the convolution 378 -> 216 us)."""
    phases = fills.shape[0]
    p = 0
    while p < phases:
        if p + 1 < phases and _paired(fills[p], fills[p + 1]):
            _fill_pair(planes, image, fills, p, plane_w, plane_size, lo, hi)
            p += 2
            continue
        dh0, dh1, dw0, dw1, sh0, shs, sw0, sws = fills[p]
        cols = dw1 - dw0
        for r in range(max(lo, dh0) - dh0, min(hi, dh1) - dh0):
            start = p * plane_size + (dh0 + r) * plane_w + dw0
            dst = planes[start:start + cols]
            if sws == 2:
                src = image[sh0 + r * shs, sw0:]
                for m in range(cols):
                    dst[m] = src[2 * m]
            elif sws == 1:  # a slice without a step, which numba knows contiguous: LLVM vectorises it
                src = image[sh0 + r * shs, sw0:sw0 + cols]
                for m in range(cols):
                    dst[m] = src[m]
            else:
                src = image[sh0 + r * shs, sw0:sw0 + (cols - 1) * sws + 1:sws]
                for m in range(cols):
                    dst[m] = src[m]
        p += 1


@njit(nogil=True, cache=True, inline="always")
def _paired(a, b):
    """Whether phases a and b read the same rows, every other column, one column apart."""
    return (a[7] == 2 and b[7] == 2 and a[0] == b[0] and a[1] == b[1] and a[4] == b[4] and a[5] == b[5]
            and abs(a[6] - b[6]) == 1)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _fill_pair(planes, image, fills, p, plane_w, plane_size, lo, hi):
    """Phases p and p + 1 (see `_paired`), their rows [lo, hi): each image row split into its even
    and odd columns."""
    e, o = (p, p + 1) if fills[p, 6] < fills[p + 1, 6] else (p + 1, p)
    dh0, dh1, sh0, shs, sw0 = fills[e, 0], fills[e, 1], fills[e, 4], fills[e, 5], fills[e, 6]
    e_cols, o_cols = fills[e, 3] - fills[e, 2], fills[o, 3] - fills[o, 2]
    both = min(e_cols, o_cols)
    for r in range(max(lo, dh0) - dh0, min(hi, dh1) - dh0):
        src = image[sh0 + r * shs, sw0:]
        e_start = e * plane_size + (dh0 + r) * plane_w + fills[e, 2]
        o_start = o * plane_size + (dh0 + r) * plane_w + fills[o, 2]
        de = planes[e_start:e_start + e_cols]
        do = planes[o_start:o_start + o_cols]
        for m in range(both):
            de[m] = src[2 * m]
            do[m] = src[2 * m + 1]
        for m in range(both, e_cols):
            de[m] = src[2 * m]
        for m in range(both, o_cols):
            do[m] = src[2 * m + 1]


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _sum_taps(planes, w, offsets, acc):
    """acc = sum over taps t of w[t] * planes[offsets[t]:][:len(acc)]: nine taps (3x3) in one pass,
    else groups of five, three, one, each one pass over acc (slices, so that LLVM sees
    non-negative indices and vectorises)."""
    n = acc.shape[0]
    taps = offsets.shape[0]
    t = 0
    if taps == 9:
        _sum_nines(planes, w, offsets, acc)
        return
    while t + 5 <= taps:
        p0 = planes[offsets[t]:]
        p1 = planes[offsets[t + 1]:]
        p2 = planes[offsets[t + 2]:]
        p3 = planes[offsets[t + 3]:]
        p4 = planes[offsets[t + 4]:]
        w0, w1, w2, w3, w4 = w[t], w[t + 1], w[t + 2], w[t + 3], w[t + 4]
        if t == 0:
            for k in range(n):
                acc[k] = p0[k] * w0 + p1[k] * w1 + p2[k] * w2 + p3[k] * w3 + p4[k] * w4
        else:
            for k in range(n):
                acc[k] += p0[k] * w0 + p1[k] * w1 + p2[k] * w2 + p3[k] * w3 + p4[k] * w4
        t += 5
    while t + 3 <= taps:
        p0 = planes[offsets[t]:]
        p1 = planes[offsets[t + 1]:]
        p2 = planes[offsets[t + 2]:]
        w0, w1, w2 = w[t], w[t + 1], w[t + 2]
        if t == 0:
            for k in range(n):
                acc[k] = p0[k] * w0 + p1[k] * w1 + p2[k] * w2
        else:
            for k in range(n):
                acc[k] += p0[k] * w0 + p1[k] * w1 + p2[k] * w2
        t += 3
    while t < taps:
        p0 = planes[offsets[t]:]
        w0 = w[t]
        if t == 0:
            for k in range(n):
                acc[k] = p0[k] * w0
        else:
            for k in range(n):
                acc[k] += p0[k] * w0
        t += 1


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _output_row(padded, w, bias, has_bias, result, r, cols, channels, c0, n, padded_w, kernel_h, kernel_w,
                stride_h, stride_w, dilation_h, dilation_w, mode, p0, p1):
    """Output row r of a channels-last depthwise convolution, channels [c0, c0 + n) of the weight's
    `channels` (w: taps * channels, tap-major), from the padded image of those n channels only
    (padded_w pixels of n a row) into result's (pixel q of row r at result[(r * cols + q) * n:][:n]):
    its sums, then the bias and the activation."""
    if kernel_h == 3 and kernel_w == 3:  # in the CPU's widest vectors (_jit_vector.nine_taps_pixels)
        line = padded_w * n
        nine_taps_pixels(padded, w[c0:], bias[c0:] if has_bias else w[c0:], has_bias, result,
                         r * stride_h * line, stride_w * n, dilation_w * n, dilation_h * line,
                         r * cols * n, cols, n, channels, n, mode, p0, p1)
        return
    zero = result.dtype.type(0)
    one = result.dtype.type(1)
    row = r * cols * n  # the row's first sums
    for q in range(cols):
        acc = result[row + q * n:row + q * n + n]
        for c in range(n):
            acc[c] = zero
    for i in range(kernel_h):
        at = (r * stride_h + i * dilation_h) * padded_w * n
        _row_taps(padded, w, result, at, row, cols, stride_w * n, dilation_w * n, i * kernel_w * channels + c0,
                  channels, kernel_w, n)
    b = bias[c0:c0 + n] if has_bias else result[row:row + n]  # (without a bias: any slice of the type)
    for q in range(cols):
        acc = result[row + q * n:row + q * n + n]
        if has_bias:
            for c in range(n):
                acc[c] = activate(acc[c] + b[c], mode, p0, p1, zero, one)
        else:
            for c in range(n):
                acc[c] = activate(acc[c], mode, p0, p1, zero, one)


# Channels transposed at a time: the input's and output's strided reads and writes of one block stay
# in L1.
BLOCK = 16


@njit(nogil=True, cache=True, boundscheck=False)
def depthwise_channels_last(x, w, bias, has_bias, out, padded, result, padded_h, padded_w, kernel_h, kernel_w,
                            stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left, mode, p0, p1, c0, c1,
                            staged):
    """Channels [c0, c1) of one image, for small images of many channels (one output per input
    channel). x (C, H, W); w (taps * C,): tap-major; out (C, OH, OW); `padded` and `result`, the
    scratch of these n = c1 - c0 channels alone (pixels n apart), so that shares of other channels
    on other threads at once write scratch of their own (sharing one, each pixel's channels split
    between two cores, a share on the team of two ran slower than the whole on one).

    The image is copied channels last into `padded` (padded_h * padded_w * n, zero border); each
    output pixel's n sums are made over its taps vectorised along the channels (a channels-first
    kernel's rows are here too short to vectorise), an output row at a time (_output_row), into
    `result` (OH * OW * n), then copied back channels first. Flat buffers and slices from zero, so
    that LLVM sees contiguous, non-negative indices and vectorises.

    `staged`: the caller has put the channels' image in `result` channels last already (H * W * n)
    and copies the result back itself (both by BLAS's transposing copy, several times faster than
    these loops, which run about an element a cycle): here the staged image goes into `padded` a
    pixel at a time, contiguous runs, and `out` is not written.
    """
    channels, height, width = x.shape
    rows, cols = out.shape[1], out.shape[2]
    n = c1 - c0
    zero = x.dtype.type(0)
    for h in range(padded_h):  # the border; scratch is shared with other steps
        inside = pad_top <= h < pad_top + height
        for v in range(padded_w):
            if not (inside and pad_left <= v < pad_left + width):
                start = (h * padded_w + v) * n
                cell = padded[start:start + n]
                for c in range(n):
                    cell[c] = zero
    if staged:
        for h in range(height):
            for v in range(width):
                start = ((h + pad_top) * padded_w + v + pad_left) * n
                at = (h * width + v) * n
                cell, staged_cell = padded[start:start + n], result[at:at + n]
                for c in range(n):
                    cell[c] = staged_cell[c]
    else:
        for b0 in range(0, n, BLOCK):
            m = min(BLOCK, n - b0)
            image = x[c0 + b0:c0 + b0 + m]
            for h in range(height):
                for v in range(width):
                    start = ((h + pad_top) * padded_w + v + pad_left) * n + b0
                    cell = padded[start:start + m]
                    for c in range(m):
                        cell[c] = image[c, h, v]
    for r in range(rows):
        _output_row(padded, w, bias, has_bias, result, r, cols, channels, c0, n, padded_w, kernel_h, kernel_w,
                    stride_h, stride_w, dilation_h, dilation_w, mode, p0, p1)
    if staged:
        return
    for b0 in range(0, n, BLOCK):
        m = min(BLOCK, n - b0)
        image = out[c0 + b0:c0 + b0 + m]
        for r in range(rows):
            for q in range(cols):
                start = (r * cols + q) * n + b0
                cell = result[start:start + m]
                for c in range(m):
                    image[c, r, q] = cell[c]


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _row_taps(padded, w, result, at, row, cols, col_step, tap_step, w_at, channels, taps, n):
    """One kernel row's taps over one output row: for each of its `cols` pixels (sums at
    result[row + q * n:][:n], image at padded[at + q * col_step:]), += tap j's pixel (tap_step
    further each) times its weights w[w_at + j * channels:][:n]. Five or three taps a pass, then
    one; each group's weights are sliced once for the whole row."""
    j = 0
    while j < taps:
        group = 5 if taps - j >= 5 else (3 if taps - j >= 3 else 1)
        w0 = w[w_at:w_at + n]
        if group == 5:
            w1 = w[w_at + channels:w_at + channels + n]
            w2 = w[w_at + 2 * channels:w_at + 2 * channels + n]
            w3 = w[w_at + 3 * channels:w_at + 3 * channels + n]
            w4 = w[w_at + 4 * channels:w_at + 4 * channels + n]
            q = 0
            if col_step == n and tap_step == n:  # stride 1, no dilation: four pixels a pass
                while q + 4 <= cols:
                    _five_taps_four(padded, result, at + q * n, row + q * n, n, w0, w1, w2, w3, w4)
                    q += 4
            for q in range(q, cols):
                s = at + q * col_step
                s0 = padded[s:s + n]
                s1 = padded[s + tap_step:s + tap_step + n]
                s2 = padded[s + 2 * tap_step:s + 2 * tap_step + n]
                s3 = padded[s + 3 * tap_step:s + 3 * tap_step + n]
                s4 = padded[s + 4 * tap_step:s + 4 * tap_step + n]
                acc = result[row + q * n:row + q * n + n]
                for c in range(n):
                    acc[c] += s0[c] * w0[c] + s1[c] * w1[c] + s2[c] * w2[c] + s3[c] * w3[c] + s4[c] * w4[c]
        elif group == 3:
            w1 = w[w_at + channels:w_at + channels + n]
            w2 = w[w_at + 2 * channels:w_at + 2 * channels + n]
            for q in range(cols):
                s = at + q * col_step
                s0 = padded[s:s + n]
                s1 = padded[s + tap_step:s + tap_step + n]
                s2 = padded[s + 2 * tap_step:s + 2 * tap_step + n]
                acc = result[row + q * n:row + q * n + n]
                for c in range(n):
                    acc[c] += s0[c] * w0[c] + s1[c] * w1[c] + s2[c] * w2[c]
        else:
            for q in range(cols):
                s = at + q * col_step
                s0 = padded[s:s + n]
                acc = result[row + q * n:row + q * n + n]
                for c in range(n):
                    acc[c] += s0[c] * w0[c]
        j += group
        at += group * tap_step
        w_at += group * channels


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _five_taps_four(padded, result, s, at, n, w0, w1, w2, w3, w4):
    """_row_taps' five taps of four neighbouring pixels (stride 1, no dilation; pixels n apart):
    eight columns loaded once for the four and each weight once, where a pixel at a time loads five
    and five for five products; each pixel's sum added in _row_taps' order (the same to the bit)."""
    k1, k2, k3 = n, 2 * n, 3 * n
    i0, i1, i2, i3 = padded[s:s + n], padded[s + k1:s + k1 + n], padded[s + k2:s + k2 + n], padded[s + k3:s + k3 + n]
    s += 4 * n
    i4, i5, i6, i7 = padded[s:s + n], padded[s + k1:s + k1 + n], padded[s + k2:s + k2 + n], padded[s + k3:s + k3 + n]
    o0, o1 = result[at:at + n], result[at + k1:at + k1 + n]
    o2, o3 = result[at + k2:at + k2 + n], result[at + k3:at + k3 + n]
    for c in range(n):
        x0, x1, x2, x3, x4, x5, x6, x7 = i0[c], i1[c], i2[c], i3[c], i4[c], i5[c], i6[c], i7[c]
        v0, v1, v2, v3, v4 = w0[c], w1[c], w2[c], w3[c], w4[c]
        o0[c] += x0 * v0 + x1 * v1 + x2 * v2 + x3 * v3 + x4 * v4
        o1[c] += x1 * v0 + x2 * v1 + x3 * v2 + x4 * v3 + x5 * v4
        o2[c] += x2 * v0 + x3 * v1 + x4 * v2 + x5 * v3 + x6 * v4
        o3[c] += x3 * v0 + x4 * v1 + x5 * v2 + x6 * v3 + x7 * v4


@njit(nogil=True, cache=True, boundscheck=False)
def pad_channels_last(x, padded, padded_h, padded_w, pad_top, pad_left):
    """padded (padded_h * padded_w * C,) <- x (H, W, C) with its top-left corner at (pad_top,
    pad_left), the border zero: each image row is one contiguous run. Only the border and the
    image are written (scratch is shared with other steps)."""
    height, width, channels = x.shape
    zero = x.dtype.type(0)
    row_len = padded_w * channels
    for h in range(padded_h):
        line = padded[h * row_len:(h + 1) * row_len]
        if pad_top <= h < pad_top + height:
            left, inside = pad_left * channels, width * channels
            for k in range(left):
                line[k] = zero
            for k in range(left + inside, row_len):
                line[k] = zero
            dst = line[left:left + inside]
            src = x[h - pad_top].reshape(-1)
            for k in range(inside):
                dst[k] = src[k]
        else:
            for k in range(row_len):
                line[k] = zero


@njit(nogil=True, cache=True, boundscheck=False)
def depthwise_nhwc(padded, w, bias, has_bias, out, padded_w, kernel_h, kernel_w, stride_h, stride_w,
                   dilation_h, dilation_w, mode, p0, p1, r0, r1):
    """Output rows [r0, r1) of a depthwise convolution whose image and output are both channels
    last (one output per channel): out (OH, OW, C) from the padded image (pad_channels_last; the
    image itself when unpadded), w (taps * C,) tap-major. Each pixel's C sums are made over its taps
    vectorised along the channels (_output_row), then the bias and the activation; no copy in or
    out. Shares of other rows may run on other threads at once."""
    cols, channels = out.shape[1], out.shape[2]
    for r in range(r0, r1):
        _output_row(padded, w, bias, has_bias, out.reshape(-1), r, cols, channels, 0, channels, padded_w, kernel_h,
                    kernel_w, stride_h, stride_w, dilation_h, dilation_w, mode, p0, p1)

