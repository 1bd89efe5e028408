"""Arena offsets from lifetimes: buffers whose lifetimes do not overlap share bytes.

The problem is NP-complete (SmartPool, see shared/seeds); like TFLite's
ArenaPlanner we place buffers one at a time, each at the best-fitting gap
among the buffers it overlaps in time. The order of placement matters, so
several are tried and the smallest arena kept: largest first, earliest first,
longest-lived first, largest in bytes x steps first, latest-ending first, and
"greedy by breadth" (TFLite's second strategy: the buffers of the step with the
most live bytes first). All are cheap.

When the best of them is above the lower bound (the most bytes live at one step),
a local search follows: two buffers of the best placement order swap places, and
the new order is kept when its arena is no larger. It stops at the bound, after
`tries` orders, after STALE orders without a smaller arena, or at the deadline;
its random choices are seeded, so a plan is the same from run to run (unless the
deadline cuts the search short).
"""

import random
import time
from dataclasses import replace

from .lifetimes import live_bytes, lower_bound
from .plan import ArenaBuffer

ALIGNMENT = 64
STALE = 1000  # the local search gives up after this many orders without a smaller arena


def align(n, alignment=ALIGNMENT):
    return -(-n // alignment) * alignment


def _overlaps(spans):
    """buffer -> the buffers whose lifetimes meet its own (a sweep over the spans by start)."""
    by_start = sorted(spans, key=lambda b: spans[b][0])
    found = {b: [] for b in spans}
    for i, a in enumerate(by_start):
        last = spans[a][1]
        for k in range(i + 1, len(by_start)):  # not a slice: a copy of the rest per buffer is quadratic
            b = by_start[k]
            if spans[b][0] > last:
                break
            found[a].append(b)
            found[b].append(a)
    return found


def _place(order, spans, sizes, overlaps=None, alignments=None):
    """Place buffers in `order`, each in the best-fitting gap among those placed that it meets in time."""
    overlaps = overlaps if overlaps is not None else _overlaps(spans)
    alignments = alignments or {}
    offsets, ends = {}, {}
    top = 0
    for buf in order:
        step = alignments.get(buf, ALIGNMENT)
        size = align(sizes[buf], step)
        busy = sorted((offsets[o], ends[o]) for o in overlaps[buf] if o in offsets)
        best, best_gap, cursor = None, None, 0
        for o, e in busy:
            start = align(cursor, step)
            gap = o - start
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = start, gap
            cursor = max(cursor, e)
        if best is None:
            best = align(cursor, step)
        offsets[buf] = best
        ends[buf] = best + size
        top = max(top, best + size)
    return offsets, top


def _by_breadth(spans, sizes):
    """Buffers of the busiest step first (largest first within a step), then the next busiest."""
    live = {}
    for buf, (first, last) in spans.items():
        for step in range(first, last + 1):
            live.setdefault(step, []).append(buf)
    load = {step: sum(sizes[b] for b in bufs) for step, bufs in live.items()}
    order, seen = [], set()
    for step in sorted(live, key=lambda s: -load[s]):
        for buf in sorted(live[step], key=lambda b: -sizes[b]):
            if buf not in seen:
                seen.add(buf)
                order.append(buf)
    return order


def assign_offsets(spans, sizes, tries=2000, seconds=0.15, alignments=None):
    """Offsets (64-byte aligned, or as `alignments` says per buffer) for every buffer, and the arena
    size they need."""
    orders = (  # made one at a time: the first to reach the bound ends the tries
        lambda: sorted(spans, key=lambda b: (-sizes[b], spans[b][0])),
        lambda: sorted(spans, key=lambda b: (spans[b][0], -sizes[b])),
        lambda: sorted(spans, key=lambda b: (spans[b][0] - spans[b][1], -sizes[b])),
        lambda: sorted(spans, key=lambda b: (-sizes[b] * (spans[b][1] - spans[b][0] + 1), spans[b][0])),
        lambda: sorted(spans, key=lambda b: (-spans[b][1], -sizes[b])),
        lambda: _by_breadth(spans, sizes),
    )
    overlaps = _overlaps(spans)
    bound = lower_bound(spans, {b: align(sizes[b]) for b in spans})
    best = None
    for make in orders:
        order = make()
        offsets, top = _place(order, spans, sizes, overlaps, alignments)
        if best is None or top < best[1]:
            best = (offsets, top, order)
        if top <= bound:  # no arena is smaller
            break
    offsets, top, order = best
    if top > bound and len(order) > 1:
        offsets, top = _local_search(order, spans, sizes, overlaps, bound, offsets, top, tries,
                                     time.perf_counter() + seconds, alignments)
    return offsets, top


def _local_search(order, spans, sizes, overlaps, bound, offsets, top, tries, deadline, alignments=None):
    rng = random.Random(len(order))
    since_better = 0
    for attempt in range(tries):
        if top <= bound or since_better >= STALE or (not attempt & 15 and time.perf_counter() > deadline):
            break
        candidate = list(order)
        i, j = rng.randrange(len(order)), rng.randrange(len(order))
        candidate[i], candidate[j] = candidate[j], candidate[i]
        placed, arena = _place(candidate, spans, sizes, overlaps, alignments)
        since_better = 0 if arena < top else since_better + 1
        if arena <= top:  # an equal arena is a step along a plateau, towards a smaller one
            order, offsets, top = candidate, placed, arena
    return offsets, top


def placed_again(plan, arena, spans, sizes, offsets, top):
    """`plan` with its arena placed again: `arena` its ArenaSlots at their new offsets, the steps'
    values moved with them, and the buffers, live bytes and bound of the new `spans` and `sizes`."""
    moved = {a.slot: a.offset for a in arena}

    def moved_value(value):
        if value is None or value.slot not in moved:
            return value
        return replace(value, offset=moved[value.slot])

    steps = tuple(replace(s, input_values=tuple(map(moved_value, s.input_values)),
                          output_values=tuple(map(moved_value, s.output_values))) for s in plan.steps)
    buffers = tuple(sorted((ArenaBuffer(b, offsets[b], sizes[b], *spans[b]) for b in spans),
                           key=lambda b: (b.offset, b.first)))
    return replace(plan, steps=steps, arena=tuple(arena), arena_bytes=top, buffers=buffers,
                   live_bytes=live_bytes(spans, sizes, len(steps)), lower_bound_bytes=lower_bound(spans, sizes))
