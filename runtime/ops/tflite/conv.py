"""TFLite convolutions and pooling (domain "tflite"), NHWC, on conv_core's numeric cores.

CONV_2D and DEPTHWISE_CONV_2D use the mapped filter as it lies: CONV_2D's
[O, H, W, I/groups] is conv_core's channels-last weight, DEPTHWISE_CONV_2D's
[1, H, W, C*M] reshapes to its tap-major (H, W, C, M) as a view. TFLite's SAME
padding (total max((out-1)*stride + (k-1)*dilation + 1 - in, 0), the odd cell at
the end) is ONNX's SAME_UPPER, VALID is no padding. Transposed convolutions
(TRANSPOSE_CONV and mediapipe's custom Convolution2DTransposeBias) run
conv_core's channels-first transposed convolution on NCHW scratch copies, the
filter packed once to its (I, O, H, W) layout.
"""

import struct

import numpy as np

from .. import conv_core
from ..activation import apply_activation
from ..registry import Inferred, Kernel, TensorInfo, register
from ..shape import int_list
from .common import DOMAIN, fused_activation

PADDINGS = {"SAME": "SAME_UPPER", "VALID": "VALID"}


def _auto_pad(kernel, padding):
    if padding not in PADDINGS:
        kernel.fail(f"padding {padding!r} is not SAME or VALID")
    return PADDINGS[padding]


def _nhwc(kernel, info, what):
    if len(info.shape) != 4:
        kernel.fail(f"{what} of shape {tuple(info.shape)} is not 4-D NHWC")
    return info.shape


class WindowKernel(Kernel):
    attributes = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "dilation_w_factor": 1,
                  "dilation_h_factor": 1, "fused_activation_function": "NONE"}

    def decode(self):
        self.auto_pad = _auto_pad(self, self.padding)
        self.activation = fused_activation(self, self.fused_activation_function)

    def window(self, in_hw, kernel_hw):
        try:
            return conv_core.make_window(in_hw, kernel_hw, (self.stride_h, self.stride_w),
                                         (self.dilation_h_factor, self.dilation_w_factor),
                                         auto_pad=self.auto_pad)
        except ValueError as e:
            self.fail(str(e))


@register("CONV_2D", since=1, domain=DOMAIN)
class Conv2D(WindowKernel):
    def infer(self, x, w, bias=None):
        n, h, wd, c = _nhwc(self, x, "input")
        o, kh, kw, c_g = _nhwc(self, w, "filter")
        if c_g == 0 or c % c_g:
            self.fail(f"filter depth {c_g} does not divide {c} input channels")
        group = c // c_g
        if bias is not None and bias.size != o:
            self.fail(f"bias of {bias.size} values for {o} output channels")
        win = self.window((h, wd), (kh, kw))
        return Inferred([TensorInfo((n, *win.out_spatial, o), x.dtype)], group=group, win=win)

    def prepare(self, x, w, bias=None):
        try:
            self.plan = conv_core.conv_plan(self.win, x.shape[3], w.shape[0], self.group, x.dtype,
                                            conv_core.CHANNELS_LAST)
        except ValueError as e:
            self.fail(str(e))
        # A grouped filter of one channel per group, [C, H, W, 1], is what conv_core's
        # depthwise path reads as (C*M, *kernel, 1): no repacking either way.
        return self.plan.scratch()

    def run(self, x, w, bias=None, *, outs, scratch, stream=None):
        """`stream`, under a memory budget, reads the filter in blocks of output channels."""
        conv_core.conv(x, w, bias, outs[0], self.plan, scratch[0] if scratch else None, self.activation, stream)


