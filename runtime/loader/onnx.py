"""ONNX file -> `ir.Graph`, without reading a weight byte.

Strip-and-parse: a wire-format walk of the mapped ModelProto descends only into
the messages that can hold a tensor (graphs, nodes, attributes, functions,
sparse tensors) and copies everything else verbatim. In every TensorProto the
`raw_data` field is cut out and a marker entry naming its absolute byte range
is appended to `external_data`; enclosing length prefixes are recomputed. The
result is a small bytes object holding the model's structure, which protobuf
parses as usual. Marked tensors become `ExternalData` views of the mapping,
`EXTERNAL` tensors views of their mapped data files, and the few tensors kept
in typed fields (`float_data`, `int64_data`, ...) small decoded arrays.

Messages no larger than `INLINE_LIMIT` are copied without being walked: they
cannot hold more than that many weight bytes, and skipping them keeps the walk
to one step per node on structure-heavy models. Their tensors are decoded into
small arrays.

The walk reads the file (`MappedFile.read`, pread) in windows rather than
touching the mapping: no page of the mapping becomes resident at MODEL_LOAD,
even where the kernel maps a whole large folio per touch.

Everything the file says is checked before it is used: offsets and lengths
against the file, dims against the byte length (before any allocation),
external data locations against the model's directory.
"""

import itertools
import os
import stat
from dataclasses import dataclass, field

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from .. import ir, size_limit
from ..errors import MalformedModelError, ModelError
from ..weights import ExternalData, check_extent, weight_array
from .mapped import MappedFile
from .protowire import length_delimited, length_delimited_header, scan_fields

# The external_data key of the marker that replaces a stripped raw_data field.
RAW_DATA_KEY = "nnrun:raw"

# Messages up to this size are copied without being walked (see module docstring).
INLINE_LIMIT = 1024
# Bytes read at a time while walking a file (see _Stripper._fields).
WALK_WINDOW_MIN = 512
WALK_WINDOW_MAX = 64 << 10
# Messages nest at most this deep below the ModelProto: protobuf's own limit (upb's, and C++
# protobuf's, so onnx's and onnxruntime's), which no file can pass. A graph in a node's attribute
# is three messages below the graph holding the node, so graphs nest at most 33 deep (31 with the
# value infos a graph needs: onnxruntime loads as deep, no deeper). The loader, PREPARE and EXECUTE
# recurse once per level of graphs (a body is planned and run by its node's kernel, some ten
# Python frames a level), so these bounds keep them far inside Python's recursion limit.
MAX_MESSAGE_DEPTH = 100
MAX_GRAPH_DEPTH = 33
# numpy's limit on array rank.
MAX_RANK = 64
# A sparse initializer is densified at load; its dense size is bounded.
MAX_DENSE_BYTES = 256 << 20

# Messages on the way from a ModelProto to its tensors, and the fields that lead on.
_MODEL, _TRAINING_INFO, _GRAPH, _NODE, _ATTRIBUTE, _FUNCTION, _SPARSE_TENSOR, _TENSOR = range(8)
_TENSOR_PATHS = {
    _MODEL: {7: _GRAPH, 20: _TRAINING_INFO, 25: _FUNCTION},
    _TRAINING_INFO: {1: _GRAPH, 2: _GRAPH},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE_TENSOR},
    _NODE: {5: _ATTRIBUTE},
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE_TENSOR,
                 23: _SPARSE_TENSOR},
    _FUNCTION: {7: _NODE, 11: _ATTRIBUTE},
    _SPARSE_TENSOR: {1: _TENSOR, 2: _TENSOR},
}
_RAW_DATA_FIELD = frozenset((9,))  # TensorProto.raw_data
_TENSOR_EXTERNAL_DATA = 13
_MARKER_KEY_FIELD = length_delimited(1, RAW_DATA_KEY.encode())  # StringStringEntryProto.key

