"""Attention (opsets 23, 24, 25) and RotaryEmbedding (opset 23).

Attention is scaled dot-product attention over (batch, heads, sequence, head_size)
tensors, or 3-D (batch, sequence, heads * head_size) ones split by `q_num_heads` /
`kv_num_heads`. Grouped-query attention never repeats K and V: the G query heads
that share one key/value head are laid out as one (G * q_sequence) block of rows,
so each key/value head is one BLAS matmul against all of its queries. The additive
bias (attn_mask, causal frontier, sliding window, padding of nonpad_kv_seqlen) is
built at its broadcast shape, never at the scores' shape. A query row whose bias is
-inf everywhere is fully masked and yields zeros (the spec's errata), not NaN.
Half-precision inputs are computed in float32 and cast back.

The optional fourth output follows onnx's reference: the scores after softcap
(modes 0 and 1), after the bias (2) or after softmax (3).
"""

import math

import numpy as np

from . import blas
from .registry import Inferred, Kernel, TensorInfo, register
from .shape import onnx_dtype

_F32 = np.dtype(np.float32)


def _compute_dtype(dtype):
    """float32 for the half types (numpy has no fast half GEMM), else the dtype."""
    return _F32 if dtype.itemsize < 4 else dtype


def exp_rows(scores, row, ones):
    """exp(scores - row max) in place, row sums in `row` (..., 1) by a matrix-vector product
    with `ones`; a row of -inf has its max taken as 0, so it is zeros and sums to 0."""
    np.maximum.reduce(scores, axis=-1, keepdims=True, out=row)
    np.copyto(row, 0, where=np.isneginf(row))
    np.subtract(scores, row, out=scores)
    np.exp(scores, out=scores)
    np.matmul(scores, ones, out=row[..., 0])


