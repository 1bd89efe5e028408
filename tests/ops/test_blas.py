"""The BLAS GEMM called directly (ops/blas.py): each library nnrun may call (its own OpenBLAS, the
scipy-openblas32 wheel; numpy's) against numpy's matmul on copies of the operands in float64; which
library and kernels a process gets; `matmul`'s layouts and the products it leaves to numpy."""

import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from oracle import rng

from nnrun import threads
from nnrun.ops import blas


@pytest.fixture(params=["own", "numpy's"])
def library(request):
    found = blas._load_own() if request.param == "own" else blas._load_numpys()
    # nnrun's own is a dependency: its absence is a broken install, not a case to skip
    assert found is not None and found.gemms, f"{request.param} BLAS has no GEMM nnrun can call"
    assert found.own == (request.param == "own")
    return found


@pytest.fixture(params=[np.float32, np.float64])
def gemm(request, library):
    return library.gemms[np.dtype(request.param)]


def _tolerance(dtype):
    return 1e-5 if dtype == np.float32 else 1e-12


def test_shifted_views_summed_into_a_block(gemm):
    """b and b2 are views of one buffer, rows 45 apart and 40 long, b2 shifted 2 along (as two taps
    of a shifted convolution); c a block of a larger array: c = a @ b, then c += a2 @ b2, the rest
    of the larger array untouched."""
    dtype = gemm.dtype
    r = rng(3)
    flat = r.standard_normal(5 * 45 + 2).astype(dtype)
    b = np.lib.stride_tricks.as_strided(flat, (5, 40), (45 * dtype.itemsize, dtype.itemsize))
    b2 = np.lib.stride_tricks.as_strided(flat[2:], (5, 40), (45 * dtype.itemsize, dtype.itemsize))
    a, a2 = r.standard_normal((7, 5)).astype(dtype), r.standard_normal((7, 5)).astype(dtype)
    big = np.full((9, 50), 7.0, dtype)
    c = big[1:8, 4:44]
    tol = _tolerance(dtype)
    gemm(a, b, c)
    np.testing.assert_allclose(c, a @ np.array(b), rtol=tol, atol=tol)
    gemm(a2, b2, c, accumulate=True)
    np.testing.assert_allclose(c, a @ np.array(b) + a2 @ np.array(b2), rtol=tol, atol=tol)
    outside = np.ones(big.shape, bool)
    outside[1:8, 4:44] = False
    assert np.all(big[outside] == 7.0)


def _layouts(r, dtype, rows, cols):
    """A (rows, cols) matrix as it lies, as a transposed view, as a block of a larger one, and as a
    transposed block: every layout a kernel hands the GEMM."""
    plain = r.standard_normal((rows, cols)).astype(dtype)
    transposed = np.ascontiguousarray(r.standard_normal((cols, rows)).astype(dtype)).T
    block = r.standard_normal((rows + 3, cols + 5)).astype(dtype)[2:2 + rows, 1:1 + cols]
    transposed_block = r.standard_normal((cols + 4, rows + 2)).astype(dtype)[3:3 + cols, 1:1 + rows].T
    return {"rows": plain, "transposed": transposed, "block": block, "transposed block": transposed_block}


@pytest.mark.parametrize("a_layout", ["rows", "transposed", "block", "transposed block"])
@pytest.mark.parametrize("b_layout", ["rows", "transposed", "block", "transposed block"])
@pytest.mark.parametrize("m, k, n", [(13, 21, 17), (13, 21, 1), (1, 21, 17), (1, 21, 1)])
def test_every_layout_of_a_and_b(gemm, a_layout, b_layout, m, k, n):
    """Matrices, and a column or a row (the library's matrix-vector product), set and added to."""
    r = rng(4)
    a = _layouts(r, gemm.dtype, m, k)[a_layout]
    b = _layouts(r, gemm.dtype, k, n)[b_layout]
    big = np.full((m + 2, n + 3), 3.0, gemm.dtype)
    c = big[1:1 + m, 2:2 + n]
    assert gemm.takes(a, b, c)
    gemm(a, b, c)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    tol = _tolerance(gemm.dtype) * 10
    np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)
    gemm(a, b, c, accumulate=True)
    np.testing.assert_allclose(c, 2 * expected, rtol=tol, atol=tol)
    assert np.all(big[0] == 3.0) and np.all(big[-1] == 3.0) and np.all(big[:, :2] == 3.0) and np.all(big[:, -1] == 3.0)


