"""Explicit vector code for the compiled kernels (the `jit` extra), written in LLVM's IR through
numba `intrinsic`s: where numba's loops leave speed behind. LLVM vectorises a numba loop to the
width it prefers (256 bits on the x86 CPUs that have AVX-512) and keeps a multiply and an add
apart (no fused multiply-add without fastmath); here the vectors are the CPU's widest and the
sums fused multiply-adds.

`WIDEST` is the float32 lanes of the widest vector of the CPU numba compiles for (16 with
AVX-512F, else 8); `splat`, `element_at`, `fma`, `activated` the pieces the kernels' IR is made of
(_jit_gemm's tiles); `nine_taps_row` a 3x3 depthwise convolution's output row from nine shifted
rows of its planes, `nine_taps_pixels` one from a padded image channels last (_jit_depthwise).

Imported only through the kernels' modules, which `jit.py` imports once numba is known to be
there (see _jit_depthwise.py for why the leading underscore). numba caches the kernels that inline
these against their own files only: after editing this one, clear the __pycache__ of _jit_gemm
and _jit_depthwise as well.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import CLAMP, HARD_SIGMOID, HARD_SWISH, LEAKY, target_features

I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()


def _widest_vector():
    """float32 lanes of the widest vector registers of the CPU numba compiles for: 16 where x86 has
    AVX-512F, else 8 (where a machine has neither, LLVM splits the vectors as it must)."""
    return 16 if "+avx512f" in (target_features() or ()) else 8


WIDEST = _widest_vector()


def splat(builder, value, width):
    """A vector of `width` copies of the scalar `value`."""
    vector = ir.VectorType(value.type, width)
    first = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(first, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(I32, width), [0] * width))


def untyped(builder, pointer):
    """`pointer` (numba's arrays' typed pointers) as LLVM's opaque pointer, to address by element_at."""
    return builder.inttoptr(builder.ptrtoint(pointer, I64), PTR)


def element_at(builder, base, offset, element):
    """The address of element `offset` (an int64 value or a Python int) of type `element` from `base`."""
    offset = offset if isinstance(offset, ir.Value) else ir.Constant(I64, offset)
    return builder.gep(base, [offset], source_etype=element)


def fma(builder, vector):
    """LLVM's fused multiply-add of `vector`s: a function to call with (a, b, c) for a * b + c."""
    name = f"llvm.fma.v{vector.count}{'f32' if vector.element == ir.FloatType() else 'f64'}"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3), name)


def activated(builder, v, mode, p0, p1):
    """The vector v through the activation `mode` (a constant of jit's) with parameters p0, p1
    (vectors like v), as _jit_activation.activate computes it (no fused multiply-add; NaN stays
    NaN under a clamp)."""
    vector = v.type
    zero = ir.Constant(vector, [0.0] * vector.count)
    if mode == CLAMP:
        v = builder.select(builder.fcmp_ordered("<", v, p0), p0, v)
        return builder.select(builder.fcmp_ordered(">", v, p1), p1, v)
    if mode == LEAKY:
        return builder.select(builder.fcmp_ordered(">=", v, zero), v, builder.fmul(v, p0))
    one = ir.Constant(vector, [1.0] * vector.count)
    f = builder.fadd(builder.fmul(v, p0), p1)
    f = builder.select(builder.fcmp_ordered("<", f, zero), zero, f)
    f = builder.select(builder.fcmp_ordered(">", f, one), one, f)
    return builder.fmul(v, f) if mode == HARD_SWISH else f


def _masked(builder, vector, what):
    """LLVM's masked load or store of `vector`s (what: "load" or "store")."""
    mask = ir.VectorType(ir.IntType(1), vector.count)
    suffix = f"v{vector.count}{'f32' if vector.element == ir.FloatType() else 'f64'}.p0"
    if what == "load":
        kind = ir.FunctionType(vector, [PTR, I32, mask, vector])
    else:
        kind = ir.FunctionType(ir.VoidType(), [vector, PTR, I32, mask])
    return cgutils.get_or_insert_function(builder.module, kind, f"llvm.masked.{what}.{suffix}")


