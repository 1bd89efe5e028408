"""onnxruntime's Python classes' module path."""

from nnrun.options import RunOptions, SessionOptions  # noqa: F401
from nnrun.ortvalue import IOBinding, OrtValue  # noqa: F401
from nnrun.session import InferenceSession, ModelMetadata, NodeArg  # noqa: F401
