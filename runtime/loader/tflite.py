"""TFLite file -> `ir.Graph`, verified as it is read, without reading a weight byte.

The flatbuffer is read where it lies, through the `tflite` package's generated
schema classes; only their `_tab` is ours: `_Table` has the accessors of
`flatbuffers.table.Table` but checks every offset it follows against the
file (the checks TFLite's flatbuffer verifier makes: the root, every vtable,
every uoffset and every vector's extent), so a truncated or hostile file
raises ModelError instead of reading past the end or looping on a claimed
length. Forward-only uoffsets mean no table can refer back to itself.

For a mapped file the structure bytes come from `MappedFile.read` (pread) in
small blocks, not from the mapping: each Buffer table sits right before its
data, and one touch of the mapping makes the kernel map the pages around it
(fault-around, large folios), which on mediapipe's models made nearly half of
the weights resident at load. Bytes given by the caller are read in place.

A weight's position is the absolute offset of its Buffer's data vector (or
the Buffer's `offset`/`size`, for data stored after the flatbuffer); it
becomes an `ExternalData` view. Graph-level checks follow TFLite's
interpreter builder: indices in range, optional inputs only where the op
allows them, every operator input produced before it is used, constant dims
matching their bytes.
"""

import itertools
import re
import struct

import numpy as np
import tflite
from flatbuffers import number_types as N

from .. import ir
from ..errors import ModelError
from ..weights import ExternalData

IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
# Structure bytes are read from a file this many at a time.
BLOCK_BITS = 12
BLOCK = 1 << BLOCK_BITS
MAX_RANK = 64

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")

_DTYPES = {
    tflite.TensorType.FLOAT32: np.float32, tflite.TensorType.FLOAT16: np.float16,
    tflite.TensorType.FLOAT64: np.float64, tflite.TensorType.INT8: np.int8,
    tflite.TensorType.INT16: np.int16, tflite.TensorType.INT32: np.int32,
    tflite.TensorType.INT64: np.int64, tflite.TensorType.UINT8: np.uint8,
    tflite.TensorType.UINT16: np.uint16, tflite.TensorType.UINT32: np.uint32,
    tflite.TensorType.UINT64: np.uint64, tflite.TensorType.BOOL: np.bool_,
    tflite.TensorType.COMPLEX64: np.complex64, tflite.TensorType.COMPLEX128: np.complex128,
}


def _enum_names(enum_class):
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and type(v) is int}


_TYPE_NAMES = _enum_names(tflite.TensorType)
_OPERATOR_NAMES = _enum_names(tflite.BuiltinOperator)
_CUSTOM = tflite.BuiltinOperator.CUSTOM

# Inputs an operator may omit (index -1), by position: bias of the convolutions
# and FULLY_CONNECTED; the peephole, projection and layer-norm inputs of LSTMs.
_LSTM_OPTIONAL = frozenset((1, 5, 9, 10, 11, 16, 17, 20, 21, 22, 23))
OPTIONAL_INPUTS = {
    "CONV_2D": frozenset((2,)),
    "DEPTHWISE_CONV_2D": frozenset((2,)),
    "FULLY_CONNECTED": frozenset((2,)),
    "CONV_3D": frozenset((2,)),
    "TRANSPOSE_CONV": frozenset((3,)),
    "CONV_3D_TRANSPOSE": frozenset((3,)),
    "SVDF": frozenset((3,)),
    "LSTM": _LSTM_OPTIONAL,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _LSTM_OPTIONAL,
}

# Options fields whose values are enums: attrs hold the member's name.
_ENUM_FIELDS = {
    "padding": tflite.Padding,
    "fused_activation_function": tflite.ActivationFunctionType,
    "weights_format": tflite.FullyConnectedOptionsWeightsFormat,
    "quantized_bias_type": tflite.TensorType,
    "output_type": tflite.TensorType,
    "out_type": tflite.TensorType,
    "in_data_type": tflite.TensorType,
    "out_data_type": tflite.TensorType,
    "idx_out_type": tflite.TensorType,
    "mode": tflite.MirrorPadMode,
    "type": tflite.LSHProjectionType,
    "combiner": tflite.CombinerType,
    "kernel_type": tflite.LSTMKernelType,
    "reduce_function": tflite.ReduceWindowFunction,
}
_ENUM_NAMES = {key: _enum_names(cls) for key, cls in _ENUM_FIELDS.items()}


