"""TFLite FULLY_CONNECTED, SOFTMAX, LOG_SOFTMAX and RESIZE_*: the row view of a fully connected
layer, and the ONNX softmax kernels and separable resize plan (resize.py) behind thin front ends.
"""


import numpy as np

from .. import activation as act
from ..registry import Inferred, Kernel, TensorInfo
from ..resize import ResizeCore
from ..shape import int_list
from ..softmax import LogSoftmax, Softmax
from .common import fused_activation, tfl

# --------------------------------------------------------------------------- fully connected


@tfl("FULLY_CONNECTED")
class FullyConnected(Kernel):
    """y = x W^T + b over the last axis; W [O, I] is used as it lies (its transpose is a view)."""

    attributes = {"fused_activation_function": "NONE", "weights_format": "DEFAULT",
                  "keep_num_dims": False, "asymmetric_quantize_inputs": False}

    def decode(self):
        self.activation = fused_activation(self, self.fused_activation_function)
        if self.weights_format != "DEFAULT":
            self.fail(f"weights_format {self.weights_format!r} is not supported")

    def infer(self, x, w, bias=None):
        if len(w.shape) != 2:
            self.fail(f"weights of shape {w.shape} are not [O, I]")
        units, depth = w.shape
        if depth == 0 or x.size % depth:
            self.fail(f"input of shape {x.shape} does not split into rows of {depth}")
        if bias is not None and bias.size != units:
            self.fail(f"bias of {bias.size} values for {units} units")
        if self.keep_num_dims:
            if x.shape[-1] != depth:
                self.fail(f"input of shape {x.shape} does not end in {depth}")
            shape = tuple(x.shape[:-1]) + (units,)
        else:
            shape = (x.size // depth, units)
        rows = (x.size // depth, depth)
        return Inferred([TensorInfo(shape, x.dtype)], rows=rows)

    def run(self, x, w, bias=None, *, outs, scratch):
        out = outs[0].reshape(-1, w.shape[0])
        np.matmul(x.reshape(self.rows), w.T, out=out)
        if bias is not None:
            np.add(out, bias.reshape(-1), out=out)
        act.apply_activation(out, self.activation)


# --------------------------------------------------------------------------- softmax


@tfl("SOFTMAX")
class TflSoftmax(Softmax):
    """Softmax over the last axis of exp(beta * x)."""

    attributes = {"beta": 1.0}
    coerce_2d = False

    def decode(self):
        self.axis = -1

    def run(self, x, *, outs, scratch):
        if outs[0].size == 0:
            return
        if self.beta != 1.0:
            np.multiply(x, x.dtype.type(self.beta), out=outs[0])
            x = outs[0]
        self.compute(x.reshape(self.view), outs[0].reshape(self.view), scratch)


@tfl("LOG_SOFTMAX")
class TflLogSoftmax(LogSoftmax):
    attributes = {}
    coerce_2d = False

    def decode(self):
        self.axis = -1


# --------------------------------------------------------------------------- resize


class TflResize(ResizeCore):
    """RESIZE_* on NHWC with a constant [height, width] size, on Resize's separable plan."""

    attributes = {"align_corners": False, "half_pixel_centers": False}

    def decode(self):
        super().decode()

    def geometry(self, x, size):
        if len(x.shape) != 4:
            self.fail(f"input of shape {x.shape} is not NHWC")
        height, width = int_list(self.node, size, "size")
        n, h, w, c = x.shape
        scales = [np.float32(1), np.float32(height) / np.float32(h) if h else np.float32(1),
                  np.float32(width) / np.float32(w) if w else np.float32(1), np.float32(1)]
        return [n, height, width, c], scales, None


@tfl("RESIZE_BILINEAR")
class ResizeBilinear(TflResize):
    mode = "linear"

    def decode(self):
        # TFLite's bilinear clamps the source coordinate into the input, as ONNX's linear does.
        self.coordinate_transformation_mode = ("align_corners" if self.align_corners else
                                               "half_pixel" if self.half_pixel_centers else "asymmetric")
        super().decode()


@tfl("RESIZE_NEAREST_NEIGHBOR")
class ResizeNearest(TflResize):
    """floor(x * in/out), or floor((x + 0.5) * in/out) with half pixel centers; align_corners rounds."""

    mode = "nearest"
    coordinate_modes = ResizeCore.coordinate_modes + ("tf_half_pixel_for_nn",)

    def decode(self):
        if self.align_corners and self.half_pixel_centers:
            self.fail("align_corners with half_pixel_centers is not supported")
        if self.align_corners:
            self.coordinate_transformation_mode, self.nearest_mode = "align_corners", "round_prefer_ceil"
        elif self.half_pixel_centers:
            self.coordinate_transformation_mode, self.nearest_mode = "tf_half_pixel_for_nn", "floor"
        else:
            self.coordinate_transformation_mode, self.nearest_mode = "asymmetric", "floor"
        super().decode()
