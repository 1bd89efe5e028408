"""The kernels' thread pool, and the ops that split across it, against onnxruntime with every op
split (the split threshold lowered to one element) on three threads."""

import contextvars
import threading
import time

import numpy as np
import pytest
from compiled import needs_numba
from oracle import assert_close, helper, make_model, rng, run_onnxruntime

import nnrun
from nnrun import threads
from nnrun.ops import conv_core, elementwise, jit, parallel


def test_pool_runs_each_chunk_once():
    pool = parallel.Pool(3)
    for count in (1, 2, 3, 7, 100):
        seen = []
        pool.run(seen.append, count)
        assert sorted(seen) == list(range(count))


def test_callers_share_a_pool_at_once():
    pool, failures = parallel.Pool(3), []

    def caller(k):
        for _ in range(50):
            out = np.zeros(12)

            def chunk(i):
                out[i] = k * 100 + i
            pool.run(chunk, 12)
            if not np.array_equal(out, k * 100 + np.arange(12)):
                failures.append(k)
    callers = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert failures == []


def test_a_chunks_error_reaches_the_caller_and_the_pool_goes_on():
    pool = parallel.Pool(2)

    def chunk(i):
        if i == 3:
            raise ValueError("chunk 3")
    with pytest.raises(ValueError, match="chunk 3"):
        pool.run(chunk, 6)
    seen = []
    pool.run(seen.append, 4)
    assert sorted(seen) == [0, 1, 2, 3]


def test_workers_run_chunks_in_the_callers_context():
    # numpy's error state is a context variable: the executor ignores inf and NaN, and a
    # worker must too.
    pool, flag = parallel.Pool(2), contextvars.ContextVar("flag", default="unset")
    seen = []

    def chunk(i):
        time.sleep(0.005)  # long enough that the worker takes some
        seen.append((threading.get_ident(), flag.get(), np.geterr()["over"]))
    token = flag.set("caller's")
    try:
        with np.errstate(over="ignore"):
            pool.run(chunk, 10)
    finally:
        flag.reset(token)
    assert len({ident for ident, _, _ in seen}) == 2  # the worker took some
    assert {(value, over) for _, value, over in seen} == {("caller's", "ignore")}


def test_a_sessions_threads():
    assert threads.kernel_threads(0) == parallel.default_threads() >= 1
    assert threads.kernel_threads(3) == 3
    for intra, expected in ((1, 1), (3, 3), (0, parallel.default_threads())):
        run_threads = threads.RunThreads(intra)
        state = run_threads.begin()
        assert parallel.current().threads == expected
        run_threads.end(state)
        assert parallel.current() is parallel.SERIAL


def test_a_runs_thread_counts_are_read_and_set_through_each_librarys_own_functions():
    """OpenBLAS's own C functions (threadpoolctl's Python around each call would cost a small model's
    run several microseconds) read and set the count threadpoolctl sees; other libraries keep
    threadpoolctl's methods."""
    import ctypes
    from types import SimpleNamespace

    libraries = [c for c in threads.controller(refresh=True).lib_controllers if c.user_api == "blas"]
    assert libraries
    for library in libraries:
        get, set_ = threads.counter(library)
        before = library.get_num_threads()
        if library.internal_api == "openblas" and library.threading_layer == "pthreads":
            assert isinstance(get, ctypes._CFuncPtr) and isinstance(set_, ctypes._CFuncPtr)
        assert get() == before
        try:
            set_(3 - min(before, 2))
            assert library.get_num_threads() == get() == 3 - min(before, 2)
        finally:
            library.set_num_threads(before)
    other = SimpleNamespace(internal_api="mkl", threading_layer="intel", filepath="libmkl_rt.so",
                            get_num_threads=lambda: 4, set_num_threads=print)
    assert threads.counter(other) == (other.get_num_threads, other.set_num_threads)