class Attention(Kernel):
    attributes = {"is_causal": 0, "kv_num_heads": 0, "q_num_heads": 0, "qk_matmul_output_mode": 0,
                  "scale": None, "softcap": 0.0, "softmax_precision": None,
                  "left_window_size": -1, "right_window_size": -1}
    windowed = False  # opset 25 adds the sliding window

    def decode(self):
        if self.qk_matmul_output_mode not in (0, 1, 2, 3):
            self.fail(f"qk_matmul_output_mode {self.qk_matmul_output_mode} is not 0, 1, 2 or 3")
        if not self.windowed:
            self.left_window_size = self.right_window_size = -1
        if self.left_window_size < -1 or self.right_window_size < -1:
            self.fail("left_window_size and right_window_size must be -1 or non-negative")
        self.precision = (None if self.softmax_precision is None
                          else onnx_dtype(self.node, self.softmax_precision, "softmax_precision"))

    def infer(self, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        rank = len(q.shape)
        if rank not in (3, 4) or len(k.shape) != rank or len(v.shape) != rank:
            self.fail(f"Q, K and V must all be 3-D or all 4-D, not {q.shape}, {k.shape}, {v.shape}")
        if (past_key is None) != (past_value is None):
            self.fail("past_key and past_value must be given together")
        if nonpad_kv_seqlen is not None and past_key is not None:
            self.fail("nonpad_kv_seqlen cannot be combined with past_key / past_value")
        if rank == 3:
            hq, hkv = self.q_num_heads, self.kv_num_heads
            if hq <= 0 or hkv <= 0:
                self.fail("3-D inputs need positive q_num_heads and kv_num_heads")
            batch, sq, q_hidden = q.shape
            skv = k.shape[1]
            if q_hidden % hq or k.shape[2] % hkv or v.shape[2] % hkv:
                self.fail(f"hidden sizes {q_hidden}, {k.shape[2]}, {v.shape[2]} do not divide "
                          f"into {hq} / {hkv} heads")
            d, dk, dv = q_hidden // hq, k.shape[2] // hkv, v.shape[2] // hkv
            if v.shape[:2] != (batch, skv) or k.shape[0] != batch:
                self.fail(f"K {k.shape} and V {v.shape} do not match Q {q.shape}")
        else:
            batch, hq, sq, d = q.shape
            _, hkv, skv, dk = k.shape
            dv = v.shape[3]
            if k.shape[0] != batch or v.shape[:3] != (batch, hkv, skv):
                self.fail(f"K {k.shape} and V {v.shape} do not match Q {q.shape}")
        if dk != d:
            self.fail(f"query head size {d} differs from key head size {dk}")
        if hkv <= 0 or hq % hkv:
            self.fail(f"q_num_heads {hq} is not a multiple of kv_num_heads {hkv}")
        past = 0
        if past_key is not None:
            past = past_key.shape[2]
            if (tuple(past_key.shape) != (batch, hkv, past, d)
                    or tuple(past_value.shape) != (batch, hkv, past, dv)):
                self.fail(f"past_key {past_key.shape} / past_value {past_value.shape} do not match "
                          f"(batch {batch}, {hkv} heads, head sizes {d} / {dv})")
        total = past + skv
        if attn_mask is not None:
            if not 1 <= len(attn_mask.shape) <= 4 or attn_mask.shape[-1] > total:
                self.fail(f"attn_mask {attn_mask.shape} does not broadcast to "
                          f"{(batch, hq, sq, total)}")
            lead = (batch, hq, sq)[4 - len(attn_mask.shape):]
            for m, t in zip(attn_mask.shape[:-1], lead):
                if m not in (1, t):
                    self.fail(f"attn_mask {attn_mask.shape} does not broadcast to "
                              f"{(batch, hq, sq, total)}")
        if nonpad_kv_seqlen is not None and tuple(nonpad_kv_seqlen.shape) != (batch,):
            self.fail(f"nonpad_kv_seqlen has shape {nonpad_kv_seqlen.shape}, not ({batch},)")
        dims = (batch, hq, hkv, sq, skv, past, d, dv, rank)
        dtype = q.dtype
        y_shape = (batch, sq, hq * dv) if rank == 3 else (batch, hq, sq, dv)
        return Inferred([TensorInfo(y_shape, dtype),
                         TensorInfo((batch, hkv, total, d), k.dtype),
                         TensorInfo((batch, hkv, total, dv), v.dtype),
                         TensorInfo((batch, hq, sq, total), dtype)], dims=dims)

    def prepare(self, q, k, v, attn_mask=None, past_key=None, past_value=None,
                nonpad_kv_seqlen=None):
        batch, hq, hkv, sq, skv, past, d, dv, rank = self.dims
        total = past + skv
        self.dtype = _compute_dtype(q.dtype)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(d)
        self.scale_value = self.dtype.type(scale)
        self.ones = np.ones(total, self.dtype)  # row sums as BLAS matrix-vector products
        # The bias, when no input it depends on varies per run, is built once here.
        self.static_bias = None
        if all(i is None or i.value is not None for i in (attn_mask, nonpad_kv_seqlen)):
            self.static_bias = self.bias_and_masked_rows(
                None if attn_mask is None else attn_mask.value,
                None if nonpad_kv_seqlen is None else nonpad_kv_seqlen.value)
        spec = [((batch, hq, sq, d), self.dtype),       # scaled queries, grouped by kv head
                ((batch, hq, sq, total), self.dtype),   # scores, then probabilities
                ((batch, hq, sq, 1), self.dtype)]       # row max, then row sum
        if rank == 3 or self.dtype != q.dtype:
            spec.append(((batch, hq, sq, dv), self.dtype))  # Y before its 3-D / dtype relayout
        return spec

    def heads(self, x, heads):
        """A 4-D (batch, heads, seq, size) view of a 3-D or 4-D input."""
        if x.ndim == 4:
            return x
        b, s, hidden = x.shape
        return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)

    def run(self, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
            *, outs, scratch):
        batch, hq, hkv, sq, skv, past, d, dv, rank = self.dims
        total = past + skv
        group = hq // hkv
        queries, scores, row = scratch[:3]
        outs = tuple(outs) + (None,) * (4 - len(outs))  # trailing optional outputs may be absent
        keys = self.cache(self.heads(k, hkv), past_key, outs[1])
        values = self.cache(self.heads(v, hkv), past_value, outs[2])
        if keys.dtype != self.dtype:
            keys, values = keys.astype(self.dtype), values.astype(self.dtype)

        # Query heads h*G .. h*G+G-1 share key/value head h: a (G * sq) block of rows each.
        np.multiply(self.heads(q, hq).reshape(batch, hkv, group, sq, d), self.scale_value,
                    out=queries.reshape(batch, hkv, group, sq, d))
        grouped = (batch, hkv, group * sq, total)
        if total:
            blas.matmul(queries.reshape(batch, hkv, group * sq, d), keys.swapaxes(2, 3), scores.reshape(grouped))
        if self.softcap > 0:
            np.multiply(scores, 1.0 / self.softcap, out=scores)
            np.tanh(scores, out=scores)
            np.multiply(scores, self.softcap, out=scores)
        qk = outs[3]
        if qk is not None and self.qk_matmul_output_mode in (0, 1):
            np.copyto(qk, scores, casting="unsafe")

        if self.static_bias is not None:
            bias, masked = self.static_bias
        else:
            bias, masked = self.bias_and_masked_rows(attn_mask, nonpad_kv_seqlen)
        if bias is not None:
            np.add(scores, bias, out=scores)
        if qk is not None and self.qk_matmul_output_mode == 2:
            np.copyto(qk, scores, casting="unsafe")
        self.exp_rows(scores, row)
        if masked is not None:
            # A row with no attendable key is zero, decided on the bias: its scores may be NaN.
            np.copyto(scores, 0, where=masked)
        # row := 1 / row sum (0 for masked rows).
        np.copyto(row, 1, where=row == 0)
        np.reciprocal(row, out=row)
        if masked is not None:
            np.copyto(row, 0, where=masked)
        probabilities = qk is not None and self.qk_matmul_output_mode == 3
        if probabilities:
            np.multiply(scores, row, out=scores)
            np.copyto(qk, scores, casting="unsafe")

        y4 = outs[0] if len(scratch) == 3 else scratch[3]
        if total:
            blas.matmul(scores.reshape(grouped), values, y4.reshape(batch, hkv, group * sq, dv))
            if not probabilities:
                # Normalising after P @ V touches sq * dv values per row instead of sq * total.
                np.multiply(y4, row, out=y4)
        else:
            y4.fill(0)
        if rank == 3:
            np.copyto(outs[0].reshape(batch, sq, hq, dv), y4.transpose(0, 2, 1, 3), casting="unsafe")
        elif y4 is not outs[0]:
            np.copyto(outs[0], y4, casting="unsafe")

    @staticmethod
    def cache(new, past, present):
        """Keys or values of the whole sequence: past then new, in `present` when it is wanted."""
        if past is None:
            if present is None:
                return new
            np.copyto(present, new)
            return present
        if present is None:
            return np.concatenate((past, new), axis=2)
        n = past.shape[2]
        present[:, :, :n] = past
        present[:, :, n:] = new
        return present

    def bias_and_masked_rows(self, attn_mask, nonpad_kv_seqlen):
        """The bias and where its rows are all -inf (None when no row is)."""
        bias = self.bias(attn_mask, nonpad_kv_seqlen)
        if bias is None:
            return None, None
        masked = np.isneginf(bias.max(axis=-1, keepdims=True, initial=-np.inf))
        return bias, (masked if masked.any() else None)

    def bias(self, attn_mask, nonpad_kv_seqlen):
        """The additive bias at its broadcast shape (mask, causal, window, padding), or None."""
        batch, hq, hkv, sq, skv, past, d, dv, rank = self.dims
        total = past + skv
        dtype = self.dtype
        bias = None
        if attn_mask is not None:
            if attn_mask.dtype == np.bool_:
                bias = np.where(attn_mask, dtype.type(0), dtype.type(-np.inf))
            else:
                bias = attn_mask.astype(dtype)
            if bias.shape[-1] < total:
                # A short mask is padded with -inf (False) up to the total length.
                bias = np.concatenate((bias, np.full(bias.shape[:-1] + (total - bias.shape[-1],),
                                                     -np.inf, dtype)), axis=-1)
            bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        windowed = self.left_window_size >= 0 or self.right_window_size >= 0
        if self.is_causal or windowed:
            # Query i sits at absolute position i + offset: past length, or per batch
            # nonpad_kv_seqlen - sq for an external cache.
            if nonpad_kv_seqlen is not None:
                offset = (nonpad_kv_seqlen.astype(np.int64) - sq).reshape(-1, 1, 1, 1)
            else:
                offset = np.full((1, 1, 1, 1), past, np.int64)
            distance = (np.arange(sq).reshape(sq, 1) + offset) - np.arange(total)  # p - j
            allowed = np.ones(distance.shape, np.bool_)
            if self.is_causal:
                allowed &= distance >= 0
            if self.left_window_size >= 0:
                allowed &= distance <= self.left_window_size
            if self.right_window_size >= 0:
                allowed &= -distance <= self.right_window_size
            frontier = np.where(allowed, dtype.type(0), dtype.type(-np.inf))
            bias = frontier if bias is None else bias + frontier
        if nonpad_kv_seqlen is not None:
            valid = np.arange(total) < nonpad_kv_seqlen.reshape(-1, 1, 1, 1)
            padding = np.where(valid, dtype.type(0), dtype.type(-np.inf))
            bias = padding if bias is None else bias + padding
        return bias

    def exp_rows(self, scores, row):
        if self.precision is not None and self.precision.itemsize < scores.dtype.itemsize:
            # Softmax at a narrower precision: round the logits there first.
            np.copyto(scores, scores.astype(self.precision), casting="unsafe")
        exp_rows(scores, row, self.ones)


