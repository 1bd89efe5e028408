"""The passes of PREPARE, by name, and the runner that applies them.

PREPARE is this list, run in order by `compile_graph`. Each pass is a function
from one frozen stage (stages.py) to the next. A pass marked `switchable` can be
turned off by name (`SessionOptions.disabled_passes`, `nnrun --disable-pass`), to
bisect a wrong answer; the others are what makes a plan at all.

The runner times each pass and puts the location in front of any error a pass
raises: `PREPARE/fold_batchnorm: node 'bn3' (BatchNormalization, #41): ...`.
"""

import time
from dataclasses import dataclass

from ..errors import ModelError, raise_located


@dataclass(frozen=True)
class Pass:
    name: str
    switchable: bool
    what: str  # what it does; when switchable, what happens instead when it is off


PASSES = tuple(Pass(*p) for p in (
    ("check_supported", False, "every op of the graph and of its subgraphs has a kernel; all missing ones "
                               "reported at once"),
    ("capture_outer_values", False, "outer-scope values a subgraph reads become explicit node inputs"),
    ("topological_order", False, "nodes in an order where every input is produced before it is read"),
    ("drop_identities", True, "Identity, and Dropout at inference, are dropped: their readers read their "
                              "input (off: each runs, as an alias)"),
    ("constants_as_weights", True, "Constant nodes' values become weights before the rewrites read them "
                                   "(off: they are computed at infer_shapes, after fold_batchnorm)"),
    ("fold_batchnorm", True, "Conv then BatchNormalization with constant parameters becomes one Conv"),
    ("fold_conv_bias", True, "Conv then an Add of a constant per output channel becomes one Conv with that bias "
                             "(so that an activation after it fuses)"),
    ("flush_denormals", True, "subnormal values in float weights become zero (each costs a ~100x slower "
                              "multiply on x86); scanned by sample, copied only when found"),
    ("fuse_patterns", True, "GELU (erf and tanh forms), HardSwish, HardSigmoid, SiLU, Mish, LayerNormalization "
                            "and attention written out op by op become one kernel each (off: each op runs)"),
    ("fuse_activations", True, "an activation after Conv, Gemm, MatMul or Add runs inside it"),
    ("fuse_residual", True, "Conv then an Add of another value (a residual connection, with the Add's "
                            "activation) becomes one Conv adding it before the activation (off: the Add runs)"),
    ("infer_shapes", False, "each node's shape rule on concrete shapes; a shape known only per run "
                            "makes an eager step"),
    ("fold_constants", True, "inside infer_shapes: a node whose inputs are all known runs at PREPARE "
                             "(off: it runs every time, or eagerly if a shape depends on it)"),
    ("inline_if", True, "inside infer_shapes: an If whose condition is known by then becomes the nodes of "
                        "the branch it takes (off: it runs as an If, its branch planned apart)"),
    ("check_output_types", False, "each graph output's element type is the one the model declares for it"),
    ("drop_dead", False, "steps whose outputs nothing reads are dropped"),
    ("prepare_kernels", False, "each kernel packs its constant inputs into its layout and sizes its scratch"),
    ("arena_buffers", False, "which arena buffers each step reads and writes (a reshape's output shares "
                             "its input's buffer; a graph output gets its own array)"),
    ("memory_aware_order", True, "among the valid orders, one with a low peak of live bytes "
                                 "(off: the topological order)"),
    ("lifetimes", False, "each buffer's first and last step"),
    ("assign_offsets", False, "an arena offset for every intermediate and scratch buffer"),
    ("build_plan", False, "the frozen Plan: steps, slots, constants (unaligned payloads copied once)"),
    ("release_weights", True, "mapped pages of weights no step reads any more are handed back "
                              "(off: they stay mapped)"),
    ("plan_budget", False, "under a memory budget: which weights stay resident and which are read ahead "
                           "of their steps and dropped after; which activations spill, the arena placed "
                           "again without them"),
))
BY_NAME = {p.name: p for p in PASSES}
SWITCHABLE = tuple(p.name for p in PASSES if p.switchable)


def check_disabled(names):
    """The set of pass names to skip; an unknown or required pass is a ModelError naming the choices."""
    names = frozenset(names or ())
    unknown = sorted(n for n in names if n not in BY_NAME)
    if unknown:
        raise ModelError(f"unknown passes {unknown}; the passes that can be turned off are "
                         f"{list(SWITCHABLE)}")
    required = sorted(n for n in names if not BY_NAME[n].switchable)
    if required:
        raise ModelError(f"passes {required} cannot be turned off: a plan needs them; the ones that "
                         f"can are {list(SWITCHABLE)}")
    return names


class PassRunner:
    """Runs passes by name: skips the disabled ones, times each, locates their errors."""

    def __init__(self, disabled=frozenset()):
        self.disabled = check_disabled(disabled)
        self.ms = {}

    def enabled(self, name):
        return name not in self.disabled

    def __call__(self, name, function, *args, otherwise=None):
        """function(*args), or `otherwise(*args)` (by default the first argument) when disabled."""
        if name in self.disabled:
            return otherwise(*args) if otherwise is not None else args[0]
        started = time.perf_counter()
        try:
            return function(*args)
        except Exception as e:  # noqa: BLE001 - every failure must say where
            raise_located(e, "PREPARE", name)
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - started) * 1e3
