"""The frozen records PREPARE's passes hand each other, from the loaded nodes to the placed arena.

    Graph ─▶ NodeList ─(rewrites)─▶ NodeList ─infer_shapes─▶ Shaped ─prepare_kernels─▶ Prepared
      ─arena_buffers─▶ Buffers ─memory_aware_order─▶ order ─lifetimes─▶ spans ─assign_offsets─▶ Placement

A pass never changes the record it is given: it returns a new one. Mappings in
them are read-only views.
"""

from dataclasses import dataclass, field
from types import MappingProxyType


def frozen_map(mapping):
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Context:
    """What every pass may read: the graph, the feeds' shapes and types, the graph's outputs,
    and the services passes use (weight release, the planner of control-flow bodies)."""
    graph: object  # ir.Graph
    feeds: MappingProxyType  # input name -> (shape tuple, numpy dtype)
    outputs: tuple  # graph output names, in order
    release: object  # release.EagerRelease: told of each mapped weight a pass copies
    planner: object = None  # plans control-flow bodies (plan_cache.PlanCache)
    packer: object = None  # keeps what kernels pack (Kernel.pack); None: in memory


@dataclass(frozen=True)
class NodeList:
    """Nodes in an order valid to run, and the weights they may read (rewrites add packed ones)."""
    nodes: tuple  # ir.Node
    weights: MappingProxyType  # name -> ExternalData | ndarray


@dataclass(frozen=True)
class ShapedStep:
    node: object  # ir.Node
    kernel: object  # ops.Kernel
    inputs: tuple  # TensorInfo per input, None for an omitted one
    outputs: tuple | None  # TensorInfo per output; None: an eager step, shapes known per run
    # what the shape rule worked out that run needs (ops.registry.Inferred.derived)
    derived: MappingProxyType = field(default_factory=lambda: frozen_map({}))


@dataclass(frozen=True)
class Shaped:
    """Steps with their shapes, and what is known of every value (None: known only per run)."""
    steps: tuple  # ShapedStep, in the order of the NodeList
    infos: MappingProxyType  # value name -> TensorInfo | None


@dataclass(frozen=True)
class PreparedStep(ShapedStep):
    scratch: tuple = ()  # (shape, dtype) of each scratch buffer the kernel asked for


@dataclass(frozen=True)
class Prepared:
    steps: tuple  # PreparedStep
    infos: MappingProxyType


@dataclass(frozen=True)
class Buffers:
    """The prepared steps in arena terms: which buffers each reads and writes, and their sizes.

    A buffer is an intermediate that owns arena bytes (an alias lives in its source's
    buffer) or a step's scratch. Graph outputs and strings get fresh arrays, eager outputs their own.
    """
    reads: tuple  # per step: buffer names it reads
    writes: tuple  # per step: buffer names it writes
    scratch: tuple  # per step: names of its scratch buffers
    sizes: MappingProxyType  # buffer -> bytes
    pinned: frozenset  # buffers that must outlive the last step (graph outputs aliasing them)
    deps: tuple  # per step: the positions of the steps it depends on
    root: MappingProxyType  # value name -> the buffer it lives in (None: not in the arena)
    fresh: frozenset  # graph outputs and strings: their kernel writes into a new array per run
    dynamic: frozenset  # values written by eager steps


@dataclass(frozen=True)
class Placement:
    order: tuple  # step positions (into Prepared.steps) in execution order
    spans: MappingProxyType  # buffer -> (first, last) position in `order`
    offsets: MappingProxyType  # buffer -> arena offset
    arena_bytes: int
