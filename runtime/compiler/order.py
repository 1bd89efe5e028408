"""Orders of steps: the file's made topological, a greedy memory-aware one, and an order's peak.

The greedy is list scheduling (shared/seeds: nntrainer #1126, the ResNet bottleneck where
running the downsample branch first lowers the peak from 300 to 225 units): at each point
the ready step whose outputs add the least memory net of the inputs it lets die. The
order PREPARE uses is order_search.best_order's, which starts from it.
"""

from ..errors import ModelError


def topological(nodes_inputs, nodes_outputs, available):
    """File order made topological (stable). `available`: names known before any step."""
    producer = {}
    for i, outs in enumerate(nodes_outputs):
        for name in outs:
            if name:
                producer[name] = i
    deps = [set() for _ in nodes_inputs]
    for i, ins in enumerate(nodes_inputs):
        for name in ins:
            if name and name not in available:
                if name not in producer:
                    raise ModelError(f"node {i}: input {name!r} is produced by no node and is not "
                                     f"a graph input or initializer")
                deps[i].add(producer[name])
    return _schedule(deps)


def _schedule(deps):
    import heapq

    n = len(deps)
    users = [[] for _ in range(n)]
    waiting = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != n:
        stuck = sorted(set(range(n)) - set(order))[:5]
        raise ModelError(f"the graph has a cycle through nodes {stuck}")
    return order


def peak_of(order, step_inputs, step_outputs, sizes, scratch=None, pinned=()):
    """The peak live bytes when steps run in `order` (buffers free after their last reader)."""
    last_use = {}
    for pos, i in enumerate(order):
        for b in step_inputs[i]:
            last_use[b] = pos
    written = set()
    live = peak = 0
    for pos, i in enumerate(order):
        live += sum(sizes.get(b, 0) for b in step_outputs[i])
        written.update(step_outputs[i])
        extra = scratch[i] if scratch else 0
        peak = max(peak, live + extra)
        for b in step_outputs[i]:
            if b not in last_use and b not in pinned:
                live -= sizes.get(b, 0)
        for b in set(step_inputs[i]):
            if last_use.get(b) == pos and b not in pinned and b in written:
                live -= sizes.get(b, 0)
    return peak


def greedy_order(deps, step_inputs, step_outputs, sizes, scratch=None, pinned=()):
    """A topological order of steps with a low peak of live arena bytes: at each point the ready
    step whose outputs add the least net of the inputs it lets die (ties: file order).

    deps[i]: the steps that must run before step i. step_inputs[i] / step_outputs[i]: the arena
    buffers step i reads / writes. The steps are in a valid topological order already. The
    starting point of the exact search (order_search.py), and its fallback.

    The ready steps wait in a heap by cost. A step's cost only falls while it waits (an input
    whose other readers have all run dies with it), and when it does the step is pushed again;
    an entry whose cost is no longer the step's is dropped when it comes up."""
    import heapq

    n = len(step_inputs)
    readers = {}
    for i, ins in enumerate(step_inputs):
        for b in set(ins):
            readers.setdefault(b, []).append(i)
    users = [[] for _ in range(n)]
    waiting = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    remaining = {b: len(r) for b, r in readers.items()}
    grow = [sum(sizes.get(b, 0) for b in outs) for outs in step_outputs]
    inputs = [set(ins) for ins in step_inputs]

    def cost(i):
        return grow[i] - sum(sizes.get(b, 0) for b in inputs[i] if remaining.get(b) == 1 and b not in pinned)

    ready = [(cost(i), i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    done = [False] * n
    order = []
    while ready:
        c, i = heapq.heappop(ready)
        if done[i]:
            continue
        now = cost(i)
        if now != c:
            heapq.heappush(ready, (now, i))
            continue
        done[i] = True
        order.append(i)
        for b in inputs[i]:
            remaining[b] -= 1
            if remaining[b] == 1 and b not in pinned and sizes.get(b, 0):
                last = next(r for r in readers[b] if not done[r])  # its cost falls: seen again
                if waiting[last] == 0:
                    heapq.heappush(ready, (cost(last), last))
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (cost(u), u))
    return order
