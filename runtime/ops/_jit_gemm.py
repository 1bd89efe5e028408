"""A convolution's product by its constant weight, compiled (the `jit` extra): out (M, N) =
W (M, K) @ X (K, N), then the bias, a residual and the activation, in one call.

BLAS packs both operands on every call: the weight (M x K, read once from beyond the caches each
run) and the image's columns. On the narrow products of mobile networks (K of 16 to 960, N of 49
to 12,544) OpenBLAS runs at 65-90 GFLOP/s hot on a Zen 4 core and far slower with the weight cold,
as it is in a model. Here the weight is packed once, at PREPARE, in the order the kernel reads it
(`pack`: tiles of MR rows, each (K, MR), the rows padded with zeros to a multiple of TILES_A_TAIL
tiles), and X is read where it lies: a tile of MR rows by NR columns keeps its sums in vector
registers over all of K (with AVX-512F 8 rows x 3 vectors of 16, else 4 rows x 6 vectors of 8),
each step one broadcast weight a row and a vector load of X's row a vector of columns, then
writes bias, residual and activation with the sums. The tile is written in LLVM's IR
(an `intrinsic`): numba's loops over a local array of sums stay in memory, at a tenth of the
speed. LLVM picks the instructions for the machine numba compiles for (on x86, AVX2 and FMA are
required: jit.tiled_product_kernel checks).

Columns are taken in chunks whose rows of X stay in L2 while every tile of the weight passes over
them; the last N % 8 columns (a 7x7 image's 49th) by `_tail`, TILES_A_TAIL tiles at once so that
its sums are independent chains.

X's rows are `ldx` elements apart (a pointwise convolution's image, a band of it), or *gathered*:
each row where an array of offsets says (a convolution's (tap, channel) rows of K, each a view
of a padded tile or of phase planes shifted by the tap: conv_core.with_tiles, with_phases; an
output row at a time into the output by `phase_rows`, which fills the rows of the planes it reads).

Sums are in a different order than BLAS's (and fused multiply-adds), so results differ from the
library's in the last bits, as one BLAS's differ from another's.

`blas_call` (an intrinsic) calls a BLAS library's cblas_sgemm, sgemv or somatcopy at its address:
_jit_team.py runs such calls, and `product`, in shares on numba's team of threads.

Imported only through `jit.py` (see _jit_depthwise.py for why the leading underscore). numba
caches against this file only what it inlines from _jit_activation, _jit_depthwise and _jit_vector: after
editing those, clear this module's __pycache__ as well.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ._jit_activation import activate
from ._jit_depthwise import fill_rows_zeroed
from ._jit_vector import I64, PTR, WIDEST, activated, each_activation, element_at, splat, sums_over

LANES = 8          # columns a step of a tile's width: a vector of 8 float32 (AVX2's), the tail's bound
NV = 6             # steps of LANES columns a tile
NR = NV * LANES    # columns a tile
CHUNK = 1 << 15    # floats of X's rows a chunk of columns keeps (128 KB, in L2)

_F32 = ir.FloatType()


# The tile's shape by the vector registers: with AVX-512F's 32 registers of 16 floats, 8 rows x 3
# vectors (24 sums), else (AVX2's 16 of 8) 4 rows x 6. Against 4 x 3 of 16, 8 x 3 read X's rows half
# as often: MobileNetV2's pointwise shapes 1.1-1.5x faster (Xeon, one thread; docs/BENCHMARKS.md).
MR = 8 if WIDEST == 16 else 4          # rows of the weight a tile
TILES_A_TAIL = 32 // MR                # tiles whose sums `_tail` keeps at once (the packed rows padded to this many)
TAIL_SCRATCH = LANES * MR * TILES_A_TAIL  # floats the tail's sums take (`product`'s `tail`)
FORM = f"tiles{MR}"                    # the weight cache's name of `pack`'s layout


def _widths(steps):
    """The vectors a tile of `steps` x LANES columns keeps a row's sums in: the widest first."""
    per = WIDEST // LANES
    return [WIDEST] * (steps // per) + [LANES] * (steps % per)


def pack(w, m, k):
    """The weight (M, K) as the kernel reads it: (tiles, K, MR), rows padded with zeros to a
    multiple of MR * TILES_A_TAIL. w is (M, K) or (M, ...) of K elements a row, in any strides
    (a transposed view: K in another order); written straight into the tiles, so that packing
    holds no copy of the weight beside them (with two copies, ResNet-50's VmHWM with its 3x3s
    packed was 342 MB, now 329; 313 with them im2col's, reading the mapped weight)."""
    w = np.asarray(w)
    inner = w.shape[1:]
    rows = -(-m // (MR * TILES_A_TAIL)) * MR * TILES_A_TAIL
    tiles = np.zeros((rows // MR, k, MR), np.float32)
    rows_of = np.moveaxis(tiles.reshape(rows // MR, *inner, MR), -1, 1)  # (tiles, MR, ...): a view
    whole = m // MR
    rows_of[:whole] = w[:whole * MR].reshape(whole, MR, *inner)
    if m % MR:
        rows_of[whole, :m % MR] = w[whole * MR:m]
    return tiles


def _at(builder, base, offset):
    return element_at(builder, base, offset, _F32)


def _row(builder, x, step, ldx, gathered):
    """Where row `step` of X starts: `ldx` elements apart, or (`gathered`) at the offset the int64
    array at address `ldx` holds for it."""
    if not gathered:
        return _at(builder, x, builder.mul(step, ldx))
    offsets = builder.inttoptr(ldx, PTR)
    return _at(builder, x, builder.load(builder.gep(offsets, [step], source_etype=I64), typ=I64, align=8))


def _tile(nv, gathered):
    """The intrinsic of a tile of MR rows by nv x LANES columns, over all of K, with its epilogue."""
    @intrinsic
    def tile(typingctx, w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k):
        sig = types.void(types.uintp, types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.uintp,
                         types.boolean, types.intp, types.intp, types.float32, types.float32, types.intp)

        def codegen(context, builder, signature, args):
            w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k = args
            w, x, out, bias, residual = (builder.inttoptr(a, PTR) for a in (w, x, out, bias, residual))
            widths = _widths(nv)
            vectors = [ir.VectorType(_F32, width) for width in widths]
            starts = [sum(widths[:b]) for b in range(len(widths))]

            def load_w(step, a, vector):
                value = builder.load(_at(builder, w, builder.add(builder.mul(step, ir.Constant(I64, MR)),
                                                                 ir.Constant(I64, a))), typ=_F32, align=4)
                return splat(builder, value, vector.count)

            def load_x(step, b):
                return builder.load(_at(builder, _row(builder, x, step, ldx, gathered), starts[b]), typ=vectors[b],
                                    align=4)
            sums = sums_over(builder, vectors, k, load_w, load_x, MR)

            def epilogue(kind):
                for a in range(MR):
                    with builder.if_then(builder.icmp_signed(">", rows, ir.Constant(I64, a))):
                        offset = builder.mul(ir.Constant(I64, a), ldo)
                        bias_a = builder.load(_at(builder, bias, a), typ=_F32, align=4)
                        for b, vector in enumerate(vectors):
                            width = vector.count
                            at = builder.add(offset, ir.Constant(I64, starts[b]))
                            v = builder.fadd(sums[a][b], splat(builder, bias_a, width))
                            r = builder.load(_at(builder, residual, at), typ=vector, align=4)
                            v = builder.fadd(v, builder.select(has_residual, r, ir.Constant(vector, [0.0] * width)))
                            v = activated(builder, v, kind, splat(builder, p0, width), splat(builder, p1, width))
                            builder.store(v, _at(builder, out, at), align=4)
            each_activation(builder, mode, epilogue)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def _tail(columns, gathered):
    """The intrinsic of `columns` (< LANES) columns by TILES_A_TAIL tiles over all of K: the sums
    only, into `sums` (float32) at [column * MR * TILES_A_TAIL + tile * MR + row]."""
    @intrinsic
    def tail(typingctx, w, x, ldx, sums, k):
        sig = types.void(types.uintp, types.uintp, types.intp, types.uintp, types.intp)

        def codegen(context, builder, signature, args):
            w, x, ldx, sums_at, k = args
            w, x, sums_at = (builder.inttoptr(a, PTR) for a in (w, x, sums_at))
            vector = ir.VectorType(_F32, MR)
            tile_size = builder.mul(k, ir.Constant(I64, MR))

            def load_w(step, t, vector):
                at = builder.add(builder.mul(tile_size, ir.Constant(I64, t)), builder.mul(step, ir.Constant(I64, MR)))
                return builder.load(_at(builder, w, at), typ=vector, align=4)

            def load_x(step, c):
                value = builder.load(_at(builder, _row(builder, x, step, ldx, gathered), c), typ=_F32, align=4)
                return splat(builder, value, MR)
            sums = sums_over(builder, [vector] * columns, k, load_w, load_x, TILES_A_TAIL)
            for t in range(TILES_A_TAIL):
                for c in range(columns):
                    builder.store(sums[t][c], _at(builder, sums_at, (c * TILES_A_TAIL + t) * MR), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return tail


_tile6, _tile5, _tile4, _tile3, _tile2, _tile1 = (_tile(nv, False) for nv in (6, 5, 4, 3, 2, 1))
_tail1, _tail2, _tail3, _tail4, _tail5, _tail6, _tail7 = (_tail(c, False) for c in range(1, 8))
_rows6, _rows5, _rows4, _rows3, _rows2, _rows1 = (_tile(nv, True) for nv in (6, 5, 4, 3, 2, 1))
_rows_tail1, _rows_tail2, _rows_tail3, _rows_tail4, _rows_tail5, _rows_tail6, _rows_tail7 = (
    _tail(c, True) for c in range(1, 8))


@njit(nogil=True, cache=True, boundscheck=False)
def _tiles(w, x, ldx, gathered, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k, vectors):
    # one call of the tile of `vectors` (1..NV) vectors of columns
    if gathered:
        if vectors == 6:
            _rows6(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
        elif vectors == 5:
            _rows5(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
        elif vectors == 4:
            _rows4(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
        elif vectors == 3:
            _rows3(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
        elif vectors == 2:
            _rows2(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
        elif vectors == 1:
            _rows1(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
    elif vectors == 6:
        _tile6(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
    elif vectors == 5:
        _tile5(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
    elif vectors == 4:
        _tile4(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
    elif vectors == 3:
        _tile3(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
    elif vectors == 2:
        _tile2(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)
    elif vectors == 1:
        _tile1(w, x, ldx, out, ldo, bias, residual, has_residual, rows, mode, p0, p1, k)


@njit(nogil=True, cache=True, boundscheck=False)
def _tail_sums(w, x, ldx, gathered, sums, k, columns):
    if gathered:
        if columns == 1:
            _rows_tail1(w, x, ldx, sums, k)
        elif columns == 2:
            _rows_tail2(w, x, ldx, sums, k)
        elif columns == 3:
            _rows_tail3(w, x, ldx, sums, k)
        elif columns == 4:
            _rows_tail4(w, x, ldx, sums, k)
        elif columns == 5:
            _rows_tail5(w, x, ldx, sums, k)
        elif columns == 6:
            _rows_tail6(w, x, ldx, sums, k)
        elif columns == 7:
            _rows_tail7(w, x, ldx, sums, k)
    elif columns == 1:
        _tail1(w, x, ldx, sums, k)
    elif columns == 2:
        _tail2(w, x, ldx, sums, k)
    elif columns == 3:
        _tail3(w, x, ldx, sums, k)
    elif columns == 4:
        _tail4(w, x, ldx, sums, k)
    elif columns == 5:
        _tail5(w, x, ldx, sums, k)
    elif columns == 6:
        _tail6(w, x, ldx, sums, k)
    elif columns == 7:
        _tail7(w, x, ldx, sums, k)


@intrinsic
def _floats(typingctx, address):
    """The float32 pointer at an address, for reading by index."""
    sig = types.CPointer(types.float32)(types.uintp)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


# Compiled for these types only, so that no run compiles another specialisation: the operands
# read (weight, x, bias, residual: arrays of the file's, of the caller's, read-only or not) by
# their addresses, out a view whose rows may be apart (a band of an image).
@njit("void(uintp, uintp, int64, boolean, int64, uintp, float32[:, :], uintp, boolean, int64, float32, float32, "
      "int64, int64, int64, int64, float32[::1])", nogil=True, cache=True, boundscheck=False)
def product(w, x, ldx, gathered, k, bias, out, residual, has_residual, mode, p0, p1, t0, t1, c0, c1, tail):
    """out[rows of tiles t0..t1, columns c0..c1] = activation(w @ x + bias + residual).

    At their addresses: w, `pack`'s (tiles, K, MR) float32; x (K, N) float32, each row contiguous,
    `ldx` elements apart, or where `gathered` at the offsets (elements from x, int64) of an array of
    K at address `ldx` (a shifted convolution's taps, each an offset view of the padded image); bias
    (M,) (zeros for none); residual (M, N) like out (each row contiguous, as far apart as out's),
    added where `has_residual`. mode, p0, p1 the activation
    (jit.activation_mode). t0 a multiple of TILES_A_TAIL; c0 a multiple of LANES, c1 one or N.
    `tail`: scratch of TAIL_SCRATCH, used where c1 - c0 is not a multiple of LANES."""
    m = out.shape[0]
    ldo = out.strides[0] // 4
    t1 = min(t1, -(-m // MR))
    ends = c0 + (c1 - c0) // LANES * LANES
    chunk = max(NR, CHUNK // max(k, 1) // NR * NR)
    oa = out.ctypes.data
    tile_bytes = k * MR * 4
    for a in range(c0, ends, chunk):
        b = min(a + chunk, ends)
        for t in range(t0, t1):
            rows = min(MR, m - t * MR)
            first = t * MR * ldo
            col = a
            while col + NR <= b:
                _tiles(w + t * tile_bytes, x + col * 4, ldx, gathered, oa + (first + col) * 4, ldo, bias + t * MR * 4,
                       residual + (first + col) * 4, has_residual, rows, mode, p0, p1, k, NV)
                col += NR
            if col < b:
                _tiles(w + t * tile_bytes, x + col * 4, ldx, gathered, oa + (first + col) * 4, ldo, bias + t * MR * 4,
                       residual + (first + col) * 4, has_residual, rows, mode, p0, p1, k, (b - col) // LANES)
    columns = c1 - ends
    if columns == 0:
        return
    zero, one = out.dtype.type(0), out.dtype.type(1)
    biases, added = _floats(bias), _floats(residual)
    for t in range(t0, t1, TILES_A_TAIL):
        _tail_sums(w + t * tile_bytes, x + ends * 4, ldx, gathered, tail.ctypes.data, k, columns)
        for u in range(min(TILES_A_TAIL, t1 - t)):
            for i in range(MR):
                row = (t + u) * MR + i
                if row >= m:
                    break
                for c in range(columns):
                    v = tail[(c * TILES_A_TAIL + u) * MR + i] + biases[row]
                    if has_residual:
                        v += added[row * ldo + ends + c]
                    out[row, ends + c] = activate(v, mode, p0, p1, zero, one)



@njit(nogil=True, cache=True, boundscheck=False)
def phase_rows(w, planes, image, fills, plane_w, plane_size, rows_at, k, bias, out, mode, p0, p1, first, r0, r1,
               tail):
    """Output rows [r0, r1) of a convolution over phase planes (conv_core.PhaseProduct; a stride-1
    one's padded tile of rows from `first` on, one plane a channel: conv_core.ShiftedGemm), into
    out (Cout, OH, OW) as it lies: each channel's plane rows those output rows read filled, with
    their padding (_jit_depthwise.fill_rows_zeroed), then each output row r the product of the
    planes' rows at `rows_at` (K offsets, int64) from plane row r - first, by the weight packed
    (`pack`) at address w, with the bias at address `bias` (zeros for none) and the activation.
    Shares of other rows may run at once on other threads: the planes' rows both read are written
    by both, with the same values."""
    width = out.shape[2]
    per_channel = fills.shape[0] * plane_size
    lo, hi = plane_size, 0  # the plane rows read: from the first row's lowest tap to the last's highest
    for t in range(rows_at.shape[0]):
        within = rows_at[t] % plane_size
        lo = min(lo, (within + (r0 - first) * plane_w) // plane_w)
        hi = max(hi, (within + (r1 - 1 - first) * plane_w + width - 1) // plane_w + 1)
    hi = min(hi, plane_size // plane_w)
    for c in range(image.shape[0]):
        fill_rows_zeroed(planes[c * per_channel:(c + 1) * per_channel], image[c], fills, plane_w, plane_size, lo, hi)
    tiles = -(-out.shape[0] // MR)
    at = planes.ctypes.data
    for r in range(r0, r1):
        product(w, at + (r - first) * plane_w * 4, rows_at.ctypes.data, True, k, bias, out[:, r], 0, False, mode, p0,
                p1, 0, tiles, 0, width, tail)

@njit(nogil=True, cache=True, boundscheck=False)
def scatter_taps(cols, bias, has_bias, out, row0, c0, c1):
    """A transposed convolution's taps that do not overlap (2-D, kernel = strides: a U-Net's 2x2
    up-convolution) into its output, channels [c0, c1): out[c, (row0 + r) * kh + i, q * kw + j] =
    cols[c, i, j, r, q] + bias[c] (where `has_bias`); cols (C, kh, kw, rows, W) the product's
    columns of rows [row0, row0 + rows) of the input, out (C, OH, OW). numpy's strided copy of a
    tap took ~1 ns an element, most of such a convolution's time."""
    kh, kw, rows, width = cols.shape[1], cols.shape[2], cols.shape[3], cols.shape[4]
    zero = out.dtype.type(0)
    for c in range(c0, c1):
        b = bias[c] if has_bias else zero
        for i in range(kh):
            for r in range(rows):
                dst = out[c, (row0 + r) * kh + i]
                if kw == 2:  # two taps' rows interleaved
                    a, z = cols[c, i, 0, r], cols[c, i, 1, r]
                    for q in range(width):
                        dst[2 * q] = a[q] + b
                        dst[2 * q + 1] = z[q] + b
                else:
                    for j in range(kw):
                        src = cols[c, i, j, r]
                        for q in range(width):
                            dst[q * kw + j] = src[q] + b


# The arguments of the CBLAS functions compiled kernels call at their addresses (blas_call): an
# enumeration (an int), the library's integer, a float, a pointer.
_ENUM, _INT, _FLOAT, _POINTER = "enum", "int", "float", "pointer"
_CBLAS = {
    # cblas_sgemm: order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
    "gemm": (_ENUM, _ENUM, _ENUM, _INT, _INT, _INT, _FLOAT, _POINTER, _INT, _POINTER, _INT, _FLOAT, _POINTER, _INT),
    # cblas_sgemv: order, trans, rows, cols, alpha, a, lda, x, incx, beta, y, incy
    "gemv": (_ENUM, _ENUM, _INT, _INT, _FLOAT, _POINTER, _INT, _POINTER, _INT, _FLOAT, _POINTER, _INT),
    # cblas_somatcopy (OpenBLAS's extension): order, trans, rows, cols, alpha, a, lda, b, ldb
    "omatcopy": (_ENUM, _ENUM, _INT, _INT, _FLOAT, _POINTER, _INT, _POINTER, _INT),
}


def blas_call(name, bits):
    """The intrinsic calling a BLAS library's float32 CBLAS function `name` ("gemm", "gemv",
    "omatcopy": _CBLAS) at an address, its integers of `bits` (32 for nnrun's own library, 64 for
    numpy's): (function, then the function's arguments: enumerations and integers as int64,
    scalars as float32, the matrices and vectors at addresses)."""
    kinds = _CBLAS[name]
    integer = ir.IntType(bits)
    i32 = ir.IntType(32)
    typed = {_ENUM: (types.int64, i32), _INT: (types.int64, integer), _FLOAT: (types.float32, _F32),
             _POINTER: (types.uintp, PTR)}

    @intrinsic
    def call(typingctx, function, *arguments):
        sig = types.void(types.uintp, types.StarArgTuple.from_types([typed[kind][0] for kind in kinds]))

        def codegen(context, builder, signature, args):
            kind = ir.FunctionType(ir.VoidType(), [typed[k][1] for k in kinds])
            target = builder.inttoptr(args[0], kind.as_pointer())
            values = []
            for i, k in enumerate(kinds):
                value = builder.extract_value(args[1], i)
                if k == _POINTER:
                    value = builder.inttoptr(value, PTR)
                elif k != _FLOAT and typed[k][1].width < 64:
                    value = builder.trunc(value, typed[k][1])
                values.append(value)
            builder.call(target, values)
            return context.get_dummy_value()
        return sig, codegen
    return call
