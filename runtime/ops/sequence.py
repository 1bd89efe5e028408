"""Sequences: SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceAt, SequenceErase,
SequenceLength, SplitToSequence, ConcatFromSequence and SequenceMap.

A sequence is a tuple of arrays and never lives in the arena: a node that makes one
gives it a `SequenceInfo` (shape None), so the compiler runs it as an eager step, and
the nodes that read it run eagerly too, their input known only per run. A tuple is
never changed: SequenceInsert and SequenceErase make a new one. A tensor that enters
a sequence is copied, since it may be a view of the arena whose bytes later steps reuse;
one taken out of a sequence (SequenceAt) is the element itself, which nothing writes.

A sequence a run makes is checked against max_tensor_bytes (size_limit.py) before it is made:
its tensors' bytes and a header per tensor, so that neither a Loop that inserts without end
nor a split into a billion pieces can take the memory.
"""

import numpy as np
from onnx import helper as onnx_helper

from .. import size_limit

from .control import ControlFlow
from .registry import REQUIRED, Kernel, SequenceInfo, TensorInfo, register

INT64 = np.dtype(np.int64)


def _position(kernel, position, length, name, end_allowed=False):
    """The index a position input names in a sequence of `length` (negative: from the end);
    `end_allowed`: `length` itself is valid (an insertion at the end)."""
    if np.asarray(position).size != 1 or np.asarray(position).dtype.kind not in "iu":
        kernel.fail(f"input {name!r} must be one integer, got {np.asarray(position)!r}")
    p = int(np.asarray(position).reshape(-1)[0])
    if not -length <= p <= (length if end_allowed else length - 1):
        kernel.fail(f"position {p} is out of range for a sequence of {length} tensors")
    return p + length if p < 0 else p


def _own(x):
    """A tensor as a sequence keeps it: its own copy."""
    return np.array(x, copy=True)


def _checked(count, nbytes):
    """A sequence of `count` tensors of `nbytes` in all may be made (size_limit.held_bytes)."""
    size_limit.held_bytes(count, nbytes, "the sequence")


def _same_dtype(kernel, sequence, dtype):
    if sequence and sequence[0].dtype != dtype:
        kernel.fail(f"a tensor of {dtype} cannot join a sequence of {sequence[0].dtype}")


@register("SequenceEmpty", since=11)
class SequenceEmpty(Kernel):
    attributes = {"dtype": 1}  # float

    def decode(self):
        self.element_dtype = np.dtype(onnx_helper.tensor_dtype_to_np_dtype(self.dtype))

    def infer(self):
        return [SequenceInfo(self.element_dtype)]

    def run(self, outs, scratch):
        return ((),)


@register("SequenceConstruct", since=11)
class SequenceConstruct(Kernel):
    def infer(self, *inputs):
        if not inputs or any(x is None for x in inputs):
            self.fail("SequenceConstruct needs one tensor or more")
        if len({x.dtype for x in inputs}) != 1:
            self.fail(f"the tensors differ in type: {sorted(str(x.dtype) for x in inputs)}")
        return [SequenceInfo(inputs[0].dtype)]

    def run(self, *inputs, outs, scratch):
        _checked(len(inputs), sum(x.nbytes for x in inputs))
        return (tuple(_own(x) for x in inputs),)


@register("SequenceInsert", since=11)
class SequenceInsert(Kernel):
    def infer(self, sequence, tensor, position=None):
        return [SequenceInfo(tensor.dtype)]

    def run(self, sequence, tensor, position=None, *, outs, scratch):
        _same_dtype(self, sequence, tensor.dtype)
        at = len(sequence) if position is None else _position(self, position, len(sequence), "position",
                                                               end_allowed=True)
        _checked(len(sequence) + 1, sum(x.nbytes for x in sequence) + tensor.nbytes)
        return (sequence[:at] + (_own(tensor),) + sequence[at:],)


@register("SequenceAt", since=11)
class SequenceAt(Kernel):
    def infer(self, sequence, position):
        return [TensorInfo(None, sequence.dtype)]  # the element's shape: known once it is picked

    def run(self, sequence, position, outs, scratch):
        return (sequence[_position(self, position, len(sequence), "position")],)


@register("SequenceErase", since=11)
class SequenceErase(Kernel):
    def infer(self, sequence, position=None):
        return [SequenceInfo(sequence.dtype)]

    def run(self, sequence, position=None, *, outs, scratch):
        if not sequence:
            self.fail("cannot erase from an empty sequence")
        at = len(sequence) - 1 if position is None else _position(self, position, len(sequence), "position")
        return (sequence[:at] + sequence[at + 1:],)


