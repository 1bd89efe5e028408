"""Running within a memory budget: which weights stay resident and which stream by execution order.

The budget counts what nnrun holds beyond the process's baseline: the arena (every activation
and scratch buffer), weights in memory of the process's own (which cannot be dropped), and the
resident pages of weights that are views of a file (the model's, or the weight cache's). Those
last are the freedom: a streamed weight's pages are read some steps before its first reader and
dropped after its last, so it costs its bytes only in between. A resident weight costs its bytes
throughout and is never read from disk again.

Every weight is read once per run, so what streaming costs is the bytes it reads from disk per
run. The plan keeps resident as many weight bytes as fit, the largest first, leaving room to
stream the rest with one step of lookahead; then each streamed weight is read as far ahead of its
first reader as the room left allows (at most MAX_LOOKAHEAD steps), in order of first use, so
reading overlaps computing.

A weight too large to stream whole (VGG-16's first fully connected weight is 392 MiB) is read in
blocks of its rows, when its step can work that way (Gemm, MatMul: a block of B's rows is a block
of the output's columns, or a partial product; Conv of one group: a block of W's output channels
is a block of the output's channels). A block is read with direct I/O into one of two
buffers (the one in use, and the next being read), past the page cache, so two blocks' bytes are in
memory at a time.

The least a model can run in is the arena, the weights of the process's own, and the most
weight bytes one step reads at once (streamed with no lookahead, a blockable weight as two
rows); a budget below that fails at PREPARE, naming that step.

When the arena itself does not fit beside the least the weights need, activations spill
(spill.py): those idle longest leave the arena between two uses, and the arena is placed again
without them. Streaming comes first because it is cheaper: a weight is read once per run, a
spilled activation written and read back.

Not here yet: control-flow bodies keep their weights resident.
"""

from dataclasses import dataclass, replace

from ..errors import BudgetError
from ..paging import PAGE, region_of
from ..weights import ExternalData
from .band import band_plan
from .spill import choose_gaps, least_arena, spill_plan

MAX_LOOKAHEAD = 8
BLOCK_SHARE = 5  # a blocked weight's block is at most this fraction of the room left for streaming
BLOCK_COPIES = 2  # a blocked weight in memory: two buffers, the block in use and the next being read
_CONVOLUTIONS = {("", "Conv"), ("ai.onnx", "Conv"), ("tflite", "CONV_2D")}  # weights in blocks of output channels


@dataclass(frozen=True)
class Blocks:
    """A weight a step reads in blocks of its rows."""
    rows: tuple  # (start, end) row ranges, in order
    regions: tuple  # the Region of each block
    whole: object  # the Region of the whole weight, dropped once more after the last block
    spans: tuple = ()  # (offset in the file, bytes) of each block: read with pread into a buffer
    row_shape: tuple = ()  # the shape of one row
    dtype: object = None


