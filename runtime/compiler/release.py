"""Hand back the mapped pages of weights the plan no longer reads.

After PREPARE, a mapped weight is still needed only if some array the plan
keeps (a constant slot, or an array a kernel holds) lies inside its bytes.
Every other weight — packed, folded into another, or dead — is released:
its pages are dropped with madvise(MADV_DONTNEED), except pages it shares with
a weight still in use.
"""

import bisect

import numpy as np
from numpy.lib.array_utils import byte_bounds

from ..ir import Graph
from ..loader.mapped import ExternalData


def mapped_sources(graph):
    """Every MappedFile that weights of the graph (and its subgraphs) point into."""
    sources = {}

    def visit_value(v):
        if isinstance(v, ExternalData):
            sources[id(v.source)] = v.source
        elif isinstance(v, Graph):
            visit_graph(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit_value(x)

    def visit_graph(g):
        for w in g.initializers.values():
            visit_value(w)
        for node in g.nodes:
            for v in node.attrs.values():
                visit_value(v)

    visit_graph(graph)
    return list(sources.values())


def kept_arrays(plan_constants, kernels):
    """Arrays the plan will read at run time: constant slots and what kernels hold."""
    for value in plan_constants:
        if isinstance(value, ExternalData):
            yield value.array()
        elif isinstance(value, np.ndarray):
            yield value
    for kernel in kernels:
        for value in vars(kernel).values():
            if isinstance(value, np.ndarray):
                yield value
            elif isinstance(value, (list, tuple)):
                for v in value:
                    if isinstance(v, np.ndarray):
                        yield v


class EagerRelease:
    """Release a weight's pages the moment PREPARE has copied it.

    Packing a weight (Conv+BatchNormalization folding, an aligned copy) makes a
    second copy of it; releasing the mapped one at once, rather than after the
    whole plan is built, keeps the two from being resident together: PREPARE's
    peak grows by one weight, not by all of them. Releasing is always safe: a
    dropped page that is read again is only re-read from the file.
    """

    def __init__(self, sources, enabled=True):
        self.bounds = [(s, s.address, s.address + s.size) for s in sources
                       if enabled and s.releasable and s.size]

    def copied(self, array):
        """`array`, a view into a mapping, was copied and will not be read again."""
        if not self.bounds or not isinstance(array, np.ndarray) or array.size == 0:
            return 0
        lo, _ = byte_bounds(array)
        for source, start, end in self.bounds:
            if start <= lo < end:
                return source.release_containing(lo - start)
        return 0


def release_unused(sources, arrays):
    """Release every tracked weight range of `sources` that no array in `arrays` touches."""
    spans = {}  # id(source) -> list of (lo, hi) byte offsets kept
    bounds = [(s, s.address, s.address + s.size) for s in sources if s.releasable and s.size]
    for array in arrays:
        if array.size == 0:
            continue
        lo, hi = byte_bounds(array)
        for source, start, end in bounds:
            if start <= lo < end:
                spans.setdefault(id(source), []).append((lo - start, hi - start))
                break
    released = 0
    for source, _, _ in bounds:
        keep = _merged(spans.get(id(source), ()))
        starts = [a for a, _ in keep]
        for lo, hi in source.tracked_ranges():
            i = bisect.bisect_left(starts, hi)
            if i == 0 or keep[i - 1][1] <= lo:
                released += source.release(lo, hi - lo)
    return released


def _merged(spans):
    merged = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged
