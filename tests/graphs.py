"""Small ONNX graphs that tests of several modules build."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from oracle import make_model, rng

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def typed_model(nodes, inputs, outputs, initializers=(), opset=17):
    """A model from nodes, value infos (any type: sequences, optionals) and (name, array)
    initializers, at an IR version onnxruntime reads."""
    graph = helper.make_graph(nodes, "test", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers])
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    made.ir_version = min(made.ir_version, 9)
    return made


def loop_model(m, body_stops):
    # carried: acc (2,); scan output: acc at each iteration; the body adds the captured x.
    iter_in = helper.make_tensor_value_info("i", I64, [])
    cond_in = helper.make_tensor_value_info("cond_in", B, [])
    acc_in = helper.make_tensor_value_info("acc_in", F, [2])
    nodes = [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
             helper.make_node("Identity", ["acc_out"], ["scan_out"])]
    if body_stops:  # keep going while the sum stays below 10
        nodes += [helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", "ten"], ["cond_out"])]
        inits = [numpy_helper.from_array(np.array(10, np.float32), "ten")]
    else:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
        inits = []
    body = helper.make_graph(nodes, "body", [iter_in, cond_in, acc_in],
                             [helper.make_tensor_value_info("cond_out", B, []),
                              helper.make_tensor_value_info("acc_out", F, [2]),
                              helper.make_tensor_value_info("scan_out", F, [2])], inits)
    node = helper.make_node("Loop", ["m", "cond", "acc0"], ["acc", "scans"], body=body)
    return make_model([node], [("x", (np.float32, [2])), ("acc0", (np.float32, [2]))],
                      [("acc", None), ("scans", None)],
                      [("m", np.array(m, np.int64)), ("cond", np.array(True))], opset=16)


def packing_model(seed=0):
    """Conv+BatchNormalization (folded at PREPARE) and a Gemm whose C is scaled (packed): a model
    with packed weights, x of shape (2, 3, 8, 8)."""
    r = rng(seed)
    w = r.standard_normal((8, 3, 3, 3)).astype(np.float32)
    bn = [(n, r.uniform(0.5, 1.5, 8).astype(np.float32)) for n in ("s", "bb", "m", "v")]
    fc = r.standard_normal((8, 5)).astype(np.float32)
    c = r.standard_normal(5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["conv", "s", "bb", "m", "v"], ["bn"], name="bn"),
             helper.make_node("GlobalAveragePool", ["bn"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc", "c"], ["y"], beta=0.5, name="fc")]
    return make_model(nodes, [("x", (np.float32, [2, 3, 8, 8]))], [("y", None)],
                      [("w", w)] + bn + [("fc", fc), ("c", c)])
