"""nnrun: a memory-first inference runtime for ONNX and TFLite models.

    import nnrun
    sess = nnrun.InferenceSession("model.onnx")
    outputs = sess.run(None, {"input": x})

The module has onnxruntime's surface (`InferenceSession`, `SessionOptions`, `RunOptions`,
`OrtValue`, `get_available_providers`, ...), so code written for onnxruntime runs with
`import nnrun as onnxruntime`, or with `sys.modules["onnxruntime"] = nnrun` for a package that
imports onnxruntime itself; `nnrun.capi` holds onnxruntime's `capi` import paths.
"""

from .errors import (BudgetError, ExecutionError, InputError, MalformedModelError, ModelError,  # noqa: F401
                     ModelFileChangedError, ModelFileError, NnrunError, SessionClosedError, SizeLimitError,
                     UnsupportedFeatureError, UnsupportedOperatorError)
from .providers import ALL as _ALL_PROVIDERS
from .providers import AVAILABLE as _AVAILABLE_PROVIDERS

__version__ = "0.1.0"
version = __version__

# Names the session module defines, imported on first use: it pulls in every op family.
_SESSION_NAMES = ("InferenceSession", "NodeArg", "ModelMetadata")
_OPTION_NAMES = ("SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder")
_VALUE_NAMES = ("OrtValue", "IOBinding")


def __getattr__(name):
    import importlib

    if name in _SESSION_NAMES:
        return getattr(importlib.import_module(".session", __name__), name)
    if name in _OPTION_NAMES:
        return getattr(importlib.import_module(".options", __name__), name)
    if name in _VALUE_NAMES:
        return getattr(importlib.import_module(".ortvalue", __name__), name)
    if name in ("backend", "debug", "capi"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'nnrun' has no attribute {name!r}")


def get_available_providers():
    """The execution providers nnrun has: the CPU."""
    return list(_AVAILABLE_PROVIDERS)


def get_all_providers():
    """Every provider name onnxruntime knows (nnrun has only the CPU's)."""
    return list(_ALL_PROVIDERS)


def get_device():
    return "CPU"


def get_version_string():
    return __version__


def get_build_info():
    return f"nnrun {__version__}: numpy kernels, CPU"


_logging = {"severity": 2, "verbosity": 0}


def set_default_logger_severity(severity):
    """onnxruntime's log threshold (0 verbose .. 4 fatal); nnrun logs only warnings, through `warnings`."""
    _logging["severity"] = int(severity)


def set_default_logger_verbosity(verbosity):
    _logging["verbosity"] = int(verbosity)


def disable_telemetry_events():
    """nnrun sends no telemetry: nothing to turn off."""


def enable_telemetry_events():
    """nnrun sends no telemetry."""


def set_seed(seed):
    """onnxruntime's seed for its random operators; nnrun's random operators take theirs from the node."""
