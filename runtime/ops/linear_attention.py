"""LinearAttention (opset 27): attention as a recurrent state, one token at a time.

Each key/value head keeps a (d_k, d_v) state S. Per token t, by `update_rule`:

    linear       S = S + k (x) v
    gated        S = exp(g) S + k (x) v
    delta        S = S + k (x) beta (v - S^T k)
    gated_delta  S = exp(g) S, then as delta
    output       o = scale * q^T S

g (`decay`, in log space) is per head or per key feature; beta per head or shared.
Query, key and value come packed (batch, T, heads * size); grouped-query heads share
their key/value head's state, as in Attention: query head h reads state h // group,
and the group's queries are one block of rows, so a token's read is one batched
matmul. The recurrence runs in float32 (the half types too) and its states and
outputs are rounded once; the state keeps past_state's type (the query's when none
is given). `chunk_size` is a hint for chunked prefill and does not change results.
"""

import math

import ml_dtypes
import numpy as np

from .registry import Inferred, Kernel, TensorInfo, register

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


@register("LinearAttention", since=27)
class LinearAttention(Kernel):
    attributes = {"chunk_size": 64, "kv_num_heads": None, "q_num_heads": None, "scale": 0.0,
                  "update_rule": "gated_delta"}

    def decode(self):
        if self.update_rule not in UPDATE_RULES:
            self.fail(f"update_rule {self.update_rule!r} is not one of {', '.join(UPDATE_RULES)}")
        hq, hkv = self.q_num_heads, self.kv_num_heads
        if hq is None or hkv is None:
            self.fail("q_num_heads and kv_num_heads are required")
        if hq <= 0 or hkv <= 0 or hq % hkv:
            self.fail(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
        self.gated = self.update_rule in ("gated", "gated_delta")
        self.delta = self.update_rule in ("delta", "gated_delta")

    def infer(self, q, k, v, past_state=None, decay=None, beta=None):
        hq, hkv = self.q_num_heads, self.kv_num_heads
        for name, info in (("query", q), ("key", k), ("value", v)):
            if len(info.shape) != 3:
                self.fail(f"{name} {list(info.shape)} must be (batch, sequence, heads * size)")
            if (q.dtype.kind != "f" and q.dtype != _BF16) or info.dtype != q.dtype:
                self.fail(f"query, key and value must be one float type, not {q.dtype}, {k.dtype}, {v.dtype}")
        batch, t, q_hidden = q.shape
        if k.shape[:2] != (batch, t) or v.shape[:2] != (batch, t):
            self.fail(f"key {list(k.shape)} and value {list(v.shape)} do not match query {list(q.shape)}")
        if q_hidden % hq or k.shape[2] % hkv or v.shape[2] % hkv:
            self.fail(f"hidden sizes {q_hidden}, {k.shape[2]}, {v.shape[2]} do not divide into "
                      f"{hq} / {hkv} heads")
        dk, dv = q_hidden // hq, v.shape[2] // hkv
        if k.shape[2] // hkv != dk:
            self.fail(f"key head size {k.shape[2] // hkv} differs from query head size {dk}")
        if self.gated != (decay is not None):
            self.fail(f"update_rule {self.update_rule!r} {'needs' if self.gated else 'takes no'} decay")
        if self.delta != (beta is not None):
            self.fail(f"update_rule {self.update_rule!r} {'needs' if self.delta else 'takes no'} beta")
        state_shape = (batch, hkv, dk, dv)
        if past_state is not None and tuple(past_state.shape) != state_shape:
            self.fail(f"past_state {list(past_state.shape)} is not {list(state_shape)}")
        if decay is not None and (len(decay.shape) != 3 or decay.shape[:2] != (batch, t)
                                  or decay.shape[2] not in (hkv, hkv * dk)):
            self.fail(f"decay {list(decay.shape)} is not ({batch}, {t}, {hkv}) or ({batch}, {t}, {hkv * dk})")
        if beta is not None and (len(beta.shape) != 3 or beta.shape[:2] != (batch, t)
                                 or beta.shape[2] not in (hkv, 1)):
            self.fail(f"beta {list(beta.shape)} is not ({batch}, {t}, {hkv}) or ({batch}, {t}, 1)")
        state_dtype = q.dtype if past_state is None else past_state.dtype
        return Inferred([TensorInfo((batch, t, hq * dv), q.dtype), TensorInfo(state_shape, state_dtype)],
                        dims=(batch, t, hq, hkv, dk, dv))

    def prepare(self, q, k, v, past_state=None, decay=None, beta=None):
        batch, t, hq, hkv, dk, dv = self.dims
        self.scale_value = np.float32(self.scale if self.scale else 1.0 / math.sqrt(dk))
        return [((batch, hkv, dk, dv), _F32),   # the state
                ((batch, hkv, dk, dv), _F32),   # a token's update
                ((batch, hkv, hq // hkv, t, dv), _F32)]  # the outputs, grouped by key/value head

    def run(self, q, k, v, past_state=None, decay=None, beta=None, *, outs, scratch):
        batch, t, hq, hkv, dk, dv = self.dims
        group = hq // hkv
        state, update, y = scratch
        if past_state is None:
            state.fill(0)
        else:
            np.copyto(state, past_state)
        # Per token: (batch, hkv, G, dk) queries, (batch, hkv, dk) keys, (batch, hkv, dv) values.
        queries = (q.reshape(batch, t, hkv, group, dk).astype(_F32) * self.scale_value).transpose(1, 0, 2, 3, 4)
        keys = k.reshape(batch, t, hkv, dk).astype(_F32).transpose(1, 0, 2, 3)
        values = v.reshape(batch, t, hkv, dv).astype(_F32).transpose(1, 0, 2, 3)
        if self.gated:
            # exp(g) per (head, key feature) or per head: a factor on the state's rows.
            gates = np.exp(decay.reshape(batch, t, hkv, -1).astype(_F32)).transpose(1, 0, 2, 3)[..., None]
        if self.delta:
            betas = beta.reshape(batch, t, -1, 1).astype(_F32).transpose(1, 0, 2, 3)
        for i in range(t):
            key = keys[i]
            if self.gated:
                np.multiply(state, gates[i], out=state)
            if self.delta:
                # v <- beta (v - S^T k): what the state already holds for this key is replaced.
                retrieved = np.matmul(key[:, :, None, :], state)[:, :, 0]
                value = betas[i] * (values[i] - retrieved)
            else:
                value = values[i]
            np.multiply(key[..., :, None], value[..., None, :], out=update)
            np.add(state, update, out=state)
            np.matmul(queries[i], state, out=y[:, :, :, i])
        # (batch, hkv, G, t, dv) -> (batch, t, hq * dv); query head h = kv head * G + g.
        np.copyto(outs[0].reshape(batch, t, hkv, group, dv), y.transpose(0, 3, 1, 2, 4), casting="unsafe")
        if len(outs) > 1 and outs[1] is not None:
            np.copyto(outs[1], state, casting="unsafe")
