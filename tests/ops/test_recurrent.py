"""LSTM, GRU and RNN (runtime/ops/recurrent.py) against onnxruntime.

onnxruntime refuses layout=1, so those cases run onnxruntime on the layout-0
model with the inputs transposed, and transpose its outputs back.
"""

import numpy as np
import pytest
from oracle import (assert_close, check_model, helper, make_model, numpy_helper, rng, run_nnrun,
                    run_onnxruntime)

import nnrun
from nnrun import ModelError

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_case(op, seq=5, batch=3, size=4, hidden=8, direction="forward", bias=True,
                   initial=True, lens=None, peepholes=False, layout=0, opset=14, outputs=None,
                   seed=1, **attrs):
    """(model, feeds) for one recurrent node; W, R, B and P are initializers."""
    gates = GATES[op]
    dirs = 2 if direction == "bidirectional" else 1
    r = rng(seed)

    def normal(shape, scale=1.0):
        return (r.standard_normal(shape) * scale).astype(np.float32)

    x = normal((seq, batch, size) if layout == 0 else (batch, seq, size))
    scale = 1 / np.sqrt(hidden)
    inits = [("W", normal((dirs, gates * hidden, size), 0.5)),
             ("R", normal((dirs, gates * hidden, hidden), scale))]
    names = ["x", "W", "R", "B" if bias else ""]
    if bias:
        inits.append(("B", normal((dirs, 2 * gates * hidden), 0.5)))
    feeds = {"x": x}
    if lens is not None:
        feeds["lens"] = np.array(lens, np.int32)
    names.append("lens" if lens is not None else "")
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    if initial:
        feeds["h0"] = normal(state)
    names.append("h0" if initial else "")
    if op == "LSTM":
        if initial:
            feeds["c0"] = normal(state)
        names.append("c0" if initial else "")
        if peepholes:
            inits.append(("P", normal((dirs, 3 * hidden), 0.5)))
            names.append("P")
    while names[-1] == "":
        names.pop()
    if outputs is None:
        outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    if layout:
        attrs["layout"] = layout
    node = helper.make_node(op, names, outputs, direction=direction, hidden_size=hidden, **attrs)
    model = make_model([node], [(n, feeds[n]) for n in names if n in feeds],
                       [(o, None) for o in outputs if o], inits, opset=opset)
    return model, feeds


def check_recurrent(op, **kw):
    model, feeds = recurrent_case(op, **kw)
    if kw.get("layout", 0) == 0:
        check_model(model, feeds)
        return
    # The same node in layout 0 through onnxruntime, inputs and outputs transposed around it.
    model0, _ = recurrent_case(op, **dict(kw, layout=0))
    feeds0 = {n: (a.transpose(1, 0, 2) if n != "lens" else a) for n, a in feeds.items()}
    expected = run_onnxruntime(model0, feeds0)
    names = [o.name for o in model0.graph.output]
    expected = [e.transpose(2, 0, 1, 3) if n == "Y" else e.transpose(1, 0, 2)
                for n, e in zip(names, expected)]
    actual = run_nnrun(model, feeds)
    for a, e, n in zip(actual, expected, names):
        assert_close(a, e, what=n)


DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("variant", ["plain", "no_bias_no_state", "ragged"])
def test_directions_and_layouts(op, direction, layout, variant):
    kw = {"plain": {}, "no_bias_no_state": {"bias": False, "initial": False},
          "ragged": {"lens": [5, 2, 3]}}[variant]
    check_recurrent(op, direction=direction, layout=layout, **kw)


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("opset", [7, 14])
@pytest.mark.parametrize("seq,batch,hidden", [(1, 1, 64), (10, 4, 128), (10, 2, 64), (3, 5, 1)])
def test_sizes(op, opset, seq, batch, hidden):
    check_recurrent(op, opset=opset, seq=seq, batch=batch, hidden=hidden, size=16,
                    direction="bidirectional" if hidden == 64 else "forward")


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ragged_batch(op, direction):
    check_recurrent(op, seq=10, batch=5, hidden=16, lens=[10, 1, 7, 3, 10], direction=direction)


ONE_STEP_VARIANTS = {
    "plain": {}, "no bias, no state": {"bias": False, "initial": False}, "lengths": {"lens": [1, 0, 1]},
    "clip": {"clip": 0.6}, "peepholes": {"peepholes": True, "clip": 0.8}, "input_forget": {"input_forget": 1},
    "activations": {"activations": ["HardSigmoid", "Tanh", "Softsign"] * 2},
}


@pytest.mark.parametrize("op,variant", [("LSTM", v) for v in ONE_STEP_VARIANTS] +
                         [("RNN", v) for v in ("plain", "no bias, no state", "lengths", "clip")])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
