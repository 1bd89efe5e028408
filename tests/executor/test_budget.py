"""Running within a memory budget (compiler/budget.py, executor/prefetch.py, memory_limit.py): outputs
equal to the unbudgeted run's (and onnxruntime's), streamed weights' pages handed back after the
run (checked with mincore, not with nnrun's accounting), a weight larger than the budget read in
blocks, a budget below the least the model needs refused at PREPARE, `auto` read from the memory
cgroup's files. Behaviour only: the harness (`nnrun-bench --memory-cap`) measures time and memory."""

import gc
import os

import numpy as np
import pytest
from onnx import helper
from oracle import assert_close, make_model, rng, run_onnxruntime

import nnrun
from nnrun.memory_limit import cgroup_memory, parse_size, resolve_budget
from nnrun.paging import PAGER, Region

MIB = 1 << 20


def mlp(trans_b=1, hidden=512, k=1024, seed=0):
    """Three Gemms over 2 MiB weights and a MatMul: x (4, k) -> (4, 10)."""
    r = rng(seed)

    def weight(n, m):
        w = (r.standard_normal((n, m)) / np.sqrt(m)).astype(np.float32)
        return w if trans_b else np.ascontiguousarray(w.T)

    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=trans_b, name="fc1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], transB=trans_b, name="fc2"),
             helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
             helper.make_node("Gemm", ["r2", "w3", "b3"], ["h3"], transB=trans_b, name="fc3"),
             helper.make_node("MatMul", ["h3", "w4"], ["y"], name="head")]
    inits = [("w1", weight(hidden, k)), ("b1", r.standard_normal(hidden).astype(np.float32)),
             ("w2", weight(hidden, hidden)), ("b2", r.standard_normal(hidden).astype(np.float32)),
             ("w3", weight(hidden, hidden)), ("b3", r.standard_normal(hidden).astype(np.float32)),
             ("w4", r.standard_normal((hidden, 10)).astype(np.float32))]
    return make_model(nodes, [("x", (np.float32, [4, k]))], [("y", None)], inits)


X = {"x": rng(7).standard_normal((4, 1024)).astype(np.float32)}


def saved(path, model):
    """The model written and synced: pages of a file being written cannot be handed back until the
    disk has them, and a model a runtime loads is not one being written."""
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def session(tmp_path, model, budget=None, name="m.onnx"):
    path = tmp_path / name
    if not path.exists():
        saved(path, model)
    options = nnrun.SessionOptions()
    options.weight_cache_dir = str(tmp_path / "cache")
    options.memory_budget = budget
    return nnrun.InferenceSession(str(path), sess_options=options)


@pytest.mark.parametrize("trans_b", [1, 0])
def test_outputs_under_a_budget_equal_the_unbudgeted_ones(tmp_path, trans_b):
    model = mlp(trans_b)
    free = session(tmp_path, model).run(None, X)[0]
    assert_close(free, run_onnxruntime(model, X)[0])
    for budget in ("3M", 2 * MIB + 300 * 1024):
        sess = session(tmp_path, model, budget)
        plan = sess.report()["plan"]
        assert plan["memory_budget_bytes"] == parse_size(budget) if isinstance(budget, str) else budget
        assert plan["streamed_weights_bytes"] > 0
        assert plan["predicted_peak_bytes"] <= plan["memory_budget_bytes"]
        blocked = any(b is not None for b in sess.plan().streaming.blocks)
        for _ in range(2):  # the second run reads again what the first dropped
            got = sess.run(None, X)[0]
            if blocked:  # BLAS on a block of columns, or partial products summed: rounding may differ
                np.testing.assert_allclose(got, free, rtol=1e-5, atol=1e-5 * float(np.abs(free).max()))
            else:  # the same kernels on the same bytes, only paged in and out
                np.testing.assert_array_equal(got, free)


