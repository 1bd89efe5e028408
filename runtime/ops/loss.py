"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12 on).

Both take scores (N, C, D1, ...) and class indices (N, D1, ...) and are computed
over a (N, C, D) view: the score of each target class is one `take_along_axis`
along C, the class weight one gather from `weight`. Targets equal to
`ignore_index` get weight 0 (and an arbitrary in-range class, so the gather stays
valid). `mean` divides by the sum of the weights actually applied, so with no
`weight` input it is the mean over the targets that are not ignored.
SoftmaxCrossEntropyLoss is NLL of the log-softmax over C, which it can also
return as its second output.

The later versions (NLL 13 and 22, SCE 13) only add element types.
"""

import math

import numpy as np

from ..errors import ExecutionError
from .registry import Inferred, Kernel, TensorInfo, register

REDUCTIONS = ("none", "sum", "mean")


class _ClassLoss(Kernel):
    attributes = {"reduction": "mean", "ignore_index": None}

    def decode(self):
        if isinstance(self.reduction, bytes):
            self.reduction = self.reduction.decode()
        if self.reduction not in REDUCTIONS:
            self.fail(f"reduction {self.reduction!r} is not one of {', '.join(REDUCTIONS)}")

    def check(self, scores, target, weight):
        """(the loss's TensorInfo, the (N, C, D) view of the scores)."""
        if scores is None or target is None:
            self.fail("inputs scores and labels are required")
        if scores.dtype.kind != "f":
            self.fail(f"scores have type {scores.dtype}; expected a floating type")
        if target.dtype.kind not in "iu":
            self.fail(f"labels have type {target.dtype}; expected int32 or int64")
        shape = tuple(scores.shape)
        if len(shape) < 2:
            self.fail(f"scores have shape {list(shape)}; expected (N, C, D1, ...)")
        if tuple(target.shape) != shape[:1] + shape[2:]:
            self.fail(f"labels have shape {list(target.shape)}; expected {list(shape[:1] + shape[2:])} "
                      f"for scores of shape {list(shape)}")
        if weight is not None and tuple(weight.shape) != (shape[1],):
            self.fail(f"weight has shape {list(weight.shape)}; expected ({shape[1]},)")
        n, c = shape[:2]
        loss_shape = tuple(target.shape) if self.reduction == "none" else ()
        return TensorInfo(loss_shape, scores.dtype), (n, c, math.prod(shape[2:]))

    def loss(self, log_prob, target, weight, out):
        """NLL of `log_prob` viewed as (N, C, D) against `target` (N, D), into `out`."""
        n, c, d = self.view
        log_prob = log_prob.reshape(self.view)
        target = target.reshape(n, d)
        if self.ignore_index is not None:
            kept = target != self.ignore_index
            classes = np.where(kept, target, 0)
        else:
            kept, classes = None, target
        if classes.size and (classes.min() < 0 or classes.max() >= c):
            raise ExecutionError(f"a label is outside [0, {c}) and is not "
                                 f"ignore_index {self.ignore_index}")
        picked = np.take_along_axis(log_prob, classes[:, None, :], axis=1)[:, 0, :]
        # Half floats sum in float32, as onnxruntime does.
        work = np.result_type(log_prob.dtype, np.float32)
        losses = np.negative(picked, dtype=work)
        if weight is not None:
            applied = weight.astype(work)[classes]
            if kept is not None:
                applied *= kept
        elif kept is not None:
            applied = kept.astype(work)
        else:
            applied = None
        if applied is not None:
            losses *= applied
        if self.reduction == "none":
            np.copyto(out.reshape(n, d), losses, casting="unsafe")
            return
        total = losses.sum()
        if self.reduction == "mean":
            count = applied.sum() if applied is not None else losses.size
            with np.errstate(invalid="ignore", divide="ignore"):
                total = total / work.type(count)
        out[...] = total


@register("NegativeLogLikelihoodLoss", since=12)
class NegativeLogLikelihoodLoss(_ClassLoss):
    def infer(self, scores, target, weight=None):
        loss, view = self.check(scores, target, weight)
        return Inferred([loss], view=view)

    def run(self, scores, target, weight=None, *, outs, scratch=()):
        self.loss(scores, target, weight, outs[0])


@register("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(_ClassLoss):
    """Loss, and optionally log_prob, of the softmax over C of the scores."""

    def infer(self, scores, target, weight=None):
        loss, view = self.check(scores, target, weight)
        with_log_prob = len(self.node.outputs) > 1 and bool(self.node.outputs[1])
        outputs = [loss, TensorInfo(tuple(scores.shape), scores.dtype)] if with_log_prob else [loss]
        return Inferred(outputs, view=view, with_log_prob=with_log_prob)

    def prepare(self, scores, target, weight=None):
        # log_prob goes into the second output when there is one, else into scratch.
        return [] if self.with_log_prob else [(tuple(scores.shape), scores.dtype)]

    def run(self, scores, target, weight=None, *, outs, scratch=()):
        if len(outs) > 1 and outs[1] is not None:
            log_prob = outs[1]
        elif scratch:
            log_prob = scratch[0]
        else:
            log_prob = np.empty(scores.shape, scores.dtype)
        n, c, d = self.view
        # Without spatial dims, (N, C) rows reduce faster than (N, C, 1) columns.
        shape = (n, c) if d == 1 else self.view
        view = log_prob.reshape(shape)
        x = scores.reshape(shape)
        if x.size:
            peak = np.max(x, axis=1, keepdims=True)
            np.subtract(x, peak, out=view)
            shifted_sum = np.sum(np.exp(view), axis=1, keepdims=True)
            np.subtract(view, np.log(shifted_sum), out=view)
        self.loss(log_prob, target, weight, outs[0])
