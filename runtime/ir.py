"""The typed graph passed from the loader to the compiler.

A `Graph` is what MODEL_LOAD produces: nodes in file order, the graph's inputs and
outputs with their declared types, and the weights, each either an
`ExternalData` view into a mapped file or a small numpy array the loader had to
decode (e.g. `int64_data`). Subgraphs of control-flow nodes are `Graph`s in the
node's attributes. Nothing in here has read a weight byte.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np


SEQUENCE, OPTIONAL = "sequence", "optional"


@dataclass
class ValueInfo:
    """A declared graph input, output or intermediate: name, dtype and dims.

    A dim is an int, a symbolic name (str), or None when the file leaves it open.
    A sequence or an optional is described by its tensors' dtype and dims and the
    containers around them, outermost first: `optional(seq(tensor(float)))` is
    (OPTIONAL, SEQUENCE).
    """
    name: str
    dtype: np.dtype | None
    dims: tuple | None  # None: rank unknown
    containers: tuple = ()  # () for a tensor

    @property
    def is_static(self):
        return not self.containers and self.dims is not None and all(isinstance(d, int) for d in self.dims)


@dataclass
class Node:
    name: str
    op_type: str
    domain: str  # "" for the default ONNX domain ("ai.onnx" is normalised to "")
    inputs: list  # names; "" marks an omitted optional input
    outputs: list
    attrs: dict = field(default_factory=dict)  # decoded: int, float, str, list, ndarray, ExternalData, Graph
    index: int = -1  # position in its graph's node list in the file; kept by every rewrite, for errors


@dataclass(frozen=True)
class ModelMeta:
    """What the file says of the model, as onnxruntime's `get_modelmeta()` reports it."""
    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict = field(default_factory=dict)


@dataclass
class Graph:
    name: str
    nodes: list
    inputs: list  # ValueInfo, initializers excluded
    outputs: list  # ValueInfo
    initializers: dict  # name -> ExternalData | np.ndarray
    value_infos: dict = field(default_factory=dict)  # name -> ValueInfo
    opsets: dict = field(default_factory=dict)  # domain -> version
    functions: dict = field(default_factory=dict)  # (domain, name[, overload]) -> model-local function
    source: Any = None  # the MappedFile the graph came from, if any
    mapped_files: tuple = ()  # on a loaded model's main graph: every MappedFile of it, external data files too
    format: str = "onnx"
    path: str | None = None
    meta: ModelMeta = field(default_factory=ModelMeta)  # the model's, on its main graph
