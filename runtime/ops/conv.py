"""ONNX convolutions: Conv and ConvTranspose (NCHW, any number of spatial dims).

The kernels decode attributes and check shapes; the numerics are in `conv_core`,
which TFLite's convolutions share. Weights are used as they lie in the mapped
file, but for a depthwise conv's small one, packed tap-major. Under a memory budget a
Conv of one group may read its weight in blocks of output channels.
"""

from dataclasses import replace

import numpy as np

from . import bands, conv_core
from .activation import apply_activation
from .registry import Inferred, Kernel, TensorInfo, register


class _ConvBase(Kernel):
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                  "pads": None, "strides": None}

    def decode(self):
        if self.auto_pad not in conv_core.AUTO_PADS:
            self.fail(f"auto_pad {self.auto_pad!r} is not one of {', '.join(conv_core.AUTO_PADS)}")
        if self.group < 1:
            self.fail(f"group {self.group} must be positive")
        self.activation = self.node.attrs.get("_activation")

    def check_inputs(self, x, w, b, c_in_of_w, c_out):
        if x is None or w is None:
            self.fail("inputs X and W are required")
        if len(x.shape) < 3:
            self.fail(f"input X has shape {list(x.shape)}; expected (N, C, D1, ...)")
        if len(w.shape) != len(x.shape):
            self.fail(f"weight W has shape {list(w.shape)}, rank {len(w.shape)} "
                      f"for an input of rank {len(x.shape)}")
        if x.dtype.kind != "f" or w.dtype != x.dtype:
            self.fail(f"X ({x.dtype}) and W ({w.dtype}) must be the same floating type")
        if self.kernel_shape is not None and tuple(self.kernel_shape) != tuple(w.shape[2:]):
            self.fail(f"kernel_shape {list(self.kernel_shape)} does not match W {list(w.shape)}")
        if x.shape[1] != c_in_of_w:
            self.fail(f"X has {x.shape[1]} channels, W {list(w.shape)} with group {self.group} "
                      f"expects {c_in_of_w}")
        if b is not None and (tuple(b.shape) != (c_out,) or b.dtype != x.dtype):
            self.fail(f"bias B {list(b.shape)} {b.dtype} must be ({c_out},) {x.dtype}")


@register("Conv", since=1)
class Conv(_ConvBase):
    """Convolution; `_activation` (set by the compiler's fusion) is applied in place. With
    `_residual` (compiler/rewrite.fuse_residual) a fourth input is added before the activation:
    the Add after the Conv, fused; a residual the convolution's output broadcasts up to (the Add's
    output larger than the Conv's) is added from a scratch copy of that output."""

    def decode(self):
        super().decode()
        self.residual = bool(self.node.attrs.get("_residual"))

    def infer(self, x, w, b=None, s=None):
        if s is not None and not self.residual:
            self.fail("takes at most 3 inputs (X, W, B)")
        if self.residual and s is None:
            self.fail("the residual input (a fused Add's other operand) is missing")
        self.check_inputs(x, w, b, w.shape[1] * self.group if w is not None else 0,
                          w.shape[0] if w is not None else 0)
        if w.shape[0] % self.group:
            self.fail(f"{w.shape[0]} output channels are not divisible by group {self.group}")
        try:
            window = conv_core.make_window(x.shape[2:], w.shape[2:], self.strides, self.dilations,
                                           self.pads, self.auto_pad)
        except ValueError as e:
            self.fail(str(e))
        shape = (x.shape[0], w.shape[0], *window.out_spatial)
        if s is None:
            return Inferred([TensorInfo(shape, x.dtype)], window=window)
        if s.dtype != x.dtype:
            self.fail(f"the residual added ({s.dtype}) is not of X's type ({x.dtype})")
        try:
            added = tuple(np.broadcast_shapes(shape, tuple(s.shape)))
        except ValueError:
            self.fail(f"the residual added, of shape {list(s.shape)}, does not broadcast with the "
                      f"output {list(shape)}")
        return Inferred([TensorInfo(added, x.dtype)], window=window,
                        conv_shape=shape if added != shape else None)

    conv_shape = None  # with a residual the output broadcasts up to: the convolution's own shape

    w_taps = None     # a depthwise conv's constant weight as its plan reads it (conv_core.depthwise_taps)
    w_shifted = None  # a "gemm-shifted" or "gemm-phases" conv's constant weight, tap-major
    #                   (conv_core.shifted_taps, shifted_tiles)
    step = None       # a convolution of one image that is one GEMM, made ready for every run (conv_core.GemmStep)
    w_live = None     # a constant weight without the taps that read only padding (conv_core.live_window)
    w_transposed = None  # a pointwise conv's constant weight (Cin, Cout) where its step is one row (GemmStep)
    w_tiles = None    # a pointwise conv's constant weight in the compiled product's tiles (GemmStep.packs_tiles)

    def prepare(self, x, w, b=None, s=None):
        live = conv_core.live_window(self.window) if w.value is not None else None
        form = ""
        if live is not None:  # the window without its dead taps, from here on; its weight packed
            self.window, kept = live
            form = "live" + "".join(f"{k.start}:{k.stop}" for k in kept)
        self.plan = conv_core.conv_plan(self.window, x.shape[1], w.shape[0], self.group, x.dtype)
        if w.value is not None:  # all taps in one compiled product: a strided one's over phase planes
            self.plan = conv_core.with_phases(conv_core.with_tiles(self.plan))
        self.step = None
        if conv_core.GemmStep.serves(self.plan) and x.shape[0] == 1 and w.value is not None and self.conv_shape is None:
            self.step = conv_core.GemmStep(self.plan, self.activation)

        def weight():
            return w.value[(slice(None), slice(None)) + kept] if live is not None else w.value
        if self.plan.method == "depthwise" and w.value is not None:
            if isinstance(self.plan.tiles, conv_core.RowMatrices):  # not tap-major: a form of its own
                form += "strips"
            self.w_taps = self.pack([1], lambda: conv_core.depthwise_taps(weight(), self.plan), form)
        elif self.plan.method == "gemm-phases":
            self.w_shifted = self.pack([1], lambda: conv_core.shifted_tiles(weight(), self.plan),
                                       form + self.plan.tiles.tiled.FORM)
        elif self.plan.method == "gemm-shifted" and w.value is not None:
            self.plan = conv_core.with_tiles(self.plan)
            if self.plan.tiles.tiled is not None:  # all taps in one compiled product
                self.w_shifted = self.pack([1], lambda: conv_core.shifted_tiles(weight(), self.plan),
                                           form + self.plan.tiles.tiled.FORM)
            else:
                self.w_shifted = self.pack([1], lambda: conv_core.shifted_taps(weight(), self.plan), form)
        elif live is not None:
            self.w_live = self.pack([1], lambda: np.ascontiguousarray(weight()), form)
        elif self.step is not None and self.step.row_product():
            self.w_transposed = self.pack(
                [1], lambda: np.ascontiguousarray(np.asarray(w.value).reshape(self.step.m, self.step.k).T),
                "transposed")
        elif self.step is not None and self.step.packs_tiles():
            step = self.step
            self.w_tiles = self.pack([1], lambda: step.tiled.pack(np.asarray(w.value), step.m, step.k), step.tiled.FORM)
        if self.conv_shape is not None:
            return self.plan.scratch() + [(self.conv_shape, x.dtype)]
        return self.plan.scratch()

    def run(self, x, w, b=None, s=None, *, outs, scratch=(), stream=None):
        """`stream`, under a memory budget, reads W in blocks of its output channels (budget.Blocks)."""
        weight = self.w_live if self.w_live is not None else self.w_transposed if self.w_transposed is not None \
            else self.w_tiles if self.w_tiles is not None else w
        if self.step is not None and stream is None and self.step(
                x, weight, b, outs[0], scratch[0] if scratch else None, s):
            return
        own = scratch[0] if self.plan.scratch_elems else None
        if self.conv_shape is None:
            self._conv(x, w, b, outs[0], self.plan, own, stream, residual=s)
            return
        self._conv(x, w, b, scratch[-1], self.plan, own, stream, activation=None)
        np.add(scratch[-1], s, out=outs[0])
        if self.activation is not None:
            apply_activation(outs[0], self.activation)

    def _conv(self, x, w, b, out, plan, scratch, stream=None, activation=..., residual=None):
        """The convolution into `out`, plus `residual` if given, then `activation` (the fused one
        unless given; None: none)."""
        activation = self.activation if activation is ... else activation
        if self.w_taps is not None:
            conv_core.depthwise_conv(x, self.w_taps, b, out, plan, scratch, activation, residual)
        elif self.w_tiles is not None:  # a pointwise convolution: any band of rows, any batch
            conv_core.tiled_pointwise(self.step.tiled, x, self.w_tiles, b, out, activation, residual)
        else:
            weight = self.w_shifted if self.w_shifted is not None else self.w_live if self.w_live is not None else w
            if self.w_transposed is not None:  # the (Cout, Cin) weight as a view of the packed one
                weight = self.w_transposed.T.reshape(self.plan.c_out, self.plan.c_in, *self.plan.window.kernel)
            conv_core.conv(x, weight, b, out, plan, scratch, activation, stream, residual)

    def band_granule(self):
        if self.residual:  # a band's residual rows are not cut out for it: the step runs whole
            return 0
        if isinstance(self.plan.tiles, conv_core.RowMatrices):  # a few rows, their matrices whole
            return 0
        return 1 if bands.windowed(self.window) else 0

    def band(self, r0, r1, scratch_limit, plans=None):
        a, b, window = bands.window_band(self.window, r0, r1)
        # A weight packed for shifted GEMMs is only that: every band runs them (by the compiled
        # product where the weight is packed for it).
        phased = self.plan.method == "gemm-phases"
        shifted = self.w_shifted is not None and not phased
        tiled = shifted and self.plan.tiles.tiled is not None

        def band_plan():
            plan = conv_core.conv_plan(window, self.plan.c_in, self.plan.c_out, self.group, self.plan.dtype,
                                       scratch_limit=scratch_limit, shifted=shifted, row_matrices=False)
            if phased:
                return conv_core.with_phases(plan, force=True)
            return conv_core.with_tiles(plan, force=True) if tiled else plan
        plan = bands.cached(plans, (window, scratch_limit, shifted, tiled, phased), band_plan)

        def run(args, out, scratch):
            self._conv(args[0], args[1], args[2] if len(args) > 2 else None, out, plan, scratch)
        return bands.Band((r0, r1), ((a, b),) + (None,) * (len(self.node.inputs) - 1), run, plan.scratch_elems)