@pytest.fixture
def split_everything(monkeypatch):
    """Every op splits (on the kernels' pool, or numba's team of threads), and the test sees that
    some did."""
    monkeypatch.setattr(parallel, "MIN_SHARE", 1)
    monkeypatch.setattr(parallel, "SPLIT_FROM", 2)
    monkeypatch.setattr(conv_core, "COMPILED_SHARE", 1)
    monkeypatch.setattr(conv_core, "COMPILED_MIN_ROW", 0)
    monkeypatch.setattr(conv_core, "EPILOGUE_SHARE", 1)
    monkeypatch.setattr(conv_core, "EPILOGUE_MIN", 0)
    monkeypatch.setattr(conv_core, "CHANNELS_LAST_BLOCK", 1)
    # Where numba is installed, its depthwise kernel and convolutions' bias and activation split too.
    monkeypatch.setenv("NNRUN_JIT", "1")
    runs = []
    real = parallel.Pool.run

    def counted(self, chunk, count):
        runs.append(count)
        return real(self, chunk, count)
    monkeypatch.setattr(parallel.Pool, "run", counted)
    # With compiled kernels a session may run them on numba's team instead: its splits count too.
    monkeypatch.setattr(conv_core, "TEAM_SHARE", 1)
    on_team = jit.on_team

    def counted_on_team(name, shares):
        runs.append(shares)
        return on_team(name, shares)
    monkeypatch.setattr(jit, "on_team", counted_on_team)
    return runs


def _check_split(model, feeds, runs):
    options = nnrun.SessionOptions()
    options.intra_op_num_threads = 3
    options.weight_cache_dir = None
    expected = run_onnxruntime(model, feeds)
    actual = nnrun.InferenceSession(model.SerializeToString(), options).run(None, feeds)
    for a, e in zip(actual, expected):
        assert_close(a, e)
    assert any(count > 1 for count in runs), "nothing was split"


def _data(shape, seed=0):
    return rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", ["Add", "Mul", "Sub", "Div"])
@pytest.mark.parametrize("a_shape, b_shape", [
    ((2, 3, 4, 5), (3, 1, 1)),  # a per-channel operand
    ((1, 8, 5, 6), (6,)),       # along the last axis
    ((1, 8, 5, 6), (1, 8, 5, 6)),
    ((7, 1), (1, 9)),           # both broadcast
    ((4, 6), ()),
])
def test_binary_ops_split(split_everything, op, a_shape, b_shape):
    a, b = _data(a_shape), np.asarray(_data(b_shape, 1) + (3 if op == "Div" else 0))
    model = make_model([helper.make_node(op, ["a", "b"], ["y"])], [("a", a), ("b", b)], [("y", None)])
    _check_split(model, {"a": a, "b": b}, split_everything)


@pytest.mark.parametrize("op, attrs", [("Relu", {}), ("Sigmoid", {}), ("HardSwish", {}), ("Exp", {}),
                                       ("LeakyRelu", {"alpha": 0.1}), ("Tanh", {})])
def test_unary_ops_split(split_everything, op, attrs):
    x = _data((2, 5, 6, 7)) * 4
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", x)], [("y", None)], opset=17)
    _check_split(model, {"x": x}, split_everything)


def test_a_residual_sum_and_its_relu_split(split_everything):
    x, r = _data((1, 6, 9, 9)), _data((1, 6, 9, 9), 1)
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    _check_split(make_model(nodes, [("x", x), ("r", r)], [("y", None)]), {"x": x, "r": r}, split_everything)


@pytest.mark.parametrize("w_shape, attrs", [
    ((8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),                  # im2col, tiled; compiled: few channels
    ((7, 3, 3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2]}),  # few channels, their planes shared
    ((8, 3, 1, 1), {}),                                      # pointwise
    ((6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 3}),      # depthwise-like grouped (multiplier 2)
    ((3, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 3}),      # depthwise
])
@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "HardSwish"])
def test_convolution_bias_and_activation_split(split_everything, w_shape, attrs, activation):
    x, w, b = _data((2, 3, 12, 11)), _data(w_shape, 1), _data((w_shape[0],), 2)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node(activation, ["c"], ["y"])]
    model = make_model(nodes, [("x", x)], [("y", None)], [("w", w), ("b", b)])
    _check_split(model, {"x": x}, split_everything)