def test_streamed_weights_leave_memory_after_the_run(tmp_path):
    sess = session(tmp_path, mlp(), "3M")
    sess.run(None, X)
    streaming = sess.plan().streaming
    dropped = [r for step in streaming.drop for r in step]
    assert dropped and all(PAGER.resident_bytes(r) == 0 for r in dropped)  # mincore: not in memory
    # Without a budget the same weights stay in memory after a run.
    free = session(tmp_path, mlp())
    free.run(None, X)
    assert sum(PAGER.resident_bytes(r) for r in dropped) > 0


def test_a_weight_larger_than_the_budget_is_read_in_blocks(tmp_path):
    model = mlp(hidden=2048, k=2048)  # w1 and w2 are 16 MiB
    x = {"x": rng(3).standard_normal((4, 2048)).astype(np.float32)}
    sess = session(tmp_path, model, "8M")
    plan = sess.plan()
    blocked = [b for b in plan.streaming.blocks if b is not None]
    assert blocked and len(blocked[0].rows) > 2
    assert sess.report()["plan"]["blocked_steps"] == len(blocked)
    assert_close(sess.run(None, x)[0], run_onnxruntime(model, x)[0])
    # Out of memory after the run, but for the page cache folios (up to 2 MiB) at a weight's two
    # edges, which it shares with the weights around it that stay resident.
    for b in blocked:
        edge = 2 * MIB
        inside = Region(b.whole.address + edge, b.whole.length - 2 * edge, b.whole.path, b.whole.file_offset + edge)
        assert PAGER.resident_bytes(inside) == 0


def test_a_budget_below_the_least_is_refused_naming_what_needs_it(tmp_path):
    model = mlp(trans_b=1)
    least = session(tmp_path, model, "64M").report()["plan"]["least_bytes"]
    with pytest.raises(nnrun.BudgetError, match=r"below the least this model can run in, .* MiB: the arena") as e:
        session(tmp_path, model, least - 4096)
    assert "reads" in str(e.value) and "PREPARE/plan_budget" in str(e.value)
    assert session(tmp_path, model, least).run(None, X)[0].shape == (4, 10)


def test_no_budget_changes_nothing_and_the_report_says_so(tmp_path):
    plan = session(tmp_path, mlp()).report()["plan"]
    assert plan["memory_budget_bytes"] is None and plan["streamed_weights_bytes"] == 0
    assert plan["predicted_peak_bytes"] == 0 and plan["spilled_activation_bytes"] == 0


def test_the_prefetcher_ends_with_the_session(tmp_path):
    sess = session(tmp_path, mlp(), "3M")
    sess.run(None, X)
    prefetcher = sess._plans.get(sess.graph, {"x": ((4, 1024), np.dtype(np.float32))}).prefetcher
    thread = prefetcher._thread
    assert thread.is_alive()
    del sess, prefetcher
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_the_cli_takes_a_budget_and_prints_it(tmp_path, capsys):
    from nnrun.cli import main

    path = tmp_path / "m.onnx"
    saved(path, mlp())
    assert main(["--model", str(path), "--memory-budget", "3M", "--weight-cache", str(tmp_path / "c")]) == 0
    assert "BUDGET" in capsys.readouterr().out
    assert main(["--model", str(path), "--memory-budget", "4K", "--weight-cache", str(tmp_path / "c")]) == 2
    assert "BudgetError" in capsys.readouterr().err


# --- the budget's value ------------------------------------------------------------------------------

