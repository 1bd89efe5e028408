"""Weights the file stores in another form, made float32 once at PREPARE in the shape rule:
DEQUANTIZE of a constant (float16 or quantized) tensor and DENSIFY of a sparse one give a known
value, so no step runs for them and their mapped source pages are released. What they make is
checked against max_tensor_bytes (size_limit.py) first: the file says how large it is.
"""


import numpy as np

from ... import size_limit
from ...errors import ModelError
from ..registry import Inferred, Kernel, TensorInfo
from .common import tfl

@tfl("DEQUANTIZE")
class Dequantize(Kernel):
    """float16 (or quantized int8/uint8) to float32. A constant input is converted once, here."""

    attributes = {"quantization": None}

    def infer(self, x):
        scale = zero_point = None
        if x.dtype != np.float16:
            q = (self.quantization or {}).get(self.node.inputs[0])
            if q is None:
                self.fail(f"a {x.dtype} input has no quantization parameters")
            shape = [1] * len(x.shape)
            scale, zero = np.asarray(q["scale"], np.float32), np.asarray(q["zero_point"], np.float32)
            if scale.size > 1:
                shape[q.get("axis", 0)] = -1
            scale, zero_point = scale.reshape(shape), zero.reshape(shape)
        if x.value is not None:  # converted now: no step runs for it
            size_limit.tensor_bytes(x.shape, np.float32, "the dequantized weight")
            out = np.empty(x.shape, np.float32)
            self.convert(x.value, out, scale, zero_point)
            return [TensorInfo(tuple(x.shape), np.dtype(np.float32), out)]
        return Inferred([TensorInfo(tuple(x.shape), np.dtype(np.float32))], scale=scale, zero_point=zero_point)

    @staticmethod
    def convert(x, out, scale, zero_point):
        np.copyto(out, x, casting="unsafe")
        if scale is not None:
            np.subtract(out, zero_point, out=out)
            np.multiply(out, scale, out=out)

    def run(self, x, *, outs, scratch):
        self.convert(x, outs[0], self.scale, self.zero_point)


@tfl("DENSIFY")
class Densify(Kernel):
    """A sparse constant (TFLite's sparsity parameters) made dense once, here."""

    attributes = {"sparsity": None}

    def infer(self, x):
        if x.value is None or self.sparsity is None:
            self.fail("DENSIFY needs a constant input and its sparsity parameters")
        dense = densify(self, np.asarray(x.value), self.sparsity, x.shape)
        return [TensorInfo(tuple(dense.shape), dense.dtype, dense)]  # made now: no step runs for it

    def run(self, x, *, outs, scratch):
        self.fail("DENSIFY runs at PREPARE only")


def densify(kernel, values, sparsity, dense_shape=None):
    """TFLite's FormatConverter::SparseToDense, level by level in traversal order, vectorised."""
    order = list(sparsity["traversal_order"])
    block_map = list(sparsity.get("block_map") or [])
    metadata = sparsity["dim_metadata"]
    if len(metadata) != len(order):
        kernel.fail("sparsity dim_metadata does not match traversal_order")
    _check_levels(metadata, values.size)
    rank = len(order) - len(block_map)
    # The size of every expanded dim: dense dims say it; a sparse dim's size is found from the
    # dense shape, which is the product of a dim and its block.
    sizes = [None] * len(order)
    for level, dim in enumerate(order):
        if metadata[level]["format"] == "DENSE":
            sizes[dim] = int(metadata[level]["dense_size"])
    # Walk the levels: `positions` is each stored element's flat position in the level's
    # parent list, `coords` its coordinate per expanded dim.
    positions = np.zeros(1, np.int64)
    coords = np.zeros((len(order), 1), np.int64)
    for level, dim in enumerate(order):
        meta = metadata[level]
        if meta["format"] == "DENSE":
            n = int(meta["dense_size"])
            _index_checked(len(order), positions.size * n)
            new_pos = (positions[:, None] * n + np.arange(n)[None, :]).reshape(-1)
            coords = np.repeat(coords, n, axis=1)
            coords[dim] = np.tile(np.arange(n), positions.size)
            positions = new_pos
        else:
            segments = np.asarray(meta["array_segments"], np.int64)
            indices = np.asarray(meta["array_indices"], np.int64)
            starts, stops = segments[positions], segments[positions + 1]
            counts = stops - starts
            if counts.size and counts.min() < 0:
                kernel.fail("sparsity array_segments decrease")
            _index_checked(len(order), int(counts.sum()))
            coords = np.repeat(coords, counts, axis=1)
            new_pos = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)]) if counts.size \
                else np.zeros(0, np.int64)
            coords[dim] = indices[new_pos]
            positions = new_pos.astype(np.int64)
            if sizes[dim] is None:
                sizes[dim] = int(indices.max()) + 1 if indices.size else 0
    block_sizes = {block_map[k]: sizes[rank + k] for k in range(len(block_map))}
    if dense_shape is not None and len(dense_shape) == rank:
        # The file's tensor shape is the dense shape: it fixes sparse dims' sizes.
        for d in range(rank):
            sizes[d] = -(-int(dense_shape[d]) // block_sizes.get(d, 1))
    # A sparse dim's true extent is unknown to the format; blocks scale it.
    shape = []
    dense_coords = []
    for d in range(rank):
        b = block_sizes.get(d, 1)
        c = coords[d] * b
        if d in block_sizes:
            c = c + coords[rank + block_map.index(d)]
        dense_coords.append(c)
        shape.append(sizes[d] * b)
    size_limit.tensor_bytes(shape, values.dtype, "the dense tensor")
    dense = np.zeros(shape, values.dtype)
    if values.size < positions.size:
        kernel.fail("sparse values are fewer than the sparsity parameters index")
    dense[tuple(dense_coords)] = values.reshape(-1)[positions]
    return dense


def _check_levels(metadata, stored):
    """Each level's entry count against the arrays the file gives for it, from the metadata alone
    (Python ints, no array made): a dense level is followed by a sparse level with one segment
    per entry, or by the values themselves; a sparse level's last segment ends within its
    indices. So no level expands to more entries than the file holds arrays for."""
    count = 1
    for level, meta in enumerate(metadata):
        if meta["format"] == "DENSE":
            count *= max(int(meta["dense_size"]), 0)
            following = metadata[level + 1] if level + 1 < len(metadata) else None
            if following is None:
                bound, what = stored, "stored values"
            elif following["format"] != "DENSE":
                bound, what = len(following["array_segments"]) - 1, f"segments at level {level + 1}"
            else:
                continue
            if count > bound:
                raise ModelError(f"sparsity level {level}: the dense levels make {count:,} entries, the file has "
                            f"{max(bound, 0):,} {what}")
        else:
            segments = meta["array_segments"]
            if len(segments) != count + 1:
                raise ModelError(f"sparsity level {level}: {len(segments):,} array_segments for {count:,} entries "
                            f"(one more is needed)")
            count = int(segments[-1]) if count else 0
            if not 0 <= count <= len(meta["array_indices"]) or int(segments[0]) != 0:
                raise ModelError(f"sparsity level {level}: array_segments run from {int(segments[0])} to {count:,}, "
                            f"beyond the {len(meta['array_indices']):,} array_indices")
    if count > stored:
        raise ModelError(f"sparsity: the levels index {count:,} values, the file stores {stored:,}")


def _index_checked(levels, count):
    """The walk's coordinates of `count` elements over `levels` levels may be made."""
    size_limit.tensor_bytes((levels, count), np.int64, "the sparse index")
