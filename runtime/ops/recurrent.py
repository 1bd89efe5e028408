"""Recurrent layers: LSTM, GRU and RNN (opset 7, and 14 which adds `layout`).

All three share one shape: X is [seq, batch, input] (layout 0) or [batch, seq,
input] (layout 1); W is [directions, gates * hidden, input] and R is
[directions, gates * hidden, hidden]. The input projection of every timestep and
both directions is one GEMM, X @ W^T with W used as it lies (a transposed view),
into arena scratch, with the input-side bias (and whatever recurrent bias lies
outside the recurrent product) added once. The timestep loop then does only the
recurrent GEMM and the gate arithmetic, with `out=` into small scratch buffers.
R alone is packed, as contiguous R^T: with a batch of a few rows, the per-step
GEMM on a transposed view runs several times slower. Both directions of a
bidirectional layer step together, their states stacked as [directions, batch,
hidden], so a step costs the same number of numpy calls either way. When f is
the plain Sigmoid (the default), its gates' columns of R^T and of the projection
are halved and sigmoid(x) is computed as (1 + tanh(x / 2)) / 2: exact halving,
and fewer passes per step than exp and a division.

`sequence_lens` masks per batch row as ONNX defines it: a row stops updating
past its length (so Y_h and Y_c are its last valid step) and its Y there is
zero. Running the reverse direction from t = seq-1 down to 0 with the same mask
starts each row at its own last valid step, which is what the spec asks.

Activations are the spec's list (Relu, Tanh, Sigmoid, Affine, LeakyRelu,
ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus), matched
without regard to case; `activation_alpha`/`activation_beta` are consumed in
order by the functions that take them, the spec's defaults filling in, as
onnxruntime does. `clip` bounds every gate's input to its activation.
"""

import numpy as np

from . import activation as act
from . import blas
from .registry import Inferred, Kernel, TensorInfo, register


def _sigmoid(x, out, alpha, beta):
    act.sigmoid(x, out)


def _tanh(x, out, alpha, beta):
    np.tanh(x, out=out)


def _affine(x, out, alpha, beta):
    np.multiply(x, alpha, out=out)
    np.add(out, beta, out=out)


def _thresholded_relu(x, out, alpha, beta):
    np.multiply(x, x > alpha, out=out)


def _scaled_tanh(x, out, alpha, beta):
    np.multiply(x, beta, out=out)
    np.tanh(out, out=out)
    np.multiply(out, alpha, out=out)


def _elu(x, out, alpha, beta):
    negative = np.minimum(x, 0)
    np.expm1(negative, out=negative)
    np.multiply(negative, alpha, out=negative)
    np.maximum(x, 0, out=out)
    np.add(out, negative, out=out)


def _softsign(x, out, alpha, beta):
    denominator = np.abs(x)
    np.add(denominator, 1, out=denominator)
    np.divide(x, denominator, out=out)


def _softplus(x, out, alpha, beta):
    np.logaddexp(0, x, out=out)  # log(1 + exp(x)) without overflow


# lower-case name -> (formula(x, out, alpha, beta), takes alpha, takes beta, default alpha, default beta)
ACTIVATIONS = {
    "relu": (lambda x, out, a, b: act.relu(x, out), False, False, 0.0, 0.0),
    "tanh": (_tanh, False, False, 0.0, 0.0),
    "sigmoid": (_sigmoid, False, False, 0.0, 0.0),
    "affine": (_affine, True, True, 1.0, 0.0),
    "leakyrelu": (lambda x, out, a, b: act.leaky_relu(x, out, a), True, False, 0.01, 0.0),
    "thresholdedrelu": (_thresholded_relu, True, False, 1.0, 0.0),
    "scaledtanh": (_scaled_tanh, True, True, 1.0, 1.0),
    "hardsigmoid": (lambda x, out, a, b: act.hard_sigmoid(x, out, a, b), True, True, 0.2, 0.5),
    "elu": (_elu, True, False, 1.0, 0.0),
    "softsign": (_softsign, False, False, 0.0, 0.0),
    "softplus": (_softplus, False, False, 0.0, 0.0),
}

DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


class Activation:
    """One activation of a cell, its alpha and beta bound; called as f(x, out)."""

    def __init__(self, formula, alpha, beta):
        self.formula, self.alpha, self.beta = formula, alpha, beta

    def __call__(self, x, out):
        self.formula(x, out, self.alpha, self.beta)

    def same(self, other):
        return (self.formula, self.alpha, self.beta) == (other.formula, other.alpha, other.beta)


