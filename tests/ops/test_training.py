"""The ai.onnx.preview.training optimisers (Adagrad, Adam, Momentum) against onnx's reference
evaluator: onnxruntime's inference build has none of them."""

import numpy as np
import pytest
from oracle import assert_close, check_model, helper, make_model, rng, run_nnrun, run_reference

import nnrun

TRAINING = "ai.onnx.preview.training"


def optimizer(op_type, n, groups, dtype=np.float32, rate=0.1, step=3, seed=0, **attrs):
    """A one-node model of `op_type` over n tensors and `groups` kinds of input per tensor (X, G, ...);
    its feeds."""
    g = rng(seed)
    shapes = [(3, 4), (5,), (2, 1, 3), ()][:n]
    feeds = {"R": np.array(rate, np.float32), "T": np.array(step, np.int64)}
    names = []
    for k in range(groups):
        for i, shape in enumerate(shapes):
            name = f"in{k}_{i}"
            value = g.normal(size=shape)
            feeds[name] = np.asarray(np.abs(value) if k >= 2 else value, dtype)  # statistics are >= 0 for sqrt
            names.append(name)
    n_out = n * (groups - 1)
    node = helper.make_node(op_type, ["R", "T"] + names, [f"y{i}" for i in range(n_out)], domain=TRAINING, **attrs)
    model = make_model([node], [(k, v) for k, v in feeds.items()], [(f"y{i}", None) for i in range(n_out)],
                       extra_opsets=[(TRAINING, 1)])
    return model, feeds


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("step", [0, 1, 7])
@pytest.mark.parametrize("attrs", [{}, dict(decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.001)])
def test_adagrad(attrs, step, n):
    model, feeds = optimizer("Adagrad", n, 3, step=step, **attrs)
    check_model(model, feeds, oracle="reference", rtol=1e-5)


def check_adam(model, feeds, dtype=np.float32, rtol=1e-5):
    # The reference evaluator's Adam returns float64 for one float32 tensor (its bias correction is
    # a Python float) and float32 for several double ones; the spec gives the inputs' type.
    expected = [e.astype(dtype) for e in run_reference(model, feeds)]
    actual = run_nnrun(model, feeds)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_close(a, e, rtol=rtol)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("step", [0, 1, 7])
@pytest.mark.parametrize("attrs", [{}, dict(alpha=0.95, beta=0.1, epsilon=1e-7, norm_coefficient=0.001),
                                   dict(alpha=0.5, beta=0.85, epsilon=0.01, norm_coefficient=0.01,
                                        norm_coefficient_post=0.02)])
def test_adam(attrs, step, n):
    model, feeds = optimizer("Adam", n, 4, step=step, **attrs)
    check_adam(model, feeds)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("step", [0, 2])
@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("alpha, beta, norm", [(0.95, 0.1, 0.001), (0.9, 1.0, 0.01)])
def test_momentum(alpha, beta, norm, mode, step, n):
    model, feeds = optimizer("Momentum", n, 3, step=step, alpha=alpha, beta=beta, mode=mode, norm_coefficient=norm)
    check_model(model, feeds, oracle="reference", rtol=1e-5)


def test_adam_in_double():
    model, feeds = optimizer("Adam", 1, 4, dtype=np.float64, alpha=0.8, beta=0.9)
    check_adam(model, feeds, dtype=np.float64, rtol=1e-12)


def test_momentum_refuses_an_unknown_mode():
    model, feeds = optimizer("Momentum", 1, 3, alpha=0.9, beta=0.1, mode="heavy", norm_coefficient=0.0)
    with pytest.raises(nnrun.NnrunError, match="mode 'heavy'"):
        run_nnrun(model, feeds)


def test_adagrad_refuses_unmatched_groups():
    model, feeds = optimizer("Adagrad", 2, 3)
    node = model.graph.node[0]
    del node.input[-1]
    del model.graph.input[-1]
    feeds.popitem()
    with pytest.raises(nnrun.NnrunError, match="groups of N tensors"):
        run_nnrun(model, feeds)