@dataclass(frozen=True)
class Streaming:
    """The budget's decision, part of the Plan: what the executor prefetches and drops."""
    budget_bytes: int
    lookahead: int  # the most steps a streamed weight is read ahead of its first reader
    prefetch: tuple  # per step position: the Regions to start reading when that step begins
    drop: tuple  # per step position: the Regions to hand back after that step (their last reader)
    blocks: tuple  # per step position: Blocks of the weight it reads in blocks, or None
    resident_weights_bytes: int
    streamed_weights_bytes: int
    fixed_bytes: int  # arena and weights of the process's own: held whatever the plan
    predicted_peak_bytes: int  # fixed + resident + the most streamed bytes in memory at one step
    least_bytes: int  # the smallest budget this plan could run in
    needed: tuple = ()  # per step position: the streamed Regions it is the first to read (waited for)
    spills: tuple = ()  # spill.Spill: activations out of the arena between two uses
    banded: tuple = ()  # per step position: band.BandedStep, or None (the step runs whole)
    on_disk: tuple = ()  # band.OnDisk: activations that live in the spill file, read and written in bands
    band_area_bytes: int = 0  # the buffer the banded steps share (part of fixed_bytes)

    @property
    def spilled_activation_bytes(self):
        return sum(s.nbytes for s in self.spills if s.write) + sum(d.nbytes for d in self.on_disk)

    def streamed_in_memory(self):
        """Per step position: bytes of streamed weights in memory while it runs (read ahead and
        not yet dropped, or a blocked weight's two buffers), as the predicted peak counts them."""
        n = len(self.prefetch)
        delta = [0] * (n + 1)
        for position in range(n):
            for region in self.prefetch[position]:
                delta[position] += region.length
            for region in self.drop[position]:
                delta[position + 1] -= region.length
            blocks = self.blocks[position]
            if blocks is not None:
                block = max(length for _, length in blocks.spans) + 2 * PAGE
                delta[position] += BLOCK_COPIES * block
                delta[position + 1] -= BLOCK_COPIES * block
        out, held = [], 0
        for position in range(n):
            held += delta[position]
            out.append(held)
        return out

    def spilled_out(self):
        """Per step position: activation bytes out of the arena (in the spill file) while it runs."""
        out = [0] * len(self.prefetch)
        for s in self.spills:
            for position in range(s.out_after + 2, min(s.back_at, len(out))):
                out[position] += s.nbytes
        written, read = {}, {}
        for position, banded in enumerate(self.banded):
            if banded is not None:
                if banded.target is not None:
                    written[banded.target.slot] = position
                for source in banded.sources:
                    if source is not None:
                        read[source.slot] = position
        for d in self.on_disk:
            for position in range(written[d.slot], read[d.slot] + 1):
                out[position] += d.nbytes
        return out

    def summary(self):
        return {"memory_budget_bytes": self.budget_bytes, "resident_weights_bytes": self.resident_weights_bytes,
                "streamed_weights_bytes": self.streamed_weights_bytes,
                "spilled_activation_bytes": self.spilled_activation_bytes, "spills": len(self.spills),
                "predicted_peak_bytes": self.predicted_peak_bytes, "least_bytes": self.least_bytes,
                "lookahead_steps": self.lookahead,
                "blocked_steps": sum(1 for b in self.blocks if b is not None),
                "banded_steps": sum(1 for b in self.banded if b is not None), "band_area_bytes": self.band_area_bytes}


def step_weights(plan, step):
    """The weight arrays a step reads when it runs, as (input index or None when packed, array)."""
    found = []
    for k, slot in enumerate(step.inputs):
        value = plan.constants.get(slot) if slot >= 0 else None
        if value is not None:
            found.append((k, value.array() if isinstance(value, ExternalData) else value))
    found.extend((None, a) for a in getattr(step.kernel, "packed_arrays", ()))
    return found


def _blockable(step, k, array):
    """Whether `step` can read input `k` in blocks of rows, C-contiguous: a Gemm's B, the B of a
    MatMul whose A is a matrix or a stack of rows, or the W of a Conv of one group (its rows are
    output channels), or the filter of a TFLite CONV_2D of one group."""
    if k != 1 or step.eager or array.ndim < 2 or not array.flags.c_contiguous or array.shape[0] < 2:
        return False
    if (step.node.domain, step.node.op_type) in _CONVOLUTIONS:
        plan = getattr(step.kernel, "plan", None)
        return plan is not None and plan.group == 1 and plan.method != "depthwise"
    if step.node.domain not in ("", "ai.onnx") or array.ndim != 2:
        return False
    if step.node.op_type == "Gemm":
        return True
    if step.node.op_type == "MatMul":
        a = step.input_values[0] if step.input_values else None
        return a is not None and a.shape is not None and (len(a.shape) == 2 or step.kernel.stacked is not None)
    return False


