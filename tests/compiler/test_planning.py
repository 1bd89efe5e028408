"""The planning functions on their own: lifetimes, lower bound, offsets, order."""

import itertools
import random

from nnrun.compiler.arena import ALIGNMENT, assign_offsets
from nnrun.compiler.lifetimes import lifetimes, lower_bound
from nnrun.compiler.order import peak_of, topological
from nnrun.compiler.order_search import best_order


def test_lifetimes_span_producer_to_last_reader():
    spans = lifetimes({"a": 0, "b": 1, "c": 2}, {"a": [1, 3], "b": [2]}, keep_to_end={"c"}, n_steps=4)
    assert spans == {"a": (0, 3), "b": (1, 2), "c": (2, 4)}


def test_lower_bound_is_the_largest_live_sum():
    spans = {"a": (0, 1), "b": (1, 2), "c": (2, 3)}
    sizes = {"a": 10, "b": 20, "c": 5}
    assert lower_bound(spans, sizes) == 30


def _check_no_overlap(spans, sizes, offsets):
    for x, y in itertools.combinations(spans, 2):
        (f1, l1), (f2, l2) = spans[x], spans[y]
        if f1 <= l2 and f2 <= l1:
            a, b = offsets[x], offsets[y]
            assert a + sizes[x] <= b or b + sizes[y] <= a, (x, y)


def test_offsets_never_overlap_in_time_and_space():
    rnd = random.Random(7)
    for _ in range(50):
        spans, sizes = {}, {}
        for k in range(rnd.randint(1, 40)):
            first = rnd.randint(0, 30)
            spans[k] = (first, first + rnd.randint(0, 6))
            sizes[k] = rnd.randint(1, 5000)
        offsets, top = assign_offsets(spans, sizes)
        _check_no_overlap(spans, sizes, offsets)
        assert all(o % ALIGNMENT == 0 for o in offsets.values())
        assert top >= lower_bound(spans, sizes)
        assert top >= max(o + sizes[k] for k, o in offsets.items())


def test_chain_reuses_memory():
    # a -> b -> c -> d, each read once by the next: two buffers at a time.
    spans = {k: (i, i + 1) for i, k in enumerate("abcd")}
    sizes = {k: 1024 for k in "abcd"}
    offsets, top = assign_offsets(spans, sizes)
    assert top == 2048 == lower_bound(spans, sizes)


def test_memory_aware_order_finds_the_bottleneck_order():
    # nntrainer #1126: T1 feeds L (main path) and P (downsample); N consumes M's output.
    # Steps: 0 S: ->T1, 1 L: T1->T2, 2 M: T2->T3, 3 N: T3->T4, 4 P: T1->T5, 5 Add: T4,T5->T6
    reads = [[], ["T1"], ["T2"], ["T3"], ["T1"], ["T4", "T5"]]
    writes = [["T1"], ["T2"], ["T3"], ["T4"], ["T5"], ["T6"]]
    sizes = {"T1": 100, "T2": 100, "T3": 25, "T4": 100, "T5": 100, "T6": 0}
    deps = [set(), {0}, {1}, {2}, {0}, {3, 4}]
    file_peak = peak_of(list(range(6)), reads, writes, sizes)
    search = best_order(deps, reads, writes, sizes)
    order = search.order
    assert file_peak == 300 == search.file_order_peak_bytes
    assert search.proven and search.peak_bytes == search.lower_bound_bytes == 225
    assert peak_of(order, reads, writes, sizes) == 225
    position = {s: i for i, s in enumerate(order)}
    assert all(position[d] < position[s] for s, ds in enumerate(deps) for d in ds)


def test_topological_is_stable_and_detects_cycles():
    import pytest

    from nnrun import ModelError

    order = topological([["b"], ["x"]], [["c"], ["b"]], available={"x"})
    assert order == [1, 0]
    with pytest.raises(ModelError, match="cycle"):
        topological([["b"], ["a"]], [["a"], ["b"]], available=set())