def test_matrices_it_cannot_pass_by_pointer_are_refused(gemm):
    dtype = gemm.dtype
    a, b, c = np.ones((3, 4), dtype), np.ones((4, 5), dtype), np.zeros((3, 5), dtype)
    bad = [
        ("a", (np.ones((6, 8), dtype)[::2, ::2], b, c)),        # neither rows nor columns of unit stride
        ("b", (a, np.ones((4, 5), np.float16), c)),             # another dtype
        ("b", (a, b, np.zeros((3, 6), dtype))),                 # c 6 wide: b is not (4, 6)
        ("c", (a, b, np.zeros((2, 5), dtype))),                 # c 2 high: a is (3, 4)
        ("c", (a, b, np.zeros((5, 3), dtype).T)),               # c transposed: the library writes rows
    ]
    for name, (x, y, z) in bad:
        with pytest.raises(ValueError, match=f"gemm: {name} "):
            gemm(x, y, z)
        if x.shape[1] == y.shape[0] and z.shape == (x.shape[0], y.shape[1]):  # shapes that match: takes() says no
            assert not gemm.takes(x, y, z)
    rows_overlap = np.lib.stride_tricks.as_strided(np.zeros(20, dtype), (4, 5), (dtype.itemsize, dtype.itemsize))
    with pytest.raises(ValueError, match="gemm: b "):  # rows that overlap: BLAS wants them apart
        gemm(a, rows_overlap, c)
    readonly = np.zeros((3, 5), dtype)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gemm(a, b, readonly)
    assert blas.kernel(np.float16) is None


def test_an_empty_sum_is_zero_or_nothing_added(gemm):
    c = np.full((2, 3), 5, gemm.dtype)
    gemm(np.ones((2, 0), gemm.dtype), np.ones((0, 3), gemm.dtype), c, accumulate=True)
    assert np.all(c == 5)
    gemm(np.ones((2, 0), gemm.dtype), np.ones((0, 3), gemm.dtype), c)
    np.testing.assert_array_equal(c, np.ones((2, 0)) @ np.ones((0, 3)))


@pytest.fixture
def gemm_calls(monkeypatch):
    """The products `matmul` hands the library (a, b, c shapes), counted; those of 64K
    multiply-adds and more, so that small arrays test it."""
    monkeypatch.setattr(blas, "MATMUL_FROM", 1 << 16)
    calls = []
    run = blas.Gemm._run

    def counted(self, a, b, c, *arguments):
        calls.append((a.shape, b.shape, c.shape))
        return run(self, a, b, c, *arguments)
    monkeypatch.setattr(blas.Gemm, "_run", counted)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_of_large_products_is_the_librarys(gemm_calls, dtype):
    r = rng(5)
    layouts_a, layouts_b = _layouts(r, dtype, 64, 48), _layouts(r, dtype, 48, 40)
    for a in layouts_a.values():
        for b in layouts_b.values():
            out = np.empty((64, 40), dtype)
            blas.matmul(a, b, out)
            np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert len(gemm_calls) == 16
    # batches: one product per entry, against one a (a pointwise convolution of several images),
    # one b (rows of several sequences), or a batch of both (attention's heads), transposed too
    batches = [
        (r.standard_normal((40, 48)), r.standard_normal((3, 48, 50))),
        (r.standard_normal((3, 40, 48)), r.standard_normal((48, 50))),
        (r.standard_normal((2, 3, 40, 48)), r.standard_normal((2, 3, 50, 48)).swapaxes(2, 3)),
    ]
    for a, b in batches:
        a, b = a.astype(dtype), b.astype(dtype)
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (40, 50), dtype)
        blas.matmul(a, b, out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert gemm_calls[16:] == [((40, 48), (48, 50), (40, 50))] * 12


def test_matmul_leaves_to_numpy_what_the_library_would_not_do_as_asked(gemm_calls):
    r = rng(6)
    cases = []
    small = r.standard_normal((4, 5)).astype(np.float32), r.standard_normal((5, 6)).astype(np.float32)
    cases.append((*small, np.empty((4, 6), np.float32)))                      # too small to pay
    square = r.standard_normal((64, 64)).astype(np.float32)
    cases.append((square.copy(), square, square))                             # the output is b
    a = r.standard_normal((64, 64)).astype(np.float32)
    cases.append((a, a.copy(), a))                                            # the output is a
    halves = r.standard_normal((64, 64)).astype(np.float16)
    cases.append((halves, halves.copy(), np.empty((64, 64), np.float16)))    # no half GEMM
    ints = r.integers(-9, 9, (64, 64))
    cases.append((ints, ints.copy(), np.empty((64, 64), np.int64)))           # integers
    wide = r.standard_normal((64, 64)).astype(np.float32)
    cases.append((wide, wide.copy(), np.empty((64, 128), np.float32)[:, ::2]))  # output of strided rows
    one, two = r.standard_normal((1, 64, 64)).astype(np.float32), r.standard_normal((2, 64, 64)).astype(np.float32)
    cases.append((one, two, np.empty((2, 64, 64), np.float32)))              # a batch axis broadcast
    cases.append((r.standard_normal(64).astype(np.float32), two, np.empty((2, 64), np.float32)))  # a vector
    for a, b, out in cases:
        expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
        blas.matmul(a, b, out)
        np.testing.assert_allclose(out, expected, rtol=1e-2 if out.dtype == np.float16 else 1e-4, atol=1e-2)
    assert gemm_calls == []


def _in_a_process(code, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("NNRUN_BLAS", "OPENBLAS_CORETYPE")}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


_CHOICE = """
import os, numpy, threadpoolctl
def numpys():
    return [i.get("architecture") for i in threadpoolctl.threadpool_info() if "64_" in i["filepath"]]
before = numpys()
from nnrun.ops import blas
library = blas.library()
print(library.own, library.core, numpys() == before, "OPENBLAS_CORETYPE" in os.environ, blas._core_type())
"""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, n", [(384, 196), (1, 7), (7, 1), (33, 65)])
def test_the_transposing_copy(library, dtype, m, n):
    """Each library's ?omatcopy (the compiled channels-last depthwise kernel's copies) against
    numpy's transposed view, exactly: a copy; nothing written past b."""
    transpose = library.transposes.get(np.dtype(dtype))
    assert transpose is not None, "OpenBLAS has ?omatcopy: its absence leaves the staged path untested"
    a = rng(0).standard_normal((m, n)).astype(dtype)
    b = np.full(m * n + 8, -1, dtype)
    transpose.rows(m, n, a, b[:m * n].reshape(n, m))
    np.testing.assert_array_equal(b[:m * n].reshape(n, m), a.T)
    assert np.all(b[m * n:] == -1)


def test_no_transposing_copy_of_a_side_its_integers_cannot_hold():
    found = blas.transpose(np.float32)
    assert found is not None and blas.transpose(np.float32, found.limit) is found
    assert blas.transpose(np.float32, found.limit + 1) is None


def test_a_process_gets_nnruns_own_library_and_numpys_is_left_as_it_was():
    own, core, numpys_unchanged, variable_left, chosen = _in_a_process(_CHOICE)
    assert own == "True" and numpys_unchanged == "True" and variable_left == "False"
    if chosen != "None":  # this CPU is one where nnrun chooses the kernels (AMD's Zen 4)
        assert core == chosen


def test_nnrun_blas_numpy_selects_numpys_library():
    own, *_ = _in_a_process(_CHOICE, NNRUN_BLAS="numpy")
    assert own == "False"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="OpenBLAS's Haswell kernels are x86's")