# Sub-byte element types: bits per element in raw_data (packed).
_PACKED_BITS = {getattr(TensorProto, name): bits for name, bits in (
    ("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
    ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, name)}
# In int32_data the 4- and 2-bit types are packed too, one byte per entry; 6-bit ones are not.
_PACKED_BITS_TYPED = {t: b for t, b in _PACKED_BITS.items() if b in (2, 4)}
_COMPLEX = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}

_A = onnx.AttributeProto
_INT, _INTS, _FLOAT = _A.INT, _A.INTS, _A.FLOAT


@dataclass(frozen=True)
class AttributeRef:
    """An attribute of a function-body node that takes the caller's attribute `ref`."""
    ref: str
    type: int


@dataclass
class Function:
    """A model-local function (FunctionProto), decoded like a graph. Not inlined yet."""
    name: str
    domain: str
    overload: str
    inputs: list
    outputs: list
    attributes: list  # every attribute name the function accepts
    attribute_defaults: dict  # name -> decoded default value
    nodes: list  # ir.Node; attrs may hold AttributeRef
    opsets: dict = field(default_factory=dict)
    value_infos: dict = field(default_factory=dict)


def load_onnx(source, path=None, base_dir=None):
    """Build the `ir.Graph` of the ONNX model held by the MappedFile `source`.

    External data files are looked up relative to `base_dir`, which defaults to
    the model's directory; a model given as bytes has none unless one is passed.
    """
    where = path or "the model bytes"
    if source.size == 0:
        raise ModelError(f"{where}: empty file")
    stripper = _Stripper(source)
    structure = stripper.strip(source.size)
    try:
        model = onnx.ModelProto.FromString(structure)
    except (DecodeError, RuntimeError, ValueError) as e:
        if "MaxDepth" in str(e):  # upb's words; the walk finds it first in a large message
            raise MalformedModelError(f"{where}: messages nested deeper than {MAX_MESSAGE_DEPTH} "
                                      f"(protobuf's limit: graphs nest at most {MAX_GRAPH_DEPTH} deep)") from None
        raise MalformedModelError(f"{where} is not a valid ONNX model: {e}") from None
    if not model.HasField("graph"):
        raise MalformedModelError(f"{where}: the model has no graph (not an ONNX model?)")
    if base_dir is None and path is not None:
        base_dir = os.path.dirname(os.path.abspath(path))
    builder = _Builder(source, path, base_dir, stripper.raw_extents)
    try:
        graph = builder.model(model)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, UnicodeError,
            RecursionError) as e:
        # Every check the builder makes raises ModelError itself; this only keeps
        # a form of malformation nobody foresaw from escaping as something else.
        raise ModelError(f"{where}: malformed model ({type(e).__name__}: {e})") from e
    from .onnx_checks import check_model  # it names this module's AttributeRef

    check_model(graph, model.ir_version, where)
    graph.mapped_files = (source, *builder.data_files.values())
    return graph


def inferred_outputs(source):
    """{name: ValueInfo} of the graph outputs as ONNX shape inference finds them from the model's
    structure (no weight byte is read); {} when inference fails. onnxruntime reports outputs with
    these shapes merged into the declared ones."""
    model = onnx.ModelProto.FromString(_Stripper(source).strip(source.size))
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
        return {}
    builder = _Builder(source, None, None, set())
    try:
        return {v.name: builder._value_info(v) for v in model.graph.output}
    except ModelError:
        return {}


