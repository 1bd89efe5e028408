"""The execution order of least peak memory: exact where it can be, segmented where it can be split.

The accounting is the arena's (lifetimes.lower_bound): a buffer is live from the step
that writes it to the last step that reads it (a pinned one, a graph output, to the
end), and a step's scratch is live while it runs. So with X the set of steps already
run, live(X) is the bytes of buffers written by X that a step outside X still reads,
and running step i next costs live(X) + its outputs + its scratch. The least peak over
all valid orders is a bottleneck shortest path over downsets (the sets X closed under
"runs before"), after SERENITY (Ahn et al., MLSys 2020):

- **Segments.** A cut step is one that every other step runs before or after in every
  valid order (each other step is its ancestor or its descendant): the block of a
  ResNet or a Transformer layer ends in one. The steps between two cuts are scheduled
  alone, on the bytes that cross into them, and the peaks compose exactly: a graph of
  a thousand steps is many small problems.
- **Search** in each segment: best-first over downsets (A*), a state's bound being
  the larger of the peak so far and the largest step still to run (its inputs,
  outputs and scratch, all live at once). The greedy order's peak prunes from the
  start, and a state reached at no lower peak than before is dropped (memoization).
- **A step that costs nothing is run at once**: when a ready step neither raises the
  peak so far nor adds to live(X), running it now is never worse (every later
  state's live bytes can only shrink by it), so it is the only successor tried.
- **Budget.** The search stops at a deadline: a segment it did not finish keeps the
  greedy order, and the least bound left on its frontier is a proven lower bound
  on its peak, reported as the gap. A segment of more than MAX_SEARCH_STEPS steps is
  not searched: it keeps the greedy order, bounded by what each of its steps holds.

The result never has a higher peak than the file order's or the greedy's.
"""

import time
from dataclasses import dataclass

from .order import greedy_order, peak_of

BEAM = 64  # states per level of the narrow search that finds an incumbent before the exact one
EXACT_SHARE = 0.75  # of a segment's time left, what the exact search may take before wider narrow ones
# A segment of more steps keeps the greedy order: its analysis (ancestors as bitmasks, the pairs
# floor, the greedy of the search) grows with the square of its steps.
MAX_SEARCH_STEPS = 512


@dataclass(frozen=True)
class OrderSearch:
    """What the search found and how: the plan reports it (`plan.order_search`)."""
    order: tuple  # step indices
    peak_bytes: int  # the order's peak of live bytes
    lower_bound_bytes: int  # no valid order has a lower peak (equal when proven)
    proven: bool  # peak_bytes is the least over every valid order
    how: str  # "exact" (one segment), "segmented", "time-limited" (a segment not finished), "greedy" (a
    # segment of more than MAX_SEARCH_STEPS steps, not searched), "file order"
    segments: int
    largest_segment: int  # steps in the largest segment
    states: int  # downsets expanded
    ms: float
    file_order_peak_bytes: int
    greedy_peak_bytes: int

    def summary(self):
        return {"how": self.how, "proven_optimal": self.proven, "peak_bytes": self.peak_bytes,
                "gap_bytes": self.peak_bytes - self.lower_bound_bytes, "segments": self.segments,
                "largest_segment": self.largest_segment, "states": self.states, "ms": round(self.ms, 3),
                "greedy_peak_bytes": self.greedy_peak_bytes}


