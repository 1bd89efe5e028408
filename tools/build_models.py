"""Builds the ONNX models nnrun is tested and benchmarked on, with random weights.

Each net is one builder function over `GraphBuilder` layers with width/depth knobs; `MODELS` names
the presets (resnet50, vgg16, bert, the tiny committed models, ...). Weights come from a fixed seed
and files carry no timestamps, so a rebuild gives the same bytes.

    python -m nnrun_tools.build_models NAME[:knob=value,...]... [--out DIR] [--force] [--check]
    python -m nnrun_tools.build_models --small        # the models committed in models/
    python -m nnrun_tools.build_models --list

Large models go to a cache directory ($NNRUN_CACHE/models, else ~/.cache/nnrun/models); the small ones
to the repository's models/. From Python: `build(name, out_dir)` and `ensure(name)` return the path.
"""

import argparse
import inspect
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx

try:
    from ._layers import FLOAT, INT64, GraphBuilder
except ImportError:  # run as a script (python tools/build_models.py): tools/ is on sys.path
    from _layers import FLOAT, INT64, GraphBuilder

REPO_MODELS = Path(__file__).resolve().parent.parent / "models"


# -- the nets ---------------------------------------------------------------------------------------

def resnet(depths=(3, 4, 6, 3), width=64, classes=1000, size=224, seed=0):
    """ResNet v1 with bottleneck blocks (the stride sits on the first 1x1 conv, as in v1)."""
    g = GraphBuilder(seed)
    g.channels["input"] = 3
    x = g.conv("input", width, 7, "conv1", stride=2)
    x = g.pool(x, "maxpool", 3, 2, pad=1)
    for stage, depth in enumerate(depths):
        mid = width * 2 ** stage
        for block in range(depth):
            name = f"layer{stage + 1}.{block}"
            stride = 2 if block == 0 and stage > 0 else 1
            skip = x
            if block == 0:
                skip = g.conv(x, mid * 4, 1, f"{name}.downsample", stride=stride, act=None)
            y = g.conv(x, mid, 1, f"{name}.conv1", stride=stride)
            y = g.conv(y, mid, 3, f"{name}.conv2")
            y = g.conv(y, mid * 4, 1, f"{name}.conv3", act=None, gamma_scale=0.3)
            x = g.act(g.add(y, skip, f"{name}.add"), "relu", f"{name}.relu")
    out = g.classifier(x, classes)
    return g.model("resnet", [("input", FLOAT, [1, 3, size, size])], out)


VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg(config=VGG16, width=1.0, fc=4096, classes=1000, size=224, seed=0):
    """VGG: 3x3 Conv + Relu stacks, MaxPool between them, Flatten and three Gemm."""
    g = GraphBuilder(seed)
    g.channels["input"] = 3
    x, conv, pool = "input", 0, 0
    for item in config:
        if item == "M":
            pool += 1
            x = g.pool(x, f"pool{pool}", 2, 2)
        else:
            conv += 1
            x = g.conv(x, max(1, int(item * width)), 3, f"conv{conv}", bn=False)
    nin = g.channels[x] * (size // 2 ** pool) ** 2
    x = g.op("Flatten", [x], "flatten", axis=1)
    x = g.gemm(x, nin, fc, "fc1", act="relu")
    x = g.gemm(x, fc, fc, "fc2", act="relu")
    out = g.gemm(x, fc, classes, "fc3")
    return g.model("vgg", [("input", FLOAT, [1, 3, size, size])], out)


def _divisible(value, divisor=8):
    """Channel rounding of MobileNet: nearest multiple of 8, never more than 10% below the value."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


# expansion t, output channels c, repeats n, first stride s
MOBILENETV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
               (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenetv2(width=1.0, classes=1000, size=224, seed=0):
    """MobileNetV2: inverted residuals with depthwise (group) convs, BN and Relu6 as Clip(0, 6)."""
    g = GraphBuilder(seed)
    g.channels["input"] = 3
    x = g.conv("input", _divisible(32 * width), 3, "features.0", stride=2, act="relu6")
    index = 1
    for t, c, n, s in MOBILENETV2:
        cout = _divisible(c * width)
        for i in range(n):
            name, cin, stride = f"features.{index}", g.channels[x], s if i == 0 else 1
            y = x
            if t != 1:
                y = g.conv(y, cin * t, 1, f"{name}.expand", act="relu6")
            y = g.conv(y, cin * t, 3, f"{name}.dw", stride=stride, group=cin * t, act="relu6")
            y = g.conv(y, cout, 1, f"{name}.project", act=None, gamma_scale=0.5)
            x = g.add(y, x, f"{name}.add") if stride == 1 and cin == cout else y
            index += 1
    x = g.conv(x, _divisible(1280 * max(1.0, width)), 1, f"features.{index}", act="relu6")
    out = g.classifier(x, classes, "classifier")
    return g.model("mobilenetv2", [("input", FLOAT, [1, 3, size, size])], out)


# GoogLeNet's inception modules: 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection; "M" pools.
GOOGLENET = ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), "M",
             (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
             (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), "M",
             (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128))


def inception(modules=GOOGLENET, width=1.0, classes=1000, size=224, seed=0):
    """Inception v1 (GoogLeNet without auxiliary heads): four parallel branches Concat-ed per module."""
    g = GraphBuilder(seed)
    g.channels["input"] = 3

    def ch(c):
        return max(1, int(c * width))

    x = g.conv("input", ch(64), 7, "conv1", stride=2, bn=False)
    x = g.pool(x, "pool1", 3, 2, ceil_mode=1)
    x = g.conv(x, ch(64), 1, "conv2", bn=False)
    x = g.conv(x, ch(192), 3, "conv3", bn=False)
    x = g.pool(x, "pool2", 3, 2, ceil_mode=1)
    for i, module in enumerate(modules):
        name = f"inception{i}"
        if module == "M":
            x = g.pool(x, f"{name}.pool", 3, 2, ceil_mode=1)
            continue
        c1, r3, c3, r5, c5, proj = (ch(c) for c in module)
        branches = [
            g.conv(x, c1, 1, f"{name}.b1", bn=False),
            g.conv(g.conv(x, r3, 1, f"{name}.b2.reduce", bn=False), c3, 3, f"{name}.b2", bn=False),
            g.conv(g.conv(x, r5, 1, f"{name}.b3.reduce", bn=False), c5, 5, f"{name}.b3", bn=False),
            g.conv(g.pool(x, f"{name}.b4.pool", 3, 1, pad=1), proj, 1, f"{name}.b4", bn=False),
        ]
        x = g.concat(branches, f"{name}.concat")
    out = g.classifier(x, classes)
    return g.model("inception", [("input", FLOAT, [1, 3, size, size])], out)


def unet(base=16, depth=4, in_channels=3, classes=2, size=256, seed=0):
    """U-Net: double convs + MaxPool down, ConvTranspose up, Concat-ed long skips, final 1x1 conv."""
    g = GraphBuilder(seed)
    g.channels["input"] = in_channels

    def double_conv(x, c, name):
        return g.conv(g.conv(x, c, 3, f"{name}.conv1"), c, 3, f"{name}.conv2")

    x, skips = "input", []
    for level in range(depth):
        skips.append(double_conv(x, base * 2 ** level, f"down{level}"))
        x = g.pool(skips[-1], f"down{level}.pool", 2, 2)
    x = double_conv(x, base * 2 ** depth, "bottleneck")
    for level in reversed(range(depth)):
        up = g.conv_transpose(x, base * 2 ** level, f"up{level}.upsample")
        x = double_conv(g.concat([up, skips[level]], f"up{level}.concat"), base * 2 ** level, f"up{level}")
    out = g.conv(x, classes, 1, "head", bn=False, act=None)
    return g.model("unet", [("input", FLOAT, [1, in_channels, size, size])], out)


def bert(hidden=256, heads=4, layers=4, vocab=8000, seq=128, ffn=None, dynamic=False,
         max_positions=512, seed=0):
    """A BERT-style encoder as exporters write it: MatMul/Add, Reshape/Transpose heads, Erf GELU.

    dynamic: the input is [1, "seq"]; position embeddings are sliced by the input's length and the
    Reshape targets use 0 / -1, so one file serves any sequence length up to max_positions.
    """
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    g = GraphBuilder(seed)
    ffn = ffn or 4 * hidden
    head_dim = hidden // heads
    words = g.op("Gather", [g.random("embeddings.word", (vocab, hidden), 1.0), "input_ids"],
                 "embeddings.gather")
    if dynamic:
        length = g.op("Slice", [g.op("Shape", ["input_ids"], "embeddings.shape"), g.constant([1], np.int64),
                                g.constant([2], np.int64)], "embeddings.length")
        positions = g.op("Slice", [g.random("embeddings.position", (max_positions, hidden), 1.0),
                                   g.constant([0], np.int64), length, g.constant([0], np.int64)],
                         "embeddings.positions")
        to_heads = g.constant([0, 0, heads, head_dim], np.int64)
        from_heads = g.constant([0, 0, hidden], np.int64)
    else:
        positions = g.op("Gather", [g.random("embeddings.position", (seq, hidden), 1.0),
                                    g.initializer("position_ids", np.arange(seq, dtype=np.int64)[None])],
                         "embeddings.positions")
        to_heads = g.constant([1, seq, heads, head_dim], np.int64)
        from_heads = g.constant([1, seq, hidden], np.int64)

    def heads_of(x, name, perm):
        """A projection split into heads: [1, seq, hidden] -> [1, heads, seq, head_dim] permuted by perm."""
        y = g.op("Reshape", [g.linear(x, hidden, hidden, name), to_heads], f"{name}.reshape")
        return g.op("Transpose", [y], f"{name}.transpose", perm=perm)

    x = g.layernorm(g.op("Add", [words, positions], "embeddings.add"), hidden, "embeddings.layernorm")
    for layer in range(layers):
        name = f"layer{layer}"
        q = heads_of(x, f"{name}.query", [0, 2, 1, 3])
        k = heads_of(x, f"{name}.key", [0, 2, 3, 1])  # transposed for Q K^T
        v = heads_of(x, f"{name}.value", [0, 2, 1, 3])
        scores = g.op("MatMul", [q, k], f"{name}.scores")
        scores = g.op("Div", [scores, g.constant(math.sqrt(head_dim))], f"{name}.scale")
        probs = g.op("Softmax", [scores], f"{name}.softmax", axis=-1)
        context = g.op("MatMul", [probs, v], f"{name}.context")
        context = g.op("Transpose", [context], f"{name}.context.transpose", perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, from_heads], f"{name}.context.reshape")
        attn = g.linear(context, hidden, hidden, f"{name}.attention.output")
        x = g.layernorm(g.op("Add", [attn, x], f"{name}.attention.residual"), hidden,
                        f"{name}.attention.layernorm")
        y = g.gelu(g.linear(x, hidden, ffn, f"{name}.intermediate"), f"{name}.gelu")
        y = g.linear(y, ffn, hidden, f"{name}.output")
        x = g.layernorm(g.op("Add", [y, x], f"{name}.output.residual"), hidden,
                        f"{name}.output.layernorm")
    return g.model("bert", [("input_ids", INT64, [1, "seq" if dynamic else seq])], x,
                   "last_hidden_state")


def tiny_cnn(classes=10, seed=0):
    """An MNIST-sized CNN: Conv, BN, Relu, MaxPool, Conv, Relu, MaxPool, Flatten, Gemm."""
    g = GraphBuilder(seed)
    g.channels["input"] = 1
    x = g.pool(g.conv("input", 8, 3, "conv1"), "pool1", 2, 2)
    x = g.pool(g.conv(x, 16, 3, "conv2", bn=False), "pool2", 2, 2)
    out = g.gemm(g.op("Flatten", [x], "flatten", axis=1), 16 * 7 * 7, classes, "fc")
    return g.model("tiny_cnn", [("input", FLOAT, [1, 1, 28, 28])], out)


# -- the presets ------------------------------------------------------------------------------------

class Preset:
    """A named model: its builder, the builder's knobs, and whether it is committed in models/."""

    def __init__(self, builder, description, small=False, external=False, **knobs):
        self.builder, self.description = builder, description
        self.small, self.external, self.knobs = small, external, knobs


MODELS = {
    "resnet50": Preset(resnet, "ResNet-50 v1, 1x3x224x224 -> 1x1000 (98 MiB)"),
    "vgg16": Preset(vgg, "VGG-16, 1x3x224x224 -> 1x1000 (528 MiB)"),
    "vgg16_external": Preset(vgg, "VGG-16 with its weights in vgg16_external.onnx.data", external=True),
    "mobilenetv2": Preset(mobilenetv2, "MobileNetV2 1.0, 1x3x224x224 -> 1x1000 (14 MiB)"),
    "inception": Preset(inception, "Inception v1 (GoogLeNet), 1x3x224x224 -> 1x1000 (27 MiB)"),
    "unet": Preset(unet, "U-Net, base 16, depth 4, 1x3x256x256 -> 1x2x256x256 (7 MiB)"),
    "bert": Preset(bert, "BERT-style encoder, hidden 256, 4 heads, 4 layers, vocab 8000, "
                         "input_ids 1x128 (20 MiB)"),
    "bert_dynamic": Preset(bert, "bert with input_ids [1, 'seq'] (any length up to 512)", dynamic=True),
    "bert_base": Preset(bert, "bert at BERT-base size: hidden 768, 12 heads, 12 layers, "
                              "vocab 30522 (414 MiB)",
                        hidden=768, heads=12, layers=12, vocab=30522),
    "tiny_cnn": Preset(tiny_cnn, "MNIST-style CNN, 1x1x28x28 -> 1x10", small=True),
    "mobilenet_tiny": Preset(mobilenetv2, "MobileNetV2 width 0.25, 1x3x96x96 -> 1x100", small=True,
                             width=0.25, size=96, classes=100),
    "bert_tiny": Preset(bert, "BERT-style, 2 layers, hidden 64, 2 heads, vocab 1000, seq 16", small=True,
                        hidden=64, heads=2, layers=2, vocab=1000, seq=16),
    "unet_tiny": Preset(unet, "U-Net base 8, depth 3, 1x3x64x64 -> 1x2x64x64", small=True,
                        base=8, depth=3, size=64),
}


def cache_dir():
    root = os.environ.get("NNRUN_CACHE")
    return Path(root) / "models" if root else Path.home() / ".cache" / "nnrun" / "models"


def default_dir(name):
    preset = MODELS[name]
    return REPO_MODELS if preset.small and REPO_MODELS.is_dir() else cache_dir()


def model_path(name, out_dir=None, **knobs):
    """out_dir/resnet50.onnx, or out_dir/resnet50-size64-width16.onnx when knobs change the preset."""
    tags = [k + re.sub(r"[^\w.]+", "_", str(v)).strip("_") for k, v in sorted(knobs.items())]
    out_dir = default_dir(name) if out_dir is None else Path(out_dir)
    return out_dir / ("-".join([name] + tags) + ".onnx")


def make(name, **knobs):
    """The ModelProto of a preset, with knobs overriding the preset's."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    preset = MODELS[name]
    knobs = {**preset.knobs, **knobs}
    try:
        inspect.signature(preset.builder).bind(**knobs)
    except TypeError as e:
        raise ValueError(f"{name}: {e}; knobs of {preset.builder.__name__}: "
                         f"{', '.join(inspect.signature(preset.builder).parameters)}") from None
    return preset.builder(**knobs)


def build(name, out_dir=None, force=False, **knobs):
    """Build a model into out_dir (default: default_dir(name)) unless it is there; returns its path."""
    path = model_path(name, out_dir, **knobs)
    if path.exists() and not force:
        return path
    model = make(name, **knobs)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed, so an interrupted build never leaves a file that a
    # later call would take as built.
    partial = path.with_name(path.name + ".partial")
    if MODELS[name].external:
        data = path.with_name(path.name + ".data")
        data.unlink(missing_ok=True)  # onnx appends to an existing data file
        onnx.save_model(model, partial, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name)
        data.chmod(0o644)  # onnx creates it owner-only; it is as public as the model file
    else:
        onnx.save_model(model, partial)
    partial.replace(path)
    return path


def ensure(name, **knobs):
    """The path of a model in its default directory, building it first if it is missing."""
    return build(name, **knobs)


def random_feeds(session, vocab=1000, seq=16, seed=0):
    """N(0, 1) floats, or token ids below vocab, for each input of an onnxruntime session.

    Dynamic dimensions get length seq.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else seq for d in arg.shape]
        if arg.type == "tensor(int64)":
            feeds[arg.name] = rng.integers(0, vocab, shape, dtype=np.int64)
        else:
            feeds[arg.name] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