class _Stripper:
    """The wire-format walk: the model's bytes with every large raw_data cut out.

    Bytes come from `source.read` (pread for a file), a window at a time, so the
    walk reads field headers and the structure, not the weights in between.
    """

    def __init__(self, source):
        self.source = source
        # A view of caller-owned bytes costs nothing: take whole messages at once.
        self.windowed = source.releasable
        self.raw_extents = set()  # (offset, length) of every raw_data cut out
        # The last window read: a tensor's header, scanned and then copied.
        self.last_start = 0
        self.last = b""

    def read(self, start, end):
        offset = start - self.last_start
        if offset >= 0 and end - self.last_start <= len(self.last):
            return self.last[offset:end - self.last_start]
        data = self.source.read(start, end)
        if self.windowed:
            self.last_start, self.last = start, memoryview(data)
        return data

    def strip(self, size):
        rewritten = self._message(_MODEL, 0, size, 0)
        if rewritten is None:
            return bytes(self.read(0, size))
        return b"".join(rewritten[0])

    def _fields(self, start, end, numbers, min_length):
        found = []
        if not self.windowed:
            scan_fields(self.read(start, end), start, end, numbers, min_length, found)
            return found
        # Windows grow while fields are dense (a run of nodes) and shrink back after
        # a payload is stepped over (a tensor's header needs a few dozen bytes).
        size = WALK_WINDOW_MIN
        pos = start
        while pos < end:
            window_end = min(end, pos + size)
            pos = scan_fields(self.read(pos, window_end), pos, end, numbers, min_length, found)
            size = min(2 * size, WALK_WINDOW_MAX) if pos <= window_end else WALK_WINDOW_MIN
        return found

    def _message(self, kind, start, end, depth):
        """(pieces, length) of the rewritten message, or None if it stays as it is."""
        if depth > MAX_MESSAGE_DEPTH:
            raise MalformedModelError(f"malformed model at byte offset {start}: messages nested deeper "
                                      f"than {MAX_MESSAGE_DEPTH} (protobuf's limit: graphs nest at most "
                                      f"{MAX_GRAPH_DEPTH} deep)")
        if kind == _TENSOR:
            return self._tensor(start, end)
        paths = _TENSOR_PATHS[kind]
        pieces = None
        length = 0
        copied = start  # the verbatim run not yet emitted starts here
        for number, value_start, value_end, field_start in self._fields(start, end, paths,
                                                                        INLINE_LIMIT):
            rewritten = self._message(paths[number], value_start, value_end, depth + 1)
            if rewritten is None:
                continue
            if pieces is None:
                pieces = []
            if field_start > copied:
                pieces.append(self.read(copied, field_start))
                length += field_start - copied
            child_pieces, child_length = rewritten
            header = length_delimited_header(number, child_length)
            pieces.append(header)
            pieces.extend(child_pieces)
            length += len(header) + child_length
            copied = value_end
        if pieces is None:
            return None
        if end > copied:
            pieces.append(self.read(copied, end))
            length += end - copied
        return pieces, length

    def _tensor(self, start, end):
        raw_fields = self._fields(start, end, _RAW_DATA_FIELD, 0)
        if not raw_fields:
            return None
        pieces = []
        length = 0
        copied = start
        for _, value_start, value_end, field_start in raw_fields:
            if field_start > copied:
                pieces.append(self.read(copied, field_start))
                length += field_start - copied
            copied = value_end
        if end > copied:
            pieces.append(self.read(copied, end))
            length += end - copied
        _, value_start, value_end, _ = raw_fields[-1]  # protobuf: the last one wins
        raw = (value_start, value_end - value_start)
        entry = _MARKER_KEY_FIELD + length_delimited(2, f"{raw[0]}:{raw[1]}".encode())
        marker = length_delimited(_TENSOR_EXTERNAL_DATA, entry)
        pieces.append(marker)
        self.raw_extents.add(raw)
        return pieces, length + len(marker)


def _check_names(names, what):
    """upb hands back bytes, not str, for a string field that is not UTF-8."""
    try:
        "".join(names)
    except TypeError:
        bad = next(n for n in names if type(n) is not str)
        raise ModelError(f"{what}: name {bad!r} is not valid UTF-8") from None