def sums_over(builder, vectors, k, load_w, load_x, count_w):
    """The loop over steps s < k (an int64 value) of `count_w` x len(vectors) vector sums, acc[a][b] +=
    load_w(s, a, vectors[b]) * load_x(s, b) by fused multiply-adds, sum b of type vectors[b]; returns
    them after the loop (zero where k is 0): a product's tile over K (_jit_gemm), a depthwise row's
    taps (`taps_row`)."""
    count_x = len(vectors)
    fmas = [fma(builder, v) for v in vectors]
    zeros = [ir.Constant(v, [0.0] * v.count) for v in vectors]
    before = builder.block
    loop = builder.function.append_basic_block("sums")
    after = builder.function.append_basic_block("summed")
    builder.cbranch(builder.icmp_signed(">", k, ir.Constant(I64, 0)), loop, after)
    builder.position_at_end(loop)
    step = builder.phi(I64)
    step.add_incoming(ir.Constant(I64, 0), before)
    acc = [[builder.phi(v) for v in vectors] for _ in range(count_w)]
    for row in acc:
        for b, p in enumerate(row):
            p.add_incoming(zeros[b], before)
    xs = [load_x(step, b) for b in range(count_x)]
    new = []
    for a in range(count_w):
        new.append([builder.call(fmas[b], [load_w(step, a, vectors[b]), xs[b], acc[a][b]]) for b in range(count_x)])
    following = builder.add(step, ir.Constant(I64, 1))
    end = builder.block
    step.add_incoming(following, end)
    for a in range(count_w):
        for b in range(count_x):
            acc[a][b].add_incoming(new[a][b], end)
    builder.cbranch(builder.icmp_signed("<", following, k), loop, after)
    builder.position_at_end(after)
    done = []
    for a in range(count_w):
        row = []
        for b in range(count_x):
            p = builder.phi(vectors[b])
            p.add_incoming(zeros[b], before)
            p.add_incoming(new[a][b], end)
            row.append(p)
        done.append(row)
    return done



def each_activation(builder, mode, write):
    """write(kind) under `if mode == kind` for each activation kind: a kernel's epilogue compiled
    once per kind, chosen by the run's `mode` (jit.activation_mode)."""
    for kind in (CLAMP, LEAKY, HARD_SIGMOID, HARD_SWISH):
        with builder.if_then(builder.icmp_signed("==", mode, ir.Constant(I64, kind))):
            write(kind)


def tail_access(builder, vector, count):
    """(load, store) of the first `count` (an int64 value, < the vector's lanes) lanes of a `vector`
    at an address, the other lanes neither read nor written (LLVM's masked load and store): a row's
    last, partial vector. load(at) gives zeros in the lanes left out; store(v, at)."""
    width = vector.count
    lanes = ir.Constant(ir.VectorType(I64, width), list(range(width)))
    mask = builder.icmp_signed("<", lanes, splat(builder, count, width))
    masked_load, masked_store = _masked(builder, vector, "load"), _masked(builder, vector, "store")
    zero = ir.Constant(vector, [0.0] * width)

    def load(at):
        return builder.call(masked_load, [at, ir.Constant(I32, 1), mask, zero])

    def store(v, at):
        builder.call(masked_store, [v, at, ir.Constant(I32, 1), mask])
    return load, store


def plain_access(builder, vector):
    """(load, store) of a whole `vector` at an address, unaligned: load(at); store(v, at)."""
    def load(at):
        return builder.load(at, typ=vector, align=1)

    def store(v, at):
        builder.store(v, at, align=1)
    return load, store


# Vectors of a row `taps_row` sums at once (a block) where the taps are a loop: independent chains
# of fused multiply-adds, each tap's weight and offset loaded once for all of them.
ROW_BLOCK = 4


