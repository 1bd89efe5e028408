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
  (NonZero, a Reshape fed its shape): it allocates its outputs itself.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    index: int  # position in the model's node list, for errors
    node: object  # ir.Node
    kernel: object  # ops.Kernel, prepared
    inputs: tuple  # slot ids, -1 for an omitted or packed input
    outputs: tuple  # slot ids
    scratch: tuple = ()  # slot ids of this step's scratch buffers
    alias_of: int = -1  # >= 0: the single output is a view of this input slot, reshaped
    alias_shape: tuple = ()
    eager: bool = False  # shapes known only per run: infer, prepare and allocate at each run


@dataclass(frozen=True)
class ArenaSlot:
    slot: int
    offset: int
    shape: tuple
    dtype: object


@dataclass(frozen=True)
class Plan:
    steps: tuple
    slot_names: tuple  # slot id -> value name (scratch slots get a synthetic name)
    constants: dict  # slot -> array or ExternalData
    feeds: dict  # input name -> (slot, shape, dtype)
    arena: tuple  # ArenaSlot
    fresh: dict  # slot -> (shape, dtype): graph outputs written straight by their kernel
    outputs: tuple  # (name, slot) in graph output order
    dynamic: frozenset  # slots written by eager steps: fresh arrays each run
    arena_bytes: int
    lower_bound_bytes: int
    stats: dict = field(default_factory=dict)  # weights mapped/packed/released bytes, steps
    output_infos: tuple = ()  # per graph output: (shape, dtype), or None when known only per run