def test_sizes_and_their_errors():
    assert parse_size("128M") == 128 * MIB and parse_size("96MiB") == 96 * MIB and parse_size("1.5G") == 3 << 29
    assert resolve_budget(None) is None and resolve_budget(4096) == 4096 and resolve_budget("2K") == 2048
    for bad in ("lots", "-5M", 0, -1, True):
        with pytest.raises(nnrun.InputError):
            resolve_budget(bad)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_auto_reads_the_tightest_cgroup_limit_v2(tmp_path):
    root = tmp_path / "sys"
    write(tmp_path / "cgroup", "0::/box/app\n")
    write(root / "box" / "app" / "memory.max", "max\n")
    write(root / "box" / "app" / "memory.current", f"{30 * MIB}\n")
    write(root / "box" / "memory.max", f"{256 * MIB}\n")
    write(root / "box" / "memory.current", f"{40 * MIB}\n")
    found = cgroup_memory(str(tmp_path / "cgroup"), str(root))
    assert found == (256 * MIB, 40 * MIB)
    budget = resolve_budget("auto", cgroup=lambda: found)
    assert budget == 256 * MIB - 40 * MIB - 16 * MIB  # a sixteenth of the limit kept aside


def test_auto_reads_cgroup_v1_and_no_limit_means_no_budget(tmp_path):
    root = tmp_path / "sys"
    write(tmp_path / "cgroup", "4:memory:/job\n3:cpu:/job\n")
    write(root / "memory" / "job" / "memory.limit_in_bytes", f"{96 * MIB}\n")
    write(root / "memory" / "job" / "memory.usage_in_bytes", f"{50 * MIB}\n")
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    write(root / "memory" / "memory.usage_in_bytes", f"{900 * MIB}\n")
    assert cgroup_memory(str(tmp_path / "cgroup"), str(root)) == (96 * MIB, 50 * MIB)
    write(root / "memory" / "job" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_memory(str(tmp_path / "cgroup"), str(root)) is None
    assert resolve_budget("auto", cgroup=lambda: None) is None
    with pytest.raises(nnrun.InputError, match="leaves nothing"):
        resolve_budget("auto", cgroup=lambda: (64 * MIB, 60 * MIB))


# --- activations spilled, and what a run reports -----------------------------------------------------

def long_skip():
    """x -> a (2 MiB), read again only by the last step; between, 4 MiB activations: the arena's
    peak holds `a` idle, which spilling can take out."""
    r = rng(5)

    def w(n, m):
        return (r.standard_normal((n, m)) / np.sqrt(n)).astype(np.float32)

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="skip"),
             helper.make_node("MatMul", ["a", "wa"], ["b"], name="narrow"),
             helper.make_node("MatMul", ["b", "wb"], ["c"], name="wide"),
             helper.make_node("Tanh", ["c"], ["d"], name="tanh"),
             helper.make_node("Sigmoid", ["d"], ["e"], name="sigmoid"),
             helper.make_node("MatMul", ["e", "wc"], ["f"], name="back"),
             helper.make_node("Add", ["f", "a"], ["y"], name="join")]
    inits = [("wa", w(256, 16)), ("wb", w(16, 512)), ("wc", w(512, 256))]
    return make_model(nodes, [("x", (np.float32, [2048, 256]))], [("y", None)], inits)


SKIP_X = {"x": rng(8).standard_normal((2048, 256)).astype(np.float32)}


def test_an_idle_activation_spills_when_the_arena_does_not_fit(tmp_path, monkeypatch):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    monkeypatch.setenv("NNRUN_SPILL_DIR", str(spill_dir))
    model = long_skip()
    free = session(tmp_path, model)
    expected = free.run(None, SKIP_X)[0]
    assert_close(expected, run_onnxruntime(model, SKIP_X)[0])
    whole = free.plan().arena_bytes
    sess = session(tmp_path, model, whole + MIB)  # the arena fits beside the weights: nothing spills
    assert sess.report()["plan"]["spilled_activation_bytes"] == 0
    sess = session(tmp_path, model, whole)  # beside the 0.5 MiB the weights need at least, it does not
    plan = sess.plan()
    spills = plan.streaming.spills
    assert [s.name for s in spills] == ["a"] and spills[0].nbytes == 2 * MIB
    assert plan.arena_bytes <= whole - 2 * MIB
    for _ in range(2):  # the same kernels on the same bytes, moved out and back
        np.testing.assert_array_equal(sess.run(None, SKIP_X)[0], expected)
    report = sess.report()
    assert report["plan"]["spilled_activation_bytes"] == 2 * MIB
    assert report["plan"]["predicted_peak_bytes"] <= report["plan"]["memory_budget_bytes"]
    execute = report["phases"]["EXECUTE"]
    assert execute["spill_written_bytes_per_run"] == execute["spill_read_bytes_per_run"] == 2 * MIB
    assert list(spill_dir.iterdir()) == []  # the spill file has no name: nothing is left behind
    # A spilled part lies at a page-aligned offset, whole pages long (direct I/O).
    assert all(s.offset % 4096 == 0 and s.file_offset % 4096 == 0 for s in spills)


