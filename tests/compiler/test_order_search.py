"""The memory-optimal order (runtime/compiler/order_search.py) against oracles of this file's own:
brute force over every topological order of small random graphs, and a plain dynamic programme
over downsets of ONNX graphs of the families where order matters (random wiring, Inception
blocks, cells, U-Nets), computed from the ONNX file alone. Never the scheduler checking itself."""

import itertools
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

import nnrun
from nnrun.compiler.order_search import best_order


# --- small random problems, brute force ---------------------------------------------------------------

def random_problem(seed, n):
    """A random DAG of n steps: step i writes buffer "b{i}" and reads a few earlier ones."""
    r = random.Random(seed)
    deps, reads = [], []
    for i in range(n):
        inputs = sorted(r.sample(range(i), min(i, r.choice((1, 1, 2, 3))))) if i else []
        deps.append(set(inputs))
        reads.append([f"b{j}" for j in inputs])
    writes = [[f"b{i}"] for i in range(n)]
    sizes = {f"b{i}": r.choice((0, 16, 64, 100, 256, 1000)) for i in range(n)}
    scratch = [r.choice((0, 0, 0, 50, 300)) for _ in range(n)]
    pinned = {f"b{i}" for i in range(n) if r.random() < 0.15}
    return deps, reads, writes, sizes, scratch, pinned


def peak_by_hand(order, deps, reads, writes, sizes, scratch, pinned):
    """A buffer lives from its writer to its last reader (pinned: to the end); scratch while its step runs."""
    position = {step: k for k, step in enumerate(order)}
    assert all(position[d] < position[s] for s in order for d in deps[s]), "not a valid order"
    peak = 0
    for k, step in enumerate(order):
        live = scratch[step]
        for s in order[:k + 1]:
            for b in writes[s]:
                last = max([position[r] for r in range(len(order)) if b in reads[r]], default=position[s])
                if b in pinned or last >= k:
                    live += sizes[b]
        peak = max(peak, live)
    return peak


def least_peak_by_brute_force(deps, reads, writes, sizes, scratch, pinned):
    n = len(deps)
    best = None
    for order in itertools.permutations(range(n)):
        position = {step: k for k, step in enumerate(order)}
        if any(position[d] > position[s] for s in range(n) for d in deps[s]):
            continue
        peak = peak_by_hand(list(order), deps, reads, writes, sizes, scratch, pinned)
        best = peak if best is None else min(best, peak)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_order_is_optimal_against_brute_force(seed):
    problem = random_problem(seed, 7 + seed % 2)
    search = best_order(*problem)
    want = least_peak_by_brute_force(*problem)
    assert search.proven and search.peak_bytes == search.lower_bound_bytes == want
    assert peak_by_hand(list(search.order), *problem) == want
    assert sorted(search.order) == list(range(len(problem[0])))
    assert search.peak_bytes <= min(search.file_order_peak_bytes, search.greedy_peak_bytes)


def random_valid_order(deps, seed):
    """A seeded random topological order of steps whose predecessors are `deps`."""
    r = random.Random(seed)
    done, order = set(), []
    while len(order) < len(deps):
        i = r.choice([i for i in range(len(deps)) if i not in done and deps[i] <= done])
        done.add(i)
        order.append(i)
    return order


def relabelled(problem, seed):
    """The same graph with its steps in another valid order (what another file order gives)."""
    deps, reads, writes, sizes, scratch, pinned = problem
    order = random_valid_order(deps, seed)
    new = {old: k for k, old in enumerate(order)}
    return ([{new[d] for d in deps[old]} for old in order], [reads[old] for old in order],
            [writes[old] for old in order], sizes, [scratch[old] for old in order], pinned)


@pytest.mark.parametrize("seed", range(10))
def test_the_peak_does_not_depend_on_the_file_order(seed):
    problem = random_problem(100 + seed, 24)
    peaks = {best_order(*relabelled(problem, k)).peak_bytes for k in range(4)}
    assert len(peaks) == 1


def test_without_time_the_order_is_still_valid_and_no_worse_than_the_file_or_the_greedy():
    problem = random_problem(7, 8)
    search = best_order(*problem, seconds=0)
    want = least_peak_by_brute_force(*problem)
    assert search.lower_bound_bytes <= want <= search.peak_bytes
    assert search.peak_bytes <= min(search.file_order_peak_bytes, search.greedy_peak_bytes)
    assert peak_by_hand(list(search.order), *problem) == search.peak_bytes
    assert search.proven == (search.peak_bytes == search.lower_bound_bytes)


