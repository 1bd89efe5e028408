"""The GEMM nnrun's kernels call: a BLAS library's ?gemm through ctypes, for the products numpy's
matmul cannot express (C += A @ B, where matmul always overwrites C; the sum of several products
in one output, conv_core's "gemm-shifted" convolution: one per tap, each over a view of the same
padded image shifted by the tap's offset, views that overlap one another), and for the large
matrix products of the convolution and Gemm kernels (`matmul`); and OpenBLAS's transposing copy
(`Transpose`), for the depthwise kernels that work channels last.

Runs on one thread use nnrun's own library where it is installed: the OpenBLAS build numpy's and
scipy's wheels are made from, as the `scipy-openblas32` wheel ships it (32-bit integers, names
that begin `scipy_`), loaded by nnrun alone, so that its kernels are chosen for nnrun without
touching the numpy library a program shares with it. OpenBLAS picks its AVX-512 ("SkylakeX")
kernels on AMD's Zen 4, which runs AVX-512 at half width, and its AVX2 ("Haswell") kernels are as
fast there on large products and up to twice as fast on narrow ones (few output channels over
many pixels): on Zen 4, where the variable is not set already, nnrun loads its library with
OPENBLAS_CORETYPE=Haswell; elsewhere OpenBLAS chooses as it does for numpy.

Runs on several threads use numpy's library (`for_run`): a second library's threads would take
the cores of the first's. nnrun's own is loaded to run on one thread, and stays so. Numpy's is
also the one where nnrun's own is absent or NNRUN_BLAS=numpy is set: its wheels link OpenBLAS
built with 64-bit integers and names ending in `64_`. Anything else (Accelerate, MKL, a
distribution's OpenBLAS) gives `kernel(dtype) is None`: callers keep their numpy path, and
`matmul` is numpy's. Numpy's library is one threadpoolctl finds, so threads.py sets its thread
count to the session's.
"""

import ctypes
import os
import threading

import numpy as np

from . import parallel

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

_SCALARS = {np.dtype(np.float32): ("s", ctypes.c_float), np.dtype(np.float64): ("d", ctypes.c_double)}

# A product of fewer multiply-adds goes to numpy's matmul: this module's checks and the ctypes call
# cost 8-11 us a product where numpy's matmul costs 2.5-4 (64 x 128 x 8: 8.0 against 2.5 us), and
# below ~1M multiply-adds (25 us at one thread) that outweighs what the kernels chosen here gain.
MATMUL_FROM = 1 << 20
# A product of at least this many multiply-adds is shared on numba's team where a run is on one
# (parallel.team; ~4 us a launch).
TEAM_GEMM_FROM = 1 << 18


class Library:
    """One BLAS library found: `name` (the file), `core` (OpenBLAS's kernel set, or None), `own`
    (nnrun's own, not numpy's), its Gemm per dtype, and its Transpose per dtype (OpenBLAS's
    ?omatcopy, where it has one)."""

    __slots__ = ("name", "core", "own", "gemms", "transposes")

    def __init__(self, name, core, own, gemms, transposes=None):
        self.name, self.core, self.own, self.gemms = name, core, own, gemms
        self.transposes = transposes or {}


class Transpose:
    """One library's ?omatcopy for one dtype: `rows(m, n, a, b)` sets b (n, m) to a (m, n)
    transposed, both C-contiguous of this dtype, unchecked (the caller has made sure). OpenBLAS's
    kernel moves blocks through registers: 384 x 196 float32 in 19 us, 960 x 49 in 9, where numpy's
    copy of a transposed view takes 23 and 28 and a compiled loop of numba's ~40 and ~20."""

    __slots__ = ("_function", "limit", "address", "wide")

    def __init__(self, function, limit):
        self._function, self.limit = function, limit
        self.address = ctypes.cast(function, ctypes.c_void_p).value  # where compiled kernels call it
        self.wide = limit > (1 << 31)  # its integers are 64-bit

    def rows(self, m, n, a, b):
        self._function(ROW_MAJOR, TRANS, m, n, 1.0, address(a), n, address(b), m)