def test_a_budget_below_the_arena_with_every_spill_is_refused(tmp_path):
    model = long_skip()
    with pytest.raises(nnrun.BudgetError, match=r"with every idle activation spilled: 8\.0 MiB"):
        session(tmp_path, model, 6 * MIB)


def test_resident_weight_bytes_never_exceed_the_prediction(tmp_path):
    """At every step, what is in memory of the streamed and resident weights (mincore), with the
    arena and the weights of the process's own, stays within the predicted peak."""
    model = mlp(hidden=1024, k=2048)
    x = {"x": rng(3).standard_normal((4, 2048)).astype(np.float32)}
    for budget in ("6M", "10M", "16M"):
        sess = session(tmp_path, model, budget)
        sess.run(None, x)
        plan = sess.plan()
        streaming = plan.streaming
        regions = set()
        for position, step in enumerate(plan.steps):
            regions.update(r for r in streaming.prefetch[position])
            if streaming.blocks[position] is not None:
                regions.update(streaming.blocks[position].regions)
        from nnrun.compiler.budget import step_weights
        from nnrun.paging import region_of
        regions.update(region_of(a) for step in plan.steps for _, a in step_weights(plan, step)
                       if region_of(a) is not None)
        seen = []

        class Options:
            @staticmethod
            def trace(step, outputs):
                seen.append(sum(PAGER.resident_bytes(r) for r in _disjoint(regions)))

        sess.run(None, x, Options)
        assert seen and streaming.fixed_bytes + max(seen) <= streaming.predicted_peak_bytes, (budget, max(seen))


def _disjoint(regions):
    """The regions, with any that lies inside another left out (a block inside its whole weight)."""
    ordered = sorted(regions, key=lambda r: (r.address, -r.length))
    out, end = [], -1
    for r in ordered:
        if r.address + r.length <= end:
            continue
        out.append(r)
        end = max(end, r.address + r.length)
    return out


def test_a_run_reports_what_it_read_and_waited_for(tmp_path):
    from nnrun.executor.spill import MEMORY_FILESYSTEMS, filesystem_of

    sess = session(tmp_path, mlp(), "3M")
    for _ in range(3):
        sess.run(None, X)
    execute = sess.report()["phases"]["EXECUTE"]
    assert execute["stalled_ms_per_run"] >= 0 and execute["spill_written_bytes_per_run"] == 0
    streamed = sess.report()["plan"]["streamed_weights_bytes"]
    if filesystem_of(str(tmp_path)) not in MEMORY_FILESYSTEMS:
        # Dropped after each run, the streamed weights come from the disk again in the next.
        assert execute["read_bytes_per_run"] >= streamed // 2
    from nnrun.report import format_table
    assert "PER RUN" in format_table(sess.report())