@dataclass(frozen=True)
class WeightUses:
    """The weights the steps read that are pages of a file, by Region: the steps that read each,
    its size and array, and whether its one reader can read it in blocks; and the bytes of the
    weights in memory of the process's own."""
    steps: int
    uses: dict  # Region -> step positions reading it, in order
    sizes: dict
    arrays: dict
    blockable: frozenset
    own_bytes: int

    @property
    def first(self):
        return {r: p[0] for r, p in self.uses.items()}

    @property
    def last(self):
        return {r: p[-1] for r, p in self.uses.items()}

    def row_bytes(self, r):
        return self.arrays[r].nbytes // self.arrays[r].shape[0]

    def held_at(self, streamed, lookahead, blocked=None):
        """Per step: bytes of streamed regions in memory while it runs (blocked: BLOCK_COPIES blocks)."""
        blocked = blocked or {}
        delta = [0] * (self.steps + 2)
        for r in streamed:
            size = BLOCK_COPIES * blocked[r] if r in blocked else self.sizes[r]
            delta[max(0, self.uses[r][0] - lookahead)] += size
            delta[self.uses[r][-1] + 1] -= size
        out, live = [], 0
        for position in range(self.steps):
            live += delta[position]
            out.append(live)
        return out


def weight_uses(plan):
    uses, sizes, own, arrays, blockable = {}, {}, {}, {}, {}
    for position, step in enumerate(plan.steps):
        for k, array in step_weights(plan, step):
            region = region_of(array)
            if region is None:
                own[id(array)] = getattr(array, "nbytes", 0)
                continue
            uses.setdefault(region, []).append(position)
            sizes[region] = region.length
            arrays[region] = array
            if region.path is not None and _blockable(step, k, array):
                blockable.setdefault(region, set()).add(position)
    # A region read by several steps is blocked only if every reader can block it.
    blockable = frozenset(r for r, readers in blockable.items() if readers == set(uses[r]) and len(uses[r]) == 1)
    return WeightUses(len(plan.steps), uses, sizes, arrays, blockable, sum(own.values()))


def plan_budget(plan, budget_bytes):
    """`plan` within `budget_bytes`: its Streaming, and its arena re-placed when activations must
    spill; raises BudgetError below the least it can run in."""
    n = len(plan.steps)
    weights = weight_uses(plan)
    uses, own_bytes, held_at, row_bytes = weights.uses, weights.own_bytes, weights.held_at, weights.row_bytes
    blockable = weights.blockable
    least_held = held_at(uses, 0, {r: row_bytes(r) + 2 * PAGE for r in blockable})
    least_weights = max(least_held, default=0)
    spills, banded, on_disk, band_area = (), (), (), 0
    least = plan.arena_bytes + own_bytes + least_weights
    if least > budget_bytes:
        # Streaming every weight leaves too little room for the arena: activations spill.
        room = budget_bytes - own_bytes - least_weights
        least_arena_bytes = least_arena(plan)
        chosen = choose_gaps(plan, room) if room >= least_arena_bytes else None
        # Not even spilling every idle activation is enough: the largest live in the file and
        # the steps around them run in bands of rows.
        # A banded step reads its weights whole (no blocks), so the room for bands leaves the weights
        # the most one step reads whole, and as much again where it can, to read them ahead.
        whole = max(held_at(uses, 0), default=0)
        banded_plan, banding, least_banded = (band_plan(plan, budget_bytes - own_bytes - whole, whole)
                                              if chosen is None else (None, None, least))
        least = min(least, least_arena_bytes + own_bytes + least_weights, least_banded + own_bytes + whole)
        if chosen is not None:
            plan, spills = spill_plan(plan, *chosen)
        elif banded_plan is not None:
            plan, (banded, on_disk, band_area) = banded_plan, banding
            blockable = frozenset(r for r in blockable if banded[uses[r][0]] is None)
        else:
            hungriest = max(range(n), key=lambda p: least_held[p]) if n else 0
            step = plan.steps[hungriest] if n else None
            what = (f"step {step.node.name or step.node.op_type!r} ({step.node.op_type}) reads "
                    f"{_mib(least_held[hungriest])} of weights" if step is not None else "no step")
            raise BudgetError(f"memory budget {_mib(budget_bytes)} is below the least this model can run in, "
                              f"{_mib(least)}: the arena {_mib(least - own_bytes - least_weights)} (with every "
                              f"idle activation spilled: {_mib(least_arena_bytes)}; with activations in the "
                              f"file and steps in bands: {_mib(least_banded)}), weights in memory of the "
                              f"process's own {_mib(own_bytes)}, and {what} at once")
    fixed = plan.arena_bytes + own_bytes + band_area
    streaming = _stream(plan, budget_bytes, fixed, replace(weights, blockable=blockable))
    return replace(plan, streaming=replace(streaming, least_bytes=least, spills=spills, banded=banded,
                                           on_disk=on_disk, band_area_bytes=band_area))


