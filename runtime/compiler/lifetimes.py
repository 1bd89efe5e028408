"""Lifetimes of the buffers an ordered list of steps uses, and the order's lower bound.

A buffer is described by the step that produces it and the steps that read it.
Its lifetime is the closed interval [first, last] of step positions: it must
hold its bytes from the step that writes it to the last step that reads it.
"""


def lifetimes(producers, readers, keep_to_end=(), n_steps=0):
    """Map buffer -> (first, last) step position.

    producers: buffer -> position of the step that writes it.
    readers: buffer -> positions of the steps that read it (aliases included).
    keep_to_end: buffers that must survive the last step (e.g. read after the run).
    """
    spans = {}
    for buf, first in producers.items():
        last = max(readers.get(buf, ()), default=first)
        if buf in keep_to_end:
            last = max(last, n_steps)
        spans[buf] = (first, max(first, last))
    return spans


def lower_bound(spans, sizes):
    """The largest sum of sizes of buffers live at any one step: no arena can be smaller."""
    if not spans:
        return 0
    events = {}
    for buf, (first, last) in spans.items():
        events[first] = events.get(first, 0) + sizes[buf]
        events[last + 1] = events.get(last + 1, 0) - sizes[buf]
    live = peak = 0
    for pos in sorted(events):
        live += events[pos]
        peak = max(peak, live)
    return peak


def live_bytes(spans, sizes, n_steps):
    """Per step position: the bytes of the buffers live across it."""
    delta = [0] * (n_steps + 2)
    for buf, (first, last) in spans.items():
        delta[first] += sizes[buf]
        delta[min(last, n_steps) + 1] -= sizes[buf]
    live, out = 0, []
    for pos in range(n_steps):
        live += delta[pos]
        out.append(live)
    return tuple(out)