@register("ConvTranspose", since=1)
class ConvTranspose(_ConvBase):
    attributes = {**_ConvBase.attributes, "output_padding": None, "output_shape": None}

    def infer(self, x, w, b=None):
        c_out = w.shape[1] * self.group if w is not None else 0
        self.check_inputs(x, w, b, w.shape[0] if w is not None else 0, c_out)
        if w.shape[0] % self.group:
            self.fail(f"{w.shape[0]} input channels are not divisible by group {self.group}")
        try:
            window = conv_core.make_transpose_window(
                x.shape[2:], w.shape[2:], self.strides, self.dilations, self.pads, self.auto_pad,
                self.output_padding, self.output_shape)
        except ValueError as e:
            self.fail(str(e))
        return Inferred([TensorInfo((x.shape[0], c_out, *window.in_spatial), x.dtype)], window=window)

    def prepare(self, x, w, b=None):
        self.plan = conv_core.conv_transpose_plan(self.window, x.shape[1], w.shape[1] * self.group,
                                                  self.group, x.dtype)
        return self.plan.scratch()

    def run(self, x, w, b=None, *, outs, scratch=()):
        conv_core.conv_transpose(x, w, b, outs[0], self.plan, scratch[0] if scratch else None,
                                 self.activation)

    def band_granule(self):
        """Bands only where each input row makes its own `stride` output rows (kernel = stride, no
        padding or dilation along the rows: a U-Net's upsampling)."""
        w = self.window
        s = w.strides[0]
        if (len(w.in_spatial) != 2 or w.kernel[0] != s or w.dilations[0] != 1 or w.pads_begin[0]
                or w.pads_end[0] or w.in_spatial[0] != w.out_spatial[0] * s):
            return 0
        return s

    def band(self, r0, r1, scratch_limit, plans=None):
        w, s = self.window, self.window.strides[0]
        a, b = r0 // s, -(-r1 // s)
        window = replace(w, in_spatial=((b - a) * s,) + w.in_spatial[1:], out_spatial=(b - a,) + w.out_spatial[1:])
        plan = bands.cached(plans, (window, scratch_limit), lambda: conv_core.conv_transpose_plan(
            window, self.plan.c_in, self.plan.c_out, self.group, self.plan.dtype, scratch_limit=scratch_limit))
        activation = self.activation

        def run(args, out, scratch):
            conv_core.conv_transpose(args[0], args[1], args[2] if len(args) > 2 else None, out, plan, scratch,
                                     activation)
        return bands.Band((r0, r1), ((a, b),) + (None,) * (len(self.node.inputs) - 1), run, plan.scratch_elems)