def _taps_row(fixed):
    """The intrinsic `taps_row` of `fixed` taps (their addresses and weights set once for the row,
    the sums unrolled over them, a vector at a time), or of any number (None: a loop over the
    taps, ROW_BLOCK vectors a pass)."""
    @intrinsic
    def taps_row(typingctx, planes, offsets, w, row, start, bias, mode, p0, p1):
        if not (isinstance(planes, types.Array) and planes.dtype in (types.float32, types.float64)
                and row.dtype == w.dtype == planes.dtype):
            return None
        sig = types.void(planes, offsets, w, row, start, bias, mode, p0, p1)

        def codegen(context, builder, signature, args):
            planes_v, offsets_v, w_v, row_v, start_v, bias_v, mode_v, p0_v, p1_v = args
            arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in range(4)]
            planes_a, offsets_a, w_a, row_a = arrays
            element = context.get_value_type(signature.args[0].dtype)
            single = signature.args[0].dtype == types.float32
            width = WIDEST if single else WIDEST // 2
            vector = ir.VectorType(element, width)
            w_step = builder.sdiv(cgutils.unpack_tuple(builder, w_a.strides, 1)[0],
                                  ir.Constant(I64, 4 if single else 8))
            n = cgutils.unpack_tuple(builder, row_a.shape, 1)[0]
            base, offsets, weights = (untyped(builder, a.data) for a in (planes_a, offsets_a, w_a))
            out = untyped(builder, row_a.data)
            b, lo, hi = (splat(builder, value, width) for value in (bias_v, p0_v, p1_v))
            per_pass = 1 if fixed else ROW_BLOCK
            block = per_pass * width
            blocks = builder.mul(builder.sdiv(n, ir.Constant(I64, block)), ir.Constant(I64, block))
            whole = builder.mul(builder.sdiv(n, ir.Constant(I64, width)), ir.Constant(I64, width))
            left = builder.sub(n, whole)
            tail_load, tail_store = tail_access(builder, vector, left)

            def weight(t):
                at = element_at(builder, weights, builder.mul(t, w_step), element)
                return splat(builder, builder.load(at, typ=element), width)

            def tap_at(t):
                begin = builder.load(element_at(builder, offsets, t, I64), typ=I64)
                return builder.add(begin, start_v)
            if fixed:
                taps = [(tap_at(ir.Constant(I64, t)), weight(ir.Constant(I64, t))) for t in range(fixed)]

            def sums(k, count, load):
                """The sums of `count` vectors from column k, over the taps."""
                if fixed:
                    add, v = fma(builder, vector), ir.Constant(vector, [0.0] * width)
                    for at, w_t in taps:
                        v = builder.call(add, [w_t, load(element_at(builder, base, builder.add(at, k), element)), v])
                    return [v]

                def load_x(t, u):
                    at = builder.add(tap_at(t), builder.add(k, ir.Constant(I64, u * width)))
                    return load(element_at(builder, base, at, element))
                count_taps = cgutils.unpack_tuple(builder, offsets_a.shape, 1)[0]
                return sums_over(builder, [vector] * count, count_taps, lambda t, a, _: weight(t), load_x, 1)[0]

            def write(k, count, load, store):
                values = sums(k, count, load)

                def each(kind):
                    for u, v in enumerate(values):
                        at = element_at(builder, out, builder.add(k, ir.Constant(I64, u * width)), element)
                        store(activated(builder, builder.fadd(v, b), kind, lo, hi), at)
                each_activation(builder, mode_v, each)

            plain_load, plain_store = plain_access(builder, vector)
            with cgutils.for_range_slice(builder, ir.Constant(I64, 0), blocks, ir.Constant(I64, block)) as (k, _):
                write(k, per_pass, plain_load, plain_store)
            if not fixed:
                with cgutils.for_range_slice(builder, blocks, whole, ir.Constant(I64, width)) as (k, _):
                    write(k, 1, plain_load, plain_store)
            with builder.if_then(builder.icmp_signed(">", left, ir.Constant(I64, 0))):
                write(whole, 1, tail_load, tail_store)
            return context.get_dummy_value()
        return sig, codegen
    return taps_row


