"""The model builders of nnrun_tools.build_models and the small models committed in models/.

Every model is checked by onnx's checker and run in onnxruntime (finite outputs, std in
[1e-3, 1e3]); the large nets are built at reduced width/size where they would be slow, and their
architecture is checked by counting the layers each is defined by.
"""

import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from nnrun_tools import build_models as bm

SMALL = {
    "tiny_cnn": [1, 10],
    "mobilenet_tiny": [1, 100],
    "bert_tiny": [1, 16, 64],
    "unet_tiny": [1, 2, 64, 64],
}


def _output_shape(stats):
    (shape, _std), = stats.values()
    return shape


@pytest.mark.parametrize("name", SMALL)
def test_committed_model_is_valid_and_runs(name):
    path = bm.REPO_MODELS / f"{name}.onnx"
    assert path.exists(), f"{path} missing: run python -m nnrun_tools.build_models --small"
    assert _output_shape(bm.verify(path)) == SMALL[name]


def test_committed_models_are_what_the_builders_make(tmp_path):
    for name in SMALL:
        rebuilt = bm.build(name, tmp_path).read_bytes()
        assert rebuilt == (bm.REPO_MODELS / f"{name}.onnx").read_bytes(), \
            f"{name}: builder changed; rebuild with python -m nnrun_tools.build_models --small --force"


def test_committed_models_stay_small():
    assert sum((bm.REPO_MODELS / f"{n}.onnx").stat().st_size for n in SMALL) < 4 * 2 ** 20


def test_every_small_preset_is_committed():
    assert {n for n, p in bm.MODELS.items() if p.small} == set(SMALL)


# name, knobs, output shape, op counts that define the architecture
BUILDS = [
    ("resnet50", {"width": 8, "size": 64}, [1, 1000],
     {"Conv": 53, "BatchNormalization": 53, "Relu": 49, "Add": 16, "MaxPool": 1, "Gemm": 1}),
    ("vgg16", {"width": 0.125, "fc": 64, "size": 32}, [1, 1000],
     {"Conv": 13, "Relu": 15, "MaxPool": 5, "Gemm": 3}),
    ("mobilenetv2", {}, [1, 1000],
     {"Conv": 52, "BatchNormalization": 52, "Clip": 35, "Add": 10, "Gemm": 1}),
    ("inception", {}, [1, 1000], {"Conv": 57, "Relu": 57, "Concat": 9, "MaxPool": 13, "Gemm": 1}),
    ("unet", {}, [1, 2, 256, 256], {"ConvTranspose": 4, "Concat": 4, "MaxPool": 4, "Conv": 19}),
    ("bert", {}, [1, 128, 256],
     {"LayerNormalization": 9, "Softmax": 4, "Erf": 4, "MatMul": 32, "Gather": 2}),
]


@pytest.mark.parametrize("name, knobs, shape, ops", BUILDS, ids=[b[0] for b in BUILDS])
def test_builder(tmp_path, name, knobs, shape, ops):
    path = bm.build(name, tmp_path, **knobs)
    assert _output_shape(bm.verify(path)) == shape
    counts = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    assert {op: counts[op] for op in ops} == ops


def test_mobilenet_depthwise_convs_and_relu6():
    model = bm.make("mobilenet_tiny")
    depthwise = [n for n in model.graph.node if n.op_type == "Conv"
                 and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(depthwise) == 17
    # Clip's min and max must be scalars (opset 11+), not [1] tensors.
    weights = {t.name: t for t in model.graph.initializer}
    bounds = {name for n in model.graph.node if n.op_type == "Clip" for name in n.input[1:]}
    assert [list(weights[b].dims) for b in bounds] == [[], []]


def test_full_size_parameter_counts():
    # Trainable parameters of the published ResNet-50 and MobileNetV2 1.0 (BN scale and bias counted,
    # running statistics not); BERT's follow from its definition.
    def params(model):
        return sum(int(np.prod(t.dims)) for t in model.graph.initializer
                   if t.data_type == onnx.TensorProto.FLOAT and not t.name.startswith("const_")
                   and not t.name.endswith((".mean", ".var")))
    assert params(bm.make("resnet50")) == 25_557_032
    assert params(bm.make("mobilenetv2")) == 3_504_872
    assert params(bm.make("bert", vocab=1000, layers=1)) == (1000 + 128) * 256 + 2 * 256 + (
        4 * (256 * 256 + 256) + 2 * 256 * 1024 + 1024 + 256 + 4 * 256)


@pytest.mark.parametrize("seq", [1, 33, 128])
def test_bert_dynamic_runs_any_length(tmp_path, seq):
    path = bm.build("bert_dynamic", tmp_path, hidden=64, heads=2, layers=2, vocab=500)
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[1].dim_param == "seq"
    assert _output_shape(bm.verify(path, seq=seq)) == [1, seq, 64]


def test_external_data_variant(tmp_path):
    path = bm.build("vgg16_external", tmp_path, width=0.125, fc=64, size=32)
    data = path.with_name(path.name + ".data")
    assert data.stat().st_size > 10 * path.stat().st_size
    locations = {e.value for t in onnx.load(str(path), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {data.name}
    assert _output_shape(bm.verify(path)) == [1, 1000]
    # A forced rebuild replaces the data file instead of appending to it.
    size = data.stat().st_size
    bm.build("vgg16_external", tmp_path, force=True, width=0.125, fc=64, size=32)
    assert data.stat().st_size == size


def test_build_is_idempotent_and_ensure_uses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NNRUN_CACHE", str(tmp_path))
    path = bm.ensure("resnet50", width=4, size=32)
    assert path == tmp_path / "models" / "resnet50-size32-width4.onnx"
    stamp = path.stat().st_mtime_ns
    assert bm.ensure("resnet50", width=4, size=32) == path and path.stat().st_mtime_ns == stamp
    assert bm.ensure("tiny_cnn") == bm.REPO_MODELS / "tiny_cnn.onnx"


def test_unknown_model_or_knob():
    with pytest.raises(KeyError, match="unknown model"):
        bm.make("resnet51")
    with pytest.raises(ValueError, match="widht"):
        bm.make("resnet50", widht=2)


def test_command_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "nnrun_tools.build_models", *args],
                              capture_output=True, text=True, check=True).stdout

    assert "vgg16_external" in run("--list")
    first = run("tiny_cnn", "unet:base=4,depth=2,size=32", "--out", str(tmp_path), "--check")
    assert "built" in first and (tmp_path / "unet-base4-depth2-size32.onnx").exists()
    assert "exists" in run("tiny_cnn", "--out", str(tmp_path))
    assert "built" in run("tiny_cnn", "--out", str(tmp_path), "--force")
    script = Path(bm.__file__).resolve()
    listing = subprocess.run([sys.executable, str(script), "--list"],
                             capture_output=True, text=True, check=True)
    assert "resnet50" in listing.stdout