@pytest.mark.parametrize("a_shape", [(4, 2048), (2, 3, 2048)])
def test_a_matmul_weight_larger_than_the_budget_is_read_in_blocks(tmp_path, a_shape):
    r = rng(11)
    w = (r.standard_normal((2048, 1024)) / 45).astype(np.float32)  # 8 MiB
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["h"], name="project"),
                        helper.make_node("Relu", ["h"], ["y"], name="relu")],
                       [("a", (np.float32, list(a_shape)))], [("y", None)], [("w", w)])
    feeds = {"a": r.standard_normal(a_shape).astype(np.float32)}
    sess = session(tmp_path, model, "5M", name=f"matmul{len(a_shape)}.onnx")
    blocked = [b for b in sess.plan().streaming.blocks if b is not None]
    assert len(blocked) == 1 and len(blocked[0].rows) > 2
    for _ in range(2):
        assert_close(sess.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])
    assert all(PAGER.resident_bytes(region) == 0 for region in blocked[0].regions)


@pytest.mark.parametrize("kernel,strides,batch", [(3, 1, 1), (3, 2, 2), (1, 1, 2)])
def test_a_convolution_weight_larger_than_the_budget_is_read_in_blocks_of_output_channels(
        tmp_path, kernel, strides, batch):
    """3x3 stride 1 builds its columns as flat rows, stride 2 per tap, 1x1 is one product: each
    reads its 4+ MiB weight in blocks of output channels, with bias and a fused Relu."""
    r = rng(13)
    c_in = 256 if kernel == 3 else 2048
    w = (r.standard_normal((512, c_in, kernel, kernel)) / np.sqrt(c_in * kernel * kernel)).astype(np.float32)
    pad = kernel // 2
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["h"], pads=[pad] * 4, strides=[strides] * 2,
                                         name="conv"),
                        helper.make_node("Relu", ["h"], ["y"], name="relu")],
                       [("x", (np.float32, [batch, c_in, 14, 14]))], [("y", None)],
                       [("w", w), ("b", r.standard_normal(512).astype(np.float32))])
    feeds = {"x": r.standard_normal((batch, c_in, 14, 14)).astype(np.float32)}
    expected = run_onnxruntime(model, feeds)[0]
    free = session(tmp_path, model).run(None, feeds)[0]
    sess = session(tmp_path, model, "5M")
    blocked = [b for b in sess.plan().streaming.blocks if b is not None]
    assert len(blocked) == 1 and len(blocked[0].rows) > 2 and blocked[0].row_shape == w.shape[1:]
    for _ in range(2):
        got = sess.run(None, feeds)[0]
        assert_close(got, expected)
        np.testing.assert_allclose(got, free, rtol=1e-5, atol=1e-5 * float(np.abs(free).max()))
    assert all(PAGER.resident_bytes(region) == 0 for region in blocked[0].regions)


def test_a_convolution_with_a_fused_residual_reads_its_weight_in_blocks(tmp_path):
    """Conv, Add of the block's input, Relu (fuse_residual: one step): the 4.5 MiB weight in blocks,
    the residual added in the pass after the last block."""
    r = rng(15)
    w = (r.standard_normal((512, 256, 3, 3)) / 48).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["h"], pads=[1] * 4, name="conv"),
                        helper.make_node("Add", ["h", "s"], ["sum"], name="add"),
                        helper.make_node("Relu", ["sum"], ["y"], name="relu")],
                       [("x", (np.float32, [1, 256, 14, 14])), ("s", (np.float32, [1, 512, 14, 14]))], [("y", None)],
                       [("w", w), ("b", r.standard_normal(512).astype(np.float32))])
    feeds = {"x": r.standard_normal((1, 256, 14, 14)).astype(np.float32),
             "s": r.standard_normal((1, 512, 14, 14)).astype(np.float32)}
    sess = session(tmp_path, model, "5M")
    assert [s.op_type for s in sess.plan().steps] == ["Conv"]
    assert len([b for b in sess.plan().streaming.blocks if b is not None]) == 1
    assert_close(sess.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])


