"""Runs of one session from many threads share no mutable state: a prepared kernel is frozen,
and 4 threads x 500 runs give, bit for bit, what one thread gives (whose outputs are checked
against onnxruntime first). The recurrent models are where per-run state used to live on the
kernel: silero's LSTM and If, and a GRU fed its bias at run time."""

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from oracle import WHOLE_MODEL_RTOL, assert_close, helper, make_model, run_onnxruntime

import nnrun
from nnrun_tools.fetch_models import MODELS, require_real_model

THREADS, RUNS = 4, 500


def hammer(sess, feeds_list):
    """Each feed run once alone, then THREADS x RUNS times across threads: every result identical."""
    alone = [sess.run(None, feeds) for feeds in feeds_list]
    jobs = [i % len(feeds_list) for i in range(THREADS * RUNS)]
    # Threads switch every few microseconds instead of every 5 ms, so runs interleave
    # step by step: a small model's run would otherwise fit in one time slice.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(lambda i: (i, sess.run(None, feeds_list[i])), jobs))
    finally:
        sys.setswitchinterval(interval)
    for i, outputs in results:
        for got, want in zip(outputs, alone[i]):
            np.testing.assert_array_equal(got, want, strict=True)
    return alone


def gru_model(hidden=8, size=5, seq=4):
    node = helper.make_node("GRU", ["x", "w", "r", "b"], ["y", "h"], hidden_size=hidden, linear_before_reset=1)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 3 * hidden, size)).astype(np.float32) * 0.3
    r = rng.standard_normal((1, 3 * hidden, hidden)).astype(np.float32) * 0.3
    return make_model([node], [("x", np.zeros((seq, 2, size), np.float32)),
                               ("b", np.zeros((1, 6 * hidden), np.float32))],
                      [("y", None), ("h", None)], [("w", w), ("r", r)], opset=14)


def test_a_gru_fed_its_bias_per_run_gives_each_thread_its_own_answer():
    model = gru_model()
    rng = np.random.default_rng(1)
    feeds_list = [{"x": rng.standard_normal((4, 2, 5)).astype(np.float32),
                   "b": rng.standard_normal((1, 48)).astype(np.float32)} for _ in range(8)]
    sess = nnrun.InferenceSession(model.SerializeToString())
    alone = hammer(sess, feeds_list)
    for feeds, outputs in zip(feeds_list, alone):
        for got, want in zip(outputs, run_onnxruntime(model, feeds)):
            assert_close(got, want)


@pytest.mark.parametrize("name", ["silero_vad", "silero_vad_16k_op15"])
def test_silero_from_four_threads_is_bit_identical_to_one(name):
    from test_real_models import feeds_for
    from oracle import run_onnxruntime_path

    path = require_real_model(*MODELS[name])
    sess = nnrun.InferenceSession(str(path))
    feeds_list = [feeds_for(name, path, seed=s) for s in range(6)]
    alone = hammer(sess, feeds_list)
    for outputs, want in zip(alone[:1], [run_onnxruntime_path(path, feeds_list[0])]):
        for got, expected in zip(outputs, want):
            assert_close(got, expected, rtol=WHOLE_MODEL_RTOL)


def test_a_prepared_kernel_refuses_changes():
    sess = nnrun.InferenceSession(gru_model().SerializeToString())
    (step,) = sess.plan().steps
    with pytest.raises(AttributeError, match="a run may not set 'run_bias'"):
        step.kernel.run_bias = None


def test_each_arena_hands_its_steps_its_own_views():
    """A step whose outputs and scratch are arena views gets them as tuples made once per arena
    (Executor._fixed_arrays): runs on different arenas at once each write their own, and every
    result is onnxruntime's."""
    rng = np.random.default_rng(2)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"]),
             helper.make_node("Add", ["c2", "r"], ["y"])]
    model = make_model(nodes, [("x", np.zeros((1, 3, 12, 10), np.float32))], [("y", None)],
                       [("w1", w1), ("w2", w2)])
    sess = nnrun.InferenceSession(model.SerializeToString())
    feeds_list = [{"x": rng.standard_normal((1, 3, 12, 10)).astype(np.float32)} for _ in range(6)]
    alone = hammer(sess, feeds_list)
    for feeds, outputs in zip(feeds_list, alone):
        assert_close(outputs[0], run_onnxruntime(model, feeds)[0])
    (executor,) = sess._by_signature.values()
    states = list(executor._free)
    assert len(states) > 1 and any(executor._fixed)  # runs took arenas of their own, concurrently
    for state in states:
        for fixed in state.fixed_arrays:
            for array in (fixed[0] + fixed[1]) if fixed is not None else ():
                if array is not None:
                    assert [np.shares_memory(array, other.arena) for other in states] == \
                        [other is state for other in states]
