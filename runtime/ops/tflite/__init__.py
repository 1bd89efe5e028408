"""TFLite builtin operators (domain "tflite", and mediapipe's custom ops in "tflite.custom"), one
module per family, each a thin front end over the numeric core of the ONNX family it shares
(elementwise.py's Binary and Div, softmax.py, resize.py's separable plan, conv_core.py):

    common       domain, registration, tensor types, fused activations
    elementwise  binary and unary ops, comparisons, PRELU
    reduce       MEAN, SUM, REDUCE_*, ARG_MAX, ARG_MIN
    tensor       reshapes, concatenation, splits, slices, gather, pad, tile, cast, shape, fill
    nn           FULLY_CONNECTED, SOFTMAX, LOG_SOFTMAX, RESIZE_*
    conv         CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, pooling
    quantize     DEQUANTIZE and DENSIFY of weights, once at PREPARE
"""

from . import conv, elementwise, nn, quantize, reduce, tensor  # noqa: F401 - they register their kernels
