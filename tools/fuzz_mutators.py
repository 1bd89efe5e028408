"""The fuzzer's mutators: each turns a seed into one hostile variant, deterministically.

A mutator is `fn(seed, rng, seeds) -> Mutant | None`: `rng` is a `random.Random` seeded from the
case, so the same case gives the same bytes; None means the mutator has nothing to change in that
seed (the fuzzer then draws again from the same rng).

- Byte level, both formats: bit flips, overwrites with interesting values, truncation, chunks
  deleted, inserted or duplicated, and the splice of two seeds of the same format.
- ONNX, field aware: the ModelProto is parsed with onnx's protobuf classes, one field is changed and
  the model is serialized again. Tensor dims, attribute values and types, op types, domains and
  opset versions, the IR version, node input and output names, nodes removed, duplicated or
  moved, initializer types and payloads, one value of a small constant (a shape, axes, indices, a
  trip count), graph inputs and outputs, external data entries; and any of these inside the bodies
  of If and Loop (`onnx_subgraph`).
- TFLite, field aware: the flatbuffer is walked once per seed through the `tflite` package's
  generated readers, with a table that records the byte position and width of every scalar it
  reads (`_SiteTable`); a mutation writes an interesting value over one such field in place:
  shapes, buffer indices, opcodes, operator and graph input/output indices, builtin options,
  quantization, sparsity, buffer sizes and offsets, tensor types and union tags, and one value of a
  small constant buffer.
- Stacked: `onnx_havoc` and `tflite_havoc` make two to four field-aware mutations at once.

Each mutator has a weight: how often a case picks it among those that apply to its seed.
"""

import functools
import math
import struct
from dataclasses import dataclass

import flatbuffers
import numpy as np
import onnx
import onnx.defs
import tflite
from flatbuffers import encode
from flatbuffers import number_types as N
from onnx import AttributeProto, TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class Mutant:
    """A mutated model: its bytes, the files beside it, and what was changed."""

    data: bytes
    what: str
    op: str = ""  # the op type the mutation touched, when one (groups parity disagreements)
    files: tuple = ()


# Values that sit on the edges integer handling gets wrong: sign, 32-bit and 64-bit limits, sizes
# that overflow a product, and small ones.
INTERESTING_INTS = (0, 1, -1, 2, 3, -2, 7, 255, 256, 65535, 2 ** 31 - 1, 2 ** 31, -(2 ** 31), 2 ** 32 - 1,
                    2 ** 32, 2 ** 40, 2 ** 62, 2 ** 63 - 1, -(2 ** 63), -(2 ** 40))
INTERESTING_DIMS = (0, -1, -2, 1, 2, 3, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 62, 2 ** 63 - 1, -(2 ** 63))
INTERESTING_FLOATS = (0.0, -0.0, math.nan, math.inf, -math.inf, -1.0, 1e30, -1e30, 1e-30, 3.4e38, 1e-45, 0.5)
# Byte patterns written over the file: single bytes and little-endian words.
INTERESTING_BYTES = (b"\x00", b"\xff", b"\x7f", b"\x80", struct.pack("<i", 2 ** 31 - 1),
                     struct.pack("<I", 2 ** 32 - 1), struct.pack("<q", 2 ** 40), struct.pack("<q", -1),
                     struct.pack("<i", -1), struct.pack("<H", 0xFFFF), struct.pack("<q", 2 ** 62),
                     struct.pack("<i", 2 ** 30))

_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _int64(value):
    return max(_INT64[0], min(_INT64[1], int(value)))


def _near(rng, current, choices):
    """An interesting value, or one next to the current value."""
    if rng.random() < 0.2:
        return _int64(current + rng.choice((-1, 1, current)))
    return rng.choice(choices)


# -- byte level -------------------------------------------------------------------------------------

def bitflip(seed, rng, seeds):
    data = bytearray(seed.data)
    flips = rng.choice((1, 1, 2, 4, 8))
    for _ in range(flips):
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
    return Mutant(bytes(data), f"{flips} bit(s) flipped")


def interesting_bytes(seed, rng, seeds):
    data = bytearray(seed.data)
    value = rng.choice(INTERESTING_BYTES)
    at = rng.randrange(max(1, len(data) - len(value)))
    data[at:at + len(value)] = value
    return Mutant(bytes(data), f"{value.hex()} written at byte {at}")


def truncate(seed, rng, seeds):
    keep = rng.choice((0, 1, 4, 8, rng.randrange(len(seed.data)), len(seed.data) - rng.randint(1, 16)))
    keep = max(0, keep)
    return Mutant(seed.data[:keep], f"truncated to {keep} of {len(seed.data)} bytes")


def _chunk(rng, size):
    length = rng.choice((1, 2, 4, 8, 16, 64, 256))
    start = rng.randrange(max(1, size - length))
    return start, min(length, size - start)


def chunk_delete(seed, rng, seeds):
    start, length = _chunk(rng, len(seed.data))
    return Mutant(seed.data[:start] + seed.data[start + length:], f"{length} bytes deleted at {start}")


def chunk_insert(seed, rng, seeds):
    at = rng.randrange(len(seed.data) + 1)
    length = rng.choice((1, 4, 8, 64))
    filler = rng.choice((b"\x00" * length, b"\xff" * length, bytes(rng.randrange(256) for _ in range(length)),
                         rng.choice(INTERESTING_BYTES)))
    return Mutant(seed.data[:at] + filler + seed.data[at:], f"{len(filler)} bytes inserted at {at}")


def chunk_duplicate(seed, rng, seeds):
    start, length = _chunk(rng, len(seed.data))
    at = rng.randrange(len(seed.data) + 1)
    chunk = seed.data[start:start + length]
    return Mutant(seed.data[:at] + chunk + seed.data[at:], f"bytes {start}..{start + length} copied to {at}")


def splice(seed, rng, seeds):
    others = [s for s in seeds if s.format == seed.format and s.name != seed.name]
    if not others:
        return None
    other = rng.choice(others)
    cut, other_cut = rng.randrange(len(seed.data)), rng.randrange(len(other.data))
    return Mutant(seed.data[:cut] + other.data[other_cut:],
                  f"bytes ..{cut} then {other.name} bytes {other_cut}..")


# -- ONNX -------------------------------------------------------------------------------------------

def _parse(seed):
    model = onnx.ModelProto()
    model.ParseFromString(seed.data)
    return model


def _graphs(graph, where="main"):
    """(graph, where) of a graph and every graph nested in its nodes' attributes."""
    yield graph, where
    for node in graph.node:
        for attr in node.attribute:
            nested = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for k, g in enumerate(nested):
                yield from _graphs(g, f"{where}/{node.name or node.op_type}.{attr.name}"
                                      f"{f'[{k}]' if attr.type == AttributeProto.GRAPHS else ''}")


def _label(node, where):
    inside = "" if where == "main" else f" in {where}"
    return f"node {node.name!r} ({node.op_type}){inside}"


def _nodes(graphs):
    return [(g, where, node) for g, where in graphs for node in g.node]


def _tensors(graphs):
    """(tensor, label, op) of every initializer and every tensor-valued attribute."""
    found = []
    for g, where, node in _nodes(graphs):
        for attr in node.attribute:
            if attr.type == AttributeProto.TENSOR:
                found.append((attr.t, f"{_label(node, where)} attribute {attr.name}", node.op_type))
    for g, where in graphs:
        found += [(t, f"initializer {t.name!r}{'' if where == 'main' else ' in ' + where}", "") for t in g.initializer]
    return found


def _value_infos(graphs):
    found = []
    for g, where in graphs:
        for kind, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
            found += [(v, f"graph {kind} {v.name!r}{'' if where == 'main' else ' in ' + where}") for v in values]
    return found


def _consumer(graphs, name):
    """The op type of a node that reads `name`, for grouping: '' when none."""
    for _, _, node in _nodes(graphs):
        if name in node.input:
            return node.op_type
    return ""


