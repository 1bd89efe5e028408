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
  on its peak, reported as the gap.

The result never has a higher peak than the file order's or the greedy's.
"""

import time
from dataclasses import dataclass

from .order import greedy_order, peak_of

BEAM = 64  # states per level of the narrow search that finds an incumbent before the exact one
EXACT_SHARE = 0.75  # of a segment's time left, what the exact search may take before wider narrow ones


@dataclass(frozen=True)
class OrderSearch:
    """What the search found and how: the plan reports it (`plan.order_search`)."""
    order: tuple  # step indices
    peak_bytes: int  # the order's peak of live bytes
    lower_bound_bytes: int  # no valid order has a lower peak (equal when proven)
    proven: bool  # peak_bytes is the least over every valid order
    how: str  # "exact" (one segment), "segmented", "time-limited" (a segment not finished), "file order"
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
    greedy = greedy_order(deps, reads, writes, sizes, scratch, pinned)
    greedy_peak = peak_of(greedy, reads, writes, sizes, scratch, pinned)
    if n == 0:
        return OrderSearch((), 0, 0, True, "exact", 0, 0, 0, 0.0, 0, 0)
    deadline = started + max(0.0, seconds)
    graph = _Graph(deps, reads, writes, sizes, scratch, pinned)
    segments = graph.segments()
    results = []
    done = 0  # bitmask of the steps of earlier segments
    states = 0
    for steps in segments:
        problem = graph.segment(steps, done)
        result = problem.solve(deadline)
        states += result.states
        results.append(result)
        done |= problem.mask
    order = [step for r in results for step in r.order]
    peak = max(r.peak for r in results)
    bound = max(r.bound for r in results)
    proven = peak == bound
    if greedy_peak < peak or file_peak < peak:  # cannot happen when segments start from the greedy
        order, peak = (greedy, greedy_peak) if greedy_peak <= file_peak else (file_order, file_peak)
        proven = peak == bound
    how = "time-limited" if not all(r.finished for r in results) else "exact" if len(segments) == 1 \
        else "segmented"
    return OrderSearch(tuple(order), peak, bound, proven, how, len(segments), max(map(len, segments)), states,
                       (time.perf_counter() - started) * 1e3, file_peak, greedy_peak)


class _Graph:
    """The whole problem: steps, their buffers, and who reads what."""

    def __init__(self, deps, reads, writes, sizes, scratch, pinned):
        self.n = len(deps)
        self.deps = [set(d) for d in deps]
        self.reads, self.writes = reads, writes
        self.sizes, self.scratch, self.pinned = sizes, scratch, set(pinned)
        self.producer, self.readers = {}, {}
        for i, outs in enumerate(writes):
            for b in outs:
                self.producer[b] = i
        for i, ins in enumerate(reads):
            for b in set(ins):
                self.readers[b] = self.readers.get(b, 0) | (1 << i)

        n = self.n
        self.ancestors = ancestors = [0] * n
        for i in range(n):  # indices are topological
            for j in self.deps[i]:
                ancestors[i] |= ancestors[j] | (1 << j)
        self.descendants = descendants = [0] * n
        for i in reversed(range(n)):
            for j in self.deps[i]:
                descendants[j] |= descendants[i] | (1 << i)
        self.necessary = self._necessary()

    def _necessary(self):
        """Per step, the bytes live while it runs in every valid order: its outputs and scratch, and
        each buffer written by one of its ancestors and read by it or one of its descendants (or
        pinned). The largest is a lower bound on any order's peak, and the bound of a search state
        is the largest among the steps still to run."""
        necessary = [self.scratch[k] + sum(self.sizes.get(b, 0) for b in self.writes[k]) for k in range(self.n)]
        for b, p in self.producer.items():
            size = self.sizes.get(b, 0)
            if not size:
                continue
            where = self.descendants[p]
            if b not in self.pinned:
                upstream = 0  # the readers and their ancestors
                for r in _bits(self.readers.get(b, 0)):
                    upstream |= self.ancestors[r] | (1 << r)
                where &= upstream
            for k in _bits(where):
                necessary[k] += size
        return necessary

    def segments(self):
        """The steps between consecutive cut steps, each cut alone, in an order every valid order keeps."""
        n = self.n
        ancestors, descendants = self.ancestors, self.descendants
        everyone = (1 << n) - 1
        cuts = sorted((i for i in range(n) if ancestors[i] | descendants[i] | (1 << i) == everyone),
                      key=lambda i: bin(ancestors[i]).count("1"))
        segments, done = [], 0
        for cut in cuts:
            before = ancestors[cut] & ~done
            if before:
                segments.append(_steps_of(before))
            segments.append([cut])
            done |= before | (1 << cut)
        if everyone & ~done:
            segments.append(_steps_of(everyone & ~done))
        return segments

    def segment(self, steps, done):
        """The segment of `steps` once the steps of `done` (a bitmask) have run."""
        mask = 0
        for i in steps:
            mask |= 1 << i
        after = ((1 << self.n) - 1) & ~(done | mask)
        sizes = self.sizes
        live = 0  # bytes written before the segment, still to be read (or pinned)
        for b, p in self.producer.items():
            if done >> p & 1 and (b in self.pinned or self.readers.get(b, 0) & ~done):
                live += sizes.get(b, 0)
        local = {step: k for k, step in enumerate(steps)}
        preds, spike, adds, frees, base = [], [], [], [], []
        for step in steps:
            p = 0
            for j in self.deps[step]:
                if j in local:
                    p |= 1 << local[j]
            preds.append(p)
            outs = self.writes[step]
            spike.append(sum(sizes.get(b, 0) for b in outs) + self.scratch[step])
            adds.append(sum(sizes.get(b, 0) for b in outs if b in self.pinned or b in self.readers))
            freeable = []
            for b in set(self.reads[step]):
                readers = self.readers[b]
                if b in self.pinned or readers & after:
                    continue  # read after the segment: it stays
                inside = 0
                for j in _steps_of(readers & mask):
                    inside |= 1 << local[j]
                freeable.append((inside, sizes.get(b, 0)))
            frees.append(tuple(freeable))
            base.append(self.necessary[step])
        floor = max(max(base), self._pairs_floor(steps, max(base)))
        return _Segment(list(steps), mask, live, preds, spike, adds, frees, base, floor)

    def _pairs_floor(self, steps, floor):
        """A lower bound from pairs of steps that may run in either order: whichever runs second
        holds, besides what it must hold anyway (`necessary`), the first one's outputs that it or
        one of its descendants reads. The least of the two ways bounds every order's peak. Only
        pairs that can raise `floor` are looked at."""
        necessary = self.necessary
        held = {}  # (first, second) -> bytes of first's outputs live while second runs

        def extra(first, second):
            key = (first, second)
            if key not in held:
                later = self.descendants[second] | (1 << second)
                held[key] = sum(self.sizes.get(b, 0) for b in self.writes[first]
                                if b in self.pinned or self.readers.get(b, 0) & later)
            return held[key]

        out = {k: sum(self.sizes.get(b, 0) for b in self.writes[k]) for k in steps}
        largest = max(out.values(), default=0)
        seconds = [k for k in steps if necessary[k] + largest > floor]
        firsts = [k for k in steps if out[k] and out[k] + max(necessary[j] for j in steps) > floor]
        for a in firsts:
            related = self.ancestors[a] | self.descendants[a] | (1 << a)
            for b in seconds:
                if related >> b & 1 or necessary[b] + out[a] <= floor or necessary[a] + out[b] <= floor:
                    continue
                bound = min(necessary[b] + extra(a, b), necessary[a] + extra(b, a))
                if bound > floor:
                    floor = bound
        return floor


def _bits(mask):
    found = []
    while mask:
        low = mask & -mask
        found.append(low.bit_length() - 1)
        mask ^= low
    return found


def _steps_of(mask):
    steps, k = [], 0
    while mask:
        if mask & 1:
            steps.append(k)
        mask >>= 1
        k += 1
    return steps


@dataclass
class _Result:
    order: list  # global step indices
    peak: int
    bound: int
    finished: bool
    states: int


class _Segment:
    """One segment's problem on local step numbers 0..m-1 (bit k of a state: step k has run)."""

    def __init__(self, steps, mask, live, preds, spike, adds, frees, base, floor):
        self.steps, self.mask, self.live, self.floor = steps, mask, live, floor
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
                if not states & 1023 and time.perf_counter() > deadline:
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