class PerDirection:
    """Different activations per direction, over [directions, batch, n] arrays."""

    def __init__(self, activations):
        self.activations = activations

    def __call__(self, x, out):
        for d, f in enumerate(self.activations):
            f(x[d], out[d])


class Recurrent(Kernel):
    """What LSTM, GRU and RNN share: attributes, shapes, the input GEMM, masks, the loop."""

    attributes = {"activation_alpha": None, "activation_beta": None, "activations": None,
                  "clip": None, "direction": "forward", "hidden_size": None}
    gates = 1                        # gate blocks stacked in W and R
    default_activations = ("Tanh",)  # one direction's
    has_cell = False                 # LSTM's Y_c
    sigmoid_gates = 0                # leading gate blocks that take the activation f
    # A NaN entering a gate is taken as +inf, as onnxruntime's LSTM and GRU have it: their
    # activations clamp the input to a range first, and the clamp turns NaN into the top of the
    # range, so a NaN in one step's input does not poison every later step's state. The spec
    # is silent on NaN.
    nan_as_top = True
    layout = 0
    # Whether a step's gates are the input's product plus the state's and nothing between (LSTM,
    # RNN; not GRU, whose candidate multiplies the state's product by the reset gate first): a
    # sequence of one step is then one product of [x, h] by W and R stacked (`stacked`).
    one_product = False
    stacked = stacked_bias = None  # (one_product, prepared) [W^T; R^T] and the bias, packed

    def decode(self):
        direction = self.direction.decode() if isinstance(self.direction, bytes) else self.direction
        if direction not in DIRECTIONS:
            self.fail(f"direction {direction!r} is not forward, reverse or bidirectional")
        self.reverse = DIRECTIONS[direction]
        if self.layout not in (0, 1):
            self.fail(f"layout {self.layout} is not 0 or 1")
        if self.clip is not None and not self.clip > 0:
            self.fail(f"clip {self.clip} must be positive")
        self.activations_of = self._decode_activations()

    def _decode_activations(self):
        per_direction = len(self.default_activations)
        names = self.activations
        if names is None:
            names = list(self.default_activations) * len(self.reverse)
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if len(names) == per_direction and len(self.reverse) == 2:
            names = names * 2
        elif len(names) == 2 * per_direction and len(self.reverse) == 1:
            names = names[:per_direction]  # RNN's spec default lists two even for one direction
        if len(names) != per_direction * len(self.reverse):
            self.fail(f"activations {names} should name {per_direction} function(s) per direction")
        alphas = list(self.activation_alpha or [])
        betas = list(self.activation_beta or [])
        bound = []
        for name in names:
            entry = ACTIVATIONS.get(name.lower())
            if entry is None:
                self.fail(f"activation {name!r} is not one of {sorted(ACTIVATIONS)}")
            formula, takes_alpha, takes_beta, alpha, beta = entry
            if takes_alpha and alphas:
                alpha = alphas.pop(0)
            if takes_beta and betas:
                beta = betas.pop(0)
            bound.append(Activation(formula, float(alpha), float(beta)))
        # Both directions step together, so each activation applies to both at once when they agree.
        joint = []
        for k in range(per_direction):
            fs = bound[k::per_direction]
            joint.append(fs[0] if all(f.same(fs[0]) for f in fs) else PerDirection(fs))
        return joint

    # shapes

    def infer(self, x, w, r, b=None, sequence_lens=None, initial_h=None, *rest):
        if len(x.shape) != 3:
            self.fail(f"X must be 3-D, got shape {list(x.shape)}")
        if x.dtype.kind != "f":
            self.fail(f"X must be a float tensor, not {x.dtype}")
        seq, batch, size = x.shape if self.layout == 0 else (x.shape[1], x.shape[0], x.shape[2])
        dirs = len(self.reverse)
        if len(r.shape) != 3 or r.shape[0] != dirs or r.shape[1] != self.gates * r.shape[2]:
            self.fail(f"R has shape {list(r.shape)}; expected [{dirs}, {self.gates} * hidden, hidden]")
        hidden = r.shape[2]
        if self.hidden_size is not None and self.hidden_size != hidden:
            self.fail(f"hidden_size {self.hidden_size} does not match R of shape {list(r.shape)}")
        self._expect(w, "W", (dirs, self.gates * hidden, size))
        self._expect(b, "B", (dirs, 2 * self.gates * hidden))
        self._expect(sequence_lens, "sequence_lens", (batch,))
        state = (dirs, batch, hidden) if self.layout == 0 else (batch, dirs, hidden)
        self._expect(initial_h, "initial_h", state)
        self.check_extra(rest, dirs, hidden, state)
        for info, what in ((w, "W"), (r, "R"), (b, "B"), (initial_h, "initial_h")):
            if info is not None and info.dtype != x.dtype:
                self.fail(f"{what} is {info.dtype} but X is {x.dtype}")
        if sequence_lens is not None and sequence_lens.dtype.kind not in "iu":
            self.fail(f"sequence_lens must be an integer tensor, not {sequence_lens.dtype}")
        y = (seq, dirs, batch, hidden) if self.layout == 0 else (batch, seq, dirs, hidden)
        outs = [TensorInfo(y, x.dtype), TensorInfo(state, x.dtype)]
        if self.has_cell:
            outs.append(TensorInfo(state, x.dtype))
        return Inferred(outs, seq=seq, batch=batch, size=size, hidden=hidden)

    def check_extra(self, rest, dirs, hidden, state):
        """Shapes of the inputs after initial_h (LSTM's initial_c and P)."""

    def _expect(self, info, what, shape):
        if info is not None and tuple(info.shape) != tuple(shape):
            self.fail(f"{what} has shape {list(info.shape)}; expected {list(shape)}")

    # bias

    def input_bias(self, b):
        """[dirs, gates * hidden]: the bias added to X @ W^T once per run (Wb + Rb by default)."""
        g = self.gates * self.hidden
        return b[:, :g] + b[:, g:]

    def prepare(self, x, w, r, b=None, sequence_lens=None, initial_h=None, *rest):
        self.halved = self.sigmoid_gates > 0 and self.plain_sigmoid(*rest)
        self.recurrent_t = None
        self.stacked = self.stacked_bias = None
        dtype = x.dtype
        if (self.one_product and self.seq == 1 and w.value is not None and r.value is not None
                and (b is None or b.value is not None)):
            # One time step (a streaming model's call: silero VAD's LSTM): the input's and the
            # state's products are one, [x, h] @ [W^T; R^T], its f columns halved, then the bias
            # (silero VAD's, hot: 28.5 -> 22.3 us a call).
            self.stacked = self.pack({1, 2}, lambda: self.pack_stacked(w.value, r.value))
            if b is not None:
                self.stacked_bias = self.pack({3}, lambda: self.halve(self.input_bias(np.asarray(b.value))[:, None]))
            xh = (len(self.reverse), self.batch, self.size + self.hidden)
            return [(xh, dtype)] + [(s, dtype) for s in self.buffers()]
        if r.value is not None:
            # The per-step GEMM h @ R^T runs several times faster on a contiguous R^T than on a
            # transposed view when the batch is small: R is packed once (its mapped pages freed).
            self.recurrent_t = self.pack({2}, lambda: self.pack_recurrent(r.value))
        self.bias = None
        if b is not None and b.value is not None:
            self.bias = self.pack({3}, lambda: self.input_bias(np.asarray(b.value)))
        projected = (self.seq if self.layout == 0 else self.batch,
                     self.batch if self.layout == 0 else self.seq,
                     len(self.reverse) * self.gates * self.hidden)
        return [(projected, dtype)] + [(s, dtype) for s in self.buffers()]

    def buffers(self):
        """Shapes of the per-step scratch buffers after the projection: [directions, batch, n]."""
        state = (len(self.reverse), self.batch, self.hidden)
        return [(len(self.reverse), self.batch, self.gates * self.hidden), state, state, state]

    def plain_sigmoid(self, *rest):
        """Whether f is the plain Sigmoid in every direction (the cell may add conditions)."""
        f = self.activations_of[0]
        return isinstance(f, Activation) and f.formula is _sigmoid

    def pack_recurrent(self, r):
        """[dirs, hidden, gates * hidden]: R^T of each direction, contiguous, f's columns halved."""
        return self.halve(np.array(np.asarray(r).transpose(0, 2, 1), order="C"))

    def pack_stacked(self, w, r):
        """[dirs, size + hidden, gates * hidden]: W^T over R^T of each direction, f's columns halved."""
        return self.halve(np.concatenate([np.asarray(w).transpose(0, 2, 1), np.asarray(r).transpose(0, 2, 1)],
                                         axis=1))

    def halve(self, packed):
        """`packed` with its f gates' columns (its last axis's first ones) halved in place, where f
        is computed from tanh of half its input (`halved`)."""
        if self.halved:
            np.multiply(packed[..., :self.sigmoid_gates * self.hidden], 0.5,
                        out=packed[..., :self.sigmoid_gates * self.hidden])
        return packed

    def half_sigmoid(self, x):
        """sigmoid(2 x) in place, from tanh: f on the halved gates."""
        np.tanh(x, out=x)
        np.multiply(x, 0.5, out=x)
        np.add(x, 0.5, out=x)

    def clip_halved(self, x):
        if self.clip is not None:
            np.clip(x, -0.5 * self.clip, 0.5 * self.clip, out=x)

    # run: both directions step together, their states stacked as [directions, batch, hidden]

    def run(self, x, w, r, b=None, sequence_lens=None, initial_h=None, *rest, outs, scratch):
        outs = tuple(outs) + (None,) * (3 - len(outs))
        if self.stacked is not None:
            self.one_step(x, initial_h, self.masks(sequence_lens), rest, outs, scratch)
            return
        dirs = len(self.reverse)
        block = self.gates * self.hidden
        projected = scratch[0]
        flat = projected.reshape(-1, dirs * block)
        self.project(x.reshape(-1, self.size), w, flat)
        bias = self.bias if b is None else self.input_bias(np.asarray(b))
        if bias is not None:
            np.add(flat, bias.reshape(-1), out=flat)
        if self.halved:
            f_inputs = flat.reshape(-1, dirs, block)[..., :self.sigmoid_gates * self.hidden]
            np.multiply(f_inputs, 0.5, out=f_inputs)
        # Step s of direction d reads time t: s forward, seq-1-s in reverse.
        inputs = [[projected[self.time(s, rev)][:, d * block:(d + 1) * block] if self.layout == 0
                   else projected[:, self.time(s, rev), d * block:(d + 1) * block]
                   for d, rev in enumerate(self.reverse)] for s in range(self.seq)]
        recurrent_t = self.recurrent_t if r is None else self.pack_recurrent(r)
        self.steps(inputs, recurrent_t, self.masks(sequence_lens), initial_h, rest, outs, scratch[1:], b)

    def one_step(self, x, initial_h, masks, rest, outs, scratch):
        """A sequence of one time step: the gates as one product of [x, h] by `stacked`, plus the
        bias, then the cell's step as `steps` takes it (its gates ready)."""
        xh, gates = scratch[0], scratch[1]
        np.copyto(xh[..., :self.size], x.reshape(self.batch, self.size))  # every direction reads x
        if initial_h is None:
            xh[..., self.size:] = 0
        else:
            np.copyto(xh[..., self.size:], initial_h if self.layout == 0 else initial_h.transpose(1, 0, 2))
        np.matmul(xh, self.stacked, out=gates)
        if self.stacked_bias is not None:
            np.add(gates, self.stacked_bias, out=gates)
        if self.nan_as_top:
            np.fmin(gates, np.inf, out=gates)
        self.steps(None, None, masks, initial_h, rest, outs, scratch[1:], None)

    def project(self, rows, w, out):
        """out = rows @ W^T of every direction, side by side: the input projection of every step."""
        blas.matmul(rows, w.reshape(-1, self.size).T, out)

    @staticmethod
    def recurrent_product(h, recurrent_t, out):
        """out = h @ R^T per direction: the recurrent product of a step."""
        blas.matmul(h, recurrent_t, out)

    def time(self, s, backwards):
        return self.seq - 1 - s if backwards else s

    def masks(self, sequence_lens):
        """Per step, [directions, batch, 1] bools of the rows still running, and their negation;
        then [batch, 1] bools of the empty rows. None when every row runs to the end."""
        if sequence_lens is None:
            return None
        lens = np.asarray(sequence_lens).reshape(-1)
        if lens.size and lens.min() >= self.seq:
            return None
        running = np.arange(self.seq)[:, None] < lens[None, :]
        by_step = np.stack([running[::-1] if rev else running for rev in self.reverse], axis=1)[..., None]
        return by_step, ~by_step, (lens <= 0)[:, None]

    def start(self, state, initial):
        if initial is None:
            state.fill(0)
        else:
            np.copyto(state, initial if self.layout == 0 else initial.transpose(1, 0, 2))

    def finish(self, out, state, masks):
        if out is None:
            return
        out = out if self.layout == 0 else out.transpose(1, 0, 2)
        np.copyto(out, state)
        if masks is not None:
            # onnxruntime's final state of an empty sequence is zero, not the initial state.
            np.copyto(out, 0, where=masks[2])

    def emit(self, s, masks, y, new, old):
        """Write step s's hidden states to Y; rows already finished keep their old state in `new`."""
        if y is not None:
            for d, rev in enumerate(self.reverse):
                t = self.time(s, rev)
                out = y[t, d] if self.layout == 0 else y[:, t, d]
                if masks is None:
                    np.copyto(out, new[d])
                else:
                    out.fill(0)
                    np.copyto(out, new[d], where=masks[0][s, d])
        if masks is not None:
            np.copyto(new, old, where=masks[1][s])

    def add_inputs(self, gates, inputs):
        """gates += each direction's input projection; then, with `nan_as_top`, a NaN becomes
        +inf, which every activation takes to its upper bound (1 for Sigmoid and Tanh)."""
        for d, x in enumerate(inputs):
            np.add(gates[d], x, out=gates[d])
        if self.nan_as_top:
            np.fmin(gates, np.inf, out=gates)

    def clip_in_place(self, x):
        if self.clip is not None:
            np.clip(x, -self.clip, self.clip, out=x)


