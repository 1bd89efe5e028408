"""onnxruntime's `capi._pybind_state`: the native module's names under their older path."""

from nnrun.capi.onnxruntime_pybind11_state import *  # noqa: F401,F403
