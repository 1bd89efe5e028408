"""CausalConvWithState (opset 27): a depthwise 1-D convolution over past and present samples.

The input (batch, channels, length) is read after the carried state (batch, channels,
k - 1), zeros when none is given: output t of channel c is the sum over the k taps j
of weight[c, 0, j] * padded[c, t + j], plus the bias, then SiLU when asked
(`silu` and `swish` are one activation). The new state is the last k - 1 samples of
the padded sequence, so a decode step of one sample carries the window on.

Kernels are short (Mamba's and Gated DeltaNet's are 4 taps): each tap is one
multiply-add over the whole (batch, channels, length) block. The sum is kept in
float32 for the half types, rounded once, as a float GEMM sums.
"""

import ml_dtypes
import numpy as np

from .activation import sigmoid
from .registry import Inferred, Kernel, TensorInfo, register

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
ACTIVATIONS = ("none", "silu", "swish")


@register("CausalConvWithState", since=27)
class CausalConvWithState(Kernel):
    attributes = {"activation": "none"}

    def decode(self):
        if self.activation not in ACTIVATIONS:
            self.fail(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")

    def infer(self, x, weight, bias=None, past_state=None):
        if len(x.shape) != 3:
            self.fail(f"input {list(x.shape)} must be (batch, channels, length)")
        batch, channels, length = x.shape
        if len(weight.shape) != 3 or weight.shape[:2] != (channels, 1) or weight.shape[2] < 1:
            self.fail(f"weight {list(weight.shape)} must be ({channels}, 1, k) for {channels} channels")
        k = weight.shape[2]
        if x.dtype.kind != "f" and x.dtype != _BF16:
            self.fail(f"input must be a float tensor, not {x.dtype}")
        for name, info, shape in (("weight", weight, None), ("bias", bias, (channels,)),
                                  ("past_state", past_state, (batch, channels, k - 1))):
            if info is None:
                continue
            if info.dtype != x.dtype:
                self.fail(f"{name} is {info.dtype}, input {x.dtype}")
            if shape is not None and tuple(info.shape) != shape:
                self.fail(f"{name} has shape {list(info.shape)}, not {list(shape)}")
        return Inferred([TensorInfo(x.shape, x.dtype), TensorInfo((batch, channels, k - 1), x.dtype)],
                        taps=k)

    def prepare(self, x, weight, bias=None, past_state=None):
        self.dtype = _F32 if x.dtype.itemsize < 4 else x.dtype
        batch, channels, length = x.shape
        # The padded sequence, and the sum (and a tap's product) when the output cannot hold it.
        spec = [((batch, channels, self.taps - 1 + length), self.dtype), ((batch, channels, length), self.dtype)]
        if self.dtype != x.dtype:
            spec.append(((batch, channels, length), self.dtype))
        return spec

    def run(self, x, weight, bias=None, past_state=None, *, outs, scratch):
        k, length = self.taps, x.shape[2]
        padded, product = scratch[:2]
        y = outs[0]
        acc = y if len(scratch) == 2 else scratch[2]
        if past_state is None:
            padded[:, :, :k - 1] = 0
        else:
            padded[:, :, :k - 1] = past_state
        padded[:, :, k - 1:] = x
        taps = weight[:, 0, :].astype(self.dtype)[None, :, :, None]  # (1, C, k, 1)
        np.multiply(padded[:, :, 0:length], taps[:, :, 0], out=acc)
        for j in range(1, k):
            np.multiply(padded[:, :, j:j + length], taps[:, :, j], out=product)
            np.add(acc, product, out=acc)
        if bias is not None:
            np.add(acc, bias.astype(self.dtype)[:, None], out=acc)
        if self.activation != "none":
            sigmoid(acc, product)
            np.multiply(acc, product, out=acc)
        if acc is not y:
            np.copyto(y, acc, casting="unsafe")
        if len(outs) > 1 and outs[1] is not None:
            np.copyto(outs[1], padded[:, :, length:], casting="unsafe")