def best_order(deps, reads, writes, sizes, scratch=None, pinned=(), seconds=1.0):
    """The order of steps with the least peak of live bytes that `seconds` of search can prove.

    deps[i]: the steps that must run before step i; reads[i] / writes[i]: the buffers step i
    reads / writes; scratch[i]: its scratch bytes; pinned: buffers live to the end. The steps'
    indices are a valid order already (the file's). `seconds` None: that order, unsearched."""
    started = time.perf_counter()
    n = len(deps)
    scratch = list(scratch) if scratch else [0] * n
    file_order = list(range(n))
    file_peak = peak_of(file_order, reads, writes, sizes, scratch, pinned)
    if seconds is None:  # the pass is off: the file's order, nothing proven
        return OrderSearch(tuple(file_order), file_peak, 0, False, "file order", 1, n, 0,
                           (time.perf_counter() - started) * 1e3, file_peak, file_peak)
    if n == 0:
        return OrderSearch((), 0, 0, True, "exact", 0, 0, 0, 0.0, 0, 0)
    deadline = started + max(0.0, seconds)
    graph = _Graph(deps, reads, writes, sizes, scratch, pinned)
    segments = graph.segments()
    if len(segments) == n:  # every step is a cut (a chain): the file's order is the only one
        greedy, greedy_peak = file_order, file_peak
    else:
        greedy = greedy_order(deps, reads, writes, sizes, scratch, pinned)
        greedy_peak = peak_of(greedy, reads, writes, sizes, scratch, pinned)
    results = []
    states = 0
    for steps in segments:
        if len(steps) == 1:
            result = graph.single(steps.start)
        elif len(steps) > MAX_SEARCH_STEPS:
            result = graph.unsearched(steps, greedy)
        else:
            result = graph.segment(steps).solve(deadline)
        states += result.states
        results.append(result)
    order = [step for r in results for step in r.order]
    peak = max(r.peak for r in results)
    bound = max(r.bound for r in results)
    proven = peak == bound
    if greedy_peak < peak or file_peak < peak:  # cannot happen when segments start from the greedy
        order, peak = (greedy, greedy_peak) if greedy_peak <= file_peak else (file_order, file_peak)
        proven = peak == bound
    if not all(r.searched for r in results):
        how = "greedy"
    elif not all(r.finished for r in results):
        how = "time-limited"
    else:
        how = "exact" if len(segments) == 1 else "segmented"
    return OrderSearch(tuple(order), peak, bound, proven, how, len(segments), max(map(len, segments)), states,
                       (time.perf_counter() - started) * 1e3, file_peak, greedy_peak)