class _Bytes:
    """Bounds-checked reads of the file's structure bytes (see module docstring)."""

    def __init__(self, source):
        self.source = source
        self.size = source.size
        # Caller-owned bytes are read in place; a mapped file through pread.
        self.direct = None if source.releasable else source.buffer
        self.blocks = {}

    def _block(self, index):
        block = self.blocks.get(index)
        if block is None:
            start = index * BLOCK
            block = self.blocks[index] = self.source.read(start, min(start + BLOCK, self.size))
        return block

    def take(self, offset, length):
        """`length` bytes at `offset`, which must lie inside the file."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ModelError(f"malformed flatbuffer: {length} bytes at byte offset {offset} "
                             f"run past the end of the file ({self.size} bytes)")
        if self.direct is not None:
            return self.direct[offset:offset + length]
        first, start = divmod(offset, BLOCK)
        if start + length <= BLOCK:
            return self._block(first)[start:start + length]
        if length > 4 * BLOCK:
            return self.source.read(offset, offset + length)
        last = (offset + length - 1) // BLOCK
        joined = b"".join(self._block(i) for i in range(first, last + 1))
        return joined[start:start + length]

    def unpack(self, packer, offset):
        direct = self.direct
        if direct is not None:
            if 0 <= offset <= self.size - packer.size:
                return packer.unpack_from(direct, offset)[0]
        else:
            # The common case, a value inside one block already read.
            block = self.blocks.get(offset >> BLOCK_BITS)
            start = offset & (BLOCK - 1)
            if block is not None and start + packer.size <= len(block):
                return packer.unpack_from(block, start)[0]
        return packer.unpack_from(self.take(offset, packer.size))[0]


class _Table:
    """A verified flatbuffers table: the accessors of `flatbuffers.table.Table`, checked."""

    __slots__ = ("data", "Pos", "slots", "Bytes")

    def __init__(self, data, pos):
        self.data = data
        self.Pos = pos
        self.Bytes = None  # generated sub-table accessors would need it; we never call them
        vtable = pos - data.unpack(_I32, pos)
        vtable_size = data.unpack(_U16, vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise ModelError(f"malformed flatbuffer: the table at byte offset {pos} has a "
                             f"vtable of {vtable_size} bytes at byte offset {vtable}")
        # Decoded once: the field offsets by slot (vtable size, table size, fields...).
        self.slots = struct.unpack_from(f"<{vtable_size // 2}H", data.take(vtable, vtable_size))
        data.take(pos, max(self.slots[1], 4))

    # The flatbuffers.table.Table interface the generated classes call.

    def Offset(self, slot):
        slots = self.slots
        index = slot >> 1
        return slots[index] if index < len(slots) else 0

    def Get(self, flags, off):
        return flags.py_type(self.data.unpack(flags.packer_type, off))

    def Indirect(self, off):
        return off + self.data.unpack(_U32, off)

    def String(self, off):
        off += self.data.unpack(_U32, off)
        length = self.data.unpack(_U32, off)
        return bytes(self.data.take(off + 4, length))

    def VectorLen(self, off):
        off += self.Pos
        off += self.data.unpack(_U32, off)
        return self.data.unpack(_U32, off)

    def Vector(self, off):
        off += self.Pos
        return off + self.data.unpack(_U32, off) + 4

    def GetVectorAsNumpy(self, flags, off):
        dtype = np.dtype(N.to_numpy_type(flags))
        start, length = self.Vector(off), self.VectorLen(off)
        raw = self.data.take(start, length * dtype.itemsize)
        return np.frombuffer(raw, dtype=dtype).copy()  # small; keeps no file bytes alive

    # Navigation, checked, in place of the generated sub-table accessors.

    def vector_extent(self, slot, itemsize):
        """(start, length) of the vector in `slot`, checked to lie in the file; None if absent."""
        o = self.Offset(slot)
        if not o:
            return None
        unpack = self.data.unpack
        at = self.Pos + o
        at += unpack(_U32, at)
        start, length = at + 4, unpack(_U32, at)
        if length * itemsize > self.data.size:
            raise ModelError(f"malformed flatbuffer: a vector at byte offset {start} claims "
                             f"{length} elements")
        self.data.take(start, length * itemsize)
        return start, length

    def table(self, slot):
        o = self.Offset(slot)
        if not o:
            return None
        return _Table(self.data, self.Indirect(self.Pos + o))

    def tables(self, slot):
        extent = self.vector_extent(slot, 4)
        if extent is None:
            return []
        start, length = extent
        indirect = self.Indirect
        return [_Table(self.data, indirect(start + 4 * i)) for i in range(length)]

    def ints(self, slot):
        """An int32 vector as a list (empty when absent)."""
        extent = self.vector_extent(slot, 4)
        if extent is None:
            return []
        start, length = extent
        return np.frombuffer(self.data.take(start, 4 * length), dtype="<i4").tolist()


def _wrap(cls, table):
    """The generated schema class `cls` reading through the verified `table`."""
    obj = cls.__new__(cls)
    obj._tab = table
    return obj


def _vector(value):
    # Generated XAsNumpy accessors return 0 when the vector is absent.
    return [] if isinstance(value, int) else value


# Options tables: the generated class's accessors, as (attr key, method, kind).
_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_OPTION_FIELDS = {}
_SKIP_METHODS = {"Init", "GetRootAs"}


def _option_fields(cls):
    fields = _OPTION_FIELDS.get(cls)
    if fields is not None:
        return fields
    names = set(vars(cls))
    fields = []
    for name in sorted(names):
        if (not name[:1].isupper() or name in _SKIP_METHODS or name.startswith("GetRootAs")
                or name.endswith(("BufferHasIdentifier", "AsNumpy", "Length", "IsNone"))):
            continue
        code = vars(cls)[name].__code__
        if code.co_argcount == 1:
            kind = "scalar"
        elif f"{name}AsNumpy" in names:
            kind = "vector"
        else:
            continue  # vectors of tables or strings: no builtin's options we run have them
        key = _SNAKE.sub("_", name).lower()
        fields.append((key, name, kind))
    _OPTION_FIELDS[cls] = fields
    return fields


def _options_classes(union_enum):
    return {value: getattr(tflite, name) for name, value in vars(union_enum).items()
            if not name.startswith("_") and type(value) is int and name != "NONE"
            and hasattr(tflite, name)}


_OPTIONS = _options_classes(tflite.BuiltinOptions)
_OPTIONS2 = _options_classes(tflite.BuiltinOptions2)
_SPARSE_INDEX = {tflite.SparseIndexVector.Int32Vector: tflite.Int32Vector,
                 tflite.SparseIndexVector.Uint16Vector: tflite.Uint16Vector,
                 tflite.SparseIndexVector.Uint8Vector: tflite.Uint8Vector}


def _decode_options(table, cls, where):
    obj = _wrap(cls, table)
    attrs = {}
    for key, method, kind in _option_fields(cls):
        if kind == "vector":
            attrs[key] = [v.item() for v in _vector(getattr(obj, f"{method}AsNumpy")())]
            continue
        value = getattr(obj, method)()
        names = _ENUM_NAMES.get(key)
        if names is not None:
            if value not in names:
                raise ModelError(f"{where}: option {key} has unknown value {value}")
            value = names[value]
        attrs[key] = value
    return attrs


def load_tflite(source, path=None):
    """Build the `ir.Graph` of the TFLite model held by the MappedFile `source`."""
    where = path or "the model bytes"
    if source.size < 8:
        raise ModelError(f"{where}: {source.size} bytes is too short for a TFLite model")
    data = _Bytes(source)
    if bytes(data.take(4, 4)) != IDENTIFIER:
        raise ModelError(f"{where}: flatbuffer identifier {bytes(data.take(4, 4))!r} is not "
                         f"{IDENTIFIER!r} (not a TFLite model)")
    try:
        return _Builder(source, data, path).model()
    except ModelError as e:
        raise ModelError(f"{where}: malformed TFLite model: {e}") from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, UnicodeError,
            struct.error) as e:
        # Every check raises ModelError itself; this keeps an unforeseen
        # malformation from escaping as something else.
        raise ModelError(f"{where}: malformed TFLite model ({type(e).__name__}: {e})") from e


class _Builder:
    def __init__(self, source, data, path):
        self.source = source
        self.data = data
        self.path = path
        self.weight_ids = itertools.count()  # each ExternalData's id, in load order

    def model(self):
        root = _Table(self.data, self.data.unpack(_U32, 0))
        model = _wrap(tflite.Model, root)
        version = model.Version()
        if version != SCHEMA_VERSION:
            raise ModelError(f"schema version {version}, nnrun reads version {SCHEMA_VERSION}")
        subgraphs = root.tables(8)
        if not subgraphs:
            raise ModelError("the model has no subgraph")
        self.buffers = root.tables(12)
        self.opcodes = [self._opcode(i, t) for i, t in enumerate(root.tables(6))]
        graph = self._subgraph(subgraphs[0])
        description = model.Description()
        graph.meta = ir.ModelMeta(graph_name=graph.name, version=version,
                                  description=description.decode("utf-8", "replace") if description else "")
        return graph

    def _opcode(self, index, table):
        code = _wrap(tflite.OperatorCode, table)
        builtin = max(code.DeprecatedBuiltinCode(), code.BuiltinCode())
        version = code.Version()
        if builtin == _CUSTOM:
            custom = code.CustomCode()
            if not custom:
                raise ModelError(f"operator code {index}: CUSTOM without a custom_code")
            return "tflite.custom", custom.decode("utf-8"), version
        name = _OPERATOR_NAMES.get(builtin)
        if name is None:
            raise ModelError(f"operator code {index}: unknown builtin operator {builtin}")
        return "tflite", name, version

    # tensors

    def _subgraph(self, table):
        subgraph = _wrap(tflite.SubGraph, table)
        tensor_tables = table.tables(4)
        count = len(tensor_tables)
        tensors = [self._tensor(i, t) for i, t in enumerate(tensor_tables)]
        names = self._names(tensors)
        self.names = names
        initializers = {}
        sparsity = {}
        available = set()
        for i, t in enumerate(tensors):
            if t["weight"] is not None:
                initializers[names[i]] = t["weight"]
                available.add(i)
            if t["sparsity"] is not None:
                sparsity[names[i]] = t["sparsity"]
            if t["variable"]:
                available.add(i)
        inputs = self._io_indices(table.ints(6), count, "input")
        outputs = self._io_indices(table.ints(8), count, "output")
        available.update(inputs)
        nodes = []
        for index, op_table in enumerate(table.tables(10)):
            nodes.append(self._operator(index, op_table, tensors, available, sparsity))
        for i in outputs:
            if i not in available:
                raise ModelError(f"graph output tensor {i} {names[i]!r} is never produced")
        value_infos = {names[i]: self._value_info(names[i], t, signature=False)
                       for i, t in enumerate(tensors) if t["weight"] is None}
        name = subgraph.Name()
        graph = ir.Graph(
            name=name.decode("utf-8", "replace") if name else "main", nodes=nodes,
            inputs=[self._value_info(names[i], tensors[i]) for i in inputs],
            outputs=[self._value_info(names[i], tensors[i]) for i in outputs],
            initializers=initializers, value_infos=value_infos, opsets={"tflite": 1},
            source=self.source, format="tflite", path=self.path)
        graph.tflite_sparsity = sparsity
        return graph

    @staticmethod
    def _io_indices(indices, count, what):
        seen = set()
        for i in indices:
            if not 0 <= i < count:
                raise ModelError(f"graph {what} tensor index {i} is out of range "
                                 f"({count} tensors)")
            if i in seen:
                raise ModelError(f"graph {what} tensor {i} is listed twice")
            seen.add(i)
        return indices

    @staticmethod
    def _names(tensors):
        counts = {}
        for t in tensors:
            if t["name"]:
                counts[t["name"]] = counts.get(t["name"], 0) + 1
        names = []
        used = set()
        for i, t in enumerate(tensors):
            name = t["name"]
            if not name:
                name = f"t{i}"
            elif counts[name] > 1:
                name = f"{name}#{i}"
            while name in used:  # a file name that looks like one of ours
                name = f"{name}#{i}"
            used.add(name)
            names.append(name)
        return names

    @staticmethod
    def _value_info(name, t, signature=True):
        dims = t["signature"] if signature and t["signature"] is not None else t["shape"]
        return ir.ValueInfo(name, t["dtype"], tuple(dims))

    def _tensor(self, index, table):
        tensor = _wrap(tflite.Tensor, table)
        raw_name = tensor.Name()
        try:
            name = raw_name.decode("utf-8") if raw_name else ""
        except UnicodeDecodeError:
            name = ""
        what = f"tensor {index}{f' {name!r}' if name else ''}"
        type_code = tensor.Type()
        dtype = _DTYPES.get(type_code)
        if dtype is None:
            if type_code in _TYPE_NAMES:
                raise ModelError(f"{what}: type {_TYPE_NAMES[type_code]} is not supported")
            raise ModelError(f"{what}: unknown tensor type {type_code}")
        dtype = np.dtype(dtype)
        shape = table.ints(4)
        if len(shape) > MAX_RANK:
            raise ModelError(f"{what}: rank {len(shape)} exceeds {MAX_RANK}")
        if any(d < 0 for d in shape):
            raise ModelError(f"{what}: negative dimension in shape {shape}")
        signature = None
        if table.Offset(18):
            dims = table.ints(18)
            if len(dims) != len(shape) or any(d < -1 for d in dims):
                raise ModelError(f"{what}: shape_signature {dims} does not match shape {shape}")
            signature = [None if d == -1 else d for d in dims]
        sparsity_table = table.table(16)
        sparsity = self._sparsity(sparsity_table, what, shape) if sparsity_table else None
        buffer_index = tensor.Buffer()
        if not 0 <= buffer_index < len(self.buffers):
            raise ModelError(f"{what}: buffer index {buffer_index} is out of range "
                             f"({len(self.buffers)} buffers)")
        weight = None
        if buffer_index > 0:
            weight = self._weight(self.buffers[buffer_index], buffer_index, what, name or f"t{index}",
                                  dtype, shape, sparsity is not None)
        quant_table = table.table(12)
        return {"name": name, "dtype": dtype, "shape": shape, "signature": signature,
                "weight": weight, "sparsity": sparsity, "variable": tensor.IsVariable(),
                "quantization": self._quantization(quant_table, what, shape) if quant_table
                else None}

    def _weight(self, table, buffer_index, what, name, dtype, shape, sparse):
        """The ExternalData of a constant tensor, or None when its buffer is empty."""
        buffer = _wrap(tflite.Buffer, table)
        extent = table.vector_extent(4, 1)
        offset, nbytes = extent if extent else (0, 0)
        if not nbytes:
            offset, nbytes = buffer.Offset(), buffer.Size()
            if offset <= 1 or not nbytes:
                return None
            if offset + nbytes > self.data.size:
                raise ModelError(f"{what}: buffer {buffer_index} at byte offset {offset} with "
                                 f"size {nbytes} runs past the end of the file "
                                 f"({self.data.size} bytes)")
        if sparse:
            # The stored values of a sparse tensor: the dense shape is in its sparsity.
            if nbytes % dtype.itemsize:
                raise ModelError(f"{what}: buffer {buffer_index} of {nbytes} bytes is not a "
                                 f"whole number of {dtype} values")
            shape = (nbytes // dtype.itemsize,)
        try:
            return ExternalData(self.source, offset, nbytes, dtype, shape, name, next(self.weight_ids))
        except ModelError as e:
            raise ModelError(f"{what} (buffer {buffer_index}): {e}") from None

    def _quantization(self, table, what, shape):
        q = _wrap(tflite.QuantizationParameters, table)
        scale = _vector(q.ScaleAsNumpy())
        if not len(scale):
            return None
        zero_point = _vector(q.ZeroPointAsNumpy())
        axis = q.QuantizedDimension()
        if len(zero_point) != len(scale):
            raise ModelError(f"{what}: quantization has {len(scale)} scales and "
                             f"{len(zero_point)} zero points")
        if len(scale) > 1 and not (0 <= axis < len(shape) and shape[axis] == len(scale)):
            raise ModelError(f"{what}: {len(scale)} quantization scales do not match "
                             f"dimension {axis} of shape {shape}")
        return {"scale": np.asarray(scale, dtype=np.float32),
                "zero_point": np.asarray(zero_point, dtype=np.int64), "axis": axis}

    def _sparsity(self, table, what, shape):
        s = _wrap(tflite.SparsityParameters, table)
        dim_metadata = []
        for dim_table in table.tables(8):
            d = _wrap(tflite.DimensionMetadata, dim_table)
            fmt = d.Format()
            if fmt not in (tflite.DimensionType.DENSE, tflite.DimensionType.SPARSE_CSR):
                raise ModelError(f"{what}: unknown sparse dimension format {fmt}")
            entry = {"format": "DENSE" if fmt == tflite.DimensionType.DENSE else "SPARSE_CSR",
                     "dense_size": d.DenseSize()}
            for key, type_slot, value_slot in (("array_segments", 8, 10), ("array_indices", 12, 14)):
                kind = dim_table.Get(N.Uint8Flags, dim_table.Pos + dim_table.Offset(type_slot)) \
                    if dim_table.Offset(type_slot) else 0
                values = np.zeros(0, dtype=np.int32)
                if kind:
                    cls = _SPARSE_INDEX.get(kind)
                    if cls is None:
                        raise ModelError(f"{what}: unknown sparse index vector type {kind}")
                    vector_table = dim_table.table(value_slot)
                    if vector_table is not None:
                        values = _vector(_wrap(cls, vector_table).ValuesAsNumpy())
                        values = np.asarray(values, dtype=np.int32)
                entry[key] = values
            dim_metadata.append(entry)
        traversal_order = [v.item() for v in _vector(s.TraversalOrderAsNumpy())]
        block_map = [v.item() for v in _vector(s.BlockMapAsNumpy())]
        if sorted(traversal_order) != list(range(len(traversal_order))) or \
                len(traversal_order) != len(dim_metadata) or \
                len(traversal_order) != len(shape) + len(block_map):
            raise ModelError(f"{what}: sparsity traversal_order {traversal_order} does not fit "
                             f"shape {shape} with block_map {block_map}")
        return {"traversal_order": traversal_order, "block_map": block_map,
                "dim_metadata": dim_metadata, "dense_shape": list(shape)}

    # operators

    def _operator(self, index, table, tensors, available, sparsity):
        op = _wrap(tflite.Operator, table)
        opcode_index = op.OpcodeIndex()
        if not 0 <= opcode_index < len(self.opcodes):
            raise ModelError(f"operator {index}: opcode index {opcode_index} is out of range "
                             f"({len(self.opcodes)} operator codes)")
        domain, op_type, version = self.opcodes[opcode_index]
        what = f"operator {index} ({op_type})"
        names = self.names
        count = len(tensors)
        optional = OPTIONAL_INPUTS.get(op_type, ()) if domain == "tflite" else ()
        input_indices, output_indices = table.ints(6), table.ints(8)
        inputs = []
        for position, i in enumerate(input_indices):
            if i == -1:
                if position not in optional:
                    raise ModelError(f"{what}: input {position} is omitted (-1), which "
                                     f"{op_type} does not allow")
                inputs.append("")
                continue
            if not 0 <= i < count:
                raise ModelError(f"{what}: input {position} tensor index {i} is out of range "
                                 f"({count} tensors)")
            if i not in available:
                raise ModelError(f"{what}: input {position} tensor {i} {names[i]!r} is used "
                                 f"before it is produced")
            inputs.append(names[i])
        outputs = []
        for position, i in enumerate(output_indices):
            if not 0 <= i < count:
                raise ModelError(f"{what}: output {position} tensor index {i} is out of range "
                                 f"({count} tensors)")
            if i in available or names[i] in outputs:
                raise ModelError(f"{what}: output {position} tensor {i} {names[i]!r} is "
                                 f"already defined (a constant, a graph input or produced "
                                 f"twice)")
            outputs.append(names[i])
        available.update(output_indices)
        if domain == "tflite":
            attrs = self._builtin_options(table, what)
        else:
            attrs = {"custom_options": self._custom_options(op, table, what)}
        attrs["tflite_opcode_version"] = version
        quantization = {}
        for i in input_indices + output_indices:
            if i >= 0 and tensors[i]["quantization"] is not None:
                quantization[names[i]] = tensors[i]["quantization"]
        if quantization:
            attrs["quantization"] = quantization
        if op_type == "DENSIFY" and inputs and inputs[0] in sparsity:
            attrs["sparsity"] = sparsity[inputs[0]]
        first = output_indices[:1]
        name = f"{op_type}_{index}"
        if first and tensors[first[0]]["name"] == names[first[0]]:
            name = names[first[0]]
        return ir.Node(name, op_type, domain, inputs, outputs, attrs, index)

    def _builtin_options(self, table, what):
        attrs = {}
        for type_slot, value_slot, classes in ((10, 12, _OPTIONS), (26, 28, _OPTIONS2)):
            o = table.Offset(type_slot)
            kind = table.Get(N.Uint8Flags, table.Pos + o) if o else 0
            if not kind:
                continue
            cls = classes.get(kind)
            if cls is None:
                raise ModelError(f"{what}: unknown builtin options type {kind}")
            options = table.table(value_slot)
            if options is not None:
                attrs.update(_decode_options(options, cls, what))
        return attrs

    def _custom_options(self, op, table, what):
        extent = table.vector_extent(14, 1)
        if extent:
            start, length = extent
            return bytes(self.data.take(start, length))
        offset, size = op.LargeCustomOptionsOffset(), op.LargeCustomOptionsSize()
        if offset > 1 and size:
            if offset + size > self.data.size:
                raise ModelError(f"{what}: custom options at byte offset {offset} with size "
                                 f"{size} run past the end of the file")
            return bytes(self.data.take(offset, size))
        return b""
