"""onnxruntime's Attention and MultiHeadAttention (domain com.microsoft), as its transformer optimizer
writes them for BERT-like encoders.

Both are front ends of attention.py's Attention (ONNX opset 23): they make Q, K and V (Attention
projects its input with merged weights; MultiHeadAttention adds the bias to the given Q, K, V),
turn their masks into one additive bias, and hand those to its kernel. onnxruntime masks by adding
`mask_filter_value` (-10000 by default), not -inf: a query whose keys are all masked attends to all
of them evenly, as it does there. The mask formats:

- (batch): the end of each row's keys (right padding); (2 * batch): the ends, then the starts;
- (batch, total) or (batch, sequence, total): 1 keeps a key, 0 masks it;
- (batch, 1, max, max): a causal mask cut to (sequence, total) at the past length.

`unidirectional` masks the keys after each query; `attention_bias` (B or 1, heads or 1, S, total)
is added too. Attention's `past` / `present` hold keys and values stacked: (2, B, heads, T, head).
"""

import numpy as np

from . import blas
from .attention import Attention as ScaledDotProduct
from .registry import REQUIRED, Inferred, TensorInfo, register

MS = "com.microsoft"


class _ContribAttention(ScaledDotProduct):
    """What Attention and MultiHeadAttention share: attributes, the mask as a bias, the core's calls."""

    attributes = {"num_heads": REQUIRED, "mask_filter_value": -10000.0, "scale": 0.0, "unidirectional": 0}

    def decode(self):
        if self.num_heads <= 0:
            self.fail(f"num_heads {self.num_heads} must be positive")
        # The scaled dot product's attributes: heads from the 3-D inputs; scale 0 is the default.
        self.q_num_heads = self.kv_num_heads = self.num_heads
        self.scale = self.scale or None
        self.is_causal = 0
        self.softcap = 0.0
        self.qk_matmul_output_mode = 0
        self.softmax_precision = None
        super().decode()

    def core_infer(self, q, k, v, past_key, past_value, mask, attention_bias):
        """The core's shape rule for 3-D Q, K, V, its additive bias standing for the masks; what
        our run needs of the masks is derived too."""
        batch, seq = q.shape[:2]
        past = 0 if past_key is None else past_key.shape[2]
        total = past + k.shape[1]
        if mask is not None:
            self.check_mask(mask, batch, seq, total)
        if attention_bias is not None:
            shape = tuple(attention_bias.shape)
            if len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, self.num_heads) \
                    or shape[2:] != (seq, total):
                self.fail(f"attention_bias of shape {list(attention_bias.shape)} is not "
                          f"(batch or 1, heads or 1, {seq}, {total})")
        biased = mask is not None or attention_bias is not None or self.unidirectional
        bias = TensorInfo((batch, self.num_heads, seq, total), q.dtype) if biased else None
        core = super().infer(q, k, v, bias, past_key, past_value)
        return core, dict(core.derived, biased=biased)

    def check_mask(self, mask, batch, seq, total):
        shape = tuple(mask.shape)
        if mask.dtype.kind not in "iub":
            self.fail(f"the mask must be an integer tensor, not {mask.dtype}")
        if shape in ((batch,), (2 * batch,), (batch, total), (batch, seq, total)):
            return
        if len(shape) == 4 and shape[:2] == (batch, 1) and shape[2] == shape[3] and shape[3] >= total:
            return
        self.fail(f"mask of shape {list(shape)} is none of (batch), (2 * batch), (batch, {total}), "
                  f"(batch, {seq}, {total}), (batch, 1, max, max)")

    def core_prepare(self, q, k, v, past_key, past_value):
        bias = (TensorInfo((q.shape[0], self.num_heads, q.shape[1], self.dims[4] + self.dims[5]), q.dtype)
                if self.biased else None)
        return super().prepare(q, k, v, bias, past_key, past_value)

    def additive_bias(self, mask, attention_bias, batch, seq, total, dtype):
        """The masks as one bias broadcasting to (batch, heads, seq, total), or None."""
        filler = dtype.type(self.mask_filter_value)
        bias = None
        if mask is not None:
            keep = self.kept_keys(mask, batch, seq, total)
            bias = np.where(keep, dtype.type(0), filler)
        if self.unidirectional:
            past = total - seq
            future = np.arange(total)[None, :] > np.arange(seq)[:, None] + past
            # Added to the mask, as onnxruntime does: in a row whose past keys are all masked, the
            # future ones weigh less still.
            causal = np.where(future, filler, dtype.type(0))[None, None]
            bias = causal if bias is None else bias + causal
        if attention_bias is not None:
            bias = attention_bias.astype(dtype) if bias is None else bias + attention_bias
        return bias

    @staticmethod
    def kept_keys(mask, batch, seq, total):
        """(batch, 1, seq or 1, total) bools: the keys each query may attend to."""
        keys = np.arange(total)
        if mask.ndim == 1:
            ends = mask[:batch].astype(np.int64).reshape(-1, 1)
            keep = keys[None, :] < ends
            if mask.shape[0] == 2 * batch:
                keep &= keys[None, :] >= mask[batch:].astype(np.int64).reshape(-1, 1)
            return keep[:, None, None, :]
        if mask.ndim == 2:
            return (mask != 0)[:, None, None, :]
        if mask.ndim == 3:
            return (mask != 0)[:, None, :, :]
        past = total - seq
        return (mask[:, :, past:past + seq, :total] != 0)

    def attend(self, q, k, v, past_key, past_value, mask, attention_bias, outs, scratch):
        batch, seq = q.shape[:2]
        total = self.dims[4] + self.dims[5]
        bias = self.additive_bias(mask, attention_bias, batch, seq, total, self.dtype) if self.biased else None
        if bias is not None:
            bias = np.broadcast_to(bias, np.broadcast_shapes(bias.shape, (1, 1, seq, total)))
        super().run(q, k, v, bias, past_key, past_value, outs=outs, scratch=scratch)


