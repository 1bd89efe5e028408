"""Operators: one module per family, each op a registered Kernel."""

from . import registry  # noqa: F401
from .registry import REQUIRED, Kernel, TensorInfo, lookup, register  # noqa: F401


def load_all():
    """Import every op family so that their kernels register."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if info.name != "registry" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