def test_blas_runs_on_one_thread_while_a_split_runs():
    # A chunk that calls BLAS must not start the library's threads from every pool thread at once.
    libraries = [library for library in threads.controller().lib_controllers if library.user_api == "blas"]
    if not libraries:
        pytest.skip("no BLAS library that threadpoolctl controls")
    before = [library.get_num_threads() for library in libraries]
    seen = []
    try:
        for library in libraries:
            library.set_num_threads(2)
        parallel.Pool(2).run(lambda i: seen.append([library.get_num_threads() for library in libraries]), 4)
        assert seen and all(counts == [1] * len(libraries) for counts in seen)
        assert [library.get_num_threads() for library in libraries] == [2] * len(libraries)
        parallel.Pool(2).run(lambda i: seen.append(None), 1)  # one chunk: run inline, nothing pinned
        assert [library.get_num_threads() for library in libraries] == [2] * len(libraries)
    finally:
        for library, count in zip(libraries, before):
            library.set_num_threads(count)


@pytest.mark.parametrize("op, opset, attrs, shape", [
    ("Softmax", 13, {}, (2, 3, 5, 7)),                   # over the last axis: 30 slices
    ("Softmax", 13, {"axis": 1}, (4, 3, 5)),              # a middle axis: (outer, n, inner) slices
    ("Softmax", 11, {"axis": 2}, (3, 4, 5, 2)),           # coerced to a matrix
    ("LogSoftmax", 13, {}, (1, 6, 9)),                   # the first axis of one: cut along the next
    ("Hardmax", 13, {}, (5, 8)),
])
def test_softmax_family_splits(split_everything, op, opset, attrs, shape):
    x = _data(shape) * 3
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", x)], [("y", None)], opset=opset)
    _check_split(model, {"x": x}, split_everything)


@pytest.mark.parametrize("axis, stats", [(-1, False), (-1, True), (1, True)])
def test_layer_normalization_splits(split_everything, axis, stats):
    x, scale, b = _data((1, 6, 4, 5)), _data((5,), 1), _data((5,), 2)  # rows of 5: 24 of them
    if axis == 1:  # rows of 6 x 4 x 5: one per image
        x, scale, b = _data((3, 6, 4, 5)), _data((6, 4, 5), 1), _data((6, 4, 5), 2)
    outputs = ["y", "mean", "inv"] if stats else ["y"]
    node = helper.make_node("LayerNormalization", ["x", "scale", "b"], outputs, axis=axis)
    model = make_model([node], [("x", x)], [(name, None) for name in outputs], [("scale", scale), ("b", b)], opset=17)
    _check_split(model, {"x": x}, split_everything)


