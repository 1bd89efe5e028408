"""Arena offsets from lifetimes: buffers whose lifetimes do not overlap share bytes.

The problem is NP-complete (SmartPool, see shared/seeds); like TFLite's
ArenaPlanner we place the largest buffers first, each at the best-fitting gap
among the buffers it overlaps in time. A second ordering (by lifetime start) is
tried as well and the smaller arena kept: both are cheap.
"""

ALIGNMENT = 64


def align(n, alignment=ALIGNMENT):
    return -(-n // alignment) * alignment


def _place(order, spans, sizes):
    placed = []  # (offset, end, first, last)
    offsets = {}
    top = 0
    for buf in order:
        size = align(sizes[buf])
        first, last = spans[buf]
        busy = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
        best, best_gap, cursor = None, None, 0
        for o, e in busy:
            gap = o - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, e)
        if best is None:
            best = cursor
        offsets[buf] = best
        placed.append((best, best + size, first, last))
        top = max(top, best + size)
    return offsets, top


def assign_offsets(spans, sizes):
    """Offsets (64-byte aligned) for every buffer, and the arena size they need."""
    by_size = sorted(spans, key=lambda b: (-sizes[b], spans[b][0]))
    by_start = sorted(spans, key=lambda b: (spans[b][0], -sizes[b]))
    best = None
    for order in (by_size, by_start):
        offsets, top = _place(order, spans, sizes)
        if best is None or top < best[1]:
            best = (offsets, top)
    return best
