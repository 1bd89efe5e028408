"""Real client packages run unchanged with nnrun standing in for onnxruntime.

Each package from PyPI ships its model and calls onnxruntime itself; nnrun_tools.clients runs
its own pipeline once on onnxruntime and once with `sys.modules["onnxruntime"] = nnrun`, each
in a subprocess. onnxruntime is the oracle: the pipeline's result (texts, labels, boxes, speech
segments) must be the same, and every array the package's session runs returned must match.

The packages come with `pip install -e '.[clients]'` (.ci/run installs them); without them each
test is skipped, saying which package is missing.
"""

import pytest

from nnrun_tools.clients import CLIENTS, RUNTIMES, installed, run_client
from oracle import WHOLE_MODEL_RTOL, assert_close

# Numbers in a result that come from float outputs: pixels of a box, a score rounded to 2 digits.
BOX_PIXELS = 2
SCORE = 0.02
# ddddocr's model is quantized by onnxruntime's dynamic quantizer: each of its 22 layers rounds its
# input to uint8 (DynamicQuantizeLinear), so a last-bit float difference before a rounding (MLAS's
# Sigmoid is not correctly rounded) moves a value one step there, and that step propagates. The
# text it reads is the same; its raw scores agree to about 0.5% of their range.
OUTPUT_RTOL = {"ddddocr": 1e-2}


def _same(ours, theirs, where="result"):
    """Equal texts and labels; boxes within BOX_PIXELS, scores within SCORE."""
    assert type(ours) is type(theirs), f"{where}: {ours!r} != {theirs!r}"
    if isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), f"{where}: {len(ours)} items != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float):
        tolerance = SCORE if "score" in where else BOX_PIXELS
        assert abs(ours - theirs) <= tolerance, f"{where}: {ours} != {theirs}"
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


@pytest.mark.parametrize("name", list(CLIENTS))
def test_client_pipeline_gives_onnxruntimes_result(name):
    if not installed(name):
        pytest.skip(f"the client package for {name} is not installed (pip install -e '.[clients]')")
    theirs, ours = (run_client(name, runtime) for runtime in RUNTIMES)
    _same(ours["result"], theirs["result"])
    assert len(ours["outputs"]) == len(theirs["outputs"]), "a different number of session runs"
    assert ours["outputs"], "the pipeline ran no session"
    for i, (mine, expected) in enumerate(zip(ours["outputs"], theirs["outputs"])):
        assert len(mine) == len(expected), f"run {i}: {len(mine)} outputs != {len(expected)}"
        for j, (a, b) in enumerate(zip(mine, expected)):
            assert_close(a, b, rtol=OUTPUT_RTOL.get(name, WHOLE_MODEL_RTOL), what=f"{name} run {i} output {j}")