@pytest.mark.parametrize("op", ["InstanceNormalization", "BatchNormalization"])
def test_instance_and_batch_normalization_split(split_everything, op):
    # BatchNormalization of the input, no Conv to fold it into: it runs
    x = _data((2, 5, 6, 7))
    scale, b, mean, var = _data((5,), 1), _data((5,), 2), _data((5,), 3), np.abs(_data((5,), 4)) + 0.5
    params = [("scale", scale), ("b", b)] + ([("mean", mean), ("var", var)] if op == "BatchNormalization" else [])
    node = helper.make_node(op, ["x"] + [name for name, _ in params], ["y"])
    _check_split(make_model([node], [("x", x)], [("y", None)], params), {"x": x}, split_everything)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceL1", "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("shape, axes, keepdims", [
    ((1, 4, 6, 5), [-1], 1), ((1, 4, 6, 5), [-1], 0), ((1, 4, 6, 5), [2], 1),  # cut along axis 1
    ((3, 4, 6, 5), [1, 3], 0),                                                  # along axis 0
    ((3, 4, 6, 5), [0], 1), ((1, 4, 6, 5), [1, 3], 1),  # the first long axis reduced: whole
])
def test_reductions_split(split_everything, op, shape, axes, keepdims):
    # opset 13: axes as an attribute (ReduceSum takes them as an input)
    x = _data(shape)
    # the first long axis reduced; or a mean or sum over trailing axes, one BLAS mat-vec on its own threads
    trailing = sorted(a % len(shape) for a in axes) == list(range(len(shape) - len(axes), len(shape)))
    whole = axes[0] == 0 or shape[0] == 1 and axes[0] == 1 or (trailing and op in ("ReduceSum", "ReduceMean"))
    if op == "ReduceSum":
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [("axes", np.array(axes, np.int64))]
    else:
        node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims)
        inits = []
    model = make_model([node], [("x", x)], [("y", None)], inits, opset=13)
    if whole:
        expected = run_onnxruntime(model, {"x": x})
        options = nnrun.SessionOptions()
        options.intra_op_num_threads = 3
        assert_close(nnrun.InferenceSession(model.SerializeToString(), options).run(None, {"x": x})[0], expected[0])
        assert not any(count > 1 for count in split_everything)
        return
    _check_split(model, {"x": x}, split_everything)


def test_global_max_pool_splits(split_everything):
    x = _data((2, 5, 6, 7))
    model = make_model([helper.make_node("GlobalMaxPool", ["x"], ["y"])], [("x", x)], [("y", None)])
    _check_split(model, {"x": x}, split_everything)


def _team_model():
    """A stem over phase planes, pointwise convolutions over many pixels (split by columns) and over
    a 7x7 image (split by the weight's tiles), depthwise convolutions channels first and channels
    last, and products by BLAS of their inputs, split by columns (B as it lies, and both
    transposed) and by rows (B transposed): every kernel numba's team runs."""
    x, a, b, c, d = _data((1, 3, 40, 48)), _data((64, 128), 1), _data((128, 200), 2), _data((300, 64), 3), \
        _data((70, 64), 4)
    inits = [("w0", _data((16, 3, 3, 3), 5) / 4), ("b0", _data((16,), 6)), ("w1", _data((32, 16, 1, 1), 7) / 4),
             ("w2", _data((32, 1, 3, 3), 8)), ("w3", _data((32, 1, 3, 3), 9)), ("w4", _data((96, 32, 1, 1), 10) / 4)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"]),                                   # 20x24
             helper.make_node("Conv", ["c1", "w2"], ["c2"], group=32, pads=[1, 1, 1, 1]),      # channels first
             helper.make_node("MaxPool", ["c2"], ["p2"], kernel_shape=[3, 3], strides=[3, 3]),  # 6x8
             helper.make_node("Conv", ["p2", "w3"], ["c3"], group=32, pads=[1, 1, 1, 1]),      # channels last
             helper.make_node("Conv", ["c3", "w4"], ["y"]),
             helper.make_node("MatMul", ["a", "b"], ["m"]),
             helper.make_node("Gemm", ["c", "d"], ["g"], transB=1),
             helper.make_node("Gemm", ["e", "f"], ["h"], transA=1, transB=1)]
    feeds = {"x": x, "a": a, "b": b, "c": c, "d": d, "e": _data((64, 48), 11), "f": _data((400, 64), 12)}
    return make_model(nodes, list(feeds.items()), [("y", None), ("m", None), ("g", None), ("h", None)], inits), feeds


def _team_session(model, threads=2):
    options = nnrun.SessionOptions()
    options.intra_op_num_threads = threads
    options.compiled_kernels = True
    options.weight_cache_dir = None
    return nnrun.InferenceSession(model.SerializeToString(), options)


def _skip_without_team():
    with jit.chosen(True):
        if not jit.team_shares(2):
            pytest.skip("numba has no thread-safe team of two threads here (one core, or neither OpenMP nor TBB)")


