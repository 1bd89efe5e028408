"""onnxruntime's native module's names: its exception classes, options, values and providers."""

from nnrun import (get_all_providers, get_available_providers, get_build_info, get_device,  # noqa: F401
                   get_version_string, set_default_logger_severity, set_default_logger_verbosity, set_seed)
from nnrun.options import ExecutionMode, ExecutionOrder, GraphOptimizationLevel, RunOptions, SessionOptions  # noqa: F401
from nnrun.ortvalue import OrtValue  # noqa: F401
from nnrun.ortvalue import IOBinding as SessionIOBinding  # noqa: F401
from nnrun.session import InferenceSession, ModelMetadata, NodeArg  # noqa: F401
from nnrun.status import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf,  # noqa: F401
                          ModelLoadCanceled, ModelLoaded, ModelRequiresCompilation, NoModel, NoSuchFile, NotFound,
                          NotImplemented, RuntimeException)
