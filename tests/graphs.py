"""Small ONNX graphs that tests of several modules build."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from oracle import make_model

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


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