@needs_numba
def test_compiled_kernels_run_on_numbas_team(monkeypatch):
    """With compiled kernels on two threads a session runs its products, depthwise convolutions and
    BLAS products in shares on numba's team, alone: the kernels' pool on one thread and BLAS on one
    while it runs. Against onnxruntime."""
    _skip_without_team()
    model, feeds = _team_model()
    session = _team_session(model)
    assert session.plan().on_team
    blas_libraries = [library for library in threads.controller().lib_controllers if library.user_api == "blas"]
    seen = []
    on_team = jit.on_team

    def recorded(name, shares):
        seen.append((name, shares, parallel.current().threads, parallel.team(),
                     [library.get_num_threads() for library in blas_libraries]))
        return on_team(name, shares)
    monkeypatch.setattr(jit, "on_team", recorded)
    monkeypatch.setattr(conv_core, "TEAM_SHARE", 1)
    for actual, expected in zip(session.run(None, feeds), run_onnxruntime(model, feeds)):
        assert_close(actual, expected, rtol=1e-4)
    assert {name for name, *_ in seen} == {"phase_rows", "product", "depthwise", "channels_last", "gemm"}
    assert all(shares == 2 and pool == 1 and team == 2 and set(counts) <= {1}
               for _, shares, pool, team, counts in seen)
    assert parallel.team() == 1  # and after the run, no team
    one = _team_session(model, threads=1)
    assert not one.plan().on_team


@needs_numba
@pytest.mark.parametrize("on_team", [True, False])
@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize("channels,size,kernel,strides", [
    (40, (14, 14), (3, 3), (1, 1)),   # blocks of 16 shared 16 and 24
    (72, (13, 11), (3, 3), (2, 2)),
    (48, (9, 12), (5, 5), (1, 1)),    # taps other than nine (_row_taps)
])
def test_channels_last_depthwise_shares_have_scratch_of_their_own(monkeypatch, on_team, staged, channels, size,
                                                                   kernel, strides):
    """A small image's depthwise convolution (the channels-last kernel) shared by ranges of whole
    blocks of channels, on numba's team or on the kernels' pool of two threads, each share with its
    own part of the scratch; its copies by BLAS's transposing copy (staged) or the kernel's own.
    Against onnxruntime, with a bias and an activation."""
    if on_team:
        _skip_without_team()
    else:
        monkeypatch.setattr(conv_core, "ON_TEAM", False)
    if not staged:
        monkeypatch.setattr(conv_core.blas, "transpose", lambda *_: None)
    pads = [k // 2 for k in kernel] * 2
    w, b = _data((channels, 1, *kernel), 1), _data((channels,), 2)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=channels, strides=list(strides), pads=pads),
             helper.make_node("Relu", ["c"], ["y"])]
    feeds = {"x": _data((2, channels, *size))}
    model = make_model(nodes, list(feeds.items()), [("y", None)], [("w", w), ("b", b)])
    session = _team_session(model)
    assert isinstance(session.plan().steps[0].kernel.plan.tiles, conv_core.CompiledChannelsLast)
    calls = []
    on_team_runner = jit.on_team
    monkeypatch.setattr(jit, "on_team", lambda name, shares: calls.append((name, shares)) or on_team_runner(name,
                                                                                                           shares))
    monkeypatch.setattr(conv_core, "TEAM_SHARE", 1)
    monkeypatch.setattr(conv_core, "COMPILED_SHARE", 1)
    assert_close(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-5)
    assert calls == ([("channels_last", 2)] * 2 if on_team else [])  # (an image each)


