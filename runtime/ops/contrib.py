"""onnxruntime's float contrib ops (domain com.microsoft), as its graph optimizer and transformer
optimizer write them: FusedConv, FusedGemm, FusedMatMul, the GELU family (Gelu, FastGelu, BiasGelu,
QuickGelu), BiasAdd, the layer norms (SkipLayerNormalization, SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization, LayerNormalization) and EmbedLayerNormalization.

These are front ends: the convolution, GEMM, GELU formulas, activations and row standardisation
are conv.py's, gemm.py's, elementwise.py's, activation.py's and normalization.py's. onnxruntime
registers LayerNormalization and SimplifiedLayerNormalization in the ONNX domain from version 1
(before ONNX had LayerNormalization, opset 17), and its transformer optimizer writes them there:
they are registered there too, and in com.microsoft. Attention and MultiHeadAttention are in
contrib_attention.py, the quantized ops in contrib_quantized.py.
"""


import numpy as np

from ..errors import InputError
from . import activation, blas
from .conv import Conv
from .elementwise import Gelu, Unary, broadcast_shape
from .gemm import Gemm
from .normalization import LayerNormalization, _standardize
from .normalization_extra import RMSNormalization, rms_rows
from .registry import FUSED, Inferred, Kernel, TensorInfo, register

MS = "com.microsoft"
F32 = np.dtype(np.float32)

# onnxruntime's activation names -> (the fused activation's op type, the names of its params).
ACTIVATIONS = {"Relu": ("Relu", ()), "Tanh": ("Tanh", ()), "Sigmoid": ("Sigmoid", ()),
               "LeakyRelu": ("LeakyRelu", ("alpha",)), "Clip": ("Clip", ("min", "max")),
               "HardSigmoid": ("HardSigmoid", ("alpha", "beta")), "HardSwish": ("HardSwish", ())}


def fused_activation(kernel, name, params):
    """An onnxruntime activation (name, its parameters in order) as activation.py's (op type, params)."""
    if not name:
        return None
    name = name.decode() if isinstance(name, bytes) else name
    if name not in ACTIVATIONS:
        kernel.fail(f"activation {name!r} is not one of {sorted(ACTIVATIONS)}")
    op_type, names = ACTIVATIONS[name]
    params = list(params or ())
    if len(params) < len(names) and op_type != "LeakyRelu":
        kernel.fail(f"activation {name} takes the parameters {list(names)}, got {params}")
    return op_type, dict(zip(names, map(float, params)))


# --------------------------------------------------------------------------- fused producers


@register("FusedConv", since=1, domain=MS)
class FusedConv(Conv):
    """Conv, plus Z (a tensor of the output's shape) added, then `activation`: act(conv + B + Z)."""

    attributes = {**Conv.attributes, "activation": "", "activation_params": None}

    def decode(self):
        super().decode()
        self.activation = fused_activation(self, self.node.attrs.get("activation"),
                                           self.node.attrs.get("activation_params"))

    def infer(self, x, w, b=None, z=None):
        inferred = super().infer(x, w, b)
        if z is not None and (tuple(z.shape) != tuple(inferred[0].shape) or z.dtype != x.dtype):
            self.fail(f"Z {list(z.shape)} {z.dtype} must be the output's {list(inferred[0].shape)} {x.dtype}")
        return inferred

    def prepare(self, x, w, b=None, z=None):
        return super().prepare(x, w, b)

    def run(self, x, w, b=None, z=None, *, outs, scratch=(), stream=None):
        if z is None:
            return super().run(x, w, b, outs=outs, scratch=scratch, stream=stream)
        self._conv(x, w, b, outs[0], self.plan, scratch[0] if scratch else None, stream, activation=None)
        np.add(outs[0], z, out=outs[0])
        activation.apply_activation(outs[0], self.activation)

    def band_granule(self):
        return 0 if len(self.node.inputs) > 3 and self.node.inputs[3] else super().band_granule()


@register("FusedGemm", since=1, domain=MS)
class FusedGemm(Gemm):
    """Gemm, then `activation` (its parameters activation_alpha, _beta)."""

    attributes = {**Gemm.attributes, "activation": "", "activation_alpha": None, "activation_beta": None,
                  "activation_gamma": None}

    def decode(self):
        params = [p for p in (self.activation_alpha, self.activation_beta) if p is not None]
        self.activation = fused_activation(self, self.node.attrs.get("activation"), params)


