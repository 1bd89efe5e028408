"""The fuzzer (nnrun_tools.fuzz): a short deterministic batch of mutants of both formats must end
in no bug outcome (foreign exception, MemoryError, crash, hang, slow typed error), and the harness
itself is checked on a target that does each of those on purpose, so the batch cannot pass because
the harness saw nothing.
"""

import os
import signal
import time

import numpy as np
import onnx
import pytest
from ai_edge_litert import interpreter as litert

from nnrun import ExecutionError, ModelError
from nnrun.errors import located, node_label
from nnrun_tools import fuzz
from nnrun_tools.fuzz_mutators import MUTATORS, Mutant
from nnrun_tools.fuzz_seeds import Seed, all_seeds

BATCH = 200  # about 10 s on a 2-core machine: most mutants are refused at load


def test_batch_has_no_bug_outcomes(tmp_path):
    seeds = all_seeds()
    # A long timeout: a busy CI machine must not turn a slow case into a hang.
    results = fuzz.fuzz(BATCH, seeds, list(MUTATORS.values()), fuzz.Settings(timeout=30), base=0,
                        out=str(tmp_path), progress_every=0)
    print(results.summary(results.elapsed))
    assert sum(results.counts.values()) == BATCH
    assert set(results.by_format) == {"onnx", "tflite"}
    assert results.counts["ok"] and results.counts["rejected"]
    assert not results.bug_count, results.summary()


# -- the harness, on a target that misbehaves on purpose ---------------------------------------------

def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _misbehaving(case, progress):
    what = case.mutant.what
    if what == "foreign inside nnrun":
        node_label(object())  # an AttributeError raised in runtime/errors.py
    elif what == "hang":
        while True:
            time.sleep(0.1)
    elif what == "allocate":
        np.ones(1 << 30, np.uint8)  # beyond the 256 MiB margin below; within reach without a limit
    elif what == "wrapped allocation":
        try:
            np.ones(1 << 30, np.uint8)
        except MemoryError as e:
            raise ModelError("could not allocate") from e
    elif what == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif what == "slow refusal":
        _burn(0.5)
        raise ModelError("refused, slowly")
    elif what == "refusal":
        raise ModelError("refused")
    elif what == "run error":
        progress.phase = "run"
        raise ExecutionError("failed while running")


EXPECTED = {"foreign inside nnrun": "foreign", "hang": "hang", "allocate": "memory", "wrapped allocation": "memory",
            "crash": "signal", "slow refusal": "slow-error", "refusal": "rejected", "run error": "run-error",
            "fine": "ok"}


def _cases(names):
    seed = Seed("fake", "onnx", b"")
    return [fuzz.Case(k, 0, seed, "fake", Mutant(b"", name), False) for k, name in enumerate(names)]


def test_the_harness_classifies_each_kind_of_failure(tmp_path):
    settings = fuzz.Settings(timeout=3, slow=0.2, memory_margin=256 << 20)
    started = time.monotonic()
    records = {case.mutant.what: record for case, record in
               fuzz.run_cases(_cases(EXPECTED), target=_misbehaving, settings=settings, jobs=len(EXPECTED))}
    assert time.monotonic() - started < 3 + 6  # the hang was ended by its timeout
    assert {what: r["outcome"] for what, r in records.items()} == EXPECTED
    foreign = records["foreign inside nnrun"]
    assert foreign["error"] == "AttributeError" and "errors.py" in foreign["frame"] and "node_label" in foreign["frame"]
    assert records["allocate"]["error"] == "MemoryError"  # from the address-space limit, not the RSS check
    assert records["wrapped allocation"]["error"] == "ModelError<-MemoryError"
    assert records["crash"]["error"] == "SIGSEGV"
    assert records["hang"]["error"] == "timeout" and "_misbehaving" in records["hang"]["traceback"]
    assert records["refusal"]["error"] == "ModelError"


def test_bug_cases_are_saved_and_deduplicated(tmp_path):
    results = fuzz.Results(str(tmp_path))
    cases = _cases(["foreign inside nnrun", "foreign inside nnrun", "refusal"])
    for case, record in fuzz.run_cases(cases, target=_misbehaving, settings=fuzz.Settings(timeout=5), jobs=3):
        results.add(case, record)
    assert results.counts == {"foreign": 2, "rejected": 1}
    assert len(results.bugs) == 1
    (bug,) = results.bugs.values()
    assert bug["count"] == 2 and os.path.exists(bug["path"])
    report = open(os.path.splitext(bug["path"])[0] + ".txt").read()
    assert "AttributeError" in report and "mutator     fake" in report
    assert sorted(os.listdir(tmp_path / "foreign")) == sorted(
        [f"00000{k}-fake-fake{suffix}" for k in (0, 1) for suffix in (".onnx", ".txt")])


