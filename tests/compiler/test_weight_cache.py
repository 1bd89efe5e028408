"""The weight cache (runtime/compiler/weight_cache.py): what PREPARE packs (folded Conv+BatchNorm
filters, a Gemm's scaled C, LSTM's packed R) is written once to a cache file and mapped read-only
by later sessions, which pack nothing; no packed byte stays anonymous. A damaged file is rebuilt,
an unwritable directory turns the cache off with one warning, racing processes publish one valid
file. Outputs are checked against onnxruntime throughout."""

import multiprocessing
import os
import warnings

import numpy as np
import pytest
from graphs import packing_model
from oracle import assert_close, helper, make_model, rng, run_onnxruntime

import nnrun
from nnrun.compiler import rewrite
from nnrun.compiler.weight_cache import cache_key
from nnrun.loader import load_model
from nnrun.weights import ExternalData


X = {"x": rng(9).standard_normal((2, 3, 8, 8)).astype(np.float32)}


def saved(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return str(path)


def session(path, directory):
    options = nnrun.SessionOptions()
    options.weight_cache_dir = str(directory)
    return nnrun.InferenceSession(path, sess_options=options)


def test_a_second_session_maps_the_cache_and_packs_nothing(tmp_path, monkeypatch):
    model = packing_model()
    path, directory = saved(tmp_path, model), tmp_path / "cache"
    want = run_onnxruntime(model, X)[0]
    cold = session(path, directory)
    plan = cold.report()["plan"]
    assert plan["weight_cache"]["state"] == "miss" and os.path.exists(plan["weight_cache"]["path"])
    assert plan["weights_anonymous_bytes"] == 0 and plan["weights_cached_bytes"] > 0
    assert_close(cold.run(None, X)[0], want)

    def refuse(*args, **kwargs):
        raise AssertionError("a warm session folded a BatchNormalization again")

    monkeypatch.setattr(rewrite, "_folded", refuse)
    warm = session(path, directory)
    plan = warm.report()["plan"]
    assert plan["weight_cache"]["state"] == "hit"
    assert plan["weights_anonymous_bytes"] == 0
    assert plan["weights_cached_bytes"] == cold.report()["plan"]["weights_cached_bytes"]
    assert_close(warm.run(None, X)[0], want)
    step = next(s for s in warm.plan().steps if s.op_type == "Gemm")
    assert not step.kernel.bias.flags.writeable  # a view of the cache file


def test_the_cache_is_off_for_a_model_given_as_bytes_or_when_asked(tmp_path):
    model = packing_model()
    assert nnrun.InferenceSession(model.SerializeToString()).report()["plan"]["weight_cache"]["state"] == "off"
    options = nnrun.SessionOptions()
    options.weight_cache_dir = None
    sess = nnrun.InferenceSession(saved(tmp_path, model), sess_options=options)
    plan = sess.report()["plan"]
    assert plan["weight_cache"]["state"] == "off" and plan["weights_anonymous_bytes"] > 0


@pytest.mark.parametrize("damage", ["payload", "truncate", "garbage"])
def test_a_damaged_cache_file_is_rebuilt_never_used(tmp_path, damage):
    model = packing_model()
    path, directory = saved(tmp_path, model), tmp_path / "cache"
    cache_path = session(path, directory).report()["plan"]["weight_cache"]["path"]
    data = bytearray(open(cache_path, "rb").read())
    if damage == "payload":
        data[4096 + 8] ^= 0x40  # inside the first packed array
    elif damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data = bytearray(b"not a cache file" * 10)
    with open(cache_path, "wb") as f:
        f.write(data)
    sess = session(path, directory)
    assert sess.report()["plan"]["weight_cache"]["state"] == "miss"  # rebuilt
    assert_close(sess.run(None, X)[0], run_onnxruntime(model, X)[0])
    assert session(path, directory).report()["plan"]["weight_cache"]["state"] == "hit"


def test_an_unwritable_cache_directory_warns_once_and_the_session_works(tmp_path):
    model = packing_model()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = session(saved(tmp_path, model), blocked / "cache")
    assert len([w for w in caught if "weight cache" in str(w.message)]) == 1
    assert sess.report()["plan"]["weight_cache"]["state"] == "off"
    assert_close(sess.run(None, X)[0], run_onnxruntime(model, X)[0])


def test_another_model_or_other_passes_get_another_key(tmp_path):
    a = load_model(saved(tmp_path, packing_model(0), "a.onnx"))
    b = load_model(saved(tmp_path, packing_model(1), "b.onnx"))
    assert cache_key(a) != cache_key(b)
    assert cache_key(a) != cache_key(a, {"fold_batchnorm"})
    assert cache_key(a) == cache_key(load_model(a.path))


def test_the_key_reads_the_file_not_the_mapping_and_sees_a_weights_ends(tmp_path):
    # The key hashes every byte outside the payloads and each payload's first and last 64 bytes,
    # read with pread: computing it leaves no page of the mapping resident.
    w = [rng(k).standard_normal((32, 32, 3, 3)).astype(np.float32) for k in range(3)]  # mapped, 37 KB each
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]), helper.make_node("Conv", ["a", "w1"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["y"])]
    path = saved(tmp_path, make_model(nodes, [("x", (np.float32, [1, 32, 9, 9]))], [("y", None)],
                                      [(f"w{k}", w[k]) for k in range(3)]))
    graph = load_model(path)
    key = cache_key(graph)
    assert graph.source.resident_bytes() == 0
    weight = max((w for w in graph.initializers.values() if isinstance(w, ExternalData)), key=lambda w: w.nbytes)
    assert weight.nbytes > 2 * 64
    stat = os.stat(path)
    for at in (weight.offset, weight.offset + weight.nbytes - 1):  # its first byte, then its last
        data = bytearray(open(path, "rb").read())
        data[at] ^= 0xFF
        edited = tmp_path / f"edited{at}.onnx"
        edited.write_bytes(bytes(data))
        os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and time
        assert cache_key(load_model(str(edited))) != key