@register("SequenceLength", since=11)
class SequenceLength(Kernel):
    def infer(self, sequence):
        return [TensorInfo((), INT64)]

    def run(self, sequence, outs, scratch):
        outs[0][...] = len(sequence)


@register("SplitToSequence", since=11)
class SplitToSequence(Kernel):
    """The input cut along `axis` into a sequence: into pieces of one (without the axis when
    not `keepdims`), of `split` each (the last may be shorter), or of the lengths `split` lists."""

    attributes = {"axis": 0, "keepdims": 1}

    def infer(self, x, split=None):
        rank = len(x.shape)
        if not -rank <= self.axis < rank:
            self.fail(f"axis {self.axis} is out of range for rank {rank}")
        return [SequenceInfo(x.dtype)]

    def run(self, x, split=None, *, outs, scratch):
        axis = self.axis % x.ndim
        n = x.shape[axis]
        if split is None:
            _checked(n, x.nbytes)
            pieces = np.split(x, n, axis=axis) if n else []
            if not self.keepdims:
                pieces = [np.squeeze(p, axis=axis) for p in pieces]
            return (tuple(_own(p) for p in pieces),)
        split = np.asarray(split)
        if split.dtype.kind not in "iu" or split.ndim > 1:
            self.fail(f"input 'split' must be an integer scalar or 1-D, got shape {split.shape} of {split.dtype}")
        if split.ndim == 0:
            length = int(split)
            if length <= 0:
                self.fail(f"split {length} must be positive")
            _checked(-(-n // length), x.nbytes)
            lengths = [length] * (n // length) + ([n % length] if n % length else [])
        else:
            lengths = [int(v) for v in split]
            if any(v < 0 for v in lengths) or sum(lengths) != n:
                self.fail(f"split {lengths} does not add up to dimension {axis}'s {n}")
            _checked(len(lengths), x.nbytes)
        bounds = np.cumsum([0] + lengths)
        index = [slice(None)] * x.ndim
        pieces = []
        for start, stop in zip(bounds[:-1], bounds[1:]):
            index[axis] = slice(int(start), int(stop))
            pieces.append(_own(x[tuple(index)]))
        return (tuple(pieces),)


@register("ConcatFromSequence", since=11)
class ConcatFromSequence(Kernel):
    """The sequence's tensors joined along `axis`, or stacked along a new axis `axis` (new_axis)."""

    attributes = {"axis": REQUIRED, "new_axis": 0}

    def infer(self, sequence):
        return [TensorInfo(None, sequence.dtype)]  # known once the tensors are

    def run(self, sequence, outs, scratch):
        if not sequence:
            self.fail("cannot concatenate an empty sequence")
        rank = sequence[0].ndim + (1 if self.new_axis else 0)
        if not -rank <= self.axis < rank:
            self.fail(f"axis {self.axis} is out of range for rank {rank}")
        size_limit.tensor_bytes((sum(x.size for x in sequence),), sequence[0].dtype, "the joined tensors")
        if self.new_axis:
            return (np.stack(sequence, axis=self.axis),)
        return (np.concatenate(sequence, axis=self.axis),)


@register("SequenceMap", since=17)
class SequenceMap(ControlFlow):
    """The body run on each position of the input sequences, each output a sequence of its results.

    The body's inputs are, in order, the element of each input sequence at that position or,
    for an input that is a tensor, the whole tensor each time."""

    attributes = {"body": REQUIRED}
    body_attributes = ("body",)

    def infer(self, *args):
        regular, _ = self.split(args)
        if not isinstance(regular[0], SequenceInfo):
            self.fail("the first input must be a sequence")
        lengths = {len(x.value) for x in regular if isinstance(x, SequenceInfo) and x.value is not None}
        if len(lengths) > 1:
            self.fail(f"the input sequences differ in length: {sorted(lengths)}")
        return [SequenceInfo() for _ in self.bodies["body"].output_names]

    def run(self, *args, outs, scratch):
        regular, captured = self.split(args)
        body = self.bodies["body"]
        results = [[] for _ in body.output_names]
        made = 0  # bytes of the results so far
        for i in range(len(regular[0])):
            feeds = [x[i] if isinstance(x, tuple) else x for x in regular]
            for acc, value in zip(results, body.run(dict(zip(body.input_names, feeds)), captured,
                                                    self.constant_names)):
                acc.append(value)
                made += getattr(value, "nbytes", 0)
            _checked((i + 1) * len(results), made)
        return tuple(tuple(acc) for acc in results)