@register("Attention", since=1, domain=MS)
class Attention(_ContribAttention):
    """Self-attention of `input` projected by merged Q/K/V weights (input_hidden, Dq + Dk + Dv)
    and bias. Inputs: input, weights, bias?, mask_index?, past?, attention_bias?; outputs: output,
    present?. qkv_hidden_sizes gives (Dq, Dk, Dv) when they differ."""

    attributes = {**_ContribAttention.attributes, "qkv_hidden_sizes": None, "past_present_share_buffer": 0,
                  "do_rotary": 0}

    def decode(self):
        if self.past_present_share_buffer or self.do_rotary:
            self.fail("past_present_share_buffer and do_rotary are not supported")
        super().decode()

    def infer(self, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
              past_sequence_length=None):
        if len(x.shape) != 3 or len(weights.shape) != 2 or weights.shape[0] != x.shape[2]:
            self.fail(f"input {list(x.shape)} must be (batch, sequence, hidden) and weights "
                      f"{list(weights.shape)} (hidden, Dq + Dk + Dv)")
        sizes = tuple(self.qkv_hidden_sizes) if self.qkv_hidden_sizes else (weights.shape[1] // 3,) * 3
        if len(sizes) != 3 or sum(sizes) != weights.shape[1] or sizes[0] != sizes[1]:
            self.fail(f"hidden sizes {list(sizes)} do not split weights {list(weights.shape)} into Q, K, V")
        if bias is not None and tuple(bias.shape) != (weights.shape[1],):
            self.fail(f"bias of shape {list(bias.shape)} must be ({weights.shape[1]},)")
        batch, seq = x.shape[:2]
        q, k, v = (TensorInfo((batch, seq, d), x.dtype) for d in sizes)
        past_key = past_value = None
        if past is not None:
            if len(past.shape) != 5 or past.shape[:3] != (2, batch, self.num_heads):
                self.fail(f"past of shape {list(past.shape)} is not (2, {batch}, {self.num_heads}, past, head)")
            past_key = past_value = TensorInfo(tuple(past.shape[1:]), past.dtype)
        core, derived = self.core_infer(q, k, v, past_key, past_value, mask_index, attention_bias)
        outputs = [core[0]]
        if len(self.node.outputs) > 1 and self.node.outputs[1]:
            outputs.append(TensorInfo((2,) + tuple(core[1].shape), x.dtype))
        return Inferred(outputs, sizes=sizes, **derived)

    def prepare(self, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                past_sequence_length=None):
        batch, seq = x.shape[:2]
        q, k, v = (TensorInfo((batch, seq, d), x.dtype) for d in self.sizes)
        pk = None if past is None else TensorInfo(tuple(past.shape[1:]), past.dtype)
        spec = self.core_prepare(q, k, v, pk, pk)
        return spec + [((batch, seq, sum(self.sizes)), x.dtype)]

    def run(self, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
            past_sequence_length=None, *, outs, scratch):
        qkv = scratch[-1]
        blas.matmul(x, weights, qkv)
        if bias is not None:
            np.add(qkv, bias, out=qkv)
        dq, dk, _ = self.sizes
        q, k, v = qkv[..., :dq], qkv[..., dq:dq + dk], qkv[..., dq + dk:]
        present = outs[1] if len(outs) > 1 else None
        core_outs = (outs[0],) + ((None, None) if present is None else (present[0], present[1]))
        self.attend(q, k, v, None if past is None else past[0], None if past is None else past[1],
                    mask_index, attention_bias, core_outs, scratch[:-1])


@register("MultiHeadAttention", since=1, domain=MS)
class MultiHeadAttention(_ContribAttention):
    """Attention of query (B, S, D) to key (B, L, D) and value (B, L, Dv), each plus its part of
    `bias` (D + D + Dv). Inputs: query, key, value, bias?, key_padding_mask?, attention_bias?,
    past_key?, past_value? (B, heads, P, head); outputs: output, present_key?, present_value?."""

    def infer(self, query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
              past_key=None, past_value=None, *rest):
        if key is None or value is None or len(query.shape) != 3 or len(key.shape) != 3 or len(value.shape) != 3:
            self.fail("only 3-D query, key and value are supported (no packed QKV or KV, no key in "
                      "the past's layout)")
        if any(r is not None for r in rest):
            self.fail("past_sequence_length and cache_indirection are not supported")
        d, dv = query.shape[2], value.shape[2]
        if bias is not None and tuple(bias.shape) != (2 * d + dv,):
            self.fail(f"bias of shape {list(bias.shape)} must be ({2 * d + dv},)")
        core, derived = self.core_infer(query, key, value, past_key, past_value, key_padding_mask, attention_bias)
        outputs = [core[0], core[1], core[2]][:max(1, len(self.node.outputs))]
        with_bias = bias is not None
        return Inferred(outputs, with_bias=with_bias, **derived)

    def prepare(self, query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                past_key=None, past_value=None, *rest):
        spec = self.core_prepare(query, key, value, past_key, past_value)
        if self.with_bias:
            spec += [(tuple(query.shape), query.dtype), (tuple(key.shape), key.dtype),
                     (tuple(value.shape), value.dtype)]
        return spec

    def run(self, query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
            past_key=None, past_value=None, *rest, outs, scratch):
        if self.with_bias:
            d = query.shape[2]
            q, k, v = scratch[-3:]
            scratch = scratch[:-3]
            np.add(query, bias[:d], out=q)
            np.add(key, bias[d:2 * d], out=k)
            np.add(value, bias[2 * d:], out=v)
        else:
            q, k, v = query, key, value
        outs = tuple(outs) + (None,) * (3 - len(outs))
        self.attend(q, k, v, past_key, past_value, key_padding_mask, attention_bias, outs, scratch)