def test_one_time_step_is_one_product(op, variant, direction, layout):
    """A sequence of one step (a streaming model's call) with W, R and B weights: the gates as one
    product of [x, h] by W and R stacked at PREPARE, then the cell's step."""
    kw = dict(ONE_STEP_VARIANTS[variant])
    if variant == "activations" and direction != "bidirectional":
        kw["activations"] = kw["activations"][:3]
    check_recurrent(op, seq=1, direction=direction, layout=layout, **kw)
    model, _ = recurrent_case(op, seq=1, direction=direction, layout=layout, **kw)
    kernel = nnrun.InferenceSession(model.SerializeToString()).plan().steps[0].kernel
    assert kernel.stacked is not None


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
def test_one_time_step_nan_as_onnxruntime(op):
    model, feeds = recurrent_case(op, seq=1, direction="bidirectional", seed=4)
    feeds["x"][0, 1, :2] = np.nan
    check_model(model, feeds)


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_empty_sequences(op, direction):
    """A row of length 0: its Y is zero and (as onnxruntime has it) so is its final state."""
    check_recurrent(op, lens=[0, 5, 2], direction=direction)


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_nan_in_one_step_as_onnxruntime(op, direction):
    """A NaN in one step's input: onnxruntime's LSTM and GRU take it to the top of each gate's
    activation, so the state recovers at the next steps; its RNN lets the NaN through. Silero VAD
    fed a NaN sample shows the first (the spec says nothing of NaN)."""
    model, feeds = recurrent_case(op, direction=direction, seed=4)
    feeds["x"][1, 0, 0] = np.nan
    feeds["x"][3, 2, :] = np.nan
    check_model(model, feeds)


@pytest.mark.parametrize("op,peepholes", [("LSTM", False), ("LSTM", True), ("GRU", False), ("RNN", False)])
def test_weights_fed_at_run_time(op, peepholes):
    """W, R, B (and P) as graph inputs: nothing can be packed at PREPARE."""
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    model, feeds = recurrent_case(op, direction="bidirectional", lens=[3, 5, 1], peepholes=peepholes,
                                  clip=2.0, **extra)
    for init in list(model.graph.initializer):
        feeds[init.name] = numpy_helper.to_array(init)
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    del model.graph.initializer[:]
    check_model(model, feeds)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lens", [None, [4, 5, 1]])
def test_lstm_peepholes(direction, lens):
    check_recurrent("LSTM", peepholes=True, direction=direction, lens=lens)


@pytest.mark.parametrize("op,peepholes", [(op, p) for op in GATES for p in (False, True)
                                           if op == "LSTM" or not p])  # only LSTM has peepholes
def test_clip(op, peepholes):
    check_recurrent(op, clip=0.7, peepholes=peepholes, direction="bidirectional")


def test_lstm_input_forget():
    check_recurrent("LSTM", input_forget=1, direction="bidirectional", lens=[2, 5, 4])


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lens", [None, [3, 5, 1]])
def test_gru_linear_before_reset(direction, bias, lens):
    check_recurrent("GRU", linear_before_reset=1, direction=direction, bias=bias, lens=lens)


@pytest.mark.parametrize("op,activations,alpha,beta", [
    ("RNN", ["Relu"], None, None),
    ("RNN", ["Sigmoid"], None, None),
    ("RNN", ["LeakyRelu"], [0.3], None),
    ("RNN", ["ThresholdedRelu"], [0.4], None),
    ("RNN", ["ScaledTanh"], [1.5], [0.7]),
    ("RNN", ["HardSigmoid"], [0.3], [0.4]),
    ("RNN", ["Affine"], [0.5], [0.1]),
    ("RNN", ["Elu"], [0.9], None),
    ("RNN", ["Softsign"], None, None),
    ("RNN", ["Softplus"], None, None),
    ("RNN", ["Tanh", "Relu"], None, None),  # bidirectional: one per direction
    ("GRU", ["HardSigmoid", "Softsign", "Sigmoid", "ScaledTanh"], [0.25, 2.0], [0.45, 0.5]),
    ("LSTM", ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "Elu", "Tanh"], [0.3, 0.8], [0.6]),
    ("LSTM", ["Sigmoid", "Softsign", "Relu"], None, None),
    ("LSTM", ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Tanh"], None, None),
    ("GRU", ["Sigmoid", "Relu"], None, None),
])
def test_activations(op, activations, alpha, beta):
    attrs = {"activations": activations}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    direction = "bidirectional" if len(activations) == 2 * {"RNN": 1, "GRU": 2, "LSTM": 3}[op] else "forward"
    check_recurrent(op, direction=direction, **attrs)


@pytest.mark.parametrize("op,outputs", [
    (op, outputs) for op in GATES for outputs in (["Y"], ["", "Y_h"], ["Y", ""], ["", "", "Y_c"])
    if op == "LSTM" or len(outputs) <= 2], ids=str)  # only LSTM has Y_c
def test_optional_outputs(op, outputs):
    check_recurrent(op, outputs=outputs, direction="bidirectional", lens=[1, 5, 3])


@pytest.mark.parametrize("op", list(GATES))
def test_bad_weights_are_model_errors(op):
    model, feeds = recurrent_case(op)
    model.graph.initializer[1].dims[1] += 1  # R: [1, gates*hidden + 1, hidden]
    model.graph.initializer[1].raw_data += b"\0" * (4 * 8)
    with pytest.raises(ModelError, match="R has shape"):
        run_nnrun(model, feeds)


def test_unknown_activation_is_a_model_error():
    model, feeds = recurrent_case("RNN", activations=["Swish"])
    with pytest.raises(ModelError, match="activation 'Swish'"):
        run_nnrun(model, feeds)


@pytest.mark.parametrize("op", list(GATES))
def test_float64_against_the_reference(op):
    """onnxruntime has no double recurrent kernels; onnx's reference (which ignores sequence_lens) does."""
    model, feeds = recurrent_case(op, direction="bidirectional", peepholes=op == "LSTM")
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    for value in model.graph.input:
        value.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(np.float64))
    feeds = {k: a.astype(np.float64) for k, a in feeds.items()}
    check_model(model, feeds, oracle="reference")