def test_off_keeps_the_file_order():
    problem = random_problem(3, 8)
    search = best_order(*problem, seconds=None)
    assert search.order == tuple(range(8)) and search.how == "file order" and not search.proven


# --- long and wide graphs: cut steps, and a segment too large to search -----------------------------------

def cut_steps_by_closure(deps):
    """The steps every other step runs before or after in every order: from the transitive closure."""
    n = len(deps)
    ancestors = [set() for _ in range(n)]
    for i in range(n):
        for j in deps[i]:
            ancestors[i] |= ancestors[j] | {j}
    descendants = [{j for j in range(n) if i in ancestors[j]} for i in range(n)]
    return [i for i in range(n) if len(ancestors[i]) + len(descendants[i]) == n - 1]


def segments_of(cuts, n):
    """Each cut alone and each run of steps between two cuts (cuts in index order are never apart)."""
    count, start = 0, 0
    for c in cuts:
        count += (c > start) + 1
        start = c + 1
    return count + (start < n)


@pytest.mark.parametrize("seed", range(60))
def test_segments_are_split_at_the_cut_steps(seed):
    problem = random_problem(500 + seed, 6 + seed % 25)
    search = best_order(*problem, seconds=0)
    assert search.segments == segments_of(cut_steps_by_closure(problem[0]), len(problem[0]))


def peak_by_sweep(order, deps, reads, writes, sizes, scratch, pinned):
    """peak_by_hand for long orders: each buffer live from its writer's position to its last reader's."""
    position = {step: k for k, step in enumerate(order)}
    assert len(position) == len(deps) and all(position[d] < position[s] for s in order for d in deps[s])
    last = {}
    for s in order:
        for b in reads[s]:
            last[b] = max(last.get(b, -1), position[s])
    delta = [0] * (len(order) + 1)
    for s in order:
        for b in writes[s]:
            end = len(order) - 1 if b in pinned else max(last.get(b, -1), position[s])
            delta[position[s]] += sizes[b]
            delta[end + 1] -= sizes[b]
    live = peak = 0
    for k, s in enumerate(order):
        live += delta[k]
        peak = max(peak, live + scratch[s])
    return peak


def test_a_chain_of_50000_steps_is_cut_at_every_step():
    n = 50_000
    deps = [{i - 1} if i else set() for i in range(n)]
    reads = [[f"b{i - 1}"] if i else [] for i in range(n)]
    writes = [[f"b{i}"] for i in range(n)]
    sizes = {f"b{i}": 64 * (1 + i % 7) for i in range(n)}
    problem = (deps, reads, writes, sizes, [0] * n, {f"b{n - 1}"})
    search = best_order(*problem)
    assert search.order == tuple(range(n)) and search.segments == n and search.proven
    assert search.peak_bytes == peak_by_sweep(list(search.order), *problem) == 64 * (7 + 6)


def test_a_segment_of_more_steps_than_are_searched_keeps_the_greedy_order():
    # A source, 3,000 branches of two steps, and a sink that reads every branch: one segment.
    width = 3000
    deps, reads, writes, sizes = [set()], [[]], [["src"]], {"src": 256}
    for k in range(width):
        first = len(deps)
        deps += [{0}, {first}]
        reads += [["src"], [f"a{k}"]]
        writes += [[f"a{k}"], [f"b{k}"]]
        sizes[f"a{k}"], sizes[f"b{k}"] = 64 * (1 + k % 5), 64
    deps.append(set(range(2, len(deps), 2)))
    reads.append([f"b{k}" for k in range(width)])
    writes.append(["out"])
    sizes["out"] = 64
    problem = (deps, reads, writes, sizes, [0] * len(deps), {"out"})
    search = best_order(*problem)
    assert search.how == "greedy" and search.largest_segment == 2 * width and not search.proven
    assert search.peak_bytes == peak_by_sweep(list(search.order), *problem)
    # Run branch by branch, each a dies at once and each b waits for the sink: the source, the other
    # branches' b and the largest a at most. The bound is what the sink holds in every order.
    assert search.peak_bytes <= 256 + 64 * (width - 1) + 64 * 5
    assert search.lower_bound_bytes == 64 * (width + 1) < search.peak_bytes <= search.file_order_peak_bytes


