"""Weights: a tensor's bytes in a mapped file (`ExternalData`), or a small array decoded or made.

Below both the loader, which makes `ExternalData`s, and the ir and compiler, which
pass them on: a weight's identity is its `id`, given by the loader in load order and
unique in the model (subgraphs and external-data files included), so release,
packing and profiling name a weight without looking at addresses.
"""

import numpy as np

from .errors import ModelError


class ExternalData:
    """One tensor's bytes inside a `MappedFile`: a zero-copy, read-only view on demand."""

    __slots__ = ("source", "offset", "nbytes", "dtype", "shape", "name", "id")

    def __init__(self, source, offset, nbytes, dtype, shape, name="", id=-1):
        self.id = id  # the loader's number for this weight; -1 for one made outside a loader
        self.source = source
        self.offset = offset
        self.nbytes = nbytes
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.name = name
        check_extent(source, offset, nbytes, self.dtype, self.shape, name)
        source.track(offset, nbytes)

    def array(self):
        """A read-only numpy view of the tensor; touching it pages the bytes in."""
        count = self.nbytes // self.dtype.itemsize
        flat = np.frombuffer(self.source.buffer, dtype=self.dtype.newbyteorder("<"),
                             count=count, offset=self.offset)
        if not self.dtype.isnative:
            flat = flat.astype(self.dtype)
        view = flat.reshape(self.shape)
        view.flags.writeable = False
        return view

    def release(self):
        """Hand this weight's pages back; returns the bytes dropped."""
        return self.source.release(self.offset, self.nbytes)

    def __repr__(self):
        return (f"ExternalData({self.name!r}, id={self.id}, offset={self.offset}, nbytes={self.nbytes}, "
                f"dtype={self.dtype}, shape={self.shape})")


def check_extent(source, offset, nbytes, dtype, shape, name):
    """Validate a tensor's placement before any view is made of it."""
    where = f"tensor {name!r}" if name else "tensor"
    if offset < 0 or nbytes < 0:
        raise ModelError(f"{where}: negative offset or length ({offset}, {nbytes})")
    if offset + nbytes > source.size:
        raise ModelError(f"{where}: data at byte offset {offset} with length {nbytes} "
                         f"runs past the end of {source.path or 'the buffer'} ({source.size} bytes)")
    count = 1
    for d in shape:
        if d < 0:
            raise ModelError(f"{where}: negative dimension {d} in shape {list(shape)}")
    if 0 in shape:  # empty, whatever the other dims say
        count = 0
    for d in shape:
        count *= d
        if count * dtype.itemsize > source.size:
            raise ModelError(f"{where}: shape {list(shape)} claims more bytes than the file holds "
                             f"({source.size})")
    if count * dtype.itemsize != nbytes:
        raise ModelError(f"{where}: shape {list(shape)} of {dtype} needs {count * dtype.itemsize} "
                         f"bytes, the data holds {nbytes}")


def weight_array(weight):
    """The numpy array of a weight: a mapped view or the array itself."""
    if isinstance(weight, ExternalData):
        return weight.array()
    return weight


def is_anonymous(array):
    """Whether `array`'s bytes are memory of this process's own (made by numpy), rather than a
    view of a mapped file (the model's, or a weight cache's) or of the loader's buffers."""
    while isinstance(array, np.ndarray):
        if array.base is None:
            return True
        array = array.base
    return False
