"""What onnxruntime refuses when it loads an ONNX model, refused by nnrun at MODEL_LOAD too.

The loader checks that the file's bytes are sound (offsets, lengths, dims); these are the rules
of the ONNX format a sound file can still break, each of which would otherwise reach a kernel
as a wrong input count or a wrong attribute type, or a run as a value written twice:

- the model's IR version and every opset it imports are ones the ONNX release nnrun is built
  on knows (a newer one may mean what nnrun does not implement);
- every value of a graph is defined once: a node may not write a graph input, an initializer
  or another node's output;
- a node of the ONNX domains (ai.onnx, ai.onnx.ml) has the number of inputs and outputs its
  schema allows, and each attribute its schema declares has the schema's type; an attribute
  the schema does not declare is refused, as onnxruntime does.

Operators of other domains (com.microsoft, model-local functions) have no ONNX schema to hold
them to; their kernels check what they take.

The schemas come from `onnx_schema_table`, written from onnx's registry by a tool: the registry
itself builds every schema on first use, 10 ms and 7.5 MB that a model's load should not cost.
"""

import bisect
import functools

import numpy as np
from onnx import AttributeProto as _A

from .. import ir
from ..errors import ModelError, count_words, location, node_label
from ..weights import ExternalData
from .onnx import AttributeRef
from .onnx_schema_table import IR_VERSION, NEWEST_OPSET, SCHEMAS

# The domains whose operators ONNX's schemas define.
SCHEMA_DOMAINS = tuple(NEWEST_OPSET)


def check_model(graph, ir_version, where):
    """Raise ModelError for the first rule `graph` (with its bodies) breaks; `where` names the file."""
    if ir_version > IR_VERSION:
        raise ModelError(f"{where}: IR version {ir_version} is newer than nnrun supports "
                         f"(at most {IR_VERSION})")
    for domain, version in graph.opsets.items():
        newest = NEWEST_OPSET.get(domain)
        if newest is not None and version > newest:
            named = f"domain {domain!r}" if domain else "the default domain (ai.onnx)"
            raise ModelError(f"{where}: opset {version} of {named} is newer than nnrun supports "
                             f"(at most {newest})")
        if version < 1 and domain in SCHEMA_DOMAINS:
            raise ModelError(f"{where}: opset {version} of domain {domain!r} is not a valid opset version")
    if "" not in graph.opsets and any(node.domain == "" for node in graph.nodes):
        raise ModelError(f"{where}: the model imports no opset of the default domain (ai.onnx), "
                         f"which its operators need")
    pending = [graph]  # the main graph and every body, without recursion: bodies may nest deep
    while pending:
        g = pending.pop()
        _check_single_definitions(g)
        for node in g.nodes:
            _check_schema(node, g.opsets.get(node.domain))
            for value in node.attrs.values():
                for body in value if isinstance(value, list) else (value,):
                    if isinstance(body, ir.Graph):
                        pending.append(body)


def _check_single_definitions(graph):
    """Each name of `graph` is given a value once: by a graph input, an initializer or one node;
    and no two nodes but Constants share a name (onnxruntime refuses both)."""
    defined = {}
    for v in graph.inputs:
        if v.name in defined:
            raise ModelError(f"MODEL_LOAD: graph {graph.name!r} lists input {v.name!r} twice")
        defined[v.name] = "a graph input"
    for name in graph.initializers:
        defined.setdefault(name, "an initializer")
    named = {}
    for node in graph.nodes:
        if node.name and not (node.op_type == "Constant" and node.domain == ""):
            # onnxruntime makes Constant nodes initializers before it compares names.
            other = named.setdefault(node.name, node)
            if other is not node:
                raise ModelError(f"{_at(node)} in graph {graph.name!r} has the name of {node_label(other)}: "
                                 f"node names must differ")
        for name in node.outputs:
            if not name:
                continue
            earlier = defined.get(name)
            if earlier is not None:
                raise ModelError(f"{_at(node)} in graph {graph.name!r} writes {name!r}, which is "
                                 f"already {earlier}: every value must be defined once")
            defined[name] = node_label(node) + "'s output"


@functools.lru_cache(maxsize=4096)
def _schema(domain, op_type, version):
    """(min inputs, max inputs, min outputs, max outputs, {attribute: type}) of the op's schema
    at opset `version` (the newest since-version at or below it), or None: not an ONNX operator
    at this opset, which check_supported names."""
    versions = SCHEMAS.get((domain, op_type))
    if versions is None or version is None:
        return None
    at = bisect.bisect_right([v[0] for v in versions], version)
    if at == 0:
        return None
    _, *counts, attributes = versions[at - 1]
    return (*counts, dict(attributes))


def _check_schema(node, version):
    schema = _schema(node.domain, node.op_type, version)
    if schema is None:
        return
    min_in, max_in, min_out, max_out, declared = schema
    _check_count(node, "input", len(node.inputs), min_in, max_in)
    _check_count(node, "output", len(node.outputs), min_out, max_out)
    for key, value in node.attrs.items():
        kind = declared.get(key)
        if kind is None:
            raise ModelError(f"{_at(node)}: {node.op_type} (opset {version}) has no attribute {key!r}")
        if not _has_type(value, kind):
            raise ModelError(f"{_at(node)}: attribute {key!r} must be {_type_words(kind)}, "
                             f"got {_value_words(value)}")


def _at(node):
    return location("MODEL_LOAD", node=node)


def _check_count(node, what, count, least, most):
    if not least <= count <= most:
        raise ModelError(f"{_at(node)}: {count_words(node.op_type, what, least, most, count)}")


def _is_tensor(value):
    return isinstance(value, (np.ndarray, ExternalData))


# What a decoded attribute value (loader/onnx.py's _attribute) is, for each type a schema declares.
_IS = {
    _A.INT: lambda v: isinstance(v, int),
    _A.FLOAT: lambda v: isinstance(v, float),
    _A.STRING: lambda v: isinstance(v, str),
    _A.TENSOR: _is_tensor,
    _A.GRAPH: lambda v: isinstance(v, ir.Graph),
    _A.INTS: lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v),
    _A.FLOATS: lambda v: isinstance(v, list) and all(isinstance(x, float) for x in v),
    _A.STRINGS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    _A.TENSORS: lambda v: isinstance(v, list) and all(_is_tensor(x) for x in v),
    _A.GRAPHS: lambda v: isinstance(v, list) and all(isinstance(x, ir.Graph) for x in v),
}


def _has_type(value, kind):
    if isinstance(value, AttributeRef):
        return True  # a function's attribute, given where the function is called
    test = _IS.get(kind)
    return test is None or test(value)  # sparse tensors and type protos: the kernel checks


def _type_words(kind):
    return {_A.INT: "an int", _A.FLOAT: "a float", _A.STRING: "a string", _A.TENSOR: "a tensor",
            _A.GRAPH: "a graph", _A.INTS: "a list of ints", _A.FLOATS: "a list of floats",
            _A.STRINGS: "a list of strings", _A.TENSORS: "a list of tensors",
            _A.GRAPHS: "a list of graphs"}.get(kind, str(kind))


def _value_words(value):
    if isinstance(value, list):
        kinds = sorted({_value_words(x).split(" ", 1)[1] + "s" for x in value})
        return "an empty list" if not kinds else f"a list of {' and '.join(kinds)}"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if _is_tensor(value):
        return "a tensor"
    if isinstance(value, ir.Graph):
        return "a graph"
    return type(value).__name__
