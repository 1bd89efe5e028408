"""FlexAttention (ai.onnx.preview, version 1): attention whose scores and probabilities a
subgraph may rewrite.

    scores = Q K^T * scale                     (B, Hq, L, S)
    scores = score_mod(scores)                 when the attribute is given
    probs  = softmax(scores)
    probs  = prob_mod(probs)                   when the attribute is given
    Y      = probs V

score_mod and prob_mod are graphs of one input and one output of the scores' shape, in
the softmax precision (`softmax_precision`, else float32, or float64 for double inputs);
they are planned like a control-flow body, by the planner PREPARE hands the kernel (see
control.py), for the scores' shape. The arithmetic is Attention's (attention.py), in
float32 (float64 for double): the query heads that share a key/value head are one
block of rows, one matmul each, and without prob_mod the rows are normalised after
P V. A row the score_mod masks wholly (all -inf) is zeros, as in Attention.
"""

import math

import ml_dtypes
import numpy as np

from .attention import exp_rows
from .control import Body, ControlFlow
from .registry import Inferred, TensorInfo, register
from .shape import onnx_dtype

_F32, _F64, _BF16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)
MODIFIERS = ("score_mod", "prob_mod")


@register("FlexAttention", since=1, domain="ai.onnx.preview")
class FlexAttention(ControlFlow):
    attributes = {"scale": None, "score_mod": None, "prob_mod": None, "softmax_precision": None}

    def decode(self):
        self.captured = list(self.node.attrs.get("_captured", []))
        self.bodies = {name: Body(getattr(self, name), self.opset, self.planner)
                       for name in MODIFIERS if getattr(self, name) is not None}
        for name, body in self.bodies.items():
            if len(body.input_names) != 1 or len(body.output_names) != 1:
                self.fail(f"{name} must have one input and one output, not {len(body.input_names)} "
                          f"and {len(body.output_names)}")
        self.precision = (None if self.softmax_precision is None
                          else onnx_dtype(self.node, self.softmax_precision, "softmax_precision"))
        if self.precision is not None and self.precision.kind != "f" and self.precision != _BF16:
            self.fail(f"softmax_precision {self.precision} is not a float type")

    def infer(self, *args):
        (q, k, v), captured = self.split(args)
        if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
            self.fail(f"Q, K and V must be 4-D, not {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
        batch, hq, length, d = q.shape
        _, hkv, span, dk = k.shape
        dv = v.shape[3]
        if k.shape[0] != batch or tuple(v.shape[:3]) != (batch, hkv, span):
            self.fail(f"K {list(k.shape)} and V {list(v.shape)} do not match Q {list(q.shape)}")
        if dk != d:
            self.fail(f"query head size {d} differs from key head size {dk}")
        if hkv <= 0 or hq % hkv:
            self.fail(f"{hq} query heads are not a multiple of {hkv} key/value heads")
        if (q.dtype.kind != "f" and q.dtype != _BF16) or k.dtype != q.dtype or v.dtype != q.dtype:
            self.fail(f"Q, K and V must be one float type, not {q.dtype}, {k.dtype}, {v.dtype}")
        softmax_dtype = self.precision or (_F64 if q.dtype == _F64 else _F32)
        scores = (batch, hq, length, span)
        constant_names = self.constant_names_of(args)
        for name, body in self.bodies.items():
            feeds = {body.input_names[0]: TensorInfo(scores, softmax_dtype)}
            (out,) = body.output_infos(feeds, captured, constant_names)
            if out is not None and (tuple(out[0]) != scores or np.dtype(out[1]) != softmax_dtype):
                self.fail(f"{name} makes {np.dtype(out[1])} {list(out[0])} of {softmax_dtype} {list(scores)}: "
                          f"it must keep the shape and type")
        return Inferred([TensorInfo((batch, hq, length, dv), v.dtype)],
                        dims=(batch, hq, hkv, length, span, d, dv), softmax_dtype=softmax_dtype)

    def prepare(self, *infos):
        super().prepare(*infos)
        batch, hq, hkv, length, span, d, dv = self.dims
        q = infos[0]
        # The arithmetic's type: float32, or float64 when the inputs or the softmax are double.
        self.dtype = _F64 if _F64 in (q.dtype, self.softmax_dtype) else _F32
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(d)
        self.scale_value = self.dtype.type(scale)
        self.ones = np.ones(span, self.dtype)
        return [((batch, hq, length, d), self.dtype),      # scaled queries
                ((batch, hq, length, span), self.dtype),   # scores, then probabilities
                ((batch, hq, length, 1), self.dtype),      # row max, then row sum
                ((batch, hq, length, dv), self.dtype)]     # Y before its cast

    def modify(self, name, values, captured):
        """values := the body `name` applied to them, fed in the softmax precision."""
        body = self.bodies[name]
        (result,) = body.run({body.input_names[0]: values.astype(self.softmax_dtype, copy=False)}, captured,
                             self.constant_names)
        if result.shape != values.shape:
            self.fail(f"{name} made {list(result.shape)} of {list(values.shape)}: it must keep the shape")
        np.copyto(values, result, casting="unsafe")

    def run(self, *args, outs, scratch):
        (q, k, v), captured = self.split(args)
        batch, hq, hkv, length, span, d, dv = self.dims
        group = hq // hkv
        queries, scores, row, y = scratch
        grouped = (batch, hkv, group * length)  # the query heads of one key/value head as one block
        np.multiply(q, self.scale_value, out=queries)
        keys, values = k.astype(self.dtype, copy=False), v.astype(self.dtype, copy=False)
        np.matmul(queries.reshape(*grouped, d), keys.swapaxes(2, 3), out=scores.reshape(*grouped, span))
        if self.softmax_dtype != self.dtype:
            # Softmax at another precision: round the logits there first.
            np.copyto(scores, scores.astype(self.softmax_dtype), casting="unsafe")
        if "score_mod" in self.bodies:
            self.modify("score_mod", scores, captured)
        exp_rows(scores, row, self.ones)
        np.copyto(row, 1, where=row == 0)  # a wholly masked row: zeros over 1
        np.reciprocal(row, out=row)
        normalised = "prob_mod" in self.bodies
        if normalised:
            np.multiply(scores, row, out=scores)
            if self.softmax_dtype != self.dtype:
                np.copyto(scores, scores.astype(self.softmax_dtype), casting="unsafe")
            self.modify("prob_mod", scores, captured)
        np.matmul(scores.reshape(*grouped, span), values, out=y.reshape(*grouped, dv))
        if not normalised:
            np.multiply(y, row, out=y)
        np.copyto(outs[0], y, casting="unsafe")