class RNN7(Recurrent):
    gates = 1
    one_product = True
    nan_as_top = False  # onnxruntime's RNN lets NaN through its activation
    default_activations = ("Tanh",)

    def steps(self, inputs, recurrent_t, masks, initial_h, rest, outs, scratch, b):
        gates, h, h_new, _ = scratch
        (f,) = self.activations_of
        self.start(h, initial_h)
        for s, xs in enumerate(inputs or [None]):
            if inputs is not None:  # (None: one step, its gates made by one_step)
                blas.matmul(h, recurrent_t, gates)
                self.add_inputs(gates, xs)
            self.clip_in_place(gates)
            f(gates, h_new)
            self.emit(s, masks, outs[0], h_new, h)
            h, h_new = h_new, h
        self.finish(outs[1], h, masks)


class GRU7(Recurrent):
    attributes = dict(Recurrent.attributes, linear_before_reset=0)
    gates = 3
    default_activations = ("Sigmoid", "Tanh")
    sigmoid_gates = 2

    def input_bias(self, b):
        # Rbh lies inside the reset gate's product when linear_before_reset is set.
        h = self.hidden
        bias = b[:, :3 * h] + b[:, 3 * h:]
        if self.linear_before_reset:
            bias[:, 2 * h:] = b[:, 2 * h:3 * h]
        return bias

    def recurrent_bias(self, b):
        """Rbh as [directions, 1, hidden] when it lies inside the reset gate's product, else None."""
        if b is None or not self.linear_before_reset:
            return None
        return np.array(b[:, 5 * self.hidden:])[:, None, :]

    def prepare(self, x, w, r, b=None, *rest):
        spec = super().prepare(x, w, r, b, *rest)
        self.candidate_bias = None if self.bias is None else self.recurrent_bias(np.asarray(b.value))
        return spec

    def buffers(self):
        state = (len(self.reverse), self.batch, self.hidden)
        return [(len(self.reverse), self.batch, 2 * self.hidden), state, state, state, state]

    def steps(self, inputs, recurrent_t, masks, initial_h, rest, outs, scratch, b):
        update_reset, h, h_new, candidate, temp = scratch
        f, g = self.activations_of
        n = self.hidden
        r_gates, r_candidate = recurrent_t[..., :2 * n], recurrent_t[..., 2 * n:]
        z, reset = update_reset[..., :n], update_reset[..., n:]
        # Rbh: packed at PREPARE when B is a weight; a fed B gives its own at each run.
        rbh = self.candidate_bias if b is None else self.recurrent_bias(np.asarray(b))
        self.start(h, initial_h)
        for s, xs in enumerate(inputs):
            np.matmul(h, r_gates, out=update_reset)
            self.add_inputs(update_reset, [x[:, :2 * n] for x in xs])
            if self.halved:
                self.clip_halved(update_reset)
                self.half_sigmoid(update_reset)
            else:
                self.clip_in_place(update_reset)
                f(update_reset, update_reset)
            if self.linear_before_reset:
                np.matmul(h, r_candidate, out=candidate)
                if rbh is not None:
                    np.add(candidate, rbh, out=candidate)
                np.multiply(candidate, reset, out=candidate)
            else:
                np.multiply(reset, h, out=temp)
                np.matmul(temp, r_candidate, out=candidate)
            self.add_inputs(candidate, [x[:, 2 * n:] for x in xs])
            self.clip_in_place(candidate)
            g(candidate, candidate)
            # (1 - z) * candidate + z * h, as candidate + z * (h - candidate)
            np.subtract(h, candidate, out=temp)
            np.multiply(temp, z, out=temp)
            np.add(candidate, temp, out=h_new)
            self.emit(s, masks, outs[0], h_new, h)
            h, h_new = h_new, h
        self.finish(outs[1], h, masks)