def _text(data):
    """A STRING attribute: str when it is UTF-8, else the bytes as they are."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _element_count(dims, limit):
    """The product of dims, or None once it exceeds `limit` (no huge integers)."""
    if 0 in dims:
        return 0
    count = 1
    for d in dims:
        count *= d
        if count > limit:
            return None
    return count


_DTYPES = {}  # ONNX data_type -> numpy dtype


def _numpy_dtype(data_type, what):
    dtype = _DTYPES.get(data_type)
    if dtype is not None:
        return dtype
    if data_type == TensorProto.UNDEFINED:
        raise ModelError(f"{what}: data_type is UNDEFINED")
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{what}: unknown data_type {data_type}") from None
    _DTYPES[data_type] = dtype
    return dtype


def _opsets(opset_import, what):
    opsets = {}
    for opset in opset_import:
        domain = opset.domain
        _check_names((domain,), what)
        opsets["" if domain == "ai.onnx" else domain] = opset.version
    return opsets


def _node_label(index, n):
    return f"node {index}{f' {n.name!r}' if n.name else ''} ({n.op_type})"


class _Builder:
    """Turns the parsed (weight-less) ModelProto into ir objects."""

    def __init__(self, source, path, base_dir, raw_extents):
        self.source = source
        self.path = path
        self.base_dir = base_dir
        self.real_base_dir = os.path.realpath(base_dir) if base_dir is not None else None
        self.raw_extents = raw_extents
        self.data_files = {}  # real path -> MappedFile, one mapping per data file per load
        self.weight_ids = itertools.count()  # each ExternalData's id, in load order
        self.opsets = {}
        self.functions = {}

    def model(self, model):
        self.opsets = _opsets(model.opset_import, "opset_import")
        for function in model.functions:
            decoded = self._function(function)
            key = (decoded.domain, decoded.name)
            if decoded.overload:
                key += (decoded.overload,)
            self.functions[key] = decoded
        graph = self._graph(model.graph, 0, in_function=False)
        graph.meta = ir.ModelMeta(
            producer_name=model.producer_name, graph_name=model.graph.name, domain=model.domain,
            description=model.doc_string, graph_description=model.graph.doc_string,
            version=model.model_version, custom_metadata_map={p.key: p.value for p in model.metadata_props})
        return graph

    # graphs, nodes, attributes

    def _graph(self, g, depth, in_function):
        if depth > MAX_GRAPH_DEPTH:
            raise MalformedModelError(f"graph {g.name!r}: graphs nested deeper than {MAX_GRAPH_DEPTH}")
        graph_name = g.name
        _check_names((graph_name,), "graph")
        what = f"graph {graph_name!r}"
        initializers = {}
        for tensor in g.initializer:
            name = tensor.name
            if not name or name in initializers:
                raise ModelError(f"{what}: initializer {name!r} is defined twice" if name else
                                 f"{what}: an initializer has no name")
            initializers[name] = self._tensor(tensor, name)
        for sparse in g.sparse_initializer:
            name = sparse.values.name
            if not name or name in initializers:
                raise ModelError(f"{what}: initializer {name!r} is defined twice" if name else
                                 f"{what}: a sparse initializer has no name")
            initializers[name] = self._densify(sparse, name)
        # Older models list initializers among the inputs too: those keep the
        # initializer and are not feeds the caller must give.
        inputs = [self._value_info(v) for v in g.input if v.name not in initializers]
        outputs = [self._value_info(v) for v in g.output]
        value_infos = {}
        for v in g.value_info:
            info = self._value_info(v)
            value_infos[info.name] = info
        node = self._node
        nodes = [node(n, i, depth, in_function) for i, n in enumerate(g.node)]
        graph = ir.Graph(name=graph_name, nodes=nodes, inputs=inputs, outputs=outputs,
                         initializers=initializers, value_infos=value_infos,
                         opsets=dict(self.opsets), source=self.source, format="onnx",
                         path=self.path)
        graph.functions = self.functions
        return graph

    def _node(self, n, index, depth, in_function):
        op_type = n.op_type
        domain = n.domain
        inputs = n.input[:]  # a slice of a upb repeated field is several times faster than list()
        outputs = n.output[:]
        name = n.name
        _check_names((name, op_type, domain, *inputs, *outputs), f"node {index}")
        if not op_type:
            raise ModelError(f"{_node_label(index, n)}: empty op_type")
        if domain == "ai.onnx":
            domain = ""
        attrs = {}
        for a in n.attribute:
            key = a.name
            if not key or key in attrs or type(key) is not str:
                raise ModelError(f"{_node_label(index, n)}: attribute {key!r} is given twice"
                                 if key in attrs else
                                 f"{_node_label(index, n)}: attribute {key!r} has no valid name")
            # The common kinds inline: this loop is most of the load time of a
            # structure-heavy model. Outside functions ref_attr_name means nothing.
            kind = a.type
            if in_function and a.ref_attr_name:
                attrs[key] = self._attribute(a, index, n, depth, in_function)
            elif kind == _INTS:
                attrs[key] = a.ints[:]
            elif kind == _INT:
                attrs[key] = a.i
            elif kind == _FLOAT:
                attrs[key] = a.f
            else:
                attrs[key] = self._attribute(a, index, n, depth, in_function)
        return ir.Node(name, op_type, domain, inputs, outputs, attrs, index)

    def _attribute(self, a, index, owner, depth, in_function):
        """The decoded value of attribute `a` of node `owner` (index `index`)."""
        kind = a.type
        if in_function and a.ref_attr_name:
            _check_names((a.ref_attr_name,), f"{_node_label(index, owner)} attribute {a.name!r}")
            return AttributeRef(a.ref_attr_name, kind)
        if kind == _INTS:
            return a.ints[:]
        if kind == _INT:
            return a.i
        if kind == _FLOAT:
            return a.f
        if kind == _A.STRING:
            return _text(a.s)
        if kind == _A.FLOATS:
            return a.floats[:]
        if kind == _A.STRINGS:
            return [_text(s) for s in a.strings]
        if kind == _A.GRAPH:
            return self._graph(a.g, depth + 1, in_function)
        if kind == _A.GRAPHS:
            return [self._graph(g, depth + 1, in_function) for g in a.graphs]
        what = f"{_node_label(index, owner)} attribute {a.name!r}"
        if kind == _A.TENSOR:
            return self._tensor(a.t, a.t.name or what)
        if kind == _A.TENSORS:
            return [self._tensor(t, t.name or f"{what}[{i}]") for i, t in enumerate(a.tensors)]
        if kind == _A.SPARSE_TENSOR:
            return self._sparse_proto(a.sparse_tensor)
        if kind == _A.SPARSE_TENSORS:
            return [self._sparse_proto(s) for s in a.sparse_tensors]
        if kind == _A.TYPE_PROTO:
            return a.tp
        if kind == _A.TYPE_PROTOS:
            return list(a.type_protos)
        raise ModelError(f"{what}: unknown attribute type {kind}")

    def _function(self, f):
        name = f.name
        domain = f.domain
        _check_names((name, domain, f.overload), "function")
        what = f"function {domain + '.' if domain else ''}{name}"
        defaults = {}
        for i, attr in enumerate(f.attribute_proto):
            _check_names((attr.name,), what)
            defaults[attr.name] = self._attribute(attr, i, f, 0, True)
        value_infos = {}
        for v in f.value_info:
            info = self._value_info(v)
            value_infos[info.name] = info
        names = (list(f.input), list(f.output), list(f.attribute))
        for group in names:
            _check_names(group, what)
        return Function(
            name=name, domain=domain, overload=f.overload, inputs=names[0], outputs=names[1],
            attributes=names[2] + [a for a in defaults if a not in names[2]],
            attribute_defaults=defaults,
            nodes=[self._node(n, i, 0, True) for i, n in enumerate(f.node)],
            opsets=_opsets(f.opset_import, what), value_infos=value_infos)

    def _value_info(self, v):
        name = v.name
        if type(name) is not str:
            _check_names((name,), "value_info")
        value_type = v.type
        kind = value_type.WhichOneof("value")
        containers = ()
        while kind in ("sequence_type", "optional_type") and len(containers) < MAX_GRAPH_DEPTH:
            containers += (ir.SEQUENCE if kind == "sequence_type" else ir.OPTIONAL,)
            value_type = getattr(value_type, kind).elem_type
            kind = value_type.WhichOneof("value")
        if kind == "tensor_type":
            tensor_type = value_type.tensor_type
        elif kind == "sparse_tensor_type":
            tensor_type = value_type.sparse_tensor_type
        else:
            return ir.ValueInfo(name, None, None, containers)
        elem_type = tensor_type.elem_type
        dtype = _numpy_dtype(elem_type, f"value {name!r}") if elem_type else None
        if not tensor_type.HasField("shape"):
            return ir.ValueInfo(name, dtype, None, containers)
        dims = []
        for d in tensor_type.shape.dim:
            value = d.dim_value
            if value > 0:
                dims.append(value)
                continue
            which = d.WhichOneof("value")
            if which == "dim_value":
                # A negative size is meaningless; some exporters write -1 for "unknown".
                dims.append(value if value == 0 else None)
            elif which == "dim_param":
                param = d.dim_param
                if type(param) is not str:
                    _check_names((param,), f"value {name!r}")
                dims.append(param or None)
            else:
                dims.append(None)
        return ir.ValueInfo(name, dtype, tuple(dims), containers)

    # tensors

    def _tensor(self, t, name):
        """An initializer or attribute tensor: ExternalData view, or a small decoded array."""
        if type(name) is not str:
            _check_names((name,), "tensor")
        data_type = t.data_type
        dtype = _DTYPES.get(data_type)
        if dtype is None:
            dtype = _numpy_dtype(data_type, f"tensor {name!r}")
        dims = t.dims[:]
        if len(dims) > MAX_RANK:
            raise ModelError(f"tensor {name!r}: rank {len(dims)} exceeds {MAX_RANK}")
        if dims and min(dims) < 0:
            raise ModelError(f"tensor {name!r}: negative dimension in shape {dims}")
        dims = tuple(dims)
        if t.HasField("segment"):
            raise ModelError(f"tensor {name!r}: segmented tensors are not supported")
        marker = self._raw_marker(t, name)
        has_raw = t.HasField("raw_data")
        if t.data_location == TensorProto.EXTERNAL:
            if marker is not None or has_raw:
                raise ModelError(f"tensor {name!r}: has both raw_data and external data")
            return self._external_tensor(t, dtype, dims, name)
        if marker is not None:
            if has_raw:
                raise ModelError(f"tensor {name!r}: raw_data is given twice")
            offset, nbytes = marker
            return self._mapped_tensor(self.source, offset, nbytes, t, dtype, dims, name)
        if has_raw:
            return self._inline_raw_tensor(t, dtype, dims, name)
        return self._typed_tensor(t, dtype, dims, name)

    def _raw_marker(self, t, name):
        """(offset, length) of the raw_data the stripper cut out of `t`, or None."""
        entries = t.external_data
        if not entries:
            return None
        last = entries[-1]
        if last.key == RAW_DATA_KEY:  # where the stripper puts it
            marker = last.value
        else:
            marker = None
            for entry in entries:
                if entry.key == RAW_DATA_KEY:
                    marker = entry.value  # merged repeats of a tensor: the last raw_data wins
            if marker is None:
                return None
        offset, _, nbytes = marker.partition(":")
        try:
            extent = (int(offset), int(nbytes))
        except ValueError:
            extent = None
        if extent not in self.raw_extents:
            raise ModelError(f"tensor {name!r}: external_data uses the reserved key "
                             f"{RAW_DATA_KEY!r}")
        return extent

    def _mapped_tensor(self, source, offset, nbytes, t, dtype, dims, name):
        what = f"tensor {name!r}"
        bits = _PACKED_BITS.get(t.data_type)
        if dtype.kind == "O":
            raise ModelError(f"{what}: string tensors cannot keep their data in raw bytes")
        if bits is None:
            return ExternalData(source, offset, nbytes, dtype, dims, name, next(self.weight_ids))
        # Sub-byte types have no numpy layout to view: decode a copy (they are small).
        check_extent(source, offset, nbytes, np.dtype(np.uint8), (nbytes,), name)
        count = _element_count(dims, nbytes * 8 // bits + 8)
        if count is None or (count * bits + 7) // 8 != nbytes:
            raise ModelError(f"{what}: shape {list(dims)} of {bits}-bit elements does not fit "
                             f"the {nbytes} data bytes at byte offset {offset}")
        copy = TensorProto(data_type=t.data_type, dims=dims,
                           raw_data=bytes(source.read(offset, offset + nbytes)))
        return self._to_array(copy, count, name)

    def _inline_raw_tensor(self, t, dtype, dims, name):
        """A tensor whose raw_data stayed in the structure (a small one): copied out of it."""
        if dtype.kind == "O":
            raise ModelError(f"tensor {name!r}: string tensors cannot keep their data in raw_data")
        raw = t.raw_data
        bits = _PACKED_BITS.get(t.data_type)
        count = _element_count(dims, len(raw) * 8 // (bits or dtype.itemsize * 8) + 8)
        if count is None or (count * (bits or dtype.itemsize * 8) + 7) // 8 != len(raw):
            raise ModelError(f"tensor {name!r}: shape {list(dims)} of {dtype} does not match "
                             f"its {len(raw)} bytes of raw_data")
        if bits is None:
            # What to_array does for raw_data on a little-endian host, minus its overhead.
            return np.frombuffer(raw, dtype=dtype).reshape(dims)
        return self._to_array(t, count, name)

    def _typed_tensor(self, t, dtype, dims, name):
        """A tensor in float_data, int64_data, ...: decoded with onnx once its size is checked."""
        data_type = t.data_type
        storage = helper.tensor_dtype_to_field(data_type)
        stored = len(getattr(t, storage))
        count = _element_count(dims, stored * 8 + 8)
        if count is None:
            expected = None
        elif data_type in _PACKED_BITS_TYPED:
            expected = (count * _PACKED_BITS_TYPED[data_type] + 7) // 8
        elif data_type in _COMPLEX:
            expected = 2 * count
        else:
            expected = count
        if expected != stored:
            raise ModelError(f"tensor {name!r}: shape {list(dims)} of {dtype} does not match "
                             f"its data ({stored} entries of {storage})")
        return self._to_array(t, count, name)

    def _to_array(self, t, count, name):
        try:
            array = numpy_helper.to_array(t)
        except Exception as e:  # onnx raises several kinds; all mean a bad tensor
            raise ModelError(f"tensor {name!r}: cannot decode: {e}") from None
        if array.size != count:
            raise ModelError(f"tensor {name!r}: decoded {array.size} elements, its shape "
                             f"needs {count}")
        array.flags.writeable = False  # weights are never written, mapped or not
        return array

    def _external_tensor(self, t, dtype, dims, name):
        what = f"tensor {name!r}"
        info = {}
        for entry in t.external_data:
            _check_names((entry.key, entry.value), what)
            info[entry.key] = entry.value
        location = info.get("location")
        if not location:
            raise ModelError(f"{what}: external data without a location")
        source = self._data_file(location, what)
        offset = self._int_key(info, "offset", 0, what)
        if offset > source.size:
            raise ModelError(f"{what}: external data offset {offset} is past the end of "
                             f"{location!r} ({source.size} bytes)")
        # No length (or 0, as onnx's own reader takes it): the tensor's own size, from its dims.
        nbytes = self._int_key(info, "length", 0, what)
        if not nbytes:
            count = _element_count(dims, (source.size - offset) // max(dtype.itemsize, 1))
            nbytes = count * dtype.itemsize if count is not None else source.size - offset + 1
        return self._mapped_tensor(source, offset, nbytes, t, dtype, dims, name)

    @staticmethod
    def _int_key(info, key, default, what):
        text = info.get(key)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ModelError(f"{what}: external data {key} {text!r} is not an integer") from None
        if value < 0:
            raise ModelError(f"{what}: negative external data {key} {value}")
        return value

    def _data_file(self, location, what):
        """The mapping of an external data file, which must lie inside the model's directory."""
        if self.real_base_dir is None:
            raise ModelError(f"{what}: external data {location!r} needs a base directory "
                             f"(the model was given as bytes; pass base_dir)")
        if "\0" in location or os.path.isabs(location) or location.startswith(("/", "\\")):
            raise ModelError(f"{what}: external data location {location!r} is not a relative path")
        root = self.real_base_dir
        target = os.path.realpath(os.path.join(root, location))
        if target == root or os.path.commonpath([root, target]) != root:
            raise ModelError(f"{what}: external data location {location!r} resolves outside "
                             f"the model directory")
        mapped = self.data_files.get(target)
        if mapped is not None:
            return mapped
        try:
            mode = os.stat(target).st_mode
        except OSError as e:
            raise ModelError(f"{what}: external data file {location!r}: "
                             f"{e.strerror or e}") from None
        if not stat.S_ISREG(mode):
            # A FIFO or device could block or never end.
            raise ModelError(f"{what}: external data {location!r} is not a regular file")
        mapped = self.data_files[target] = MappedFile.open(target, "external data file")
        return mapped

    # sparse tensors

    def _sparse_proto(self, sparse):
        """A SPARSE_TENSOR attribute as the onnx object, with its stripped bytes put back."""
        restored = onnx.SparseTensorProto()
        restored.CopyFrom(sparse)
        for tensor in (restored.values, restored.indices):
            marker = self._raw_marker(tensor, tensor.name)
            if marker is None:
                continue
            offset, nbytes = marker
            check_extent(self.source, offset, nbytes, np.dtype(np.uint8), (nbytes,), tensor.name)
            kept = [e for e in tensor.external_data if e.key != RAW_DATA_KEY]
            del tensor.external_data[:]
            tensor.external_data.extend(kept)
            tensor.raw_data = bytes(self.source.read(offset, offset + nbytes))
        return restored

    def _densify(self, sparse, name):
        """A sparse initializer as a dense read-only array (bounded by MAX_DENSE_BYTES)."""
        what = f"sparse initializer {name!r}"
        values = weight_array(self._tensor(sparse.values, name))
        indices = weight_array(self._tensor(sparse.indices, f"{name}.indices"))
        dims = tuple(sparse.dims)
        if any(d < 0 for d in dims) or len(dims) > MAX_RANK:
            raise ModelError(f"{what}: invalid shape {list(dims)}")
        size_limit.tensor_bytes(dims, values.dtype, what)  # SessionOptions.max_tensor_bytes
        count = _element_count(dims, MAX_DENSE_BYTES // values.dtype.itemsize)
        if count is None:
            raise ModelError(f"{what}: dense shape {list(dims)} exceeds {MAX_DENSE_BYTES} bytes")
        nnz = values.size
        if values.ndim != 1 or indices.dtype != np.int64:
            raise ModelError(f"{what}: values must be 1-D and indices int64")
        if indices.shape == (nnz,):
            flat = indices
        elif indices.shape == (nnz, len(dims)):
            if np.any(indices < 0) or np.any(indices >= np.asarray(dims, dtype=np.int64)):
                raise ModelError(f"{what}: an index is out of range of shape {list(dims)}")
            flat = np.ravel_multi_index(tuple(indices.T), dims) if nnz else indices[:, 0]
        else:
            raise ModelError(f"{what}: indices of shape {list(indices.shape)} do not match "
                             f"{nnz} values of rank {len(dims)}")
        if nnz and (flat.min() < 0 or flat.max() >= count):
            raise ModelError(f"{what}: an index is out of range of shape {list(dims)}")
        dense = np.zeros(count, dtype=values.dtype)
        dense[flat] = values
        dense = dense.reshape(dims)
        dense.flags.writeable = False
        return dense