@pytest.mark.parametrize("seed", range(20))
def test_an_unsearched_segment_is_valid_and_its_bound_holds(seed, monkeypatch):
    from nnrun.compiler import order_search

    monkeypatch.setattr(order_search, "MAX_SEARCH_STEPS", 3)
    problem = random_problem(900 + seed, 8)
    search = best_order(*problem)
    want = least_peak_by_brute_force(*problem)
    assert peak_by_hand(list(search.order), *problem) == search.peak_bytes
    assert search.lower_bound_bytes <= want <= search.peak_bytes <= search.greedy_peak_bytes
    assert (search.how == "greedy") == (search.largest_segment > 3)


# --- ONNX graphs where the order decides the peak, against a downset DP of the file ----------------------

ROWS = 16


class Graph:
    """MatMuls on [1, ROWS, C] tensors merged by Concat or Add, as the memory-order families are."""

    def __init__(self, seed, width=32):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.width, self.k = [], [], {"x": width}, 0

    def name(self, prefix):
        self.k += 1
        return f"{prefix}{self.k}"

    def matmul(self, x, c):
        w, y = self.name("w"), self.name("t")
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal((self.width[x], c)) * 0.1).astype(np.float32), w))
        self.nodes.append(helper.make_node("MatMul", [x, w], [y], name=self.name("mm")))
        self.width[y] = c
        return y

    def merge(self, xs):
        if len(xs) == 1:
            return xs[0]
        y = self.name("t")
        if len({self.width[x] for x in xs}) == 1:
            self.nodes.append(helper.make_node("Sum", xs, [y], name=self.name("sum")))
            self.width[y] = self.width[xs[0]]
        else:
            self.nodes.append(helper.make_node("Concat", xs, [y], axis=2, name=self.name("cat")))
            self.width[y] = sum(self.width[x] for x in xs)
        return y

    def model(self, outputs):
        g = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, ROWS, self.width["x"]])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, ROWS, self.width[o]])
                               for o in outputs], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m


def random_wiring(seed, n=14):
    r = random.Random(seed)
    g = Graph(seed)
    out = {}
    for i in range(n):
        preds = sorted(r.sample(range(max(0, i - 5), i), min(i, r.choice((1, 2, 2, 3)))))
        out[i] = g.matmul(g.merge([out[j] for j in preds] or ["x"]), int(r.choice((8, 16, 32, 64, 128))))
    sinks = [out[i] for i in range(n) if not any(out[i] in node.input for node in g.nodes)]
    return g.model([g.merge(sinks)])


def inception(seed, blocks=3):
    g = Graph(seed)
    x = "x"
    for _ in range(blocks):
        w = [int(c) for c in g.rng.choice((16, 32, 64, 128), 6)]
        x = g.merge([g.matmul(x, w[0]), g.matmul(g.matmul(x, w[1]), w[2]),
                     g.matmul(g.matmul(g.matmul(x, w[3]), w[4]), w[5]), g.matmul(x, 8)])
    return g.model([g.matmul(x, 32)])


def cell(seed, cells=2):
    g = Graph(seed)
    prev, cur = "x", g.matmul("x", 32)
    for _ in range(cells):
        states = [prev, cur]
        for _ in range(4):
            i, j = g.rng.choice(len(states), 2)
            c = int(g.rng.choice((16, 32, 64)))
            states.append(g.merge([g.matmul(states[i], c), g.matmul(states[j], c)]))
        prev, cur = cur, g.matmul(g.merge(states[2:]), 32)
    return g.model([cur])


def unet(seed, depth=3):
    g = Graph(seed)
    x, skips, c = "x", [], 16
    for _ in range(depth):
        x = g.matmul(g.matmul(x, c), c)
        skips.append(x)
        c *= 2
    x = g.matmul(x, c)
    for s in reversed(skips):
        c //= 2
        x = g.matmul(g.merge([g.matmul(x, c), s]), c)
    return g.model([x])


def shuffled(model, seed):
    """The same graph, its nodes in another valid order."""
    nodes = list(model.graph.node)
    produced = {o: i for i, n in enumerate(nodes) for o in n.output}
    order = random_valid_order([{produced[x] for x in n.input if x in produced} for n in nodes], seed)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    del other.graph.node[:]
    other.graph.node.extend(nodes[i] for i in order)
    return other