def test_the_users_core_type_is_the_libraries_choice():
    own, core, _, variable_left, chosen = _in_a_process(_CHOICE, OPENBLAS_CORETYPE="Haswell")
    assert own == "True" and core == "Haswell" and variable_left == "True" and chosen == "None"


@pytest.mark.parametrize("vendor, family, flags, expected", [
    ("AuthenticAMD", "25", "fpu avx2 avx512f avx512bw", "Haswell"),   # Zen 4: AVX-512 at half width
    ("AuthenticAMD", "25", "fpu avx2 fma", None),                      # Zen 3: OpenBLAS picks AVX2 itself
    ("AuthenticAMD", "26", "fpu avx2 avx512f", None),                  # Zen 5: AVX-512 at full width
    ("GenuineIntel", "6", "fpu avx2 avx512f", None),
])
def test_the_kernels_chosen_by_cpu(tmp_path, monkeypatch, vendor, family, flags, expected):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nflags\t\t: {flags}\n\n"
                       f"processor\t: 1\nvendor_id\t: GenuineIntel\n")
    assert blas._core_type(str(cpuinfo)) == expected
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert blas._core_type(str(cpuinfo)) is None
    assert blas._core_type(str(tmp_path / "absent")) is None


def test_nnruns_own_library_runs_on_one_thread_whatever_a_session_asks():
    """It serves runs on one thread only: loaded with one (no thread of its own to spin), and a
    session of several bounds numpy's, not it; set to more by the program, a run puts it back."""
    assert blas.library().own
    own = [c for c in threads.controller(refresh=True).lib_controllers if blas.is_own(c.filepath)]
    assert len(own) == 1 and own[0].get_num_threads() == 1
    run_threads = threads.RunThreads(2)
    counts = {c.filepath: n for c, n in zip(run_threads.libraries, run_threads.counts)}
    assert counts[own[0].filepath] == 1
    assert [n for path, n in counts.items() if path.endswith(blas.numpys().name)] == [2]
    state = run_threads.begin()
    assert own[0].get_num_threads() == 1
    run_threads.end(state)
    try:
        own[0].set_num_threads(2)
        state = run_threads.begin()
        assert own[0].get_num_threads() == 1
        run_threads.end(state)
        assert own[0].get_num_threads() == 2  # the program's setting, back after the run
    finally:
        own[0].set_num_threads(1)


def test_runs_on_several_threads_use_numpys_library(gemm_calls):
    """nnrun's own library serves runs on one thread; on several, numpy's (whose threads alone
    then spin for the next product)."""
    from nnrun.ops import parallel

    assert blas.library().own and not blas.numpys().own
    r = rng(7)
    a, b = r.standard_normal((64, 48)).astype(np.float32), r.standard_normal((48, 40)).astype(np.float32)
    out = np.empty((64, 40), np.float32)
    token = parallel.enter(parallel.pool(2))
    try:
        assert blas.for_run() is blas.numpys() and blas.kernel(np.float32) is blas.numpys().gemms[np.dtype(np.float32)]
        blas.matmul(a, b, out)
    finally:
        parallel.leave(token)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert gemm_calls == []  # numpy's matmul, not a call through ctypes
    assert blas.for_run() is blas.library()
    blas.matmul(a, b, out)
    assert len(gemm_calls) == 1
