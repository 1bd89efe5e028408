"""The largest tensor a model file or its feeds may make nnrun allocate: SessionOptions.max_tensor_bytes.

Every size a file or a feed dictates is checked against it before anything of that size is
allocated or looped over: the graph's inputs, each output a shape rule gives (at PREPARE, and
at EXECUTE for the sizes a run's values decide), kernels' scratch and what they plan tile by
tile, densified sparse weights, a Loop's scan outputs and the sequences a run builds. Beyond
it: `SizeLimitError`, naming the tensor, its shape, its bytes and the limit.

Sizes are Python ints, multiplied dim by dim and compared as they grow: no product wraps
around, as numpy's int64 would (2**62 * 2**62 is 0 there).

The limit is an int handed down: `CompileOptions.max_tensor_bytes` to PREPARE, the executor's
`max_tensor_bytes` to EXECUTE. Shape rules, kernels and the loader take no options, so the
compiler, the executor and the session also put the limit in force (`in_force`) around the
code that runs them, and that code reads it with `current()`, as conv_core's scratch_limit is.
"""

import contextvars
import functools
import operator

import numpy as np

from .errors import InputError, ModelError, SizeLimitError
from .memory_limit import cgroup_memory

# What a sequence, or a Loop's list of scan values, holds per tensor beyond its bytes: a
# numpy array's header. A million one-byte tensors take a hundred megabytes, not one.
ELEMENT_OVERHEAD = 112


def default_max_tensor_bytes(physical=None, cgroup=cgroup_memory):
    """Half of the physical memory, or of the memory cgroup's limit when that is lower."""
    if physical is None:
        import psutil

        physical = psutil.virtual_memory().total
    found = cgroup()
    memory = min(physical, found[0]) if found is not None else physical
    return max(1, memory // 2)


def resolve(value):
    """The limit in bytes for SessionOptions.max_tensor_bytes `value` (None: the default)."""
    if value is None:
        return default_max_tensor_bytes()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"max_tensor_bytes must be a positive number of bytes or None, not {value!r}")
    if value <= 0:
        raise InputError(f"max_tensor_bytes must be positive, not {value}")
    return int(value)


@functools.cache
def _process_default():
    return default_max_tensor_bytes()


_LIMIT = contextvars.ContextVar("nnrun_max_tensor_bytes", default=None)


class in_force:
    """`with in_force(limit):` makes `current()` return `limit` inside (None: the process's
    default). A class, as contextlib.suppress is: every run enters one, and a generator-based
    context manager costs five times as much (1.2 against 0.25 us)."""

    __slots__ = ("limit", "token")

    def __init__(self, limit):
        self.limit = limit

    def __enter__(self):
        self.token = _LIMIT.set(self.limit)

    def __exit__(self, *exc):
        _LIMIT.reset(self.token)


def current():
    """The limit in force: the session's, or by default half of the memory (see
    default_max_tensor_bytes), read once per process."""
    limit = _LIMIT.get()
    return limit if limit is not None else _process_default()


def shape_text(shape):
    """A shape for a message: in full, or its ends when it has many dims."""
    shape = list(shape)
    if len(shape) <= 12:
        return str(shape)
    return f"[{', '.join(map(str, shape[:6]))}, ..., {', '.join(map(str, shape[-2:]))}] ({len(shape)} dims)"


def tensor_bytes(shape, dtype, what="a tensor", limit=None):
    """The bytes of a tensor of `shape` and `dtype`, a Python int, once checked: ModelError for a
    dim that is not an integer >= 0, SizeLimitError beyond `limit` (None: the limit in force).
    `what` names the tensor in the message ("output 'y'")."""
    limit = current() if limit is None else limit
    dims = []
    for d in shape:
        try:
            d = operator.index(d)
        except TypeError:
            raise ModelError(f"{what}: dimension {d!r} of shape {shape_text(shape)} is not an integer") from None
        if d < 0:
            raise ModelError(f"{what}: negative dimension in shape {shape_text(shape)}")
        dims.append(d)
    dtype = np.dtype(dtype)
    if 0 in dims:
        return 0
    n = dtype.itemsize
    for k, d in enumerate(dims):
        n *= d
        if n > limit:
            # The exact size for the message; past 64 dims (the loaders' largest rank) the
            # product may be a number of thousands of digits: "more than" says enough.
            if len(dims) <= 64:
                for rest in dims[k + 1:]:
                    n *= rest
                size = f"{n:,} bytes"
            else:
                size = f"more than {n:,} bytes"
            raise SizeLimitError(f"{what} of shape {shape_text(dims)} {dtype} would take {size}, "
                                 f"beyond max_tensor_bytes ({limit:,})")
    return n


def held_bytes(count, nbytes, what, limit=None):
    """The memory `count` tensors of `nbytes` in all hold (a sequence, a Loop's scan values),
    headers included, once checked against `limit` (None: the limit in force)."""
    limit = current() if limit is None else limit
    held = nbytes + count * ELEMENT_OVERHEAD
    if held > limit:
        raise SizeLimitError(f"{what} would hold {count:,} tensors, {held:,} bytes with their headers, "
                             f"beyond max_tensor_bytes ({limit:,})")
    return held
