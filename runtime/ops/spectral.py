"""Spectral ops: DFT (opsets 17 and 20), STFT and MelWeightMatrix (opset 17).

A signal's last axis holds its samples as (real) or (real, imaginary); the transforms
are numpy's FFTs along one axis, computed in float32 for the half types (numpy has no
half FFT) and written back in the input's type, as the spec asks. DFT-17 takes its
axis as an attribute, DFT-20 as an optional input; both take dft_length as an input,
which pads or truncates the signal. `onesided` forward keeps the first
dft_length // 2 + 1 bins (RFFT); inverse, it reads those bins and makes a real
signal of dft_length samples (IRFFT).

Values that decide a shape (dft_length, frame_step, frame_length, num_mel_bins...)
must be known at PREPARE for the node to be planned; else it runs eagerly.
"""

import ml_dtypes
import numpy as np

from ..errors import ExecutionError, ModelError
from .registry import Inferred, Kernel, TensorInfo, register
from .shape import int_list, onnx_dtype, sane_shape

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)


def _is_float(dtype):
    return dtype.kind == "f" or dtype == _BF16


def _fft_dtype(dtype):
    """The type the FFT runs in: float32 for the half types, else the input's."""
    return _F32 if dtype.itemsize < 4 else dtype


def _scalar(node, info, what):
    """A known scalar integer input, None when the input is omitted."""
    values = int_list(node, info, what)
    if values is None:
        return None
    if len(values) != 1:
        raise ModelError(f"input {what!r} must be a scalar, not {len(values)} values")
    return values[0]


def as_complex(x, dtype):
    """The complex signal of a (..., 1) real or (..., 2) complex array, without its last axis."""
    x = x.astype(dtype, copy=False)
    if x.shape[-1] == 1:
        return x[..., 0]
    return x[..., 0] + 1j * x[..., 1]


def write_complex(out, values):
    """`values` (complex or real) into `out` (..., 2) or, real, (..., 1)."""
    np.copyto(out[..., 0], values.real, casting="unsafe")
    if out.shape[-1] == 2:
        np.copyto(out[..., 1], values.imag, casting="unsafe")