def verify(path, seq=16):
    """Check a model file: onnx full check, then one onnxruntime run on random inputs.

    Raises AssertionError unless every output is finite with a std in [1e-3, 1e3]; returns
    {output name: (shape, std)}. seq is the length given to dynamic dimensions.
    """
    import onnxruntime as ort

    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path), load_external_data=False).graph
    vocab = next((t.dims[0] for t in graph.initializer if t.name == "embeddings.word"), 1000)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    stats = {}
    for arg, value in zip(session.get_outputs(), session.run(None, random_feeds(session, vocab, seq))):
        std = float(np.std(value))
        assert np.isfinite(value).all(), f"{path}: output {arg.name} has non-finite values"
        assert 1e-3 <= std <= 1e3, f"{path}: output {arg.name} has std {std}"
        stats[arg.name] = (list(value.shape), std)
    return stats


# -- command line -----------------------------------------------------------------------------------

def _parse_spec(spec):
    """NAME or NAME:knob=value,knob=value (values are Python literals: 0.5, 12, True, (2,2,2,2))."""
    import ast

    name, _, rest = spec.partition(":")
    knobs = {}
    for item in filter(None, re.split(r",(?=\w+=)", rest)):  # commas inside (2,2,2,2) stay
        key, _, value = item.partition("=")
        try:
            knobs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            knobs[key] = value
    return name, knobs


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m nnrun_tools.build_models",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME[:knob=value,...]",
                        help="models to build; 'small' stands for the models committed in models/")
    parser.add_argument("--out", type=Path,
                        help="output directory (default: the cache, or models/ for the small ones)")
    parser.add_argument("--small", action="store_true", help="build the small models into models/")
    parser.add_argument("--force", action="store_true", help="rebuild files that exist")
    parser.add_argument("--check", action="store_true", help="verify each model with onnx and onnxruntime")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, preset in MODELS.items():
            print(f"{name:16} {preset.description}{'  [committed]' if preset.small else ''}")
        print(f"\ncache: {cache_dir()}   committed: {REPO_MODELS}")
        return 0
    specs = [s for s in args.names if s != "small"]
    if args.small or "small" in args.names:
        specs += [n for n, p in MODELS.items() if p.small]
    if not specs:
        parser.error("no model named (see --list)")
    for spec in specs:
        name, knobs = _parse_spec(spec)
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        start = time.perf_counter()
        existed = model_path(name, args.out, **knobs).exists()
        try:
            path = build(name, args.out, force=args.force, **knobs)
        except ValueError as e:
            parser.error(str(e))
        took = time.perf_counter() - start
        size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + ".data"))
        state = "exists " if existed and not args.force else f"built in {took:6.2f} s"
        line = f"{path}  {size / 2 ** 20:9.2f} MiB  {state}"
        if args.check:
            line += "  " + "  ".join(f"{k} {s} std {std:.3g}" for k, (s, std) in verify(path).items())
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
