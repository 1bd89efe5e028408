"""onnxruntime's `capi` import paths, for code that imports from them.

Clients write `from onnxruntime.capi import _pybind_state as C` or
`from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument`. With
`sys.modules["onnxruntime"] = nnrun` those resolve here. Every name is imported from `nnrun`
by its absolute name, never relatively: under the alias these modules load a second time as
`onnxruntime.capi...`, and a relative import would then load a second copy of nnrun's error
classes, which `except` clauses would not match.
"""

from nnrun.capi import _pybind_state  # noqa: F401
from nnrun.capi import onnxruntime_pybind11_state  # noqa: F401