@register("FusedMatMul", since=1, domain=MS)
class FusedMatMul(Kernel):
    """alpha * A' @ B' with numpy.matmul's broadcasting. transA / transB swap the last two axes;
    transBatchA / transBatchB move axis 0 to just before the last: (d0, d1, ..., dk, n) is read as
    (d1, ..., dk, d0, n) (then transposed when trans is set too)."""

    attributes = {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}

    def operand_axes(self, rank, trans, trans_batch, what):
        """The axes permutation that makes the operand as it is multiplied (None: as it lies)."""
        if not (trans or trans_batch):
            return None
        if rank < 2 or (trans_batch and rank < 3):
            self.fail(f"{what} of rank {rank} cannot be transposed as asked")
        axes = list(range(rank))
        if trans_batch:
            axes = axes[1:-1] + [0, rank - 1]
        if trans:
            axes[-2], axes[-1] = axes[-1], axes[-2]
        return tuple(axes)

    def infer(self, a, b):
        if a.dtype != b.dtype or a.dtype.kind != "f":
            self.fail(f"A ({a.dtype}) and B ({b.dtype}) must share one floating type")
        a_axes = self.operand_axes(len(a.shape), self.transA, self.transBatchA, "A")
        b_axes = self.operand_axes(len(b.shape), self.transB, self.transBatchB, "B")
        a_shape = tuple(a.shape[k] for k in a_axes) if a_axes else tuple(a.shape)
        b_shape = tuple(b.shape[k] for k in b_axes) if b_axes else tuple(b.shape)
        a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
        b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
        if a2[-1] != b2[-2]:
            self.fail(f"inner dimensions differ: {list(a_shape)} @ {list(b_shape)}")
        batch = broadcast_shape(self.node, a2[:-2], b2[:-2])
        shape = batch + (a2[-2],) * (len(a_shape) > 1) + (b2[-1],) * (len(b_shape) > 1)
        return Inferred([TensorInfo(shape, a.dtype)], a_axes=a_axes, b_axes=b_axes)

    def run(self, a, b, *, outs, scratch):
        a = a.transpose(self.a_axes) if self.a_axes else a
        b = b.transpose(self.b_axes) if self.b_axes else b
        blas.matmul(a, b, outs[0])
        if self.alpha != 1:
            np.multiply(outs[0], outs[0].dtype.type(self.alpha), out=outs[0])


@register("BiasAdd", since=1, domain=MS)
class BiasAdd(Kernel):
    """Y = X + bias + skip; X and skip (N, S, C), bias (C)."""

    def infer(self, x, bias, skip):
        if len(x.shape) != 3 or tuple(skip.shape) != tuple(x.shape) or tuple(bias.shape) != (x.shape[2],):
            self.fail(f"X {list(x.shape)} and skip {list(skip.shape)} must be (N, S, C), bias "
                      f"{list(bias.shape)} (C)")
        return [TensorInfo(tuple(x.shape), x.dtype)]

    def run(self, x, bias, skip, *, outs, scratch):
        np.add(x, bias, out=outs[0])
        np.add(outs[0], skip, out=outs[0])


# --------------------------------------------------------------------------- GELU family


register("Gelu", 1, MS)(Gelu)  # the erf form; its `approximate` is "none"


class BiasedGelu(Gelu):
    """GELU of X + bias (bias optional, broadcast), the sum made in scratch."""

    attributes = {}

    def infer(self, x, bias=None):
        if bias is not None and bias.dtype != x.dtype:
            self.fail(f"bias ({bias.dtype}) and X ({x.dtype}) must share one type")
        shape = tuple(x.shape) if bias is None else broadcast_shape(self.node, x.shape, bias.shape)
        inferred = super().infer(TensorInfo(shape, x.dtype))
        del inferred.derived["shapes_"]  # two inputs: no bands
        return inferred

    def prepare(self, x, bias=None):
        spec = super().prepare(TensorInfo(self.shape_of(x, bias), x.dtype))
        return spec + ([] if bias is None else [(self.shape_of(x, bias), x.dtype)])

    def shape_of(self, x, bias):
        return tuple(x.shape) if bias is None else broadcast_shape(self.node, x.shape, bias.shape)

    def run(self, x, bias=None, *, outs, scratch):
        if bias is not None:
            x = np.add(x, bias, out=scratch[-1])
            scratch = scratch[:-1]
        self.apply(x, outs[0], scratch)


