import atexit
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import compiled  # noqa: E402 - the tests' directory is on the path from here
from nnrun.ops import conv_core  # noqa: E402

# The suite's weight cache files go to a directory of its own, removed at the end (the CLI tests'
# subprocesses inherit it), not into the user's cache.
os.environ["NNRUN_WEIGHT_CACHE"] = tempfile.mkdtemp(prefix="nnrun-test-weights-")
atexit.register(shutil.rmtree, os.environ["NNRUN_WEIGHT_CACHE"], True)


@pytest.fixture(params=["numpy", pytest.param("compiled", marks=compiled.needs_numba),
                        pytest.param("compiled, channels first", marks=compiled.needs_numba)])
def kernels(request, monkeypatch):
    """Both kinds of kernel: numpy's, and those numba compiles (`compiled_kernels`): a convolution's
    bias and activation, depthwise convolution and pooling, which then serve every 1-D and 2-D case
    however small (the cases are small to keep the oracles fast): depthwise channels last where the
    image is small and each channel has one output, or always channels first. The compiled bias and
    activation serves every size too."""
    if request.param == "numpy":
        monkeypatch.delenv("NNRUN_JIT", raising=False)  # the default
    else:
        monkeypatch.setenv("NNRUN_JIT", "1")
        monkeypatch.setattr(conv_core, "COMPILED_MIN_ROW", 0)
        monkeypatch.setattr(conv_core, "EPILOGUE_MIN", 0)
        monkeypatch.setattr(conv_core, "COMPILED_POOL_MIN_INSIDE", 0)
        if request.param == "compiled, channels first":
            monkeypatch.setattr(conv_core, "CHANNELS_LAST_MAX_PIXELS", -1)
    return request.param