@needs_numba
def test_compiled_erf_and_gelu_run_on_the_team(monkeypatch):
    """In a plan on numba's team (a compiled product asks for it), the compiled Erf and GELU run in
    shares on the team too: against onnxruntime, and to the bit as one thread computes them."""
    _skip_without_team()
    x = _data((1, 4, 61, 45)) * 3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Gelu", ["c"], ["g"]),
             helper.make_node("Erf", ["g"], ["y"])]
    model = make_model(nodes, [("x", x)], [("g", None), ("y", None)], [("w", _data((8, 4, 1, 1), 1))], opset=20)
    calls = []
    on_team = jit.on_team
    monkeypatch.setattr(jit, "on_team", lambda name, shares: calls.append((name, shares)) or on_team(name, shares))
    monkeypatch.setattr(elementwise, "TEAM_SHARE", 1000)
    session = _team_session(model)
    assert session.plan().on_team
    made = session.run(None, {"x": x})
    assert ("gelu", 2) in calls and ("erf", 2) in calls
    for actual, expected in zip(made, run_onnxruntime(model, {"x": x})):
        assert_close(actual, expected, rtol=1e-5)
    alone = _team_session(model, threads=1).run(None, {"x": x})
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(made, alone))


@needs_numba
@pytest.mark.parametrize("op,attributes,team_kernel", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "max_pool"),
    ("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0]}, "max_pool"),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "depthwise"),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
     "depthwise"),
])
def test_compiled_pools_run_on_the_team(monkeypatch, op, attributes, team_kernel):
    """A pooling the compiled kernel serves is split by channels on numba's team, each share with
    planes of its own: against onnxruntime."""
    _skip_without_team()
    feeds = {"x": _data((2, 9, 41, 37))}
    model = make_model([helper.make_node(op, ["x"], ["y"], **attributes)], list(feeds.items()), [("y", None)])
    session = _team_session(model)
    assert session.plan().on_team and session.plan().steps[0].kernel.plan.compiled is not None
    calls = []
    on_team = jit.on_team
    monkeypatch.setattr(jit, "on_team", lambda name, shares: calls.append((name, shares)) or on_team(name, shares))
    monkeypatch.setattr(conv_core, "TEAM_SHARE", 1)
    assert_close(session.run(None, feeds)[0], run_onnxruntime(model, feeds)[0], rtol=1e-6)
    assert calls == [(team_kernel, 2)] * 2  # (an image each)


@needs_numba
def test_matrix_vector_products_run_on_the_team(monkeypatch):
    """In a plan on numba's team, BLAS's matrix-vector products (a row by a weight as it lies, or
    transposed; a matrix by a column) run in shares of the result on the team, each its own part of
    the weight where it is not transposed: against onnxruntime."""
    _skip_without_team()
    # (products of 1M multiply-adds and more go to BLAS: blas.MATMUL_FROM)
    feeds = {"x": _data((1, 3, 40, 48)), "r": _data((1, 1100)), "m": _data((1001, 1100), 3)}
    inits = [("w", _data((16, 3, 3, 3), 1)), ("k", _data((1100, 1000), 2)), ("t", _data((1003, 1100), 4)),
             ("v", _data((1100, 1), 5))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1]),  # (the team's)
             helper.make_node("MatMul", ["r", "k"], ["rk"]),           # a row by a weight as it lies
             helper.make_node("Gemm", ["r", "t"], ["rt"], transB=1),   # ... by a transposed one
             helper.make_node("MatMul", ["m", "v"], ["mv"])]           # a matrix by a column
    model = make_model(nodes, list(feeds.items()), [("y", None), ("rk", None), ("rt", None), ("mv", None)], inits)
    session = _team_session(model)
    assert session.plan().on_team
    calls = []
    on_team = jit.on_team
    monkeypatch.setattr(jit, "on_team", lambda name, shares: calls.append((name, shares)) or on_team(name, shares))
    monkeypatch.setattr(conv_core.blas, "TEAM_GEMM_FROM", 1)
    for actual, expected in zip(session.run(None, feeds), run_onnxruntime(model, feeds)):
        assert_close(actual, expected, rtol=1e-4)
    assert calls.count(("gemv", 2)) == 3