register("Attention", since=23)(Attention)
register("Attention", since=24)(type("Attention", (Attention,), {}))
register("Attention", since=25)(type("Attention", (Attention,), {"windowed": True}))


@register("RotaryEmbedding", since=23)
class RotaryEmbedding(Kernel):
    """Rotates pairs of each head's first `rotary_embedding_dim` features by position angles.

    Pairs are (x[i], x[i + half]) or, `interleaved`, (x[2i], x[2i + 1]); the angles come
    as cos / sin caches indexed by position_ids, or already per (batch, position).
    """

    attributes = {"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0}

    def infer(self, x, cos_cache, sin_cache, position_ids=None):
        rank = len(x.shape)
        if rank == 4:
            batch, heads, seq, head = x.shape
        elif rank == 3:
            batch, seq, hidden = x.shape
            heads = self.num_heads
            if heads <= 0 or hidden % heads:
                self.fail(f"3-D input needs num_heads dividing its hidden size {hidden}")
            head = hidden // heads
        else:
            self.fail(f"input must be 3-D or 4-D, not {x.shape}")
        rotary = self.rotary_embedding_dim or head
        if rotary > head or rotary % 2:
            self.fail(f"rotary_embedding_dim {rotary} must be even and at most head size {head}")
        half = rotary // 2
        want = (batch, seq, half) if position_ids is None else (None, half)
        for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
            if len(cache.shape) != len(want) or cache.shape[-1] != half or (
                    position_ids is None and tuple(cache.shape) != want):
                self.fail(f"{name} has shape {cache.shape}; expected last dimension {half} "
                          f"and {'(batch, seq, half)' if position_ids is None else '(positions, half)'}")
        if position_ids is not None and tuple(position_ids.shape) != (batch, seq):
            self.fail(f"position_ids has shape {position_ids.shape}, not {(batch, seq)}")
        dims = (batch, heads, seq, head, rotary, rank)
        return Inferred([TensorInfo(tuple(x.shape), x.dtype)], dims=dims)

    def run(self, x, cos_cache, sin_cache, position_ids=None, *, outs, scratch):
        batch, heads, seq, head, rotary, rank = self.dims
        half = rotary // 2
        if position_ids is not None:
            positions = position_ids.astype(np.intp, copy=False)
            if positions.size and (positions.min() < 0 or positions.max() >= cos_cache.shape[0]):
                self.fail(f"position_ids out of range [0, {cos_cache.shape[0]})")
            cos_cache, sin_cache = cos_cache[positions], sin_cache[positions]
        # (batch, heads, seq, head) views of input and output; angles broadcast over heads.
        if rank == 3:
            xs = x.reshape(batch, seq, heads, head).transpose(0, 2, 1, 3)
            ys = outs[0].reshape(batch, seq, heads, head).transpose(0, 2, 1, 3)
        else:
            xs, ys = x, outs[0]
        cos = cos_cache[:, None]
        sin = sin_cache[:, None]
        if self.interleaved:
            x1, x2 = xs[..., 0:rotary:2], xs[..., 1:rotary:2]
            y1, y2 = ys[..., 0:rotary:2], ys[..., 1:rotary:2]
        else:
            x1, x2 = xs[..., :half], xs[..., half:rotary]
            y1, y2 = ys[..., :half], ys[..., half:rotary]
        np.subtract(cos * x1, sin * x2, out=y1, casting="unsafe")
        np.add(sin * x1, cos * x2, out=y2, casting="unsafe")
        if rotary < head:
            ys[..., rotary:] = xs[..., rotary:]
