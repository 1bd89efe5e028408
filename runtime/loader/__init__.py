"""MODEL_LOAD: a model file (or its bytes) -> `ir.Graph`, reading no weight byte.

`load_model` maps the file and dispatches on its format: TFLite (`.tflite`, or
the flatbuffer identifier "TFL3"; `loader.tflite`), else ONNX (`loader.onnx`).
"""

import os

from ..paging import open_regular
from .mapped import MappedFile

TFLITE_IDENTIFIER = b"TFL3"  # flatbuffer file identifier, bytes 4..8


def model_format(model):
    """"tflite" or "onnx", from a path's suffix or the first bytes of the file (or bytes)."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return "tflite" if bytes(model[4:8]) == TFLITE_IDENTIFIER else "onnx"
    path = os.fsdecode(os.fspath(model))
    if path.lower().endswith(".tflite"):
        return "tflite"
    try:  # a FIFO or a device is refused unread: a read of it could block forever
        fd = open_regular(path)
    except OSError:
        return "onnx"  # load_model reports the error
    try:
        head = os.pread(fd, 8, 0)
    except OSError:
        return "onnx"
    finally:
        os.close(fd)
    return "tflite" if head[4:8] == TFLITE_IDENTIFIER else "onnx"


def import_reader(fmt):
    """Import the reader of a format ahead of MODEL_LOAD, so its import is not counted there."""
    if fmt == "tflite":
        from . import tflite  # noqa: F401
    else:
        from . import onnx  # noqa: F401


def load_model(model, base_dir=None):
    """The `ir.Graph` of `model`: a path, or the bytes of a model file.

    External data files are resolved relative to `base_dir`, by default the
    model's directory; a model given as bytes can use external data only when
    `base_dir` is given.
    """
    if isinstance(model, (bytes, bytearray, memoryview)):
        path = None
        source = MappedFile.from_bytes(model)
    else:
        try:
            path = os.fspath(model)
        except TypeError:
            raise TypeError(f"a model is a path or bytes, not {type(model).__name__}") from None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        source = MappedFile.open(path)
    # The identifier is read with pread: a touch of the mapping would page in weights.
    if (path is not None and path.lower().endswith(".tflite")) \
            or (source.size >= 8 and bytes(source.read(4, 8)) == TFLITE_IDENTIFIER):
        from .tflite import load_tflite
        graph = load_tflite(source, path=path)
        graph.mapped_files = (source,)
        return graph
    from .onnx import load_onnx  # here, not at import: ir imports loader.mapped
    return load_onnx(source, path=path, base_dir=base_dir)
