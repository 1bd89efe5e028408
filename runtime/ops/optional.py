"""Optionals: Optional, OptionalHasElement and OptionalGetElement.

An optional is its element (a tensor, or a sequence: see sequence.py) or None when it
is empty, as an omitted input is: no op tells the two apart. One that holds a tensor
is that tensor, in the arena like any other; an empty one, or one that holds a
sequence, is made by an eager step (see registry.SequenceInfo).
"""

import numpy as np

from .registry import Kernel, TensorInfo, register
from .shape import Identity


@register("Optional", since=15)
class Optional(Identity):
    """Its input as an optional (the input itself), or an empty optional of type `type` without one."""

    attributes = {"type": None}

    def infer(self, x=None):
        if x is None and self.type is None:
            self.fail("an empty Optional needs the attribute 'type'")
        return super().infer(x)

    def run(self, x=None, *, outs, scratch):
        return super().run(x, outs=outs, scratch=scratch)


@register("OptionalHasElement", since=15)
class OptionalHasElement(Kernel):
    """Whether the input holds an element: false when it is empty or omitted. A tensor or a sequence
    always does, so only an optional known per run is looked at per run."""

    def infer(self, x=None):
        return [TensorInfo.of(np.array(x is not None))]

    def run(self, x=None, *, outs, scratch):
        outs[0][...] = x is not None


@register("OptionalGetElement", since=15)
class OptionalGetElement(Identity):
    """The element an optional holds (a tensor or a sequence given as it is, from opset 18)."""

    def infer(self, x):
        if x is None:
            self.fail("the optional input is empty")
        return super().infer(x)