class Gemm:
    """One library's ?gemm for one dtype: `gemm(a, b, c, accumulate)` sets c = a @ b, or adds a @ b
    to c; a (M, K), b (K, N), c (M, N). c has unit stride along its rows; a and b along their
    rows or (a transposed view) their columns; each with its other stride at least its rows' (or
    columns') length (checked: the library reads and writes through raw pointers). A product of
    one column or one row (N or M of 1) is the library's ?gemv where it has one (768 x 384 by a
    vector as a ?gemm of one column took 250 us at two threads, numpy's matmul 60)."""

    __slots__ = ("dtype", "_function", "_gemv", "_limit", "_wide", "_address", "_gemv_address")

    def __init__(self, dtype, function, limit, gemv=None):
        self.dtype = dtype
        self._function = function
        self._gemv = gemv
        self._limit = limit  # the largest dimension or leading dimension the library's integers hold
        self._wide = limit > (1 << 31)  # its integers are 64-bit (compiled kernels call it so)
        self._address = ctypes.cast(function, ctypes.c_void_p).value if dtype == np.float32 else None
        self._gemv_address = ctypes.cast(gemv, ctypes.c_void_p).value if dtype == np.float32 and gemv else None

    def __call__(self, a, b, c, accumulate=False):
        m, k = a.shape
        n = c.shape[1]
        matrices = (("a", a, m, k), ("b", b, k, n), ("c", c, m, n))
        for name, matrix, rows, cols in matrices:
            if matrix.dtype != self.dtype or matrix.shape != (rows, cols):
                raise ValueError(f"gemm: {name} {matrix.shape} {matrix.dtype} is not a ({rows}, {cols}) {self.dtype} "
                                 f"matrix")
        if not c.flags.writeable:
            raise ValueError("gemm: c is read-only")
        if m == 0 or n == 0:
            return c
        if k == 0:  # an empty sum (the library would refuse a leading dimension of 0)
            if not accumulate:
                c[...] = 0
            return c
        arguments = self._arguments(a, b, c)
        if arguments is None:
            for name, matrix in (("a", a), ("b", b), ("c", c)):
                layout = _layout(matrix, self.dtype.itemsize)
                if layout is None or name == "c" and layout[0] != NO_TRANS:
                    raise ValueError(f"gemm: {name} {matrix.shape} {matrix.dtype} strides {matrix.strides} "
                                     f"is not a matrix of unit-stride rows apart")
            raise ValueError(f"gemm: {(m, k, n)} is beyond the library's {self._limit} elements a dimension")
        self._run(a, b, c, 1.0 if accumulate else 0.0, *arguments)
        return c

    @property
    def limit(self):
        """The largest dimension or leading dimension the library's integers hold."""
        return self._limit

    def rows_product(self, m, n, k, a, b, c):
        """c (m, n) = a (m, k) @ b (k, n), all three C-contiguous of this dtype, m and n above 1,
        each dimension within `limit`: unchecked, the caller has made sure (conv_core.GemmStep at
        PREPARE and on each call), so a product costs the library's call and nothing else."""
        if not self._on_team(NO_TRANS, NO_TRANS, m, n, k, a, k, b, n, 0.0, c, n):
            self._function(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, address(a), k, address(b), n, 0.0,
                           address(c), n)

    def _on_team(self, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc):
        """The product in shares on numba's team where the run is on one (parallel.team) and it is
        large enough to share (TEAM_GEMM_FROM): each share this library's call on one thread (the
        library's own threads would spin beside the team's). Whether it was done so."""
        shares = parallel.team()
        if shares < 2 or self._address is None or m * n * k < TEAM_GEMM_FROM or max(m, n // 16) < 2:
            return False
        from . import jit

        jit.on_team("gemm", shares)(self._address, self._wide, trans_a, trans_b, m, n, k, address(a),
                                    lda, address(b), ldb, beta, address(c), ldc)
        return True

    def takes(self, a, b, c):
        """Whether `self(a, b, c)` computes c = a @ b as the operands lie (not an empty product)."""
        return self._arguments(a, b, c) is not None

    def product(self, a, b, c):
        """c = a @ b where the library takes the operands as they lie; False (nothing done) where it
        does not. The lean form of `self(a, b, c)`, for products of every run: a few microseconds
        of Python, where numpy's matmul takes two or three."""
        arguments = self._arguments(a, b, c)
        if arguments is None:
            return False
        self._run(a, b, c, 0.0, *arguments)
        return True

    def _arguments(self, a, b, c):
        """(m, n, k, a's, b's and c's layouts) of c = a @ b, or None where the library cannot take
        them as they lie: other dtypes or shapes, a read-only c, an empty product, a layout of
        neither unit-stride rows nor columns (c: rows), a dimension beyond its integers."""
        dtype = self.dtype
        if a.dtype != dtype or b.dtype != dtype or c.dtype != dtype or a.ndim != 2 or c.ndim != 2:
            return None
        m, k = a.shape
        n = c.shape[1]
        if b.shape != (k, n) or c.shape[0] != m or not (m and n and k) or not c.flags.writeable:
            return None
        item = dtype.itemsize
        la, lb, lc = _layout(a, item), _layout(b, item), _layout(c, item)
        if la is None or lb is None or lc is None or lc[0] != NO_TRANS:
            return None
        if max(m, n, k, la[1], lb[1], lc[1]) > self._limit:
            return None
        return m, n, k, la, lb, lc

    def _run(self, a, b, c, beta, m, n, k, la, lb, lc):
        (trans_a, lda), (trans_b, ldb), (_, ldc) = la, lb, lc
        item = self.dtype.itemsize
        if self._gemv is not None and n == 1:  # c's column = a @ b's column
            stored = (m, k) if trans_a == NO_TRANS else (k, m)
            self._matrix_vector(trans_a, stored, address(a), lda, address(b), b.strides[0] // item, beta,
                                address(c), c.strides[0] // item)
        elif self._gemv is not None and m == 1:  # c's row = b^T @ a's row
            stored = (k, n) if trans_b == NO_TRANS else (n, k)
            self._matrix_vector(TRANS if trans_b == NO_TRANS else NO_TRANS, stored, address(b), ldb, address(a),
                                a.strides[1] // item, beta, address(c), c.strides[1] // item)
        elif not self._on_team(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc):
            self._function(ROW_MAJOR, trans_a, trans_b, m, n, k, 1.0, address(a), lda, address(b), ldb,
                           beta, address(c), ldc)

    def _matrix_vector(self, trans, stored, a, lda, x, incx, beta, y, incy):
        """y = op(A) x + beta * y by the library's ?gemv, A (stored: rows, cols) and the vectors at
        addresses; in shares on numba's team where the run is on one and it is large enough
        (TEAM_GEMM_FROM): a memory-bound product of a large weight (VGG-16's three fully connected
        layers at two threads, in one process: 37.3 -> 20.7 ms in all)."""
        shares = parallel.team()
        if shares >= 2 and self._gemv_address is not None and stored[0] * stored[1] >= TEAM_GEMM_FROM:
            from . import jit

            jit.on_team("gemv", shares)(self._gemv_address, self._wide, trans, *stored, a, lda, x, incx,
                                        beta, y, incy)
            return
        self._gemv(ROW_MAJOR, trans, *stored, 1.0, a, lda, x, incx, beta, y, incy)


def _layout(matrix, item):
    """(NO_TRANS or TRANS, leading dimension) of a matrix the library can read as it lies, or None.
    (A vector's one stride may be any whole positive number of items: ?gemv's increment.)"""
    rows, cols = matrix.shape
    row_stride, col_stride = matrix.strides
    if (col_stride == item or cols == 1) and row_stride % item == 0 and row_stride >= max(cols, 1) * item:
        return NO_TRANS, row_stride // item if rows > 1 else max(cols, 1)
    if (row_stride == item or rows == 1) and col_stride % item == 0 and col_stride >= max(rows, 1) * item:
        return TRANS, col_stride // item if cols > 1 else max(rows, 1)
    return None


def _data_field():
    """The address of an array's data, read from the array object itself: numpy's C structure
    (PyArrayObject) holds it first after the object header, as it has since numpy 1.7. Read
    that way it takes 0.25 us; `ndarray.ctypes.data` builds a helper object, 1.8 us, three per
    product. Checked here on views of every kind; where it does not hold, `ctypes.data`."""
    read = ctypes.c_void_p.from_address
    offset = object.__basicsize__

    def address(array):
        return read(id(array) + offset).value

    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    for array in (base, base[1:, 2:], base.T, base[::2, 3:7], np.empty(0), np.zeros((3, 3), np.float64)[1:]):
        if address(array) != array.ctypes.data:
            return lambda array: array.ctypes.data
    return address


address = _data_field()


def matmul(a, b, out):
    """out = a @ b, as np.matmul(a, b, out=out) computes it for operands of two dimensions or
    more, by the library's GEMM where it serves: float32/64 products of at least MATMUL_FROM
    multiply-adds each, operands it reads as they lie, an output that overlaps neither, and batch
    axes that are out's on each operand or absent from it (one product per batch entry), in a run
    on nnrun's own library (`for_run`). Anything else is numpy's, as are 1-D operands."""
    if (a.ndim >= 2 and b.ndim >= 2 and out.ndim == max(a.ndim, b.ndim) and out.size
            and a.shape[-2] * a.shape[-1] * out.shape[-1] >= MATMUL_FROM
            and not np.may_share_memory(out, a) and not np.may_share_memory(out, b)):
        library = for_run()
        gemm = library.gemms.get(out.dtype) if library.own else None
        batch = out.shape[:-2]
        if gemm is not None and a.shape[:-2] in ((), batch) and b.shape[:-2] in ((), batch):
            if not batch:
                if gemm.product(a, b, out):
                    return out
            else:
                def entry(index):
                    return a[index] if a.ndim > 2 else a, b[index] if b.ndim > 2 else b, out[index]
                arguments = gemm._arguments(*entry((0,) * len(batch)))
                if arguments is not None:
                    for index in np.ndindex(*batch):  # every entry's layout is the first's
                        gemm._run(*entry(index), 0.0, *arguments)
                    return out
    np.matmul(a, b, out=out)
    return out


_library = None  # nnrun's own, else numpy's
_numpys = None
_lock = threading.Lock()


def library():
    """nnrun's own Library (numpy's where it is absent, or NNRUN_BLAS=numpy), loaded on first call
    (a library that is not there: name None)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = _load()
    return _library


def is_own(filepath):
    """Whether a library file (threadpoolctl's `filepath`) is nnrun's own, loaded here."""
    own = library()
    return own.own and os.path.basename(filepath) == own.name


def numpys():
    """numpy's Library (`library()` where numpy's has no GEMM nnrun can call)."""
    global _numpys
    if _numpys is None:
        own = library()
        found = _load_numpys() if own.own else own
        with _lock:
            if _numpys is None:
                _numpys = found if found.gemms else own
    return _numpys


def for_run():
    """The Library of the run in progress: nnrun's own where the run is on one thread, numpy's
    where it is on several. On several, two libraries would each keep threads spinning for their
    next product, taking the same cores from each other (PP-OCRv6 det at two threads, both
    libraries on two: 80 ms against 33 ms with numpy's alone; with numpy's pinned to one thread
    while runs last, the set ran 7% slower than on numpy's alone, and silero VAD alternated
    between 0.2 and 0.4 ms a run), while one thread has no threads to spin. A run on numba's team
    (parallel.team) has a pool of one thread: nnrun's own library, its products shared on the team
    (Gemm._on_team)."""
    return library() if parallel.current().threads == 1 else numpys()


def kernel(dtype):
    """The Gemm for `dtype` (float32 or float64) of the run in progress (`for_run`), or None
    where there is no usable library."""
    return for_run().gemms.get(np.dtype(dtype))


def _load():
    if os.environ.get("NNRUN_BLAS", "").strip().lower() != "numpy":
        own = _load_own()
        if own is not None:
            return own
    return _load_numpys()


def _load_own():
    # Found, not imported: importing the package loads the library at once (into the global
    # namespace, and before nnrun could choose its kernels).
    import importlib.util

    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    try:
        names = sorted(f for f in os.listdir(directory) if f.startswith("libscipy_openblas") and
                       f.endswith((".so", ".dylib", ".dll")))
    except OSError:
        return None
    if not names:
        return None
    # Read by the library as it loads: its kernels, and one thread (it serves runs on one thread
    # only, so it starts none of its own that could spin for a next product; threads.py keeps it
    # at one).
    settings = {"OPENBLAS_NUM_THREADS": "1"}
    core = _core_type()
    if core is not None:
        settings["OPENBLAS_CORETYPE"] = core
    before = {name: os.environ.get(name) for name in settings}
    try:
        os.environ.update(settings)
        handle = ctypes.CDLL(os.path.join(directory, names[0]))
    except OSError:
        return None
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    gemms = _gemms(handle, "scipy_cblas_{}gemm", ctypes.c_int32)
    if not gemms:
        return None
    return Library(names[0], _core_name(handle, "scipy_openblas_get_corename"), True, gemms,
                   _transposes(handle, "scipy_cblas_{}omatcopy", ctypes.c_int32))


def _load_numpys():
    # numpy's library, as threadpoolctl finds it among those loaded (threads.controller)
    from ..threads import controller

    for found in controller(refresh=True).lib_controllers:
        if found.user_api != "blas":
            continue
        try:
            handle = ctypes.CDLL(found.filepath)
        except OSError:
            continue
        gemms, transposes = {}, {}
        for pattern in ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_"):
            for dtype, gemm in _gemms(handle, pattern, ctypes.c_int64).items():
                gemms.setdefault(dtype, gemm)
            for dtype, transpose in _transposes(handle, pattern.replace("gemm", "omatcopy"), ctypes.c_int64).items():
                transposes.setdefault(dtype, transpose)
        if gemms:
            return Library(os.path.basename(found.filepath), getattr(found, "architecture", None), False, gemms,
                           transposes)
    return Library(None, None, False, {})


def _gemms(handle, pattern, integer):
    """{dtype: Gemm} of the library's ?gemm symbols named by `pattern` (its ?gemv's by the same
    pattern with "gemv" for "gemm")."""
    gemms = {}
    for dtype, (letter, scalar) in _SCALARS.items():
        function = _bound(handle, pattern.format(letter),
                          [ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer, integer, scalar,
                           ctypes.c_void_p, integer, ctypes.c_void_p, integer, scalar, ctypes.c_void_p, integer])
        if function is None:
            continue
        gemv = _bound(handle, pattern.replace("gemm", "gemv").format(letter),
                      [ctypes.c_int, ctypes.c_int, integer, integer, scalar, ctypes.c_void_p, integer,
                       ctypes.c_void_p, integer, scalar, ctypes.c_void_p, integer])
        gemms[dtype] = Gemm(dtype, function, _largest(integer), gemv)
    return gemms


def _transposes(handle, pattern, integer):
    """{dtype: Transpose} of the library's ?omatcopy symbols named by `pattern` (OpenBLAS's
    extension: (order, trans, rows, cols, alpha, a, lda, b, ldb))."""
    transposes = {}
    for dtype, (letter, scalar) in _SCALARS.items():
        function = _bound(handle, pattern.format(letter), [ctypes.c_int, ctypes.c_int, integer, integer, scalar,
                                                            ctypes.c_void_p, integer, ctypes.c_void_p, integer])
        if function is not None:
            transposes[dtype] = Transpose(function, _largest(integer))
    return transposes


def _bound(handle, name, argtypes):
    """The library's function `name`, returning nothing, its arguments' types set; None where the
    library has none."""
    function = getattr(handle, name, None)
    if function is not None:
        function.restype = None
        function.argtypes = argtypes
    return function


def _largest(integer):
    """The largest dimension or leading dimension the library's integers hold."""
    return (1 << (8 * ctypes.sizeof(integer) - 1)) - 1


def transpose(dtype, largest=0):
    """The Transpose for `dtype` of the run in progress (`for_run`), or None where its library has
    none (not OpenBLAS) or its integers cannot hold `largest` (a matrix's longest side)."""
    found = for_run().transposes.get(np.dtype(dtype))
    return found if found is not None and largest <= found.limit else None


def _core_name(handle, symbol):
    function = getattr(handle, symbol, None)
    if function is None:
        return None
    function.restype = ctypes.c_char_p
    function.argtypes = []
    name = function()
    return name.decode() if name else None


def _core_type(cpuinfo="/proc/cpuinfo"):
    """The OPENBLAS_CORETYPE nnrun's own library is loaded with: "Haswell" on AMD's Zen 4 (family
    25 with AVX-512), None elsewhere, and None where the variable is set (the user's choice)."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None
    try:
        with open(cpuinfo) as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break  # the first processor's fields are enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return None
    zen4 = (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
            and "avx512f" in fields.get("flags", "").split())
    return "Haswell" if zen4 else None
