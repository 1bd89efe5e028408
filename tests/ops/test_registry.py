"""The kernel contract of runtime/ops/registry.py, held by every kernel: a shape rule (infer) is a
pure function, what run needs it returns (Inferred) for the compiler to keep, and a prepared kernel
is frozen. The seal is checked on a kernel; the purity of every infer in the source by a scan, so a
kernel no test happens to drive is held to it too."""

import ast
import os

import numpy as np
import pytest
from oracle import helper, make_model, rng

import nnrun
from nnrun import ir
from nnrun.ops.registry import Inferred, Kernel, TensorInfo

OPS = os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "ops")


def self_writes(function):
    """Attributes of self that `function` (an ast.FunctionDef) assigns, or setattr calls on self."""
    found = []
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for e in ast.walk(target):
                if (isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Store)
                        and isinstance(e.value, ast.Name) and e.value.id == "self"):
                    found.append(e.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
            found.append("setattr")
    return found


def kernel_sources():
    for folder, _, files in os.walk(OPS):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(folder, name), OPS)


@pytest.mark.parametrize("module", sorted(kernel_sources()))
def test_no_shape_rule_writes_to_its_kernel(module):
    with open(os.path.join(OPS, module)) as f:
        tree = ast.parse(f.read())
    wrong = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in ("infer", "run"):
                wrong += [f"{cls.name}.{fn.name} sets {a}" for a in self_writes(fn)]
    assert not wrong, wrong


def test_the_scan_sees_a_write():
    source = "def infer(self, x):\n    self.axis = 1\n    setattr(self, 'a', 2)\n    out[self.index] = 0\n"
    assert self_writes(ast.parse(source).body[0]) == ["axis", "setattr"]


class Writer(Kernel):
    def infer(self, x):
        self.seen = x.shape
        return [x]


class Deriver(Kernel):
    def infer(self, x):
        return Inferred([x], axis=len(x.shape) - 1)

    def prepare(self, x):
        self.prepared_axis = self.axis  # what infer derived is kept before prepare runs
        return []


def node():
    return ir.Node("k", "Test", "", ["x"], ["y"], {}, 0)


def test_a_shape_rule_that_writes_raises_and_leaves_the_kernel_as_it_was():
    k = Writer(node(), 17)
    with pytest.raises(AttributeError, match="Writer.infer is a shape rule and may not set 'seen'"):
        k.shape_rule(TensorInfo((2,), np.dtype(np.float32)))
    assert "seen" not in vars(k)
    k.seen = 1  # outside the shape rule the kernel is open again


def test_what_infer_derives_is_kept_before_prepare_and_the_kernel_freezes():
    k = Deriver(node(), 17)
    x = TensorInfo((2, 3), np.dtype(np.float32))
    inferred = k.shape_rule(x)
    assert list(inferred) == [x] and inferred.derived == {"axis": 1}
    assert "axis" not in vars(k)
    assert k.ready(inferred.derived, x) == []
    assert k.prepared_axis == 1
    k.freeze()
    with pytest.raises(AttributeError, match="is prepared"):
        k.axis = 0


def test_a_derived_value_of_a_base_rule_is_kept_with_the_subclass_ones():
    assert Inferred(Inferred([1], a=1), b=2).derived == {"a": 1, "b": 2}


def test_every_kernel_of_a_plan_is_frozen():
    model = make_model([helper.make_node("Softmax", ["x"], ["s"], axis=1),
                        helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0])],
                       [("x", (np.float32, [2, 3]))], [("y", None)])
    sess = nnrun.InferenceSession(model.SerializeToString())
    for step in sess.plan().steps:
        with pytest.raises(AttributeError, match="is prepared"):
            step.kernel.view = None
    sess.run(None, {"x": rng(0).standard_normal((2, 3)).astype(np.float32)})
