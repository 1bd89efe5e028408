"""TensorScatter against onnxruntime (values are moved, so compared exactly), and the reference
evaluator for the types onnxruntime does not scatter."""

import numpy as np
import pytest

import nnrun
from oracle import check_model, check_node, data, helper, i64, make_model


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("cache,update,axis", [
    ((2, 3, 8, 4), (2, 3, 2, 4), -2), ((2, 8, 4), (2, 3, 4), 1), ((3, 2, 5, 6), (3, 2, 5, 6), -1),
    ((2, 6, 3, 2), (2, 1, 3, 2), 1), ((2, 4, 5), (2, 4, 5), -2), ((2, 3, 7), (2, 3, 0), 2)], ids=str)
def test_tensor_scatter(cache, update, axis, mode):
    length, n = cache[axis], update[axis]
    # Linear writes must fit; circular ones start anywhere and wrap.
    starts = i64(0, length - n) if mode == "linear" else i64(length - 1, 3)
    starts = np.resize(starts, cache[0])
    check_node("TensorScatter", [("past", data(cache)), ("update", data(update, seed=1)), ("indices", starts)],
               {"axis": axis, "mode": mode}, opset=24)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int64, np.int8, np.uint16])
def test_tensor_scatter_types(dtype):
    check_node("TensorScatter", [("past", data((2, 2, 6, 3), dtype)), ("update", data((2, 2, 3, 3), dtype, 1)),
                                 ("indices", i64(2, 4))], {"mode": "circular"}, opset=24)


def test_tensor_scatter_bool():
    # onnxruntime does not scatter bool.
    check_node("TensorScatter", [("past", data((2, 5, 3), np.bool_)), ("update", data((2, 2, 3), np.bool_, 1)),
                                 ("indices", i64(1, 3))], {}, opset=24, oracle="reference")


def test_tensor_scatter_without_indices_writes_at_zero():
    check_node("TensorScatter", [("past", data((2, 3, 6, 4))), ("update", data((2, 3, 2, 4), seed=1))], {}, opset=24)


def test_tensor_scatter_of_a_weight_cache():
    # The past cache is a weight: it is read, never written.
    past = data((2, 2, 4, 3))
    node = helper.make_node("TensorScatter", ["past", "update", "indices"], ["y"])
    model = make_model([node], [("update", data((2, 2, 1, 3), seed=1)), ("indices", i64(0, 0))], [("y", None)],
                       initializers=[("past", past)], opset=24)
    for start in ([3, 1], [0, 2]):
        check_model(model, {"update": data((2, 2, 1, 3), seed=start[0]), "indices": i64(*start)})


def test_tensor_scatter_linear_past_the_end_is_an_error():
    node = helper.make_node("TensorScatter", ["past", "update", "indices"], ["y"])
    model = make_model([node], [("past", data((2, 4, 3))), ("update", data((2, 2, 3))), ("indices", i64(0, 3))],
                       [("y", None)], opset=24)
    session = nnrun.InferenceSession(model.SerializeToString())
    with pytest.raises(nnrun.ExecutionError, match="cache length 4"):
        session.run(None, {"past": data((2, 4, 3)), "update": data((2, 2, 3)), "indices": i64(0, 3)})


@pytest.mark.parametrize("update,attrs,message", [((2, 5, 3), {}, "does not fit"), ((2, 4, 2), {}, "differ in dim"),
                                                  ((2, 2, 3), {"axis": 0}, "batch axis")])
def test_tensor_scatter_shapes_are_checked(update, attrs, message):
    node = helper.make_node("TensorScatter", ["past", "update"], ["y"], **attrs)
    model = make_model([node], [("past", data((2, 4, 3))), ("update", data(update))], [("y", None)], opset=24)
    with pytest.raises(nnrun.ModelError, match=message):
        nnrun.InferenceSession(model.SerializeToString())