class _Graph:
    """The whole problem: steps, their buffers, and who reads what.

    Built in time linear in the steps and buffers, so a graph of a hundred thousand steps costs
    little more than its segments: the bitmasks of ancestors and descendants are a segment's own,
    over its steps alone. That is exact because a segment lies between two cut steps:
    a step before it is an ancestor of each of its steps, a step after it a descendant."""

    def __init__(self, deps, reads, writes, sizes, scratch, pinned):
        self.n = n = len(deps)
        self.deps, self.reads, self.writes = deps, reads, writes
        self.sizes, self.scratch, self.pinned = sizes, scratch, set(pinned)
        self.producer, self.last_read = {}, {}
        for i, outs in enumerate(writes):
            for b in outs:
                self.producer[b] = i
        for i, ins in enumerate(reads):
            for b in ins:
                self.last_read[b] = i
        # live_before[a]: bytes written before step a that a step from a on reads (or pinned).
        delta = [0] * (n + 2)
        for b, p in self.producer.items():
            size = sizes.get(b, 0)
            end = n if b in self.pinned else self.last_read.get(b, -1)
            if size and end > p:
                delta[p + 1] += size
                delta[end + 1] -= size
        self.live_before = live_before = [0] * (n + 1)
        live = 0
        for a in range(n + 1):
            live += delta[a]
            live_before[a] = live

    def segments(self):
        """The steps between consecutive cut steps, each cut alone, in an order every valid order keeps.

        Step i is a cut when each step before it is its ancestor and each step after it its
        descendant. The indices being topological, a path between two steps stays between them,
        so the first holds when every step j < i has a successor at or before i (following such
        successors from j ends at i), and the second when every step after i has a predecessor at
        or after i: two sweeps over the dependencies."""
        n = self.n
        first_succ = [n] * n  # the earliest successor; n: none
        last_pred = [-1] * n  # the latest predecessor; -1: none
        for i, d in enumerate(self.deps):
            for j in d:
                if i < first_succ[j]:
                    first_succ[j] = i
                if j > last_pred[i]:
                    last_pred[i] = j
        cut = [False] * n
        reach = -1
        for i in range(n):
            cut[i] = reach <= i
            reach = max(reach, first_succ[i])
        reach = n
        for i in reversed(range(n)):
            cut[i] = cut[i] and reach >= i
            reach = min(reach, last_pred[i])
        segments, start = [], 0
        for i in range(n):
            if cut[i]:
                if i > start:
                    segments.append(range(start, i))
                segments.append(range(i, i + 1))
                start = i + 1
        if start < n:
            segments.append(range(start, n))
        return segments

    def _stays(self, b, end):
        """Whether buffer `b` is live to the end of a segment that ends before step `end`: pinned, or
        read at or after `end`."""
        return b in self.pinned or self.last_read.get(b, -1) >= end

    def _spike(self, step):
        return sum(self.sizes.get(b, 0) for b in self.writes[step]) + self.scratch[step]

    def single(self, step):
        """A segment of one step: it runs with what is live before it, its outputs and its scratch."""
        peak = self.live_before[step] + self._spike(step)
        return _Result([step], peak, peak, True, 0)

    def segment(self, steps):
        """The segment of `steps`, a range of indices between cuts, once every earlier step has run."""
        a, end, m = steps.start, steps.stop, len(steps)
        sizes, pinned, last_read = self.sizes, self.pinned, self.last_read
        live = self.live_before[a]  # bytes written before the segment, still to be read (or pinned)
        preds, spike, adds, frees = [], [], [], []
        local_readers = {}  # buffer -> bitmask of the segment's steps that read it
        for k, step in enumerate(steps):
            p = 0
            for j in self.deps[step]:
                if j >= a:
                    p |= 1 << (j - a)
            preds.append(p)
            for b in self.reads[step]:
                local_readers[b] = local_readers.get(b, 0) | (1 << k)
            outs = self.writes[step]
            spike.append(self._spike(step))
            adds.append(sum(sizes.get(b, 0) for b in outs if b in pinned or b in last_read))
        ancestors = [0] * m
        for k in range(m):
            for j in _bits(preds[k]):
                ancestors[k] |= ancestors[j] | (1 << j)
        descendants = [0] * m
        for k in reversed(range(m)):
            for j in _bits(preds[k]):
                descendants[j] |= descendants[k] | (1 << k)
        for step in steps:
            freeable = []
            for b in set(self.reads[step]):
                if not self._stays(b, end):  # else read after the segment: it stays
                    freeable.append((local_readers[b], sizes.get(b, 0)))
            frees.append(tuple(freeable))
        necessary = self._necessary(steps, spike, live, local_readers, ancestors, descendants)
        floor = max(max(necessary), self._pairs_floor(steps, necessary, local_readers, descendants, ancestors,
                                                      max(necessary)))
        return _Segment(list(steps), live, preds, spike, adds, frees, necessary, floor)

    def _necessary(self, steps, spike, live, local_readers, ancestors, descendants):
        """Per step of the segment, the bytes live while it runs in every valid order: its outputs and
        scratch, and each buffer written by one of its ancestors and read by it or one of its
        descendants (or pinned). The largest is a lower bound on any order's peak, and the bound of
        a search state is the largest among the steps still to run. A buffer written before the
        segment was written by an ancestor of each of its steps; one read after it, by a
        descendant of each."""
        a, end = steps.start, steps.stop
        sizes = self.sizes

        def upstream(readers):  # the readers and their ancestors
            found = 0
            for r in _bits(readers):
                found |= ancestors[r] | (1 << r)
            return found

        necessary = list(spike)
        through = live  # written before the segment and live through it
        for b, readers in local_readers.items():
            p = self.producer.get(b)
            size = sizes.get(b, 0)
            if p is None or p >= a or not size or self._stays(b, end):
                continue
            through -= size
            for k in _bits(upstream(readers)):
                necessary[k] += size
        for k, step in enumerate(steps):
            for b in self.writes[step]:
                size = sizes.get(b, 0)
                if not size:
                    continue
                where = descendants[k]
                if not self._stays(b, end):
                    where &= upstream(local_readers.get(b, 0))
                for j in _bits(where):
                    necessary[j] += size
        return [x + through for x in necessary]

    def _pairs_floor(self, steps, necessary, local_readers, descendants, ancestors, floor):
        """A lower bound from pairs of steps that may run in either order: whichever runs second
        holds, besides what it must hold anyway (`necessary`), the first one's outputs that it or
        one of its descendants reads. The least of the two ways bounds every order's peak. Only
        pairs that can raise `floor` are looked at. Steps are local here (0 is the segment's first)."""
        end = steps.stop
        held = {}  # (first, second) -> bytes of first's outputs live while second runs

        def extra(first, second):
            key = (first, second)
            if key not in held:
                later = descendants[second] | (1 << second)
                held[key] = sum(self.sizes.get(b, 0) for b in self.writes[steps[first]]
                                if self._stays(b, end) or local_readers.get(b, 0) & later)
            return held[key]

        m = len(steps)
        out = [sum(self.sizes.get(b, 0) for b in self.writes[step]) for step in steps]
        largest = max(out, default=0)
        most = max(necessary)
        seconds = [k for k in range(m) if necessary[k] + largest > floor]
        firsts = [k for k in range(m) if out[k] and out[k] + most > floor]
        for a in firsts:
            related = ancestors[a] | descendants[a] | (1 << a)
            for b in seconds:
                if related >> b & 1 or necessary[b] + out[a] <= floor or necessary[a] + out[b] <= floor:
                    continue
                bound = min(necessary[b] + extra(a, b), necessary[a] + extra(b, a))
                if bound > floor:
                    floor = bound
        return floor

    def unsearched(self, steps, greedy):
        """A segment of more than MAX_SEARCH_STEPS steps, whose analysis alone (bitmasks of ancestors)
        would grow with the square of its steps: the greedy order's steps in it (they follow every
        earlier segment's in any valid order), their peak, and as bound what each step holds in
        every order (its outputs, scratch and inputs, and what crosses the segment)."""
        a, end = steps.start, steps.stop
        sizes, producer = self.sizes, self.producer
        order = list(greedy[a:end])
        live = through = self.live_before[a]
        count = {}
        for step in steps:
            for b in set(self.reads[step]):
                count[b] = count.get(b, 0) + 1
        for b in count:
            p = producer.get(b)
            if p is not None and p < a and not self._stays(b, end):
                through -= sizes.get(b, 0)
        peak = bound = 0
        for step in order:
            spike = self._spike(step)
            held = 0
            for b in set(self.reads[step]):
                p = producer.get(b)
                if p is not None and p != step and not (p < a and self._stays(b, end)):
                    held += sizes.get(b, 0)
            bound = max(bound, spike + through + held)
            peak = max(peak, live + spike)
            live += sum(sizes.get(b, 0) for b in self.writes[step] if b in self.pinned or b in self.last_read)
            for b in set(self.reads[step]):
                count[b] -= 1
                if not count[b] and not self._stays(b, end):
                    live -= sizes.get(b, 0)
        return _Result(order, peak, min(bound, peak), False, 0, searched=False)