@register("DEPTHWISE_CONV_2D", since=1, domain=DOMAIN)
class DepthwiseConv2D(WindowKernel):
    attributes = dict(WindowKernel.attributes, depth_multiplier=0)

    def infer(self, x, w, bias=None):
        n, h, wd, c = _nhwc(self, x, "input")
        one, kh, kw, c_out = _nhwc(self, w, "filter")
        if one != 1 or c == 0 or c_out % c:
            self.fail(f"filter of shape {tuple(w.shape)} does not fit {c} input channels")
        # depth_multiplier is redundant with the filter (and 0 in some files): the filter decides.
        multiplier = c_out // c
        if bias is not None and bias.size != c_out:
            self.fail(f"bias of {bias.size} values for {c_out} output channels")
        win = self.window((h, wd), (kh, kw))
        return Inferred([TensorInfo((n, *win.out_spatial, c_out), x.dtype)], multiplier=multiplier, win=win)

    def prepare(self, x, w, bias=None):
        c, c_out = x.shape[3], w.shape[3]
        kh, kw = w.shape[1:3]
        self.weight = None
        try:
            if c == 1:
                # One input channel: a dense conv with M outputs, filter (M, H, W, 1).
                self.plan = conv_core.conv_plan(self.win, 1, c_out, 1, x.dtype, conv_core.CHANNELS_LAST)
                if w.value is not None:
                    self.weight = self.pack({1}, lambda: np.ascontiguousarray(
                        np.asarray(w.value).reshape(kh, kw, c_out).transpose(2, 0, 1)[..., None]))
            else:
                self.plan = conv_core.conv_plan(self.win, c, c_out, c, x.dtype, conv_core.CHANNELS_LAST)
        except ValueError as e:
            self.fail(str(e))
        return self.plan.scratch()

    def run(self, x, w, bias=None, *, outs, scratch):
        s = scratch[0] if scratch else None
        out = outs[0]
        if self.plan.method == "depthwise":
            kh, kw = self.win.kernel
            taps = w.reshape(kh, kw, self.plan.c_in, self.multiplier)
            conv_core.depthwise_conv(x, taps, bias, out, self.plan, s, self.activation)
            return
        weight = self.weight
        if weight is None:
            kh, kw = self.win.kernel
            weight = np.ascontiguousarray(w.reshape(kh, kw, -1).transpose(2, 0, 1)[..., None])
        conv_core.conv(x, weight, bias, out, self.plan, s, self.activation)


class TransposeConvKernel(Kernel):
    """A transposed convolution with filter [O, H, W, I] on NHWC, through conv_core (NCHW)."""

    activation = None

    def geometry(self, x, w, out_hw, padding, strides):
        n, h, wd, c = _nhwc(self, x, "input")
        o, kh, kw, c_in = _nhwc(self, w, "filter")
        if c_in != c:
            self.fail(f"filter depth {c_in} differs from {c} input channels")
        try:
            win = conv_core.make_transpose_window((h, wd), (kh, kw), strides, auto_pad="SAME_UPPER",
                                                  output_shape=out_hw)
        except ValueError as e:
            self.fail(str(e))
        return Inferred([TensorInfo((n, *out_hw, o), x.dtype)], win=win, shapes=((n, c, h, wd), (n, o, *out_hw)))

    def prepare_filter(self, x, w, index):
        try:
            self.plan = conv_core.conv_transpose_plan(self.win, x.shape[3], w.shape[0], 1, x.dtype)
        except ValueError as e:
            self.fail(str(e))
        self.weight = None
        if w.value is not None:
            self.weight = self.pack({index}, lambda: np.ascontiguousarray(np.asarray(w.value).transpose(3, 0, 1, 2)))
        x_elems = int(np.prod(self.shapes[0]))
        y_elems = int(np.prod(self.shapes[1]))
        return self.plan.scratch() + [((x_elems,), x.dtype), ((y_elems,), x.dtype)]

    def compute(self, x, w, bias, out, scratch):
        if scratch:
            *plan_scratch, x_buf, y_buf = scratch
        else:
            plan_scratch, x_buf, y_buf = [], np.empty(int(np.prod(self.shapes[0])), x.dtype), \
                np.empty(int(np.prod(self.shapes[1])), x.dtype)
        weight = self.weight if self.weight is not None else np.ascontiguousarray(w.transpose(3, 0, 1, 2))
        x_nchw = x_buf.reshape(self.shapes[0])
        np.copyto(x_nchw, x.transpose(0, 3, 1, 2))
        y_nchw = y_buf.reshape(self.shapes[1])
        conv_core.conv_transpose(x_nchw, weight, bias, y_nchw, self.plan,
                                 plan_scratch[0] if plan_scratch else None)
        np.copyto(out, y_nchw.transpose(0, 2, 3, 1))
        apply_activation(out, self.activation)


@register("TRANSPOSE_CONV", since=1, domain=DOMAIN)
class TransposeConv(TransposeConvKernel):
    """Inputs: output_shape [4], filter [O, H, W, I], input, optional bias [O]."""

    attributes = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"}

    def decode(self):
        _auto_pad(self, self.padding)
        self.activation = fused_activation(self, self.fused_activation_function)

    def infer(self, output_shape, w, x, bias=None):
        shape = int_list(self.node, output_shape, "output_shape")
        if len(shape) != 4 or shape[0] != x.shape[0] or shape[3] != w.shape[0]:
            self.fail(f"output_shape {shape} does not fit input {tuple(x.shape)} and filter "
                      f"{tuple(w.shape)}")
        if bias is not None and bias.size != w.shape[0]:
            self.fail(f"bias of {bias.size} values for {w.shape[0]} output channels")
        return self.geometry(x, w, tuple(shape[1:3]), self.padding, (self.stride_h, self.stride_w))

    def prepare(self, output_shape, w, x, bias=None):
        return self.prepare_filter(x, w, 1)

    def run(self, output_shape, w, x, bias=None, *, outs, scratch):
        self.compute(x, w, bias, outs[0], scratch)


@register("Convolution2DTransposeBias", since=1, domain="tflite.custom")
class Convolution2DTransposeBias(TransposeConvKernel):
    """mediapipe's transposed convolution: inputs (input, filter [O, H, W, I], bias [O]).

    custom_options is a raw TfLiteTransposeConvParams: int32 padding (1 SAME, 2 VALID),
    stride_width, stride_height. SAME gives out = in * stride, VALID (in - 1) * stride + k.
    """

    attributes = {"custom_options": b""}

    def decode(self):
        options = bytes(self.custom_options or b"")
        self.options = None
        if len(options) >= 12:
            padding, stride_w, stride_h = struct.unpack_from("<3i", options)
            if padding in (1, 2) and stride_w > 0 and stride_h > 0:
                self.options = ("SAME" if padding == 1 else "VALID", stride_h, stride_w)
        if self.options is None:
            self.fail(f"custom_options {options.hex()} are not padding and strides")

    def infer(self, x, w, bias=None):
        padding, stride_h, stride_w = self.options
        _, h, wd, _ = _nhwc(self, x, "input")
        _, kh, kw, _ = _nhwc(self, w, "filter")
        if padding == "SAME":
            out_hw = (h * stride_h, wd * stride_w)
        else:
            out_hw = ((h - 1) * stride_h + kh, (wd - 1) * stride_w + kw)
        if bias is not None and bias.size != w.shape[0]:
            self.fail(f"bias of {bias.size} values for {w.shape[0]} output channels")
        return self.geometry(x, w, out_hw, padding, (stride_h, stride_w))

    def prepare(self, x, w, bias=None):
        return self.prepare_filter(x, w, 1)

    def run(self, x, w, bias=None, *, outs, scratch):
        self.compute(x, w, bias, outs[0], scratch)


class Pool2D(WindowKernel):
    attributes = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "filter_width": 1,
                  "filter_height": 1, "fused_activation_function": "NONE"}
    kind = None
    dilation_h_factor = dilation_w_factor = 1

    def infer(self, x):
        n, h, w, c = _nhwc(self, x, "input")
        win = self.window((h, w), (self.filter_height, self.filter_width))
        return Inferred([TensorInfo((n, *win.out_spatial, c), x.dtype)], win=win)

    def prepare(self, x):
        # TFLite's average counts only the taps inside the input.
        self.plan = conv_core.pool_plan(self.win, self.kind, x.shape[3], x.dtype, conv_core.CHANNELS_LAST,
                                        count_include_pad=False, batch=x.shape[0])
        return self.plan.scratch()

    def run(self, x, *, outs, scratch):
        conv_core.pool(x, outs[0], self.plan, scratch[0] if scratch else None)
        apply_activation(outs[0], self.activation)


@register("MAX_POOL_2D", since=1, domain=DOMAIN)
class MaxPool2D(Pool2D):
    kind = "max"


@register("AVERAGE_POOL_2D", since=1, domain=DOMAIN)
class AveragePool2D(Pool2D):
    kind = "average"