def _serve(path, directory, queue):
    sess = session(path, directory)
    queue.put(sess.run(None, X)[0])


def test_four_processes_starting_on_an_empty_cache_leave_one_valid_file(tmp_path):
    model = packing_model()
    path, directory = saved(tmp_path, model), tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_serve, args=(path, directory, queue)) for _ in range(4)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    want = run_onnxruntime(model, X)[0]
    for got in results:
        assert_close(got, want)
    assert len(os.listdir(directory)) == 1  # one file, no temporary left
    assert session(path, directory).report()["plan"]["weight_cache"]["state"] == "hit"


def test_packed_values_of_nodes_that_differ_only_in_attributes_have_different_names():
    """A body's node and the main graph's may share an index and their inputs: the attributes
    are part of a packed value's name, so one never takes the other's place."""
    from nnrun import ir
    from nnrun.ops.registry import node_digest

    a = ir.Node("n", "Gemm", "", ["x", "w", "c"], ["y"], {"beta": 0.5}, 3)
    b = ir.Node("n", "Gemm", "", ["x", "w", "c"], ["y"], {"beta": 0.25}, 3)
    assert node_digest(a) != node_digest(b)
    assert node_digest(a) == node_digest(ir.Node("other", "Gemm", "", ["p", "q", "r"], ["s"], {"beta": 0.5}, 3))


def test_the_plan_says_which_weights_a_step_reads_from_the_cache(tmp_path):
    from nnrun.compiler.plan import CACHED, MEMORY, PACKED

    model = packing_model()
    path, directory = saved(tmp_path, model), tmp_path / "cache"

    def where(sess):
        return {(step.op_type, w.name.split("/")[-1]): w.where for step in sess.plan().steps for w in step.weights}

    off = nnrun.SessionOptions()
    off.weight_cache_dir = None
    off.compiled_kernels = False  # (a compiled product would pack the folded weight in its tiles)
    plain = where(nnrun.InferenceSession(path, sess_options=off))
    assert plain[("Gemm", "c")] == PACKED and plain[("Conv", "bn_folded_weight")] == MEMORY
    session(path, directory)
    warm = where(session(path, directory))
    assert warm[("Gemm", "c")] == CACHED and warm[("Conv", "bn_folded_weight")] == CACHED
    assert warm[("Gemm", "fc")] == plain[("Gemm", "fc")]  # a weight read as the file has it: unchanged


def test_a_new_version_of_a_model_file_removes_the_cache_of_the_old_one(tmp_path):
    directory = tmp_path / "cache"
    path = saved(tmp_path, packing_model(0))
    old = session(path, directory).report()["plan"]["weight_cache"]["path"]
    options = nnrun.SessionOptions()
    options.weight_cache_dir = str(directory)
    options.disabled_passes = ["fuse_activations"]  # the same file with other options: kept
    other_options = nnrun.InferenceSession(path, sess_options=options).report()["plan"]["weight_cache"]["path"]
    assert other_options != old

    saved(tmp_path, packing_model(1))  # re-exported in place: another size or mtime
    os.utime(path, ns=(os.stat(old).st_mtime_ns + 10**9,) * 2)  # whatever the clock's tick
    new_sess = session(path, directory)
    new = new_sess.report()["plan"]["weight_cache"]["path"]
    assert new != old and os.path.exists(new)
    assert not os.path.exists(old)
    assert not os.path.exists(other_options)  # it too was for the old file
    assert_close(new_sess.run(None, X)[0], run_onnxruntime(packing_model(1), X)[0])