def _located_twice(case, progress):
    """A kernel's foreign error located at PREPARE, then by the pass runner again: as the compiler
    does, the second `raise located(e) from e` makes the error its own cause."""
    try:
        try:
            node_label(object())
        except AttributeError as e:
            raise located(e, "PREPARE", "infer_shapes") from e
    except ModelError as e:
        raise located(e, "PREPARE", "infer_shapes") from e


def test_a_typed_error_is_signed_by_its_first_cause():
    record = fuzz.classify(_located_twice, _cases(["twice"])[0], fuzz.Settings())
    assert (record["outcome"], record["error"], record["cause"]) == ("rejected", "ModelError", "AttributeError")
    assert "node_label" in record["frame"] and "node_label" in record["cause_frame"]


# -- cases and seeds ---------------------------------------------------------------------------------

def test_a_case_is_determined_by_its_numbers():
    def described(base):
        plan = fuzz.CasePlan(all_seeds(), MUTATORS.values(), base)
        return [(c.seed.name, c.mutator, c.from_path, c.mutant.data) for c in plan.cases(60)]

    assert described(7) == described(7)
    assert described(7) != described(8)


def test_every_mutator_changes_every_seed_it_applies_to():
    seeds = all_seeds()
    for mutator in MUTATORS.values():
        applies = [s for s in seeds if mutator.applies(s)]
        assert applies, mutator.name
        for seed in applies:
            changed = [fuzz.mutate(seed, mutator, index, 0, seeds).data != seed.data for index in range(6)]
            assert any(changed), (mutator.name, seed.name)


def test_seeds_are_valid_models(tmp_path):
    seeds = all_seeds()
    assert {s.format for s in seeds} == {"onnx", "tflite"}
    fuzz.warm_up(seeds)  # each runs on nnrun
    for seed in seeds:
        (tmp_path / seed.name).mkdir()
        path = tmp_path / seed.name / f"model{seed.suffix}"
        path.write_bytes(seed.data)
        for name, data in seed.files:
            (tmp_path / seed.name / name).write_bytes(data)
        if seed.format == "onnx":
            onnx.checker.check_model(str(path), full_check=True)
        else:
            interpreter = litert.Interpreter(model_path=str(path), experimental_op_resolver_type=(
                litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
            interpreter.allocate_tensors()


@pytest.mark.parametrize("kind, shape, expected", [
    ("tensor(float)", ["N", 3], ((2, 3), np.float32)),
    ("tensor(int64)", [None], ((2,), np.int64)),
    ("tensor(bool)", [], ((), np.bool_)),
])
def test_feeds_follow_the_described_inputs(kind, shape, expected):
    class Arg:
        name, type = "x", kind

    Arg.shape = shape
    feed = fuzz.make_feeds([Arg], np.random.default_rng(0))["x"]
    assert (feed.shape, feed.dtype) == (expected[0], np.dtype(expected[1]))


def test_a_loop_the_file_sets_to_2_62_iterations_is_stopped_by_the_watchdog_not_a_hang():
    """The model's own computation, not nnrun hanging: the child's watchdog sets RunOptions.terminate
    at half the timeout, and the run ends with a typed error at the loop's next iteration."""
    from onnx import TensorProto, helper, numpy_helper

    def value(name, shape, dtype=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, dtype, shape)

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Neg", ["acc"], ["acc2"])], "body",
        [value("i", [], TensorProto.INT64), value("c", [], TensorProto.BOOL), value("acc", [1])],
        [value("c2", [], TensorProto.BOOL), value("acc2", [1])])
    graph = helper.make_graph([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)], "g", [value("x", [1])],
                              [value("y", [1])], [numpy_helper.from_array(np.array(1 << 62, np.int64), "M")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    case = fuzz.Case(0, 0, Seed("loop", "onnx", data), "loop", Mutant(data, "M = 2^62"), False)
    started = time.monotonic()
    [(_, record)] = list(fuzz.run_cases([case], settings=fuzz.Settings(timeout=4), jobs=1))
    assert record["outcome"] == "stopped", record
    assert record["error"] == "ExecutionError" and "terminate flag" in record["message"]
    assert time.monotonic() - started < 4  # ended at half the timeout, not killed at it