class LSTM7(Recurrent):
    attributes = dict(Recurrent.attributes, input_forget=0)
    gates = 4
    one_product = True
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    has_cell = True
    sigmoid_gates = 3  # input, output, forget

    def plain_sigmoid(self, initial_c=None, peepholes=None, *rest):
        # A peephole adds to the gates after the projection: they are left unhalved.
        return peepholes is None and super().plain_sigmoid()

    def check_extra(self, rest, dirs, hidden, state):
        initial_c = rest[0] if rest else None
        peepholes = rest[1] if len(rest) > 1 else None
        self._expect(initial_c, "initial_c", state)
        self._expect(peepholes, "P", (dirs, 3 * hidden))

    def buffers(self):
        state = (len(self.reverse), self.batch, self.hidden)
        return [(len(self.reverse), self.batch, 4 * self.hidden)] + [state] * 5

    def steps(self, inputs, recurrent_t, masks, initial_h, rest, outs, scratch, b):
        gates, h, h_new, c, c_new, temp = scratch
        initial_c = rest[0] if rest else None
        peepholes = rest[1] if len(rest) > 1 else None
        f, g, h_act = self.activations_of
        n = self.hidden
        # ONNX's gate order in W, R and B: input, output, forget, cell.
        i_gate, o_gate, f_gate, c_gate = (gates[..., k * n:(k + 1) * n] for k in range(4))
        sigmoid_gates = gates[..., :3 * n]
        if peepholes is not None:
            p_i, p_o, p_f = (peepholes[:, None, k * n:(k + 1) * n] for k in range(3))
        cell_tanh = isinstance(g, Activation) and g.formula is _tanh
        self.start(h, initial_h)
        self.start(c, initial_c)
        product = self.recurrent_product
        for s, xs in enumerate(inputs or [None]):
            if inputs is not None:  # (None: one step, its gates made by one_step)
                product(h, recurrent_t, gates)
                self.add_inputs(gates, xs)
            if self.halved:
                if self.clip is not None:
                    self.clip_halved(sigmoid_gates)
                    self.clip_in_place(c_gate)
                if cell_tanh:
                    np.tanh(gates, out=gates)  # f's gates and g's, in one pass
                    np.multiply(sigmoid_gates, 0.5, out=sigmoid_gates)
                    np.add(sigmoid_gates, 0.5, out=sigmoid_gates)
                else:
                    self.half_sigmoid(sigmoid_gates)
                    g(c_gate, c_gate)
            elif peepholes is None:
                self.clip_in_place(gates)
                f(sigmoid_gates, sigmoid_gates)
                g(c_gate, c_gate)
            else:
                for gate, p in ((i_gate, p_i), (f_gate, p_f)):
                    np.multiply(c, p, out=temp)
                    np.add(gate, temp, out=gate)
                    self.clip_in_place(gate)
                    f(gate, gate)
                self.clip_in_place(c_gate)
                g(c_gate, c_gate)
            if self.input_forget:
                np.subtract(1, i_gate, out=f_gate)
            np.multiply(f_gate, c, out=c_new)
            np.multiply(i_gate, c_gate, out=temp)
            np.add(c_new, temp, out=c_new)
            if peepholes is not None:
                np.multiply(c_new, p_o, out=temp)
                np.add(o_gate, temp, out=o_gate)
                self.clip_in_place(o_gate)
                f(o_gate, o_gate)
            h_act(c_new, temp)
            np.multiply(o_gate, temp, out=h_new)
            self.emit(s, masks, outs[0], h_new, h)
            if masks is not None:
                np.copyto(c_new, c, where=masks[1][s])
            h, h_new = h_new, h
            c, c_new = c_new, c
        self.finish(outs[1], h, masks)
        self.finish(outs[2], c, masks)


def _with_layout(cls):
    """The opset-14 version of a cell: the same, plus the `layout` attribute."""
    return type(cls.__name__[:-1] + "14", (cls,), {"attributes": dict(cls.attributes, layout=0)})


for _cls in (RNN7, GRU7, LSTM7):
    _name = _cls.__name__[:-1]
    register(_name, since=7)(_cls)
    register(_name, since=14)(_with_layout(_cls))