@needs_numba
@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    # (outputs 64 wide: rows of whole vectors and wide enough, conv_core.ROWS_FROM_WIDTH)
    ((2, 5, 13, 64), (6, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 12, 66), (3, 4, 5, 3), {"pads": [2, 0, 1, 2], "dilations": [1, 2]}),
    ((1, 3, 6, 60), (4, 3, 3, 3), {"pads": [3, 3, 3, 3]}),                # rows and taps all padding
])
@pytest.mark.parametrize("limit", [12000, 1 << 20])  # tiles of a few rows, or the image
def test_shifted_convolutions_by_the_product_share_rows_on_the_team(monkeypatch, x_shape, w_shape, attrs, limit):
    """A stride-1 convolution by the compiled product (conv_core.with_tiles) of wide rows on
    numba's team: each tile's output rows in ranges at once, each filling the padded tile's rows it
    reads (the scratch full of NaN): against onnxruntime."""
    _skip_without_team()
    x, w, b = _data(x_shape), _data(w_shape, 1), _data((w_shape[0],), 2)
    window = conv_core.make_window(x_shape[2:], w_shape[2:], None, attrs.get("dilations"), attrs.get("pads"))
    with jit.chosen(True):
        plan = conv_core.with_tiles(conv_core.conv_plan(window, x_shape[1], w_shape[0], scratch_limit=limit,
                                                        shifted=True), force=True)
    assert plan.method == "gemm-shifted" and plan.tiles.tiled is not None and plan.tiles.fills is not None
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                        helper.make_node("Relu", ["c"], ["y"])], [("x", x)], [("y", None)], [("w", w), ("b", b)])
    expected = run_onnxruntime(model, {"x": x})[0]
    calls = []
    on_team = jit.on_team
    monkeypatch.setattr(jit, "on_team", lambda name, shares: calls.append((name, shares)) or on_team(name, shares))
    monkeypatch.setattr(conv_core, "TEAM_SHARE", 1)
    out = np.full(expected.shape, np.nan, np.float32)
    scratch = np.full(plan.scratch_elems, np.nan, np.float32)
    token = parallel.enter_team(2)
    try:
        conv_core.conv(x, conv_core.shifted_tiles(w, plan), b, out, plan, scratch, activation=("Relu", {}))
    finally:
        parallel.leave_team(token)
    assert_close(out, expected)
    assert ("phase_rows", 2) in calls


@needs_numba
def test_sessions_run_on_the_team_from_two_threads_at_once():
    """Runs of two sessions on numba's team at once, from two threads (its threading layer is a
    thread-safe one): each as onnxruntime computes it."""
    _skip_without_team()
    model, feeds = _team_model()
    expected = run_onnxruntime(model, feeds)
    sessions = [_team_session(model), _team_session(model)]
    failures = []

    def runs(session):
        try:
            for _ in range(10):
                for actual, wanted in zip(session.run(None, feeds), expected):
                    assert_close(actual, wanted, rtol=1e-4)
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            failures.append(e)
    workers = [threading.Thread(target=runs, args=(s,)) for s in sessions]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert not any(worker.is_alive() for worker in workers) and not failures, failures


@needs_numba
def test_a_forked_child_runs_without_the_team():
    """OpenMP's runtime does not start its threads again in a forked child: a child of a process
    that ran on numba's team runs its session's kernels on one thread, and finishes, as onnxruntime
    computes it."""
    import multiprocessing

    _skip_without_team()
    model, feeds = _team_model()
    session = _team_session(model)
    session.run(None, feeds)
    expected = run_onnxruntime(model, feeds)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()

    def child():
        queue.put((jit.team_shares(2), session.run(None, feeds)))
    process = context.Process(target=child)
    process.start()
    shares, outputs = queue.get(timeout=120)
    process.join(30)
    assert shares == 0 and process.exitcode == 0
    for actual, wanted in zip(outputs, expected):
        assert_close(actual, wanted, rtol=1e-4)