def _stream(plan, budget_bytes, fixed, weights):
    """Which weights stay resident and when the others are read and dropped (see the module's text)."""
    n = len(plan.steps)
    uses, sizes, arrays, blockable = weights.uses, weights.sizes, weights.arrays, weights.blockable
    first, last, row_bytes, held_at = weights.first, weights.last, weights.row_bytes, weights.held_at
    # Blocks for the weights that cannot stream whole: at most 1/BLOCK_SHARE of the room beside
    # the arena and the weights of the process's own.
    block_bytes = max(PAGE, (budget_bytes - fixed) // BLOCK_SHARE)
    blocked = {}
    for r in blockable:
        if 2 * sizes[r] > budget_bytes - fixed:
            rows = max(1, block_bytes // row_bytes(r))
            blocked[r] = rows * row_bytes(r) + 2 * PAGE
    streamed = set(uses)
    resident, resident_bytes = set(), 0
    current = held_at(streamed, 1, blocked)
    if fixed + max(current, default=0) <= budget_bytes:
        for r in sorted(set(uses) - set(blocked), key=lambda r: (-sizes[r], first[r])):
            trial = list(current)
            for position in range(max(0, first[r] - 1), last[r] + 1):
                trial[position] -= sizes[r]
            if fixed + resident_bytes + sizes[r] + max(trial, default=0) <= budget_bytes:
                resident.add(r)
                resident_bytes += sizes[r]
                current = trial
        streamed -= resident

    # Each streamed region is read as far ahead of its first reader as the room left allows.
    room = budget_bytes - fixed - resident_bytes
    held = [0] * (n + 1)
    for r, size in blocked.items():
        held[first[r]] += BLOCK_COPIES * size
    starts = {}
    for r in sorted(streamed - set(blocked), key=lambda r: (first[r], -sizes[r])):
        start = first[r]
        for candidate in range(max(0, first[r] - MAX_LOOKAHEAD), first[r] + 1):
            if all(held[p] + sizes[r] <= room for p in range(candidate, first[r])):
                start = candidate
                break
        starts[r] = start
        for p in range(start, last[r] + 1):
            held[p] += sizes[r]
    peak = fixed + resident_bytes + max(held[:n], default=0)
    lookahead = max((first[r] - starts[r] for r in starts), default=0)
    prefetch = [[] for _ in range(n)]
    drop = [[] for _ in range(n)]
    for r in sorted(starts, key=lambda r: (starts[r], first[r], r.address)):
        prefetch[starts[r]].append(r)
        drop[last[r]].append(r)
    blocks = [None] * n
    for r, size in blocked.items():
        array = arrays[r]
        rows = max(1, (size - 2 * PAGE) // row_bytes(r))
        ranges = tuple((s, min(s + rows, array.shape[0])) for s in range(0, array.shape[0], rows))
        base = array.ctypes.data
        spans = tuple((r.file_offset + base - r.address + s * row_bytes(r), (e - s) * row_bytes(r)) for s, e in ranges)
        blocks[first[r]] = Blocks(ranges, tuple(region_of(array[s:e]) for s, e in ranges), r, spans,
                                  tuple(array.shape[1:]), array.dtype)
    needed = [[] for _ in range(n)]
    for r in starts:
        needed[first[r]].append(r)
    return Streaming(budget_bytes, lookahead, tuple(map(tuple, prefetch)), tuple(map(tuple, drop)), tuple(blocks),
                     resident_bytes, sum(sizes[r] for r in streamed), fixed, peak, 0, tuple(map(tuple, needed)))


def _mib(nbytes):
    return f"{nbytes / 2 ** 20:,.1f} MiB"