def test_a_tflite_filter_larger_than_the_budget_is_read_in_blocks(tmp_path):
    """CONV_2D's filter (O, H, W, I) in blocks of output channels, against LiteRT."""
    pytest.importorskip("ai_edge_litert.interpreter")
    from tflite_model import build_tflite, run_litert

    r = rng(14)
    x = r.standard_normal((1, 14, 14, 256)).astype(np.float32)
    w = (r.standard_normal((512, 3, 3, 256)) / 48).astype(np.float32)
    bias = r.standard_normal(512).astype(np.float32)
    model = build_tflite("CONV_2D", [("x", x, False), ("w", w, True), ("b", bias, True)], 1,
                         {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    path = tmp_path / "conv.tflite"
    with open(path, "wb") as f:
        f.write(model)
        f.flush()
        os.fsync(f.fileno())
    options = nnrun.SessionOptions()
    options.memory_budget = "5M"
    sess = nnrun.InferenceSession(str(path), sess_options=options)
    blocked = [b for b in sess.plan().streaming.blocks if b is not None]
    assert len(blocked) == 1 and len(blocked[0].rows) > 2
    got = sess.run(None, {"x": x})[0]
    assert_close(got, run_litert(model, [x])[0])


def test_a_budget_bounds_convolution_scratch(tmp_path):
    r = rng(12)
    w = (r.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")],
                       [("x", (np.float32, [1, 32, 96, 96]))], [("y", None)], [("w", w)])
    feeds = {"x": r.standard_normal((1, 32, 96, 96)).astype(np.float32)}
    free = session(tmp_path, model)
    assert free.plan().steps[0].scratch_bytes > MIB  # im2col of the whole image: 10 MiB, in 4 MiB tiles
    sess = session(tmp_path, model, 8 * MIB)
    assert 0 < sess.plan().steps[0].scratch_bytes <= 8 * MIB // 16
    assert_close(sess.run(None, feeds)[0], run_onnxruntime(model, feeds)[0])


def test_without_direct_io_blocks_and_spills_go_through_the_page_cache(tmp_path, monkeypatch):
    """A filesystem that refuses O_DIRECT: blocks are read with pread and dropped from the page
    cache, spills written through it and synced; the outputs are the same."""
    from nnrun.paging import Pager

    monkeypatch.setattr(Pager, "direct_fd", lambda self, path: None)
    monkeypatch.delattr(os, "O_DIRECT")
    monkeypatch.setenv("NNRUN_SPILL_DIR", str(tmp_path))
    model = mlp(hidden=2048, k=2048)
    x = {"x": rng(3).standard_normal((4, 2048)).astype(np.float32)}
    sess = session(tmp_path, model, "8M")
    blocked = [b for b in sess.plan().streaming.blocks if b is not None]
    assert blocked
    assert_close(sess.run(None, x)[0], run_onnxruntime(model, x)[0])
    for b in blocked:
        edge = 2 * MIB
        inside = Region(b.whole.address + edge, b.whole.length - 2 * edge, b.whole.path, b.whole.file_offset + edge)
        assert PAGER.resident_bytes(inside) == 0

    skip = long_skip()
    expected = session(tmp_path, skip, name="skip.onnx").run(None, SKIP_X)[0]
    spilling = session(tmp_path, skip, 10 * MIB, name="skip.onnx")
    assert spilling.plan().streaming.spills
    np.testing.assert_array_equal(spilling.run(None, SKIP_X)[0], expected)
    executor = spilling._plans.get(spilling.graph, {"x": ((2048, 256), np.dtype(np.float32))})
    assert executor._free and not executor._free[0].spill_file.direct


def test_the_memory_timeline_follows_the_budget_plan(tmp_path, monkeypatch):
    """Rows: the weights kept plus those streamed in memory at each step, as the predicted peak
    counts them; streamed weights leave again; spilled activations are out of the arena."""
    from nnrun.timeline import draw, memory_timeline

    sess = session(tmp_path, mlp(hidden=1024, k=2048), "6M")
    plan = sess.plan()
    rows = memory_timeline(plan)
    streamed = [r["streamed_weights_bytes"] for r in rows]
    assert len(rows) == len(plan.steps) and max(streamed) > 0
    assert any(b < a for a, b in zip(streamed, streamed[1:]))  # dropped after their last reader
    streaming = plan.streaming
    assert max(r["weights_resident_bytes"] for r in rows) + plan.arena_bytes == streaming.predicted_peak_bytes
    assert all(r["weights_resident_bytes"] + r["arena_live_bytes"] <= streaming.budget_bytes for r in rows)

    monkeypatch.setenv("NNRUN_SPILL_DIR", str(tmp_path))
    model = long_skip()
    whole = session(tmp_path, model, name="skip.onnx").plan().arena_bytes
    spilling = session(tmp_path, model, whole, name="skip.onnx").plan()
    spilled = [r["spilled_bytes"] for r in memory_timeline(spilling)]
    assert max(spilled) == 2 * MIB and spilled[0] == spilled[-1] == 0
    pytest.importorskip("matplotlib", reason="the plot extra is part of the test extra")
    assert draw(spilling, tmp_path / "t.png").stat().st_size > 0


def windows(batch=2):
    """Every kernel that runs in bands, batch 2: a padded dilated Conv, a stride-2 Conv, an
    AveragePool counting its padding, a MaxPool, a ConvTranspose 2x2 stride 2, a Concat of channels,
    a Mul by a per-channel constant, a Sigmoid, a residual Add and its Relu."""
    r = rng(15)

    def w(*shape):
        return (r.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[2, 2, 2, 2], dilations=[2, 2], name="c1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("AveragePool", ["r1"], ["a1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              count_include_pad=1, name="avg"),
             helper.make_node("Conv", ["a1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="down"),
             helper.make_node("MaxPool", ["c2"], ["m2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="max"),
             helper.make_node("ConvTranspose", ["m2", "w3", "b3"], ["u3"], kernel_shape=[2, 2], strides=[2, 2],
                              name="up"),
             helper.make_node("Concat", ["u3", "a1"], ["cat"], axis=1, name="cat"),
             helper.make_node("Conv", ["cat", "w4"], ["c4"], pads=[1, 1, 1, 1], name="c4"),
             helper.make_node("Mul", ["c4", "scale"], ["s4"], name="scale"),
             helper.make_node("Sigmoid", ["s4"], ["g4"], name="gate"),
             helper.make_node("Add", ["g4", "c4"], ["a4"], name="residual"),
             helper.make_node("Relu", ["a4"], ["r4"], name="relu4"),
             helper.make_node("Conv", ["r4", "w5"], ["y"], name="head")]
    inits = [("w1", w(8, 3, 3, 3)), ("b1", r.standard_normal(8).astype(np.float32)), ("w2", w(8, 8, 3, 3)),
             ("w3", w(8, 8, 2, 2)), ("b3", r.standard_normal(8).astype(np.float32)), ("w4", w(8, 16, 3, 3)),
             ("w5", w(2, 8, 1, 1)), ("scale", r.standard_normal((1, 8, 1, 1)).astype(np.float32))]
    return make_model(nodes, [("x", (np.float32, [batch, 3, 96, 96]))], [("y", None)], inits)


@pytest.mark.parametrize("name", ["unet", "windows", "windows shifted"])
def test_activations_larger_than_the_budget_live_in_the_file_and_their_steps_run_in_bands(
        tmp_path, monkeypatch, name):
    """A third and a sixth of the unbudgeted arena: the largest activations live in the spill file
    and the steps around them run in bands of rows; outputs as onnxruntime's and the unbudgeted run's.
    U-Net's larger convolutions and the windows' c4 run as shifted GEMMs, each band too; "windows
    shifted": c1 as well, though it has 3 input channels."""
    from nnrun_tools.build_models import make
    from nnrun.ops import conv_core, jit

    if name == "windows shifted":
        for limit in ("SHIFTED_MIN_PIXELS", "SHIFTED_MIN_CHANNELS", "SHIFTED_MIN_OUT_CHANNELS"):
            monkeypatch.setattr(conv_core, limit, 0)

    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    monkeypatch.setenv("NNRUN_SPILL_DIR", str(spill_dir))
    if name == "unet":
        model, shape = make("unet", base=8, depth=2, size=128), (1, 3, 128, 128)
        feed_name = "input"
    else:
        model, shape, feed_name = windows(), (2, 3, 96, 96), "x"
    feeds = {feed_name: rng(16).standard_normal(shape).astype(np.float32)}
    free_session = session(tmp_path, model, name=f"{name}.onnx")
    free = free_session.run(None, feeds)[0]
    assert_close(free, run_onnxruntime(model, feeds)[0])
    shifted = {s.kernel.node.name for s in free_session.plan().steps
               if getattr(getattr(s.kernel, "plan", None), "method", None) == "gemm-shifted"}
    by_product = {s.kernel.node.name for s in free_session.plan().steps
                  if getattr(getattr(getattr(s.kernel, "plan", None), "tiles", None), "tiled", None) is not None}
    if name != "unet" and jit.wanted():
        # c1, of 3 channels, takes the compiled product (STEMS_BY_PRODUCT, on one thread or numba's
        # team), else the compiled kernel of few channels; in bands too
        assert shifted - {"c1"} == {"c4"} and ("c1" not in shifted or "c1" in by_product)
    else:
        assert shifted == {"windows": {"c4"}, "windows shifted": {"c1", "c4"}}.get(name, shifted) and shifted
    arena = free_session.plan().arena_bytes
    for budget in (arena // 3, arena // 6):
        sess = session(tmp_path, model, budget, name=f"{name}.onnx")
        streaming = sess.plan().streaming
        assert streaming.on_disk and sum(b is not None for b in streaming.banded) >= 2
        assert streaming.predicted_peak_bytes <= budget
        assert sess.plan().arena_bytes + streaming.band_area_bytes <= budget
        for _ in range(2):
            got = sess.run(None, feeds)[0]
            np.testing.assert_allclose(got, free, rtol=1e-5, atol=1e-5 * float(np.abs(free).max()))
        report = sess.report()
        in_file = sum(d.nbytes for d in streaming.on_disk)
        assert report["plan"]["spilled_activation_bytes"] == in_file and report["plan"]["banded_steps"] >= 2
        execute = report["phases"]["EXECUTE"]
        assert execute["spill_written_bytes_per_run"] == in_file  # each written once, band by band
        assert execute["spill_read_bytes_per_run"] >= in_file  # and read at least once (halos twice)
    assert list(spill_dir.iterdir()) == []


def test_auto_is_settled_once_the_model_is_compiled(tmp_path, monkeypatch):
    """'auto' loses what the process's anonymous memory grew by while the model was compiled (it
    is baseline too), and two sets of graph outputs (the caller's last ones and the run's)."""
    import nnrun.compiler.build as build
    import nnrun.session

    path = tmp_path / "m.onnx"
    saved(path, mlp())
    monkeypatch.setattr(nnrun.session, "resolve_budget", lambda value: 64 * MIB)
    monkeypatch.setattr(nnrun.session, "anonymous_bytes", lambda: 100 * MIB)
    monkeypatch.setattr(build, "anonymous_bytes", lambda: 103 * MIB)  # compiling took 3 MiB
    options = nnrun.SessionOptions()
    options.weight_cache_dir = str(tmp_path / "cache")
    options.memory_budget = "auto"
    sess = nnrun.InferenceSession(str(path), sess_options=options)
    outputs = 4 * 10 * 4  # y: (4, 10) float32
    assert sess.report()["plan"]["memory_budget_bytes"] == 61 * MIB - 2 * outputs
    options.memory_budget = 64 * MIB  # a number is taken as it is
    assert nnrun.InferenceSession(str(path), sess_options=options).report()["plan"]["memory_budget_bytes"] == 64 * MIB