@register("BiasGelu", since=1, domain=MS)
class BiasGelu(BiasedGelu):
    """gelu(A + B), the erf form."""
    approximate = "none"


@register("FastGelu", since=1, domain=MS)
class FastGelu(BiasedGelu):
    """0.5 x (1 + tanh(0.797885 x + 0.035677 x^3)) of x = X + bias: the tanh form."""
    approximate = "tanh"


@register("QuickGelu", since=1, domain=MS)
class QuickGelu(Unary):
    """x * sigmoid(alpha * x)."""

    attributes = {"alpha": 1.702}

    def apply(self, x, out, temps):
        np.multiply(x, out.dtype.type(self.alpha), out=out)
        activation.sigmoid(out, out)
        np.multiply(out, x, out=out)


# --------------------------------------------------------------------------- layer norms


register("LayerNormalization", 1)(LayerNormalization)
register("LayerNormalization", 1, MS)(LayerNormalization)
register("LayerNormalization", 1, FUSED)(LayerNormalization)  # the compiler's fuse_patterns writes it


@register("SimplifiedLayerNormalization", since=1)
class SimplifiedLayerNormalization(RMSNormalization):
    """onnxruntime's name for RMSNormalization (written for opsets before 23), with the inverse
    RMS as an optional second output (InvStdDev)."""

    def infer(self, x, scale):
        inferred = super().infer(x, scale)
        axis = inferred.derived["split"]
        stats = TensorInfo(tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis), self.stash)
        return Inferred([inferred[0], stats][:max(1, len(self.node.outputs))], split=axis)

    def run(self, x, scale, *, outs, scratch=()):
        inv_rms = self.normalize(x, scale, outs[0])
        if len(outs) > 1 and outs[1] is not None:
            np.copyto(outs[1].reshape(inv_rms.shape), inv_rms, casting="unsafe")


register("SimplifiedLayerNormalization", 1, MS)(SimplifiedLayerNormalization)


class _SkipNormalization(Kernel):
    """Normalize input + skip (+ bias) over the last axis; skip is (B, S, H), (1, S, H) or (S, H).
    Outputs: the result, the mean and inverse standard deviation (B, S, 1), and the sum."""

    attributes = {"epsilon": 1e-12}
    has_beta = True

    def infer(self, x, skip, gamma, *rest):
        beta, bias = (rest[0] if rest else None, rest[1] if len(rest) > 1 else None) if self.has_beta \
            else (None, rest[0] if rest else None)
        if len(x.shape) not in (2, 3) or x.dtype.kind != "f":
            self.fail(f"input must be a 2-D or 3-D floating tensor, not {x.dtype} {list(x.shape)}")
        if broadcast_shape(self.node, x.shape, skip.shape) != tuple(x.shape):
            self.fail(f"skip of shape {list(skip.shape)} does not broadcast to the input's {list(x.shape)}")
        hidden = x.shape[-1]
        for what, p in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            if p is not None and tuple(p.shape) != (hidden,):
                self.fail(f"{what} has shape {list(p.shape)}; expected ({hidden},)")
        stats = TensorInfo(tuple(x.shape[:-1]) + (1,), F32)
        outputs = [TensorInfo(tuple(x.shape), x.dtype), stats, stats, TensorInfo(tuple(x.shape), x.dtype)]
        return outputs[:max(1, len(self.node.outputs))]

    def prepare(self, x, *rest):
        return [(tuple(x.shape), x.dtype)]

    def run(self, x, skip, gamma, *rest, outs, scratch):
        beta, bias = (rest[0] if rest else None, rest[1] if len(rest) > 1 else None) if self.has_beta \
            else (None, rest[0] if rest else None)
        outs = tuple(outs) + (None,) * (4 - len(outs))
        total = outs[3] if outs[3] is not None else scratch[0]
        np.add(x, skip, out=total)
        if bias is not None:
            np.add(total, bias, out=total)
        rows = total.reshape(-1, x.shape[-1])
        y = outs[0].reshape(rows.shape)
        dtype = np.result_type(x.dtype, F32)
        work, mean, inv = self.normalize(rows, dtype, y)
        np.multiply(work, gamma, out=work)
        if beta is not None:
            np.add(work, beta, out=work)
        if work is not y:
            np.copyto(y, work, casting="unsafe")
        for out, stat in zip(outs[1:3], (mean, inv)):
            if out is not None:
                np.copyto(out.reshape(inv.shape), 0 if stat is None else stat, casting="unsafe")

    def normalize(self, rows, dtype, out):
        return _standardize(rows, self.epsilon, dtype, out=out)


