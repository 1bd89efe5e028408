"""TensorScatter (opset 24): a key/value cache of fixed length, updated at each sample's write index.

present_cache is past_cache with, for each sample b of the batch, the update's
sequence written along `axis` from position write_indices[b] (0 when not given);
`circular` wraps those positions modulo the cache length, `linear` must fit them in.
Each sample is one indexed assignment of its whole update.
"""

import numpy as np

from ..errors import ExecutionError
from .registry import Inferred, Kernel, TensorInfo, register
from .shape import normalize_axis

MODES = ("linear", "circular")


@register("TensorScatter", since=24)
class TensorScatter(Kernel):
    attributes = {"axis": -2, "mode": "linear"}

    def decode(self):
        if self.mode not in MODES:
            self.fail(f"mode {self.mode!r} is not one of {', '.join(MODES)}")

    def infer(self, past, update, write_indices=None):
        rank = len(past.shape)
        if len(update.shape) != rank:
            self.fail(f"update {list(update.shape)} and past_cache {list(past.shape)} differ in rank")
        axis = normalize_axis(self.node, self.axis, rank)
        if axis == 0:
            self.fail("axis cannot be 0, the batch axis")
        if update.dtype != past.dtype:
            self.fail(f"update is {update.dtype}, past_cache {past.dtype}")
        for i, (p, u) in enumerate(zip(past.shape, update.shape)):
            if (u > p) if i == axis else (u != p):
                self.fail(f"update {list(update.shape)} does not fit past_cache {list(past.shape)} "
                          f"along axis {axis}" if i == axis else
                          f"update {list(update.shape)} and past_cache {list(past.shape)} differ in dim {i}")
        if write_indices is not None and tuple(write_indices.shape) != (past.shape[0],):
            self.fail(f"write_indices has shape {list(write_indices.shape)}, not [{past.shape[0]}]")
        return Inferred([TensorInfo(past.shape, past.dtype)], axis_index=axis)

    def run(self, past, update, write_indices=None, *, outs, scratch=()):
        out = outs[0]
        np.copyto(out, past)
        length, n = past.shape[self.axis_index], update.shape[self.axis_index]
        lead = (slice(None),) * (self.axis_index - 1)
        starts = np.zeros(past.shape[0], np.int64) if write_indices is None else write_indices.astype(np.int64)
        if self.mode == "linear" and n and (starts.min(initial=0) < 0 or starts.max(initial=0) + n > length):
            raise ExecutionError(f"write_indices {starts.tolist()} with {n} positions to write go past "
                                 f"the cache length {length} (mode linear)")
        for b, start in enumerate(starts):
            positions = np.arange(start, start + n)
            if self.mode == "circular":
                positions %= length
            out[b][lead + (positions,)] = update[b]