def _mutate_dims(model, rng, graphs):
    tensors = _tensors(graphs)
    shaped = [(v, what) for v, what in _value_infos(graphs)
              if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")]
    if shaped and (not tensors or rng.random() < 0.4):
        v, what = rng.choice(shaped)
        dims = v.type.tensor_type.shape.dim
        choice = rng.randrange(4) if dims else 3
        if choice == 0:
            k = rng.randrange(len(dims))
            dims[k].dim_value = value = _near(rng, dims[k].dim_value, INTERESTING_DIMS)
            return f"{what} dim {k} = {value}", _consumer(graphs, v.name)
        if choice == 1:
            k = rng.randrange(len(dims))
            dims[k].dim_param = rng.choice(("N", "", "x" * 200, "batch"))
            return f"{what} dim {k} made symbolic {dims[k].dim_param!r}", _consumer(graphs, v.name)
        if choice == 2:
            del dims[rng.randrange(len(dims))]
            return f"{what} lost a dim", _consumer(graphs, v.name)
        dims.add().dim_value = value = rng.choice((1, 2, 0, 2 ** 40))
        return f"{what} gained a dim {value}", _consumer(graphs, v.name)
    if not tensors:
        return None
    t, what, op = rng.choice(tensors)
    op = op or _consumer(graphs, t.name)
    choice = rng.randrange(4) if t.dims else 3
    if choice in (0, 1):
        k = rng.randrange(len(t.dims))
        t.dims[k] = value = _near(rng, t.dims[k], INTERESTING_DIMS)
        return f"{what} dim {k} = {value}", op
    if choice == 2:
        del t.dims[rng.randrange(len(t.dims))]
        return f"{what} lost a dim", op
    value = rng.choice((0, 1, 2, 2 ** 40, 2 ** 62))
    if t.dims:
        t.dims.insert(rng.randrange(len(t.dims) + 1), value)
    else:
        t.dims.append(value)
    return f"{what} gained a dim {value}", op


_WORDS = (b"", b"constant", b"reflect", b"edge", b"wrap", b"linear", b"cubic", b"nearest", b"SAME_LOWER",
          b"SAME_UPPER", b"VALID", b"NOTSET", b"bogus", b"\xff\xfe", b"half_pixel", b"tf_crop_and_resize",
          b"round_prefer_ceil", b"CRD", b"DCR", b"x" * 1000)
_EXTRA_ATTRIBUTES = ("axis", "axes", "perm", "group", "pads", "strides", "dilations", "kernel_shape", "to",
                     "keepdims", "mode", "k", "epsilon", "alpha", "beta", "value", "auto_pad", "body", "split")


def _mutate_attribute(model, rng, graphs):
    candidates = [(g, where, node) for g, where, node in _nodes(graphs) if node.attribute]
    if not candidates or rng.random() < 0.1:
        nodes = _nodes(graphs)
        if not nodes:
            return None
        _, where, node = rng.choice(nodes)
        name = rng.choice(_EXTRA_ATTRIBUTES)
        value = rng.choice((rng.choice(INTERESTING_INTS), [1, 2 ** 40], -1.5, b"bogus"))
        node.attribute.append(helper.make_attribute(name, value))
        return f"{_label(node, where)} gained attribute {name} = {value!r}", node.op_type
    _, where, node = rng.choice(candidates)
    attr = rng.choice(node.attribute)
    what = f"{_label(node, where)} attribute {attr.name}"
    kind = attr.type
    if kind == AttributeProto.INT:
        attr.i = value = _near(rng, attr.i, INTERESTING_INTS)
        return f"{what} = {value}", node.op_type
    if kind == AttributeProto.INTS:
        choice = rng.randrange(5) if attr.ints else 3
        if choice <= 1:
            k = rng.randrange(len(attr.ints))
            attr.ints[k] = value = _near(rng, attr.ints[k], INTERESTING_INTS)
            return f"{what}[{k}] = {value}", node.op_type
        if choice == 2:
            del attr.ints[:]
            return f"{what} emptied", node.op_type
        if choice == 3:
            attr.ints.extend([rng.choice(INTERESTING_INTS)] * rng.choice((1, 2, 8)))
            return f"{what} lengthened to {len(attr.ints)}", node.op_type
        del attr.ints[rng.randrange(len(attr.ints))]
        return f"{what} shortened to {len(attr.ints)}", node.op_type
    if kind == AttributeProto.FLOAT:
        attr.f = value = rng.choice(INTERESTING_FLOATS)
        return f"{what} = {value}", node.op_type
    if kind == AttributeProto.FLOATS:
        if attr.floats and rng.random() < 0.7:
            attr.floats[rng.randrange(len(attr.floats))] = value = rng.choice(INTERESTING_FLOATS)
            return f"{what} element = {value}", node.op_type
        del attr.floats[:]
        return f"{what} emptied", node.op_type
    if kind == AttributeProto.STRING:
        attr.s = value = rng.choice(_WORDS)
        return f"{what} = {value[:20]!r}", node.op_type
    if kind == AttributeProto.TENSOR:
        return _mutate_tensor(attr.t, rng, what, node.op_type)
    if kind == AttributeProto.GRAPH:
        body = [(attr.g, f"{where}/{node.name or node.op_type}.{attr.name}")]
        return _mutate_graph_io(model, rng, body)
    del node.attribute[list(node.attribute).index(attr)]
    return f"{what} removed", node.op_type


def _other_attribute(name, kind, rng):
    """An attribute named `name` holding a value of a random type other than `kind`."""
    while True:
        attr = helper.make_attribute(name, rng.choice(_ATTRIBUTE_VALUES))
        if attr.type != kind:
            return attr


_ATTRIBUTE_VALUES = (
    3, 2 ** 40, -1, 1.5, math.nan, [1, 2 ** 40], [0.5, -1.0], b"bogus", [b"a", b"b"],
    numpy_helper.from_array(np.array(1e-5, np.float32)), numpy_helper.from_array(np.array([1, 2], np.int64)),
    helper.make_graph([], "empty", [], []))


def _mutate_attribute_type(model, rng, graphs):
    candidates = [(where, node) for _, where, node in _nodes(graphs) if node.attribute]
    if not candidates:
        return None
    where, node = rng.choice(candidates)
    k = rng.randrange(len(node.attribute))
    old = node.attribute[k]
    before = AttributeProto.AttributeType.Name(old.type)
    if rng.random() < 0.2:
        # The type field and the value disagree: the value stays, the type says something else.
        old.type = rng.choice([t for t in AttributeProto.AttributeType.values() if t != old.type])
        return (f"{_label(node, where)} attribute {old.name} type {before} -> "
                f"{AttributeProto.AttributeType.Name(old.type)}, value unchanged", node.op_type)
    new = _other_attribute(old.name, old.type, rng)
    node.attribute[k].CopyFrom(new)
    return (f"{_label(node, where)} attribute {old.name} type {before} -> "
            f"{AttributeProto.AttributeType.Name(new.type)}", node.op_type)


@functools.lru_cache(maxsize=1)
def _all_op_types():
    return sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""})


_SEED_OPS = ("Conv", "MaxPool", "AveragePool", "Gemm", "MatMul", "BatchNormalization", "Clip", "Relu", "Reshape",
             "Transpose", "Concat", "Gather", "Slice", "ConstantOfShape", "Expand", "Tile", "Range", "Pad",
             "Resize", "TopK", "ArgMax", "Softmax", "Cast", "Constant", "If", "Loop", "Scan", "SplitToSequence",
             "SequenceAt", "Identity", "Add", "Squeeze", "Unsqueeze", "Flatten", "Split", "Where", "Einsum",
             "ScatterND", "GatherND", "NonZero", "ConvTranspose", "LSTM", "Upsample", "Shape", "Size")


def _mutate_op_type(model, rng, graphs):
    nodes = _nodes(graphs)
    if not nodes:
        return None
    _, where, node = rng.choice(nodes)
    old, label = node.op_type, _label(node, where)
    pool = rng.choice((_SEED_OPS, _all_op_types(), ("", "Bogus", "conv", "Conv ", "x" * 300)))
    node.op_type = rng.choice(pool)
    return f"{label}: op type -> {node.op_type!r}", old


_DOMAINS = ("com.microsoft", "ai.onnx.ml", "ai.onnx", "bogus.domain", "com.microsoft.nchwc", "ai.onnx.preview.training",
            "", "tflite")
_OPSET_VERSIONS = (99999, 0, 1, 6, 7, 9, 10, 11, 12, 13, 18, 21, 22, 23, 25, -1, 2 ** 62)