def least_peak_of_file(model):
    """The least peak of live intermediate bytes over every order of the ONNX graph's nodes, by a plain
    DP over downsets. A tensor is live from its node to its last reader; graph inputs and outputs are
    not intermediates (an output is an array of its own)."""
    inferred = shape_inference.infer_shapes(model)
    size = {}
    for v in inferred.graph.value_info:
        size[v.name] = int(np.prod([d.dim_value for d in v.type.tensor_type.shape.dim])) * 4
    outputs = {o.name for o in model.graph.output}
    nodes = list(model.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    readers = {}
    for i, n in enumerate(nodes):
        for x in set(n.input):
            if x in producer:
                readers.setdefault(x, set()).add(i)
    preds = [sum(1 << producer[x] for x in set(n.input) if x in producer) for n in nodes]

    def bytes_of(t):
        return 0 if t in outputs else size[t]

    def live(done):
        return sum(bytes_of(t) for t, p in producer.items()
                   if done >> p & 1 and any(not done >> r & 1 for r in readers.get(t, ())))

    level = {0: 0}
    for _ in nodes:
        following = {}
        for done, peak in level.items():
            now = live(done)
            for i, n in enumerate(nodes):
                if not done >> i & 1 and not preds[i] & ~done:
                    cost = max(peak, now + sum(bytes_of(o) for o in n.output))
                    after = done | 1 << i
                    following[after] = min(cost, following.get(after, cost))
        level = following
    (peak,) = level.values()
    return peak


FAMILIES = [("random_wiring", random_wiring, s) for s in range(6)] + \
    [("inception", inception, 1), ("cell", cell, 2), ("cell", cell, 3), ("unet", unet, 1)]


def planned(model):
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    return nnrun.InferenceSession(model.SerializeToString(), sess_options=options)


@pytest.mark.parametrize("family,make,seed", FAMILIES, ids=[f"{f}{s}" for f, _, s in FAMILIES])
def test_the_plan_reaches_the_least_peak_in_any_file_order(family, make, seed):
    model = make(seed)
    want = least_peak_of_file(model)
    x = {"x": np.random.default_rng(seed).standard_normal((1, ROWS, 32)).astype(np.float32)}
    expected = None
    for k, variant in enumerate([model, shuffled(model, seed), shuffled(model, seed + 50)]):
        sess = planned(variant)
        plan = sess.report()["plan"]
        assert plan["lower_bound_bytes"] == want, f"file order {k}"
        assert plan["arena_bytes"] == want  # the placement reaches the order's bound
        assert plan["order_search"]["proven_optimal"] and plan["order_search"]["gap_bytes"] == 0
        assert plan["file_order_peak_bytes"] >= want
        y = sess.run(None, x)[0]
        if expected is None:
            import onnxruntime

            expected = onnxruntime.InferenceSession(model.SerializeToString(),
                                                    providers=["CPUExecutionProvider"]).run(None, x)[0]
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_the_report_says_how_the_order_was_found():
    sess = planned(cell(2))
    search = sess.report()["plan"]["order_search"]
    assert search["how"] in ("exact", "segmented") and search["segments"] >= 1
    assert search["largest_segment"] >= 1 and search["states"] >= 0 and search["ms"] >= 0
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    options.memory_aware_order = False
    off = nnrun.InferenceSession(cell(2).SerializeToString(), sess_options=options).report()["plan"]
    assert off["order_search"]["how"] == "file order"
    assert off["lower_bound_bytes"] == off["file_order_peak_bytes"] >= sess.report()["plan"]["lower_bound_bytes"]


def test_control_flow_bodies_are_ordered_by_the_same_search():
    body_model = cell(4)
    then = helper.make_graph(list(body_model.graph.node), "then", [], list(body_model.graph.output),
                             list(body_model.graph.initializer))
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y2"])], "else", [],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, ROWS, 32])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "top",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ROWS, 32])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = planned(model)
    x = np.random.default_rng(0).standard_normal((1, ROWS, 32)).astype(np.float32)
    got = sess.run(None, {"c": np.array(True), "x": x})[0]
    import onnxruntime

    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"c": np.array(True), "x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    searched = [e.plan.stats["order_search"] for e in sess._plans._executors.values() if e.plan is not sess.plan()]
    then_search = max(searched, key=lambda s: s["peak_bytes"])
    assert then_search["proven_optimal"] and then_search["peak_bytes"] == least_peak_of_file(body_model)