def dft(signal, n, axis, inverse=False, onesided=False):
    """The DFT of a complex or real signal along `axis`, padded or truncated to `n` samples:
    forward (one-sided: the first n // 2 + 1 bins) or inverse (one-sided: the real signal of
    n samples whose first n // 2 + 1 bins are given)."""
    if inverse:
        return np.fft.irfft(signal, n=n, axis=axis) if onesided else np.fft.ifft(signal, n=n, axis=axis)
    if onesided and not np.iscomplexobj(signal):
        return np.fft.rfft(signal, n=n, axis=axis)
    spectrum = np.fft.fft(signal, n=n, axis=axis)
    if onesided:
        # A complex signal's spectrum has no symmetry; onnx's reference keeps its first half too.
        spectrum = spectrum.take(np.arange(n // 2 + 1), axis=axis)
    return spectrum


class _DFT(Kernel):
    attributes = {"inverse": 0, "onesided": 0}

    def decode(self):
        if self.onesided not in (0, 1) or self.inverse not in (0, 1):
            self.fail(f"onesided ({self.onesided}) and inverse ({self.inverse}) must be 0 or 1")

    def check_axis(self, axis, rank):
        """`axis` as a non-negative signal axis of a rank-`rank` input, or an error: the last
        axis holds the real and imaginary parts."""
        if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
            raise ModelError(f"axis {axis} is not a signal axis of a rank-{rank} input")
        return axis % rank

    def infer(self, x, dft_length=None, axis=None):
        rank = len(x.shape)
        if rank < 2 or x.shape[-1] not in (1, 2):
            self.fail(f"input {list(x.shape)} must end in 1 (real) or 2 (complex)")
        if not _is_float(x.dtype):
            self.fail(f"input must be a float tensor, not {x.dtype}")
        if self.onesided and self.inverse and x.shape[-1] != 2:
            self.fail("an inverse one-sided DFT (IRFFT) needs a complex input")
        n = _scalar(self.node, dft_length, "dft_length")
        if n is not None and n < 1:
            self.fail(f"dft_length {n} must be positive")
        known_axis = self.axis_of(axis)
        if known_axis is None:
            # An axis known only per run: the output's shape is the input's, but for the
            # complex axis, unless the length along the axis changes.
            if self.onesided or n is not None:
                self.needs_value("axis")
            shape = (*x.shape[:-1], 1 if self.onesided and self.inverse else 2)
            return Inferred([TensorInfo(shape, x.dtype)], length=n)
        k = self.check_axis(known_axis, rank)
        size = x.shape[k]
        if n is None:
            n = 2 * (size - 1) if self.onesided and self.inverse else size
            if n < 1:
                self.fail(f"axis {known_axis} of {list(x.shape)} gives a DFT of length {n}")
        bins = n // 2 + 1 if self.onesided and not self.inverse else n
        shape = [*x.shape[:-1], 1 if self.onesided and self.inverse else 2]
        shape[k] = bins
        return Inferred([TensorInfo(sane_shape(self.node, shape, x.dtype), x.dtype)], length=n)

    def run(self, x, dft_length=None, axis=None, *, outs, scratch=()):
        rank = x.ndim
        try:
            k = self.check_axis(self.axis_at_run(axis), rank)
        except ModelError as e:  # an axis known only now
            raise ExecutionError(str(e)) from None
        n = self.length
        if n is None:
            n = 2 * (x.shape[k] - 1) if self.onesided and self.inverse else x.shape[k]
        signal = as_complex(x, _fft_dtype(x.dtype))
        write_complex(outs[0], dft(signal, n, k, bool(self.inverse), bool(self.onesided)))


@register("DFT", since=17)
class DFT17(_DFT):
    attributes = {**_DFT.attributes, "axis": 1}

    def axis_of(self, axis_input):
        return self.axis

    def axis_at_run(self, axis_input):
        return self.axis


@register("DFT", since=20)
class DFT20(_DFT):
    def axis_of(self, axis_input):
        if axis_input is None:
            return -2
        if axis_input.value is None:
            return None
        return _scalar(self.node, axis_input, "axis")

    def axis_at_run(self, axis_input):
        return -2 if axis_input is None else int(np.asarray(axis_input).reshape(-1)[0])


@register("STFT", since=17)
class STFT(Kernel):
    """Frames of `frame_length` samples every `frame_step`, each windowed, then its DFT."""

    attributes = {"onesided": 1}

    def infer(self, signal, frame_step, window=None, frame_length=None):
        if len(signal.shape) != 3 or signal.shape[-1] not in (1, 2):
            self.fail(f"signal {list(signal.shape)} must be [batch, length, 1 or 2]")
        if not _is_float(signal.dtype):
            self.fail(f"signal must be a float tensor, not {signal.dtype}")
        step = _scalar(self.node, frame_step, "frame_step")
        length = _scalar(self.node, frame_length, "frame_length")
        if window is not None:
            if len(window.shape) != 1:
                self.fail(f"window must be 1-D, not {list(window.shape)}")
            if length is not None and window.shape[0] != length:
                self.fail(f"window of {window.shape[0]} samples for frame_length {length}")
            length = window.shape[0]
        if length is None:
            length = signal.shape[1]
        if step < 1 or length < 1:
            self.fail(f"frame_step {step} and frame_length {length} must be positive")
        if length > signal.shape[1]:
            self.fail(f"frame_length {length} is longer than the signal ({signal.shape[1]} samples)")
        frames = (signal.shape[1] - length) // step + 1
        bins = length // 2 + 1 if self.onesided else length
        return Inferred([TensorInfo((signal.shape[0], frames, bins, 2), signal.dtype)],
                        step=step, length=length)

    def run(self, signal, frame_step, window=None, frame_length=None, *, outs, scratch=()):
        dtype = _fft_dtype(signal.dtype)
        frames = outs[0].shape[1]
        # (batch, frames, 1 or 2, length): a view, each frame `step` samples past the last.
        windows = np.lib.stride_tricks.sliding_window_view(signal, self.length, axis=1)
        windows = windows[:, :frames * self.step:self.step].astype(dtype)
        if window is not None:
            windows *= window.astype(dtype)
        samples = windows[:, :, 0] if windows.shape[2] == 1 else windows[:, :, 0] + 1j * windows[:, :, 1]
        write_complex(outs[0], dft(samples, self.length, -1, onesided=bool(self.onesided)))


@register("MelWeightMatrix", since=17)
class MelWeightMatrix(Kernel):
    """Triangular filters, equally spaced on the mel scale, over the bins of a one-sided DFT.

    Filter i rises from edge i to a peak of 1 at edge i + 1 and falls to edge i + 2; the
    num_mel_bins + 2 edges are spaced by (mel(upper) - mel(lower)) / (num_mel_bins + 2) from
    mel(lower), and each is mapped to the bin floor((dft_length + 1) * hertz / sample_rate),
    as onnxruntime and onnx's reference do.
    """

    attributes = {"output_datatype": 1}

    def decode(self):
        self.dtype = onnx_dtype(self.node, self.output_datatype, "output_datatype")

    def infer(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        mels = _scalar(self.node, num_mel_bins, "num_mel_bins")
        n = _scalar(self.node, dft_length, "dft_length")
        if mels < 1 or n < 1:
            self.fail(f"num_mel_bins {mels} and dft_length {n} must be positive")
        return [TensorInfo(sane_shape(self.node, (n // 2 + 1, mels), self.dtype), self.dtype)]

    def run(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
            outs, scratch=()):
        bins, mels = outs[0].shape
        n = int(np.asarray(dft_length).reshape(-1)[0])
        rate = int(np.asarray(sample_rate).reshape(-1)[0])
        if rate <= 0:
            raise ExecutionError(f"sample_rate {rate} must be positive")
        low, high = (float(np.asarray(v).reshape(-1)[0]) for v in (lower_edge_hertz, upper_edge_hertz))
        low_mel, high_mel = (2595 * np.log10(1 + hz / 700) for hz in (low, high))
        mel_edges = low_mel + np.arange(mels + 2) * ((high_mel - low_mel) / (mels + 2))
        hertz = 700 * (10 ** (mel_edges / 2595) - 1)
        edges = np.floor((n + 1) * hertz / rate).astype(np.int64)
        # A filter may end on the bin past the last (it is 0 there), not start or peak on it.
        if edges.min() < 0 or edges[:-1].max() >= bins or edges[-1] > bins:
            raise ExecutionError(f"the mel edges fall on DFT bins {edges.min()}..{edges.max()}, "
                                 f"outside the {bins} of a DFT of length {n}")
        j = np.arange(bins)[:, None]
        left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
        with np.errstate(divide="ignore", invalid="ignore"):
            rising = (j - left) / (center - left)
            falling = (right - j) / (right - center)
        weights = np.where((j >= left) & (j <= center), np.where(center == left, 1.0, rising), 0.0)
        # The falling side starts at the center (overwriting its 1) unless it is empty.
        weights = np.where((j >= center) & (j < right), falling, weights)
        np.copyto(outs[0], weights, casting="unsafe")
