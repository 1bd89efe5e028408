"""The frozen result of PREPARE: what to run, in which order, where every value lives.

A `Plan` never changes once built; the executor keeps per-run state (arena,
output arrays, feeds) apart from it, so runs share nothing mutable.

Values are numbered slots. A slot is filled, per run, from one of:
- `constants`: weights and values folded at PREPARE (mapped views or arrays);
- `feeds`: the caller's inputs;
- `arena`: a view at (offset, shape, dtype) in the run's arena;
- `fresh`: a graph output the last kernel writes directly, allocated per run;
- an alias step, which views another slot under a new shape;
- an eager step, whose output shapes depend on values known only per run
  (NonZero, a Reshape fed its shape): it allocates its outputs itself. So do the
  steps that make sequences and optionals, which never live in the arena.

Each `PlannedStep` says, besides what the executor needs, what the step touches:
its values (`ValueSlot`: where each lives, its shape and dtype), the weights it
reads (`WeightRead`) and its scratch bytes. The profiler, the memory timeline and
the report read them; nothing recovers them from addresses.
"""

from dataclasses import dataclass, field

# Where a value of a step lives.
ARENA, FEED, CONSTANT, FRESH, ALIAS, EAGER = "arena", "feed", "constant", "fresh", "alias", "eager"
# Where a weight's bytes are: the model file's pages, or memory PREPARE made (a kernel's
# packed layout, a folded value, an aligned copy, a small value the loader decoded).
MAPPED, PACKED, MEMORY = "mapped", "packed", "memory"
# ...or a weight cache file's pages (what PREPARE made, mapped read-only: paged in and out like MAPPED).
CACHED = "cached"


@dataclass(frozen=True)
class ValueSlot:
    slot: int
    name: str
    kind: str  # ARENA, FEED, CONSTANT, FRESH, ALIAS or EAGER
    shape: tuple | None  # None: known only per run
    dtype: object
    offset: int = -1  # in the arena, for ARENA values

    @property
    def nbytes(self):
        if self.shape is None or self.dtype is None:
            return 0
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class WeightRead:
    name: str  # the value's name in the graph (a packed weight: the name of its source)
    nbytes: int
    where: str  # MAPPED, PACKED, CACHED or MEMORY
    id: int = -1  # the loader's id of the weight in the file it comes from; -1: none (made at PREPARE)


@dataclass(frozen=True)
class PlannedStep:
    index: int  # position of the node in the model file (after rewrites: the original's)
    node: object  # ir.Node
    kernel: object  # ops.Kernel, prepared
    inputs: tuple  # slot ids, -1 for an omitted or packed input
    outputs: tuple  # slot ids
    scratch: tuple = ()  # slot ids of this step's scratch buffers
    alias_of: int = -1  # >= 0: the single output is a view of this input slot, reshaped
    alias_shape: tuple = ()
    eager: bool = False  # shapes known only per run: infer, prepare and allocate at each run
    input_values: tuple = ()  # ValueSlot | None per input
    output_values: tuple = ()  # ValueSlot | None per output
    weights: tuple = ()  # WeightRead of each constant input it reads
    scratch_bytes: int = 0

    @property
    def name(self):
        return self.node.name

    @property
    def op_type(self):
        return self.node.op_type

    @property
    def weight_bytes(self):
        return sum(w.nbytes for w in self.weights)


@dataclass(frozen=True)
class ArenaSlot:
    slot: int
    offset: int
    shape: tuple
    dtype: object


@dataclass(frozen=True)
class ArenaBuffer:
    """A buffer of the arena and its life: steps [first, last] of the plan's order."""
    name: str
    offset: int
    nbytes: int
    first: int
    last: int


@dataclass(frozen=True)
class Plan:
    steps: tuple  # PlannedStep, in execution order
    slot_names: tuple  # slot id -> value name (scratch slots get a synthetic name)
    constants: dict  # slot -> array or ExternalData
    feeds: dict  # input name -> (slot, shape, dtype); shape and dtype None: a sequence or an optional
    arena: tuple  # ArenaSlot
    fresh: dict  # slot -> (shape, dtype): graph outputs written straight by their kernel
    outputs: tuple  # (name, slot) in graph output order
    dynamic: frozenset  # slots the run owns: written by eager steps, or sequences and optionals fed
    arena_bytes: int
    lower_bound_bytes: int
    stats: dict = field(default_factory=dict)  # weights mapped/packed/released bytes, steps, pass times
    output_infos: tuple = ()  # per graph output: (shape, dtype), or None when known only per run
    live_bytes: tuple = ()  # per step: arena bytes live while it runs (its scratch included)
    buffers: tuple = ()  # ArenaBuffer, by offset
    mapped_weights: tuple = ()  # the ExternalData whose mapped bytes the steps read at run time
    streaming: object = None  # budget.Streaming under a memory budget: weights read ahead and dropped
    on_team: bool = False  # kernels split over numba's team of threads (ops/parallel.team): runs use it alone
