"""Spilling activations: which leave the arena between two of their uses, and the arena without them.

Under a memory budget the arena may be larger than the room the budget leaves it. An activation
that waits several steps between two uses (a U-Net's skip connection, an Inception branch kept for
a late Concat) need not hold its bytes while it waits: it is written to a spill file after the
earlier use (while the next step runs) and read back into the arena one step before the later
one (while that step runs). Each spell in the arena is a buffer of its own to the placement, so
the bytes it leaves are reused by the steps in between. The file is written and read with direct
I/O (O_DIRECT), past the page cache, so a spill costs no memory beside the arena: its parts lie
at page-aligned offsets, their lengths whole pages.

The choice follows AutoSwap (shared/seeds): while the most bytes live at one step exceed the
target, the gap that covers that step with the largest size x idle steps is taken. A gap must be
at least four steps long (used at u, written out while u + 1 runs, read back while v - 1 runs for
step v: out of the arena for steps u + 2 .. v - 2). Spilling moves an activation's bytes twice
per run (a weight streams once), so the budget planner spills only what streaming every weight
cannot make room for.

An activation is written once per run, after its writer's gap, however many gaps it leaves by:
no kernel writes into its inputs, so the file keeps what the arena had. Spillable are arena
buffers that are no graph output, no scratch, and not viewed under another shape by an alias step
(the alias would keep pointing at the old place).
"""

from dataclasses import dataclass, replace

from ..paging import DIRECT_IO_ALIGNMENT
from .arena import align, assign_offsets, placed_again
from .lifetimes import live_bytes, lower_bound

FILE_ALIGNMENT = DIRECT_IO_ALIGNMENT
MIN_SPILL_BYTES = 64 * 1024  # smaller activations are not worth a write and a read


@dataclass(frozen=True)
class Spill:
    """One activation out of the arena between two of its uses."""
    slot: int
    name: str
    nbytes: int
    out_after: int  # its last use before the gap: it is written out while the next step runs
    back_at: int  # when this step begins it is read back, for the step after
    offset: int  # where in the arena it is read back to
    file_offset: int  # where in the spill file it lies
    write: bool  # whether leaving writes it (its first gap in the run): later gaps find it in the file


@dataclass(frozen=True)
class Gap:
    buffer: str
    out_after: int
    next_use: int

    @property
    def steps(self):
        """The steps it is out of the arena for."""
        return range(self.out_after + 2, self.next_use - 1)


def buffer_uses(plan):
    """Arena buffer name -> sorted step positions that write or read it, for the spillable buffers."""
    names = plan.slot_names
    arena_slots = {a.slot for a in plan.arena}
    aliased = {step.alias_of for step in plan.steps if step.alias_of >= 0}
    outputs = {slot for _, slot in plan.outputs}
    uses = {}
    for position, step in enumerate(plan.steps):
        for slot in set(step.inputs) | set(step.outputs):
            if slot in arena_slots:
                uses.setdefault(slot, set()).add(position)
    n = len(plan.steps)
    spans = {b.name: (b.first, b.last) for b in plan.buffers}
    found = {}
    for slot, positions in uses.items():
        name = names[slot]
        if slot in aliased or slot in outputs or name not in spans or spans[name][1] >= n:
            continue
        found[name] = sorted(positions)
    return found


def gaps_of(uses, sizes):
    return [Gap(b, u, v) for b, positions in uses.items() if sizes[b] >= MIN_SPILL_BYTES
            for u, v in zip(positions, positions[1:]) if v - u >= 4]


def cuts_by_buffer(gaps):
    """Buffer -> its gaps, in order."""
    found = {}
    for gap in sorted(gaps, key=lambda g: g.out_after):
        found.setdefault(gap.buffer, []).append(gap)
    return found


def split_spans(spans, sizes, gaps):
    """The spans, sizes and alignments with every spilled buffer cut at its gaps: part 0 keeps the
    buffer's name, part k is `name#back{k}`; each part is whole pages at a page-aligned offset."""
    out, out_sizes, alignments = dict(spans), dict(sizes), {}
    for buffer, cuts in cuts_by_buffer(gaps).items():
        first, last = spans[buffer]
        start = first
        for k, gap in enumerate(cuts):
            out[_part(buffer, k)] = (start, gap.out_after + 1)
            start = gap.next_use - 1
        out[_part(buffer, len(cuts))] = (start, last)
        for k in range(len(cuts) + 1):
            out_sizes[_part(buffer, k)] = align(sizes[buffer], FILE_ALIGNMENT)
            alignments[_part(buffer, k)] = FILE_ALIGNMENT
    return out, out_sizes, alignments


def _part(buffer, k):
    return buffer if k == 0 else f"{buffer}#back{k}"


def least_arena(plan):
    """The smallest arena spilling can reach: the most bytes live at one step with every gap taken."""
    sizes = {b.name: align(b.nbytes) for b in plan.buffers}
    spans = {b.name: (b.first, b.last) for b in plan.buffers}
    split, part_sizes, _ = split_spans(spans, sizes, gaps_of(buffer_uses(plan), sizes))
    return lower_bound(split, part_sizes)


def choose_gaps(plan, room):
    """The gaps to spill so that the arena fits `room` bytes, or None when no choice can.
    Returns (gaps, spans, sizes, alignments, offsets, arena bytes)."""
    n = len(plan.steps)
    sizes = {b.name: b.nbytes for b in plan.buffers}
    spans = {b.name: (b.first, b.last) for b in plan.buffers}
    gaps = gaps_of(buffer_uses(plan), sizes)
    chosen = []
    target = room
    for _ in range(8):  # each round lowers the target by what the placement missed it by
        live = list(live_bytes(spans, sizes, n))
        for gap in chosen:
            for p in gap.steps:
                live[p] -= sizes[gap.buffer]
        taken = set(chosen)
        while True:
            peak = max(range(n), key=lambda p: live[p]) if n else 0
            if not n or live[peak] <= target:
                break
            covering = [g for g in gaps if g not in taken and peak in g.steps]
            if not covering:
                return None
            best = max(covering, key=lambda g: (sizes[g.buffer] * len(g.steps), -g.out_after))
            chosen.append(best)
            taken.add(best)
            for p in best.steps:
                live[p] -= sizes[best.buffer]
        split, part_sizes, alignments = split_spans(spans, sizes, chosen)
        offsets, top = assign_offsets(split, part_sizes, alignments=alignments)
        if top <= room:
            return chosen, split, part_sizes, offsets, top
        target -= top - room
    return None


def spill_plan(plan, gaps, split, part_sizes, offsets, top):
    """The plan with its arena re-placed around the spilled gaps, and the Spills the executor runs."""
    names = plan.slot_names
    slot_of = {names[a.slot]: a.slot for a in plan.arena}
    arena = tuple(replace(a, offset=offsets[names[a.slot]]) for a in plan.arena)
    nbytes_of = {b.name: b.nbytes for b in plan.buffers}
    spills, file_offset = [], 0
    for buffer, cuts in cuts_by_buffer(gaps).items():  # by first gap: the file in the order of writing
        nbytes = nbytes_of[buffer]
        for k, gap in enumerate(cuts):
            spills.append(Spill(slot_of[buffer], buffer, nbytes, gap.out_after, gap.next_use - 1,
                                offsets[_part(buffer, k + 1)], file_offset, k == 0))
        file_offset += align(nbytes, FILE_ALIGNMENT)
    return placed_again(plan, arena, split, part_sizes, offsets, top), tuple(spills)