# row[k] = the activation `mode` (p0, p1) of sum over taps t of w[t] * planes[offsets[t] + start + k]
# + bias, for every k of row: a depthwise convolution's output row straight from a channel's flat
# phase planes (_jit_depthwise.depthwise), with no sums kept between. Vectors of the CPU's widest,
# each tap a fused multiply-add, the last vector masked; the activation as _jit_activation.activate's.
# planes: a contiguous 1-D float array; offsets: int64, each tap's start in it; w: the taps' weights,
# 1-D, strided; row: contiguous, of planes' type. Nine taps (3x3) unrolled, any other count a loop.
nine_taps_row = _taps_row(9)
taps_row = _taps_row(None)


@intrinsic
def nine_taps_pixels(typingctx, padded, w, bias, has_bias, result, start, col_step, right, down, out_start,
                     cols, pixel, channels, n, mode, p0, p1):
    """One output row of a 3x3 depthwise convolution channels last (_jit_depthwise's small images):
    for each of its `cols` pixels q and channels c < n, result[out_start + q * pixel + c] = the
    activation `mode` (p0, p1) of bias[c] (where `has_bias`) + sum over the taps (i, j) of
    w[(3i + j) * channels + c] * padded[start + q * col_step + i * down + j * right + c]. Channels
    in vectors of the CPU's widest (the last masked), each vector's nine weights and bias held in
    registers across the row, each tap a fused multiply-add. padded, result: contiguous 1-D float
    arrays of one type; w (taps * channels, tap-major) and bias of it too, from the block's first
    channel (slices)."""
    if not (isinstance(padded, types.Array) and padded.dtype in (types.float32, types.float64)
            and result == padded and w.dtype == bias.dtype == padded.dtype):
        return None
    sig = types.void(padded, w, bias, has_bias, result, start, col_step, right, down, out_start, cols, pixel,
                     channels, n, mode, p0, p1)

    def codegen(context, builder, signature, args):
        (padded_v, w_v, bias_v, has_bias_v, result_v, start_v, col_step_v, right_v, down_v, out_start_v, cols_v,
         pixel_v, channels_v, n_v, mode_v, p0_v, p1_v) = args
        data = [untyped(builder, context.make_array(signature.args[i])(context, builder, args[i]).data)
                for i in (0, 1, 2, 4)]
        image, weights, biases, out = data
        element = context.get_value_type(signature.args[0].dtype)
        width = WIDEST if signature.args[0].dtype == types.float32 else WIDEST // 2
        vector = ir.VectorType(element, width)
        add = fma(builder, vector)
        zero = ir.Constant(vector, [0.0] * width)
        lo, hi = splat(builder, p0_v, width), splat(builder, p1_v, width)
        whole = builder.mul(builder.sdiv(n_v, ir.Constant(I64, width)), ir.Constant(I64, width))
        left = builder.sub(n_v, whole)
        tail_load, tail_store = tail_access(builder, vector, left)
        offsets = [builder.add(builder.mul(ir.Constant(I64, i), down_v), builder.mul(ir.Constant(I64, j), right_v))
                   for i in range(3) for j in range(3)]

        def channels_of(c, load, store, kind):
            taps = [load(element_at(builder, weights, builder.add(builder.mul(ir.Constant(I64, t), channels_v), c),
                                    element)) for t in range(9)]
            b = builder.select(has_bias_v, load(element_at(builder, biases, c, element)), zero)
            with cgutils.for_range(builder, cols_v) as loop:
                q = loop.index
                base = builder.add(builder.add(start_v, builder.mul(q, col_step_v)), c)
                v = b
                for weight, offset in zip(taps, offsets):
                    pixel = load(element_at(builder, image, builder.add(base, offset), element))
                    v = builder.call(add, [weight, pixel, v])
                at = builder.add(builder.add(out_start_v, builder.mul(q, pixel_v)), c)
                store(activated(builder, v, kind, lo, hi), element_at(builder, out, at, element))

        plain_load, plain_store = plain_access(builder, vector)
        def each(kind):
            with cgutils.for_range_slice(builder, ir.Constant(I64, 0), whole, ir.Constant(I64, width)) as (c, _):
                channels_of(c, plain_load, plain_store, kind)
            with builder.if_then(builder.icmp_signed(">", left, ir.Constant(I64, 0))):
                channels_of(whole, tail_load, tail_store, kind)
        each_activation(builder, mode_v, each)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def nine_taps_two_rows(typingctx, planes, offsets, w, row, below, start, step, bias, mode, p0, p1):
    """`nine_taps_row` of two output rows at once: `row` from `start`, `below` from start + step,
    where each tap t < 6 of the row below reads what tap t + 3 of the row above does (a 3x3 window
    at stride 1: offsets[t + 3] == offsets[t] + step, which the caller has made sure of). Twelve
    loads a vector of both rows where two rows apart take eighteen."""
    if not (isinstance(planes, types.Array) and planes.dtype in (types.float32, types.float64)
            and row.dtype == below.dtype == w.dtype == planes.dtype):
        return None
    sig = types.void(planes, offsets, w, row, below, start, step, bias, mode, p0, p1)

    def codegen(context, builder, signature, args):
        planes_v, offsets_v, w_v, row_v, below_v, start_v, step_v, bias_v, mode_v, p0_v, p1_v = args
        arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in range(5)]
        planes_a, offsets_a, w_a, row_a, below_a = arrays
        element = context.get_value_type(signature.args[0].dtype)
        single = signature.args[0].dtype == types.float32
        width = WIDEST if single else WIDEST // 2
        vector = ir.VectorType(element, width)
        w_step = builder.sdiv(cgutils.unpack_tuple(builder, w_a.strides, 1)[0], ir.Constant(I64, 4 if single else 8))
        n = cgutils.unpack_tuple(builder, row_a.shape, 1)[0]
        base, offsets, weights = (untyped(builder, a.data) for a in (planes_a, offsets_a, w_a))
        outs = [untyped(builder, a.data) for a in (row_a, below_a)]
        b, lo, hi = (splat(builder, value, width) for value in (bias_v, p0_v, p1_v))
        whole = builder.mul(builder.sdiv(n, ir.Constant(I64, width)), ir.Constant(I64, width))
        left = builder.sub(n, whole)
        tail_load, tail_store = tail_access(builder, vector, left)
        add, zero = fma(builder, vector), ir.Constant(vector, [0.0] * width)

        def at_tap(t, extra):
            begin = builder.load(element_at(builder, offsets, ir.Constant(I64, t), I64), typ=I64)
            return builder.add(builder.add(begin, start_v), extra)
        no = ir.Constant(I64, 0)
        above = [at_tap(t, no) for t in range(9)] + [at_tap(6 + dx, step_v) for dx in range(3)]
        weight = [splat(builder, builder.load(element_at(builder, weights, builder.mul(ir.Constant(I64, t), w_step),
                                                         element), typ=element), width) for t in range(9)]

        def write(k, load, store):
            loaded = [load(element_at(builder, base, builder.add(at, k), element)) for at in above]
            first, second = zero, zero
            for t in range(9):
                first = builder.call(add, [weight[t], loaded[t], first])
                second = builder.call(add, [weight[t], loaded[t + 3], second])

            def each(kind):
                for out, v in zip(outs, (first, second)):
                    store(activated(builder, builder.fadd(v, b), kind, lo, hi), element_at(builder, out, k, element))
            each_activation(builder, mode_v, each)

        plain_load, plain_store = plain_access(builder, vector)
        with cgutils.for_range_slice(builder, ir.Constant(I64, 0), whole, ir.Constant(I64, width)) as (k, _):
            write(k, plain_load, plain_store)
        with builder.if_then(builder.icmp_signed(">", left, ir.Constant(I64, 0))):
            write(whole, tail_load, tail_store)
        return context.get_dummy_value()
    return sig, codegen
