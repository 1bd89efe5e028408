"""nnrun: a memory-first inference runtime for ONNX and TFLite models.

    import nnrun
    sess = nnrun.InferenceSession("model.onnx")
    outputs = sess.run(None, {"input": x})
"""

from .errors import (BudgetError, ExecutionError, InputError, ModelError, NnrunError,  # noqa: F401
                     UnsupportedOperatorError)

__version__ = "0.1.0"


def __getattr__(name):
    # The session pulls in every op family; import it only when asked for.
    if name in ("InferenceSession", "SessionOptions", "RunOptions", "NodeArg"):
        from . import session
        return getattr(session, name)
    if name in ("backend", "debug"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'nnrun' has no attribute {name!r}")