def _mutate_opset(model, rng, graphs):
    choice = rng.randrange(5)
    if choice == 0 and model.opset_import:
        entry = rng.choice(model.opset_import)
        old, entry.version = entry.version, rng.choice(_OPSET_VERSIONS)
        return f"opset {entry.domain or 'ai.onnx'} {old} -> {entry.version}", ""
    if choice == 1:
        nodes = _nodes(graphs)
        _, where, node = rng.choice(nodes)
        node.domain = rng.choice(_DOMAINS)
        return f"{_label(node, where)}: domain -> {node.domain!r}", node.op_type
    if choice == 2:
        entry = model.opset_import.add()
        entry.domain, entry.version = rng.choice(_DOMAINS), rng.choice(_OPSET_VERSIONS)
        return f"opset import added: {entry.domain!r} {entry.version}", ""
    if choice == 3:
        del model.opset_import[:]
        return "opset imports removed", ""
    entry = model.opset_import.add()
    entry.domain, entry.version = "", rng.choice(_OPSET_VERSIONS)
    return f"a second default-domain opset import, {entry.version}", ""


def _mutate_ir_version(model, rng, graphs):
    old = model.ir_version
    model.ir_version = rng.choice((2 ** 62, 0, 1, 2, 3, 4, 7, 11, 12, 13, 99, -1, 2 ** 63 - 1))
    return f"ir_version {old} -> {model.ir_version}", ""


def _names(graphs):
    """The names a node input can refer to: graph inputs, initializers, node outputs."""
    names = []
    for g, _ in graphs:
        names += [v.name for v in g.input] + [t.name for t in g.initializer]
        names += [o for n in g.node for o in n.output]
    return names


def _mutate_rename(model, rng, graphs):
    nodes = _nodes(graphs)
    if not nodes:
        return None
    everything = _names(list(_graphs(model.graph)))
    g, where, node = rng.choice(nodes)
    own_inputs = [v.name for v in g.input] + [t.name for t in g.initializer]
    candidates = ([""] + everything + own_inputs + [o.name for o in g.output] + ["nonexistent", node.output[0]
                  if node.output else "self"])
    new = rng.choice(candidates)
    choice = rng.randrange(4)
    if choice == 0 and node.input:
        k = rng.randrange(len(node.input))
        old, node.input[k] = node.input[k], new
        return f"{_label(node, where)} input {k} {old!r} -> {new!r}", node.op_type
    if choice == 1 and node.output:
        k = rng.randrange(len(node.output))
        old, node.output[k] = node.output[k], new
        return f"{_label(node, where)} output {k} {old!r} -> {new!r}", node.op_type
    if choice == 2:
        node.input.append(new)
        return f"{_label(node, where)} gained input {new!r}", node.op_type
    if node.input:
        node.input.pop()
        return f"{_label(node, where)} lost its last input", node.op_type
    node.output.append(new)
    return f"{_label(node, where)} gained output {new!r}", node.op_type


def _mutate_nodes(model, rng, graphs):
    nodes = _nodes(graphs)
    if not nodes:
        return None
    g, where, node = rng.choice(nodes)
    index = list(g.node).index(node)
    choice = rng.randrange(4)
    if choice == 0:
        del g.node[index]
        return f"{_label(node, where)} removed", node.op_type
    if choice == 1:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        g.node.insert(rng.randrange(len(g.node) + 1), copy)
        return f"{_label(node, where)} duplicated, same outputs", node.op_type
    if choice == 2:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for k in range(len(copy.output)):
            copy.output[k] = f"{copy.output[k]}_copy"
        g.node.insert(index + 1, copy)
        return f"{_label(node, where)} duplicated, outputs renamed", node.op_type
    moved = onnx.NodeProto()
    moved.CopyFrom(node)
    del g.node[index]
    g.node.insert(rng.randrange(len(g.node) + 1), moved)
    return f"{_label(node, where)} moved", node.op_type


def _tensor_types():
    return [t for t in TensorProto.DataType.values()] + [99, -1]