@register("SkipLayerNormalization", since=1, domain=MS)
class SkipLayerNormalization(_SkipNormalization):
    """Inputs: input, skip, gamma, beta (optional), bias (optional)."""


@register("SkipSimplifiedLayerNormalization", since=1, domain=MS)
class SkipSimplifiedLayerNormalization(_SkipNormalization):
    """RMS normalization of input + skip (+ bias). Inputs: input, skip, gamma, bias (optional). Its
    mean output is zeros, as onnxruntime leaves it."""

    has_beta = False

    def normalize(self, rows, dtype, out):
        work, inv = rms_rows(rows, self.epsilon, dtype, out)
        return work, None, inv


@register("EmbedLayerNormalization", since=1, domain=MS)
class EmbedLayerNormalization(Kernel):
    """BERT's embeddings: word + position (+ segment) embeddings of the ids, layer-normalized.

    Inputs: input_ids, segment_ids?, word_embedding, position_embedding, segment_embedding?, gamma,
    beta, mask?, position_ids? (positions 0..S-1 when absent). Outputs: the result, mask_index
    (the count of ones of each mask row; zeros without a mask) and the sum before normalization.
    """

    attributes = {"epsilon": 1e-12, "mask_index_type": 1}

    def infer(self, input_ids, segment_ids, word, position, segment, gamma, beta, mask=None, position_ids=None):
        if len(input_ids.shape) != 2:
            self.fail(f"input_ids must be (batch, sequence), not {list(input_ids.shape)}")
        batch, seq = input_ids.shape
        hidden = word.shape[-1]
        for what, info in (("word_embedding", word), ("position_embedding", position),
                           ("segment_embedding", segment)):
            if info is not None and (len(info.shape) != 2 or info.shape[1] != hidden):
                self.fail(f"{what} has shape {list(info.shape)}; expected (n, {hidden})")
        if (segment is None) != (segment_ids is None):
            self.fail("segment_ids and segment_embedding must be given together")
        for what, info in (("segment_ids", segment_ids), ("mask", mask)):
            if info is not None and tuple(info.shape) != (batch, seq):
                self.fail(f"{what} has shape {list(info.shape)}; expected {[batch, seq]}")
        if position_ids is not None and tuple(position_ids.shape) not in ((batch, seq), (1, seq)):
            self.fail(f"position_ids has shape {list(position_ids.shape)}; expected {[batch, seq]} or {[1, seq]}")
        out = TensorInfo((batch, seq, hidden), word.dtype)
        return [out, TensorInfo((batch,), np.dtype(np.int32)), out][:max(1, len(self.node.outputs))]

    def run(self, input_ids, segment_ids, word, position, segment, gamma, beta, mask=None, position_ids=None,
            *, outs, scratch):
        batch, seq = input_ids.shape
        outs = tuple(outs) + (None,) * (3 - len(outs))
        if position_ids is None:
            position_ids = np.arange(seq)
        total = self.lookup(word, input_ids, "input_ids")
        total += self.lookup(position, position_ids, "position_ids")
        if segment is not None:
            total += self.lookup(segment, segment_ids, "segment_ids")
        if outs[2] is not None:
            np.copyto(outs[2], total)
        rows = total.reshape(-1, total.shape[-1])
        work, _, _ = _standardize(rows, self.epsilon, np.result_type(total.dtype, F32), out=rows)
        np.multiply(work, gamma, out=work)
        np.add(work, beta, out=work)
        np.copyto(outs[0].reshape(rows.shape), work, casting="unsafe")
        if outs[1] is not None:
            if mask is None:
                outs[1].fill(0)
            else:
                np.sum(mask == 1, axis=1, out=outs[1])

    @staticmethod
    def lookup(table, ids, what):
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise InputError(f"{what} must lie in [0, {table.shape[0]}); got values in "
                             f"[{ids.min()}, {ids.max()}]")
        return table[ids]
