"""onnxruntime's status codes as exception classes, under the names clients catch.

Code written for onnxruntime catches `onnxruntime.capi.onnxruntime_pybind11_state.Fail`,
`InvalidArgument`, `NoSuchFile`... nnrun's own errors (errors.py) derive from these, so such
`except` clauses catch nnrun's errors too when nnrun stands in for onnxruntime. Like
onnxruntime's, each derives from Exception alone. `nnrun.capi` exports them at onnxruntime's
import paths.
"""


class Fail(Exception):
    """FAIL: a failure with no more specific status (a run that failed, a budget not met)."""


class InvalidArgument(Exception):
    """INVALID_ARGUMENT: a feed, an option or an argument the model cannot take."""


class NoSuchFile(Exception):
    """NO_SUCHFILE: the model file cannot be opened."""


class NoModel(Exception):
    """NO_MODEL: no model was given."""


class EngineError(Exception):
    """ENGINE_ERROR."""


class RuntimeException(Exception):
    """RUNTIME_EXCEPTION: a kernel raised while it ran."""


class InvalidProtobuf(Exception):
    """INVALID_PROTOBUF: the model's bytes do not parse."""


class ModelLoaded(Exception):
    """MODEL_LOADED."""


class NotImplemented(Exception):  # noqa: A001 - onnxruntime's name, which clients catch
    """NOT_IMPLEMENTED: an operator or a feature the runtime does not have."""


class InvalidGraph(Exception):
    """INVALID_GRAPH: the model parses but is not a valid graph."""


class EPFail(Exception):
    """EP_FAIL: an execution provider failed."""


class ModelLoadCanceled(Exception):
    """MODEL_LOAD_CANCELED."""


class ModelRequiresCompilation(Exception):
    """MODEL_REQUIRES_COMPILATION."""


class NotFound(Exception):
    """NOT_FOUND."""


STATUS_CLASSES = (Fail, InvalidArgument, NoSuchFile, NoModel, EngineError, RuntimeException, InvalidProtobuf,
                  ModelLoaded, NotImplemented, InvalidGraph, EPFail, ModelLoadCanceled, ModelRequiresCompilation,
                  NotFound)