def _mutate_tensor(t, rng, what, op):
    choice = rng.randrange(5)
    if choice == 0:
        old, t.data_type = t.data_type, rng.choice([d for d in _tensor_types() if d != t.data_type])
        return f"{what} data_type {old} -> {t.data_type}", op
    if choice == 1 and t.raw_data:
        raw = t.raw_data
        cut = rng.choice((0, 1, len(raw) // 2, len(raw) - 1, len(raw) + rng.choice((1, 4, 64))))
        t.raw_data = raw[:cut] + b"\x01" * max(0, cut - len(raw))
        return f"{what} raw_data {len(raw)} -> {cut} bytes", op
    if choice == 2:
        fields = [f for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
                  if getattr(t, f)]
        if fields:
            field = getattr(t, rng.choice(fields))
            if rng.random() < 0.5:
                del field[len(field) // 2:]
                return f"{what} typed data shortened to {len(field)}", op
            field.extend(field[:1] * rng.choice((1, 100)))
            return f"{what} typed data lengthened to {len(field)}", op
        t.float_data.extend([1.0, 2.0])
        return f"{what} gained float_data beside its raw_data", op
    if choice == 3:
        t.ClearField("raw_data")
        for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(f)
        return f"{what} payload removed", op
    dims = t.dims
    if dims:
        k = rng.randrange(len(dims))
        dims[k] = value = _near(rng, dims[k], INTERESTING_DIMS)
        return f"{what} dim {k} = {value}", op
    dims.append(value := rng.choice((0, 2, 2 ** 40)))
    return f"{what} gained dim {value}", op


def _mutate_initializer(model, rng, graphs):
    tensors = _tensors(graphs)
    if not tensors:
        return None
    t, what, op = rng.choice(tensors)
    return _mutate_tensor(t, rng, what, op or _consumer(graphs, t.name))


SMALL_TENSOR = 64  # elements: the tensors that hold shapes, axes, indices, counts and scales


def _small_constants(graphs):
    """(tensor, label, op, array) of the constants of at most SMALL_TENSOR numbers held in the model."""
    small = []
    for t, what, op in _tensors(graphs):
        if t.data_location == TensorProto.EXTERNAL:
            continue  # its bytes live in the data file
        try:
            array = numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001 - a tensor onnx cannot decode has no value to change
            continue
        if 0 < array.size <= SMALL_TENSOR and array.dtype.kind in "biuf":
            small.append((t, what, op, array))
    return small


def _mutate_values(model, rng, graphs):
    """One value of a small constant: a Reshape target, Tile repeats, Slice bounds, TopK's k, a
    Loop's trip count, Resize scales, Gather indices, a ConstantOfShape shape..."""
    small = _small_constants(graphs)
    if not small:
        return None
    # Integers are the shapes, axes, indices and counts a size is computed from: most cases go there.
    integers = [entry for entry in small if entry[3].dtype.kind in "iu"]
    t, what, op, array = rng.choice(integers if integers and rng.random() < 0.8 else small)
    flat = array.reshape(-1).copy()
    k = rng.randrange(flat.size)
    old = flat[k].item()
    if array.dtype.kind == "b":
        new = not old
    elif array.dtype.kind == "f":
        new = rng.choice(INTERESTING_FLOATS + (old * 1000, -old))
    else:
        info = np.iinfo(array.dtype)
        new = max(info.min, min(info.max, _near(rng, old, INTERESTING_INTS + (old * 1000, -old))))
    flat[k] = new
    t.CopyFrom(numpy_helper.from_array(flat.reshape(array.shape), t.name))
    return f"{what}[{k}] {old} -> {new}", op or _consumer(graphs, t.name)


def _mutate_graph_io(model, rng, graphs):
    g, where = rng.choice(graphs)
    inside = "" if where == "main" else f" of {where}"
    choice = rng.randrange(7)
    if choice == 0 and g.output:
        g.output.append(rng.choice(g.output))
        return f"graph output {g.output[-1].name!r}{inside} listed twice", ""
    if choice == 1:
        del g.output[:]
        return f"graph outputs{inside} removed", ""
    if choice == 2 and g.output:
        names = [v.name for v in g.input] + [t.name for t in g.initializer] + ["", "nonexistent"]
        v = rng.choice(g.output)
        old, v.name = v.name, rng.choice(names)
        return f"graph output {old!r}{inside} renamed {v.name!r}", ""
    values = list(g.input) + list(g.output)
    if choice == 3 and values:
        v = rng.choice(values)
        old, v.type.tensor_type.elem_type = v.type.tensor_type.elem_type, rng.choice(_tensor_types())
        return f"{v.name!r}{inside} elem_type {old} -> {v.type.tensor_type.elem_type}", _consumer(graphs, v.name)
    if choice == 4 and g.input:
        v = rng.choice(g.input)
        del g.input[list(g.input).index(v)]
        return f"graph input {v.name!r}{inside} removed", _consumer(graphs, v.name)
    if choice == 5 and g.input:
        g.input.append(rng.choice(g.input))
        return f"graph input {g.input[-1].name!r}{inside} listed twice", ""
    if choice == 6 and values:
        v = rng.choice(values)
        v.type.ClearField("tensor_type")
        if rng.random() < 0.5:
            v.type.sequence_type.elem_type.tensor_type.elem_type = TensorProto.FLOAT
            return f"{v.name!r}{inside} declared a sequence", _consumer(graphs, v.name)
        return f"{v.name!r}{inside} lost its type", _consumer(graphs, v.name)
    if g.initializer:
        t = rng.choice(g.initializer)
        g.input.append(helper.make_tensor_value_info(t.name, rng.choice((TensorProto.FLOAT, TensorProto.INT64)),
                                                     [rng.choice((1, "N"))]))
        return f"initializer {t.name!r}{inside} also declared a graph input", _consumer(graphs, t.name)
    return None


_LOCATIONS = ("../weights.bin", "/etc/hostname", "missing.bin", "", ".", "model.onnx", "weights.bin/x",
              "./weights.bin", "x" * 300, "/dev/zero", "/proc/self/mem", "weights.bin\x01")


def _mutate_external(model, rng, graphs):
    tensors = _tensors(graphs)
    if not tensors:
        return None
    external = [entry for entry in tensors if entry[0].data_location == TensorProto.EXTERNAL]
    if not external:
        t, what, op = rng.choice(tensors)
        t.ClearField("raw_data")
        t.external_data.add(key="location", value=rng.choice(_LOCATIONS))
        t.external_data.add(key="offset", value=str(rng.choice((0, 4, 2 ** 40))))
        t.data_location = TensorProto.EXTERNAL
        return f"{what} made external, {t.external_data[0].value!r}", op or _consumer(graphs, t.name)
    t, what, op = rng.choice(external)
    op = op or _consumer(graphs, t.name)
    choice = rng.randrange(5)
    entries = {e.key: e for e in t.external_data}
    if choice == 0 and "location" in entries:
        entries["location"].value = rng.choice(_LOCATIONS)
        return f"{what} location -> {entries['location'].value!r}", op
    if choice in (1, 2):
        key = "offset" if choice == 1 else "length"
        entry = entries.get(key) or t.external_data.add(key=key)
        entry.value = str(rng.choice((-1, 0, 1, 3, 2 ** 31, 2 ** 40, 2 ** 63 - 1, 2 ** 64))) \
            if rng.random() < 0.9 else rng.choice(("", "ten", "0x10", " 4"))
        return f"{what} {key} -> {entry.value!r}", op
    if choice == 3:
        key = rng.choice(list(entries))
        del t.external_data[list(t.external_data).index(entries[key])]
        return f"{what} lost external_data key {key}", op
    t.data_location = TensorProto.DEFAULT
    return f"{what} data_location DEFAULT with external_data kept", op


def _subgraphs(model):
    return [(g, where) for g, where in _graphs(model.graph) if where != "main"]


_ONNX_FIELDS = {
    "onnx_dims": _mutate_dims,
    "onnx_attribute": _mutate_attribute,
    "onnx_attribute_type": _mutate_attribute_type,
    "onnx_op_type": _mutate_op_type,
    "onnx_opset": _mutate_opset,
    "onnx_ir_version": _mutate_ir_version,
    "onnx_rename": _mutate_rename,
    "onnx_nodes": _mutate_nodes,
    "onnx_initializer": _mutate_initializer,
    "onnx_values": _mutate_values,
    "onnx_graph_io": _mutate_graph_io,
    "onnx_external_data": _mutate_external,
}
# What onnx_havoc stacks: all but the whole-model switches, which mostly end a case at the first check.
_HAVOC_FIELDS = ("onnx_dims", "onnx_attribute", "onnx_attribute_type", "onnx_op_type", "onnx_rename",
                 "onnx_nodes", "onnx_initializer", "onnx_values", "onnx_values", "onnx_graph_io")
# What onnx_subgraph applies inside a body: the mutators whose target is a graph's contents.
_SUBGRAPH_FIELDS = ("onnx_dims", "onnx_attribute", "onnx_attribute_type", "onnx_op_type", "onnx_rename",
                    "onnx_nodes", "onnx_initializer", "onnx_values", "onnx_graph_io")


def _onnx_mutator(mutate):
    def mutator(seed, rng, seeds):
        model = _parse(seed)
        found = mutate(model, rng, list(_graphs(model.graph)))
        if found is None:
            return None
        what, op = found
        return Mutant(model.SerializeToString(), what, op)
    return mutator


def onnx_subgraph(seed, rng, seeds):
    model = _parse(seed)
    bodies = _subgraphs(model)
    if not bodies:
        return None
    found = _ONNX_FIELDS[rng.choice(_SUBGRAPH_FIELDS)](model, rng, [rng.choice(bodies)])
    if found is None:
        return None
    what, op = found
    return Mutant(model.SerializeToString(), what, op)


# -- TFLite -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Site:
    """A scalar of a flatbuffer: where it lies, how wide it is, what it means."""

    category: str
    what: str
    pos: int
    fmt: str  # struct format: "<i", "<B", "<f", ...


class _SiteTable(flatbuffers.table.Table):
    """A flatbuffers Table that records, while `recording`, each scalar field and vector element
    read through it, and each vector length it reads, as a Site in the current category."""

    __slots__ = ("sites", "category", "what", "recording")

    def __init__(self, table, sites, category, what):
        super().__init__(table.Bytes, table.Pos)
        self.sites, self.category, self.what = sites, category, what
        self.recording = False

    def _raw(self, flags, off):
        return encode.Get(flags.packer_type, self.Bytes, off)

    def Offset(self, slot):
        vtable = self.Pos - self._raw(N.SOffsetTFlags, self.Pos)
        if slot < self._raw(N.VOffsetTFlags, vtable):
            return self._raw(N.VOffsetTFlags, vtable + slot)
        return 0

    def Vector(self, off):
        off += self.Pos
        return off + self._raw(N.UOffsetTFlags, off) + 4

    def VectorLen(self, off):
        at = off + self.Pos
        at += self._raw(N.UOffsetTFlags, at)
        if self.recording:
            self.sites.append(Site(self.category, f"{self.what} length", at, "<I"))
        return self._raw(N.UOffsetTFlags, at)

    def Get(self, flags, off):
        if self.recording:
            self.sites.append(Site(self.category, self.what, off, flags.packer_type.format))
        return super().Get(flags, off)


def _wrap(obj, sites, category, what):
    obj._tab = _SiteTable(obj._tab, sites, category, what)
    return obj


def _read(obj, category, what, method):
    """Call the accessor `method` (and each element, for a vector), recording in `category`."""
    tab = obj._tab
    tab.category, tab.what, tab.recording = category, what, True
    try:
        length = getattr(obj, f"{method}Length", None)
        if length is None:
            return getattr(obj, method)()
        values = []
        for k in range(length()):
            tab.what = f"{what}[{k}]"
            values.append(getattr(obj, method)(k))
        return values
    finally:
        tab.recording = False


def _union_table(obj, slot):
    tab = obj._tab
    o = tab.Offset(slot)
    return None if not o else tab.Pos + o + tab._raw(N.UOffsetTFlags, tab.Pos + o)


_OPTION_CLASSES = {value: getattr(tflite, name) for name, value in vars(tflite.BuiltinOptions).items()
                   if not name.startswith("_") and type(value) is int and hasattr(tflite, name)}
_SKIPPED = ("Init", "GetRootAs")


def _option_sites(cls, buf, pos, sites, what):
    """The fields of a builtin options table: its generated class's scalar and vector accessors."""
    obj = cls()
    obj.Init(buf, pos)
    _wrap(obj, sites, "options", what)
    members = vars(cls)
    for name, member in sorted(members.items()):
        if (not name[:1].isupper() or name.startswith(_SKIPPED) or not callable(member)
                or name.endswith(("BufferHasIdentifier", "AsNumpy", "IsNone", "Length"))):
            continue
        argcount = member.__code__.co_argcount
        if argcount == 1 or (argcount == 2 and f"{name}Length" in members):
            _read(obj, "options", f"{what} {name}", name)


def _sparse_sites(tensor, buf, sites, what):
    sp = tensor.Sparsity()
    if sp is None:
        return
    _wrap(sp, sites, "sparsity", what)
    _read(sp, "sparsity", f"{what} traversal_order", "TraversalOrder")
    _read(sp, "sparsity", f"{what} block_map", "BlockMap")
    for k in range(sp.DimMetadataLength()):
        d = _wrap(sp.DimMetadata(k), sites, "sparsity", f"{what} dim {k}")
        for field in ("Format", "DenseSize", "ArraySegmentsType", "ArrayIndicesType"):
            _read(d, "sparsity", f"{what} dim {k} {field}", field)
        for field, slot in (("array_segments", 10), ("array_indices", 14)):
            pos = _union_table(d, slot)
            if pos is not None:
                vector = tflite.Int32Vector()
                vector.Init(buf, pos)
                _wrap(vector, sites, "sparsity", "")
                _read(vector, "sparsity", f"{what} dim {k} {field}", "Values")


_FLOAT_FORMATS = ("<f", "<d")
# The constants worth changing one value of: the int32/int64 shapes, axes, indices and sizes, and floats.
_VALUE_FORMATS = {tflite.TensorType.INT32: "<i", tflite.TensorType.INT64: "<q", tflite.TensorType.FLOAT32: "<f"}


@functools.lru_cache(maxsize=64)
def tflite_sites(data):
    """Every scalar of a (valid) TFLite model the fuzzer may change, as Sites."""
    buf = bytearray(data)
    sites = []
    model = _wrap(tflite.Model.GetRootAs(buf, 0), sites, "opcode", "model")
    _read(model, "opcode", "model version", "Version")
    codes = []
    for i in range(model.OperatorCodesLength()):
        code = _wrap(model.OperatorCodes(i), sites, "opcode", f"operator code {i}")
        for field in ("DeprecatedBuiltinCode", "BuiltinCode", "Version"):
            _read(code, "opcode", f"operator code {i} {field}", field)
        codes.append(code.BuiltinCode())
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    data_at = {}  # buffer index -> (start, length) of its data vector
    for i in range(model.BuffersLength()):
        buffer = _wrap(model.Buffers(i), sites, "buffer_size", f"buffer {i}")
        buffer._tab.what, buffer._tab.recording = f"buffer {i} data", True
        length = buffer.DataLength()
        buffer._tab.recording = False
        if length:
            data_at[i] = (buffer._tab.Vector(buffer._tab.Offset(4)), length)
        _read(buffer, "buffer_size", f"buffer {i} offset", "Offset")
        _read(buffer, "buffer_size", f"buffer {i} size", "Size")
    for s in range(model.SubgraphsLength()):
        sg = _wrap(model.Subgraphs(s), sites, "graph_io", f"subgraph {s}")
        for t in range(sg.TensorsLength()):
            tensor = _wrap(sg.Tensors(t), sites, "shape", "")
            what = f"tensor {t} {(tensor.Name() or b'').decode()!r}"
            _read(tensor, "shape", f"{what} shape", "Shape")
            _read(tensor, "shape", f"{what} shape_signature", "ShapeSignature")
            kind = _read(tensor, "type", f"{what} type", "Type")
            index = _read(tensor, "buffer_index", f"{what} buffer", "Buffer")
            fmt = _VALUE_FORMATS.get(kind)
            start, length = data_at.get(index, (0, 0))
            if fmt and length <= SMALL_TENSOR * 8:
                width = struct.calcsize(fmt)
                sites += [Site("values", f"{what} value {k}", start + k * width, fmt) for k in range(length // width)]
            q = tensor.Quantization()
            if q is not None:
                _wrap(q, sites, "quantization", what)
                for field in ("Scale", "ZeroPoint", "Min", "Max"):
                    _read(q, "quantization", f"{what} {field.lower()}", field)
                _read(q, "quantization", f"{what} quantized_dimension", "QuantizedDimension")
                _read(q, "quantization", f"{what} details_type", "DetailsType")
            _sparse_sites(tensor, buf, sites, what)
        _read(sg, "graph_io", f"subgraph {s} inputs", "Inputs")
        _read(sg, "graph_io", f"subgraph {s} outputs", "Outputs")
        for k in range(sg.OperatorsLength()):
            op = _wrap(sg.Operators(k), sites, "opcode", "")
            index = op.OpcodeIndex()
            name = names.get(codes[index], "?") if 0 <= index < len(codes) else "?"
            what = f"operator {k} ({name})"
            _read(op, "opcode", f"{what} opcode_index", "OpcodeIndex")
            _read(op, "operator_io", f"{what} inputs", "Inputs")
            _read(op, "operator_io", f"{what} outputs", "Outputs")
            _read(op, "options", f"{what} builtin_options_type", "BuiltinOptionsType")
            kind = op.BuiltinOptionsType()
            pos = _union_table(op, 12)
            if kind in _OPTION_CLASSES and pos is not None:
                _option_sites(_OPTION_CLASSES[kind], buf, pos, sites, f"{what} {_OPTION_CLASSES[kind].__name__}")
    # An accessor may read another field too (BuiltinCode reads the deprecated code): a field's first
    # reading names it.
    unique = {}
    for site in sites:
        unique.setdefault(site.pos, site)
    return tuple(unique.values())




def _site_value(rng, site, current):
    if site.fmt in _FLOAT_FORMATS:
        return rng.choice(INTERESTING_FLOATS)
    bits = struct.calcsize(site.fmt) * 8
    if bits <= 8:
        value = rng.choice((0, 1, 2, 3, 0x7F, 0x80, 0xFF, rng.randrange(256), current + 1, current - 1))
    elif bits == 16:
        value = rng.choice((0, 1, 0x7FFF, 0x8000, 0xFFFF, current + 1, current - 1, rng.randrange(64)))
    elif bits == 32:
        value = rng.choice(INTERESTING_INTS[:14] + (current + 1, current - 1, current * 2, 2 ** 30, 2 ** 24,
                                                    rng.randrange(64)))
    else:
        value = rng.choice(INTERESTING_INTS + (current + 1, current - 1))
    mask = (1 << bits) - 1
    value &= mask
    if site.fmt[1:].islower() and value >> (bits - 1):  # a signed format: back to a negative number
        value -= 1 << bits
    return value


def _write_site(data, site, rng):
    """Write an interesting value other than the present one over `site`; return what was done."""
    current = struct.unpack_from(site.fmt, data, site.pos)[0]
    value = current
    for _ in range(8):
        value = _site_value(rng, site, current)
        if value != current and not (value != value and current != current):
            break
    struct.pack_into(site.fmt, data, site.pos, value)
    return f"{site.what}: {current} -> {value}"


def _site_op(site):
    return site.what.split("(")[1].split(")")[0] if site.what.startswith("operator ") and "(" in site.what else ""


def _tflite_mutator(category):
    def mutator(seed, rng, seeds):
        sites = [s for s in tflite_sites(seed.data) if s.category == category]
        if not sites:
            return None
        integers = [s for s in sites if s.fmt not in _FLOAT_FORMATS]
        if category == "values" and integers and rng.random() < 0.8:
            sites = integers  # the int32 shapes, axes, paddings and indices rather than the weights
        site = rng.choice(sites)
        data = bytearray(seed.data)
        what = _write_site(data, site, rng)
        return Mutant(bytes(data), what, _site_op(site))
    return mutator


HAVOC = (2, 3, 4)  # how many mutations a havoc case stacks


def tflite_havoc(seed, rng, seeds):
    """Several fields of any category at once. Sites are found in the seed: writing in place moves
    nothing, so they stay where they were (and a mutated file is never walked)."""
    sites = tflite_sites(seed.data)
    data = bytearray(seed.data)
    picked = [rng.choice(sites) for _ in range(rng.choice(HAVOC))]
    whats = [_write_site(data, site, rng) for site in picked]
    return Mutant(bytes(data), "; ".join(whats), next((_site_op(s) for s in picked if _site_op(s)), ""))


def onnx_havoc(seed, rng, seeds):
    """Several field-aware mutations of one ModelProto, each seeing the ones before it."""
    model = _parse(seed)
    whats, ops = [], []
    for _ in range(rng.choice(HAVOC)):
        name = rng.choice(_HAVOC_FIELDS)
        found = _ONNX_FIELDS[name](model, rng, list(_graphs(model.graph)))
        if found is not None:
            whats.append(found[0])
            ops.append(found[1])
    if not whats:
        return None
    return Mutant(model.SerializeToString(), "; ".join(whats), next((op for op in ops if op), ""))


TFLITE_CATEGORIES = ("shape", "buffer_index", "opcode", "operator_io", "graph_io", "options", "quantization",
                     "sparsity", "buffer_size", "type", "values")


# -- the table --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutator:
    name: str
    formats: tuple
    mutate: object  # fn(seed, rng, seeds) -> Mutant | None
    available: object = None  # fn(seed) -> bool: whether the seed has anything this mutator changes
    # How often a case picks this mutator, relative to the others that apply to its seed: byte-level
    # mutants mostly end at the parser, so the field-aware ones, which reach PREPARE and EXECUTE,
    # get more of the cases.
    weight: float = 2.0

    def applies(self, seed):
        return seed.format in self.formats and (self.available is None or self.available(seed))


def _has_subgraphs(seed):
    return bool(_subgraphs(_parse(seed)))


def _has_small_constants(seed):
    return bool(_small_constants(list(_graphs(_parse(seed).graph))))


def _has_attributes(seed):
    return any(node.attribute for _, _, node in _nodes(list(_graphs(_parse(seed).graph))))


def _has_sites(category):
    return lambda seed: any(s.category == category for s in tflite_sites(seed.data))


def _table():
    both = ("onnx", "tflite")
    table = [Mutator(fn.__name__, both, fn, weight=1.0) for fn in (
        bitflip, interesting_bytes, truncate, chunk_delete, chunk_insert, chunk_duplicate, splice)]
    needs = {"onnx_attribute_type": _has_attributes, "onnx_values": _has_small_constants}
    weights = {"onnx_values": 4.0, "onnx_attribute": 3.0, "onnx_ir_version": 1.0, "onnx_opset": 1.0}
    table += [Mutator(name, ("onnx",), _onnx_mutator(fn), needs.get(name), weights.get(name, 2.0))
              for name, fn in _ONNX_FIELDS.items()]
    table.append(Mutator("onnx_subgraph", ("onnx",), onnx_subgraph, _has_subgraphs, 3.0))
    table.append(Mutator("onnx_havoc", ("onnx",), onnx_havoc, weight=4.0))
    table += [Mutator(f"tflite_{category}", ("tflite",), _tflite_mutator(category), _has_sites(category),
                      4.0 if category in ("values", "shape", "options") else 2.0)
              for category in TFLITE_CATEGORIES]
    table.append(Mutator("tflite_havoc", ("tflite",), tflite_havoc, weight=4.0))
    return {m.name: m for m in table}


MUTATORS = _table()
