"""The session's one plan cache (runtime/plan_cache.py): the main graph's plans per signature and the
control-flow bodies' plans, made once each, bodies planned with the session's passes minus release."""

import threading

import numpy as np
from oracle import run_onnxruntime
from graphs import loop_model

import nnrun
from nnrun.compiler.build import CompileOptions
from nnrun.loader import load_model
from nnrun.plan_cache import PlanCache


def loop_graph():
    model = loop_model(100, body_stops=True)
    return model, load_model(model.SerializeToString())


FEEDS = {"x": ((2,), np.dtype(np.float32)), "acc0": ((2,), np.dtype(np.float32))}


def test_bodies_and_the_main_graph_share_one_cache():
    model, graph = loop_graph()
    cache = PlanCache()
    executor = cache.executor(graph, FEEDS)
    assert cache.executor(graph, FEEDS) is executor
    assert cache.get(graph, FEEDS) is executor
    body = graph.nodes[0].attrs["body"]
    assert len(cache.plans(graph)) == 1
    assert len(cache.plans(body)) >= 1  # planned at PREPARE, through the same cache
    feeds = {"x": np.array([1.0, 2.0], np.float32), "acc0": np.zeros(2, np.float32)}
    before = len(cache.plans(body))
    got = executor.run(feeds)
    assert len(cache.plans(body)) == before  # every iteration found its body plan
    for name, want in zip(("acc", "scans"), run_onnxruntime(model, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-6)


def test_a_body_is_planned_with_the_sessions_passes_but_never_releases():
    _, graph = loop_graph()
    cache = PlanCache(CompileOptions(fold_constants=False))
    assert cache.body_options.disabled_passes == {"fold_constants", "release_weights"}
    cache.executor(graph, FEEDS)
    body = graph.nodes[0].attrs["body"]
    (plan, *_) = cache.plans(body)
    assert "fold_constants" not in plan.stats["passes_ms"]
    assert "release_weights" not in plan.stats["passes_ms"]


def test_threads_asking_for_one_signature_get_one_plan():
    _, graph = loop_graph()
    cache = PlanCache()
    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.executor(graph, FEEDS))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in got}) == 1
    assert len(cache.plans(graph)) == 1


def test_a_session_counts_only_its_main_graph_plans():
    model, _ = loop_graph()
    sess = nnrun.InferenceSession(model.SerializeToString())
    sess.run(None, {"x": np.array([1.0, 2.0], np.float32), "acc0": np.zeros(2, np.float32)})
    assert sess.report()["plan"]["plans"] == 1