def _bits(mask):
    found = []
    while mask:
        low = mask & -mask
        found.append(low.bit_length() - 1)
        mask ^= low
    return found


@dataclass
class _Result:
    order: list  # global step indices
    peak: int
    bound: int
    finished: bool
    states: int
    searched: bool = True  # False: a segment too large to search, in the greedy order


class _Segment:
    """One segment's problem on local step numbers 0..m-1 (bit k of a state: step k has run)."""

    def __init__(self, steps, live, preds, spike, adds, frees, base, floor):
        self.steps, self.live, self.floor = steps, live, floor
        self.preds, self.spike, self.adds, self.frees, self.base = preds, spike, adds, frees, base
        self.m = len(steps)
        self.succs = [[j for j in range(self.m) if preds[j] >> k & 1] for k in range(self.m)]
        self.by_base = sorted(range(self.m), key=lambda k: -base[k])

    def _freed(self, state, k):
        after = state | (1 << k)
        return sum(size for inside, size in self.frees[k] if not inside & ~after)

    def _bound(self, state):
        """The largest of the bytes necessarily live (see _Graph._necessary) at a step still to run."""
        for k in self.by_base:
            if not state >> k & 1:
                return self.base[k]
        return 0

    def peak_of(self, order):
        state, live, peak = 0, self.live, 0
        for k in order:
            peak = max(peak, live + self.spike[k])
            live += self.adds[k] - self._freed(state, k)
            state |= 1 << k
        return peak

    def greedy(self):
        """At each point the ready step that adds the least to live bytes (ties: the smaller spike)."""
        state, live, order = 0, self.live, []
        for _ in range(self.m):
            best = None
            for k in range(self.m):
                if state >> k & 1 or self.preds[k] & ~state:
                    continue
                key = (self.adds[k] - self._freed(state, k), self.spike[k], k)
                if best is None or key < best:
                    best = key
            k = best[2]
            live += self.adds[k] - self._freed(state, k)
            state |= 1 << k
            order.append(k)
        return order

    def solve(self, deadline):
        steps = self.steps
        if self.m == 1:
            peak = self.live + self.spike[0]
            return _Result(list(steps), peak, peak, True, 0)
        floor = self.floor  # no order of this segment peaks lower
        incumbent = self.greedy()
        upper = self.peak_of(incumbent)
        states = 0
        if upper > floor:  # a narrow search first: a better incumbent prunes the exact one
            order, peak, _, _, states = self._levels(upper, floor, deadline, width=BEAM)
            if order is not None and peak < upper:
                incumbent, upper = order, peak
        if upper <= floor:
            return _Result([steps[k] for k in incumbent], upper, upper, True, states)
        now = time.perf_counter()
        exact_until = now + (deadline - now) * EXACT_SHARE
        order, peak, bound, finished, more = self._levels(upper, floor, exact_until)
        states += more
        if order is not None:
            incumbent, upper = order, peak
        width = BEAM
        while not finished and upper > bound and time.perf_counter() < deadline:
            width *= 4  # the exact search ran out of time: wider narrow searches, for a better order
            order, peak, _, complete, more = self._levels(upper, floor, deadline, width=width)
            states += more
            if order is not None and peak < upper:
                incumbent, upper = order, peak
            if not complete:
                break
        return _Result([steps[k] for k in incumbent], upper, bound, finished, states)

    def _levels(self, upper, floor, deadline, width=None):
        """Dynamic programming over downsets, level by level (k steps run), each downset kept at
        its least peak so far; states that cannot beat `upper` are dropped. `width` keeps only
        that many states per level, the lowest (peak, live) first: a heuristic, not a proof.
        Returns (an order below `upper` or None, its peak, a proven lower bound, whether the
        search finished, states expanded)."""
        m, spike, adds, preds, succs = self.m, self.spike, self.adds, self.preds, self.succs
        start_ready = 0
        for k in range(m):
            if not preds[k]:
                start_ready |= 1 << k
        level = {0: (0, self.live, start_ready)}
        parent = {}
        states = 0
        for _ in range(m):
            following = {}
            for state, (g, live, ready) in level.items():
                states += 1
                if not states & 15 and time.perf_counter() > deadline:  # a state may have hundreds of successors
                    low = min(max(g, self._bound(x)) for x, (g, _, _) in level.items())
                    return None, upper, max(floor, min(low, upper)), False, states
                choices = _bits(ready)
                for k in choices:  # a step that costs nothing now is the only successor worth trying
                    if live + spike[k] <= g and adds[k] - self._freed(state, k) <= 0:
                        choices = (k,)
                        break
                for k in choices:
                    cost = live + spike[k]
                    g2 = cost if cost > g else g
                    if g2 >= upper:
                        continue
                    after = state | (1 << k)
                    known = following.get(after)
                    if known is not None and known[0] <= g2:
                        continue
                    if self._bound(after) >= upper:
                        continue
                    ready2 = ready & ~(1 << k)
                    for j in succs[k]:
                        if not preds[j] & ~after:
                            ready2 |= 1 << j
                    following[after] = (g2, live + adds[k] - self._freed(state, k), ready2)
                    parent[after] = (state, k)
            if not following:
                return None, upper, upper, width is None, states  # no order peaks below `upper`
            if width is not None and len(following) > width:
                kept = sorted(following.items(), key=lambda item: (item[1][0], item[1][1]))[:width]
                following = dict(kept)
            level = following
        (full, (g, _, _)), = level.items()
        return self._path(parent, full), g, g, True, states

    @staticmethod
    def _path(parent, state):
        order = []
        while state:
            state, k = parent[state]
            order.append(k)
        order.reverse()
        return order
