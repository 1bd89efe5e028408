"""Layers for building ONNX test models with random weights: a graph under construction.

`GraphBuilder` appends nodes and initializers to lists and remembers the channel count of each
convolutional tensor, so a net is written as a chain of calls (`conv`, `pool`, `linear`, ...).
Weights come from one seeded generator and are scaled by fan-in (He for layers followed by Relu,
1/sqrt(fan_in) otherwise), so activations stay O(1) through a deep net without training.
"""

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
# Opset 17 needs IR 8; declaring the lowest IR that allows it keeps the files loadable by older runtimes.
IR_VERSION = 8


class GraphBuilder:
    """Nodes, initializers and per-tensor channel counts of a graph being built."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.initializers = []
        self.channels = {}
        self._names = set()
        self._constants = {}

    # -- plumbing -------------------------------------------------------------------------------

    def _unique(self, name):
        if name in self._names:
            raise ValueError(f"duplicate name {name!r} in the graph being built")
        self._names.add(name)
        return name

    def initializer(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.asarray(array), self._unique(name)))
        return name

    def constant(self, value, dtype=np.float32):
        """A shared scalar or vector initializer, one per distinct value (Clip bounds, GELU's 0.5, shapes)."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.initializer(f"const_{len(self._constants)}", array)
        return self._constants[key]

    def random(self, name, shape, std, mean=0.0):
        array = self.rng.standard_normal(shape, dtype=np.float32)
        array *= np.float32(std)
        array += np.float32(mean)
        return self.initializer(name, array)

    def op(self, op_type, inputs, name, **attrs):
        """Append one node with a single output named after the node; returns the output name."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [self._unique(name)], name=name, **attrs))
        return name

    # -- convolutional layers ---------------------------------------------------------------------

    def act(self, x, kind, name):
        """Relu, Relu6 as Clip(0, 6) with min/max inputs (opset 11+ form), or no activation."""
        if kind is None:
            return x
        if kind == "relu":
            y = self.op("Relu", [x], name)
        elif kind == "relu6":
            y = self.op("Clip", [x, self.constant(0.0), self.constant(6.0)], name)
        else:
            raise ValueError(f"unknown activation {kind!r}")
        if x in self.channels:
            self.channels[y] = self.channels[x]
        return y

    def batchnorm(self, x, name, gamma_scale=1.0):
        """Inference BatchNormalization with non-trivial statistics, close to identity on average.

        gamma ~ sqrt(var) keeps each channel's scale near 1, so a deep stack neither grows nor
        vanishes; a residual branch passes gamma_scale < 1 so the sum with its skip stays O(1).
        """
        c = self.channels[x]
        var = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        gamma = np.sqrt(var) * self.rng.uniform(0.8, 1.2, c).astype(np.float32) * np.float32(gamma_scale)
        beta = self.rng.normal(0.0, 0.1, c).astype(np.float32)
        mean = self.rng.normal(0.0, 0.1, c).astype(np.float32)
        inputs = [x] + [self.initializer(f"{name}.{p}", a)
                        for p, a in (("scale", gamma), ("bias", beta), ("mean", mean), ("var", var))]
        y = self.op("BatchNormalization", inputs, name, epsilon=1e-5)
        self.channels[y] = c
        return y

    def conv(self, x, cout, kernel, name, stride=1, pad=None, group=1, bn=True, act="relu",
             gamma_scale=1.0):
        """Conv (+ BatchNormalization) (+ activation), each a separate node as frameworks export it.

        With bn the Conv has no bias, as in torchvision; without bn it has a small random bias.
        """
        cin = self.channels[x]
        pad = kernel // 2 if pad is None else pad
        fan_in = cin // group * kernel * kernel
        std = math.sqrt((2.0 if act else 1.0) / fan_in)
        inputs = [x, self.random(f"{name}.weight", (cout, cin // group, kernel, kernel), std)]
        if not bn:
            inputs.append(self.random(f"{name}.bias", (cout,), 0.1))
        y = self.op("Conv", inputs, name, kernel_shape=[kernel, kernel], strides=[stride, stride],
                    pads=[pad] * 4, group=group)
        self.channels[y] = cout
        if bn:
            y = self.batchnorm(y, f"{name}.bn", gamma_scale)
        return self.act(y, act, f"{name}.{act}")

    def conv_transpose(self, x, cout, name, kernel=2, stride=2):
        cin = self.channels[x]
        # Each output pixel of a kernel == stride ConvTranspose sees one input pixel: fan-in is cin.
        weight = self.random(f"{name}.weight", (cin, cout, kernel, kernel), math.sqrt(1.0 / cin))
        y = self.op("ConvTranspose", [x, weight, self.random(f"{name}.bias", (cout,), 0.1)], name,
                    kernel_shape=[kernel, kernel], strides=[stride, stride])
        self.channels[y] = cout
        return y

    def pool(self, x, name, kernel, stride, pad=0, ceil_mode=0):
        y = self.op("MaxPool", [x], name, kernel_shape=[kernel, kernel], strides=[stride, stride],
                    pads=[pad] * 4, ceil_mode=ceil_mode)
        self.channels[y] = self.channels[x]
        return y

    def concat(self, xs, name):
        y = self.op("Concat", xs, name, axis=1)
        self.channels[y] = sum(self.channels[x] for x in xs)
        return y

    def add(self, a, b, name):
        y = self.op("Add", [a, b], name)
        if a in self.channels:
            self.channels[y] = self.channels[a]
        return y

    def gemm(self, x, nin, nout, name, act=None):
        """Gemm with a [nout, nin] weight (transB=1, as PyTorch exports Linear) (+ activation)."""
        std = math.sqrt((2.0 if act else 1.0) / nin)
        y = self.op("Gemm", [x, self.random(f"{name}.weight", (nout, nin), std),
                             self.random(f"{name}.bias", (nout,), 0.1)], name, transB=1)
        return self.act(y, act, f"{name}.{act}")

    def classifier(self, x, classes, name="fc"):
        """GlobalAveragePool, Flatten, Gemm: the head of most image classifiers."""
        nin = self.channels[x]
        pooled = self.op("GlobalAveragePool", [x], "avgpool")
        return self.gemm(self.op("Flatten", [pooled], "flatten", axis=1), nin, classes, name)

    # -- transformer layers -----------------------------------------------------------------------

    def linear(self, x, nin, nout, name):
        """MatMul by a [nin, nout] weight + Add bias: a transformer Linear as exported to ONNX."""
        y = self.op("MatMul", [x, self.random(f"{name}.weight", (nin, nout), math.sqrt(1.0 / nin))],
                    f"{name}.matmul")
        return self.op("Add", [y, self.random(f"{name}.bias", (nout,), 0.1)], f"{name}.add")

    def layernorm(self, x, hidden, name):
        return self.op("LayerNormalization",
                       [x, self.random(f"{name}.weight", (hidden,), 0.1, mean=1.0),
                        self.random(f"{name}.bias", (hidden,), 0.1)], name, axis=-1, epsilon=1e-12)

    def gelu(self, x, name):
        """GELU written out as exporters do without a fused op: x * 0.5 * (1 + Erf(x / sqrt(2)))."""
        y = self.op("Div", [x, self.constant(math.sqrt(2.0))], f"{name}.div")
        y = self.op("Erf", [y], f"{name}.erf")
        y = self.op("Add", [y, self.constant(1.0)], f"{name}.add")
        y = self.op("Mul", [x, y], f"{name}.mul")
        return self.op("Mul", [y, self.constant(0.5)], name)

    # -- the model --------------------------------------------------------------------------------

    def model(self, graph_name, inputs, output, output_name="output"):
        """A ModelProto with inputs [(name, TensorProto type, shape)] and one output, renamed output_name.

        The output's shape is taken from ONNX shape inference, so a builder never computes it by hand.
        """
        next(n for n in self.nodes if n.output[0] == output).output[0] = output = output_name
        graph = helper.make_graph(
            self.nodes, graph_name,
            [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
            [helper.make_empty_tensor_value_info(output)], self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="nnrun_tools.build_models", ir_version=IR_VERSION)
        # Inference sees float weights as typed inputs: serializing hundreds of MB for it is slow.
        weights = [helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                   for t in self.initializers if t.data_type == TensorProto.FLOAT]
        typed = helper.make_graph(self.nodes, graph_name, list(graph.input) + weights, list(graph.output),
                                  [t for t in self.initializers if t.data_type != TensorProto.FLOAT])
        typed_model = helper.make_model(typed, opset_imports=model.opset_import, ir_version=IR_VERSION)
        inferred = onnx.shape_inference.infer_shapes(typed_model, strict_mode=True)
        out_type = next(v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)
                        if v.name == output and v.type.tensor_type.HasField("shape"))
        model.graph.output[0].type.CopyFrom(out_type)
        return model
