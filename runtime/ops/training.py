"""The optimisers of ai.onnx.preview.training: Adagrad, Adam and Momentum.

Each takes the learning rate R and the iteration count T (scalars), then for N tensors to
optimise their values X, gradients G and one or two running statistics per optimiser, grouped
by kind (X1..XN, G1..GN, ...); it returns the new values then the new statistics, grouped the
same way. One step of the update rule the spec writes out, computed in float64 and rounded once
to each output's type. Nothing is random: the same inputs give the same step.
"""

import numpy as np

from .registry import REQUIRED, Kernel, TensorInfo, register

TRAINING = "ai.onnx.preview.training"


class Optimizer(Kernel):
    """Inputs R, T, then `states` groups of N tensors (X, G, statistics); outputs the X's and
    the statistics' new values, N each."""

    states = 3  # groups of inputs after R and T: X, G and the statistics

    def infer(self, r, t, *tensors):
        if r is None or t is None or r.size != 1 or t.size != 1:
            self.fail("R and T must be scalars")
        if t.dtype != np.int64:
            self.fail(f"T has type {t.dtype}; expected int64")
        if r.dtype.kind != "f":
            self.fail(f"R has type {r.dtype}; expected a floating type")
        n, extra = divmod(len(tensors), self.states)
        if extra or n == 0:
            self.fail(f"{len(tensors)} inputs after R and T; expected {self.states} groups of N tensors")
        groups = [tensors[k * n:(k + 1) * n] for k in range(self.states)]
        for i in range(n):
            shapes = {tuple(g[i].shape) for g in groups}
            if len(shapes) > 1 or any(g[i].dtype.kind != "f" for g in groups):
                self.fail(f"the tensors of parameter {i + 1} must be floats of one shape, "
                          f"got {[list(g[i].shape) for g in groups]}")
        outputs = [g[i] for g in groups[:1] + groups[2:] for i in range(n)]
        return [TensorInfo(tuple(o.shape), o.dtype) for o in outputs]

    def run(self, r, t, *tensors, outs, scratch):
        n = len(tensors) // self.states
        groups = [tensors[k * n:(k + 1) * n] for k in range(self.states)]
        rate, step = float(r.reshape(-1)[0]), int(t.reshape(-1)[0])
        for i in range(n):
            results = self.update(rate, step, *(g[i].astype(np.float64) for g in groups))
            for k, result in enumerate(results):
                np.copyto(outs[k * n + i], result, casting="unsafe")

    def update(self, rate, step, x, g, *statistics):
        raise NotImplementedError


@register("Adagrad", since=1, domain=TRAINING)
class Adagrad(Optimizer):
    attributes = {"decay_factor": 0.0, "epsilon": 1e-6, "norm_coefficient": 0.0}

    def update(self, rate, step, x, g, h):
        rate = rate / (1 + step * self.decay_factor)
        g = self.norm_coefficient * x + g  # the gradient of the L2 regularisation added
        h = h + g * g
        return x - rate * g / (np.sqrt(h) + self.epsilon), h


@register("Adam", since=1, domain=TRAINING)
class Adam(Optimizer):
    attributes = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "norm_coefficient": 0.0,
                  "norm_coefficient_post": 0.0}
    states = 4

    def update(self, rate, step, x, g, v, h):
        g = self.norm_coefficient * x + g
        v = self.alpha * v + (1 - self.alpha) * g
        h = self.beta * h + (1 - self.beta) * g * g
        if step > 0:  # bias correction of the two momentums
            rate = rate * np.sqrt(1 - self.beta ** step) / (1 - self.alpha ** step)
        x = x - rate * v / (np.sqrt(h) + self.epsilon)
        return (1 - self.norm_coefficient_post) * x, v, h


@register("Momentum", since=1, domain=TRAINING)
class Momentum(Optimizer):
    attributes = {"alpha": REQUIRED, "beta": REQUIRED, "mode": REQUIRED, "norm_coefficient": REQUIRED}

    def decode(self):
        if self.mode not in ("standard", "nesterov"):
            self.fail(f"mode {self.mode!r} is not 'standard' or 'nesterov'")

    def update(self, rate, step, x, g, v):
        g = self.norm_coefficient * x + g
        v = self.alpha * v + (self.beta if step > 0 else 1) * g  # the first step takes the whole gradient
        if self.mode == "nesterov":
            return x - rate * (g + self.alpha * v), v
        return x - rate * v, v
