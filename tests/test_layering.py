"""Arrows point down: each layer of the runtime imports only the layers below it.

    session, cli, debug, backend, plan_cache, timeline, report      (the top: may import anything)
    compiler          executor                                      (siblings: neither imports the other)
    ops                                                             (kernels: given services, never reaching up)
    loader                                                          (file formats to the IR)
    ir, weights, errors, cache_file                                 (the bottom)
"""

import ast
import os

import pytest

RUNTIME = os.path.join(os.path.dirname(__file__), "..", "runtime")

# layer -> the layers it must not import
FORBIDDEN = {
    "compiler": {"executor", "session", "plan_cache", "cli", "debug", "backend"},
    "executor": {"compiler", "session", "plan_cache", "cli", "debug", "backend", "loader"},
    "ops": {"compiler", "executor", "session", "plan_cache", "cli", "debug", "backend", "loader"},
    "loader": {"compiler", "executor", "ops", "session", "plan_cache"},
    "ir": {"loader", "compiler", "executor", "ops", "session", "plan_cache"},
    "weights": {"loader", "compiler", "executor", "ops", "session", "plan_cache", "ir"},
    "errors": {"loader", "compiler", "executor", "ops", "session", "plan_cache", "ir", "weights"},
    "cache_file": {"loader", "compiler", "executor", "ops", "session", "plan_cache", "ir", "weights"},
}


def modules():
    for folder, _, files in os.walk(RUNTIME):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, RUNTIME)[:-3].split(os.sep)
                yield path, parts


def imported_layers(source, parts):
    """The top-level runtime modules/packages the module `parts` (its source) imports, at any
    depth (function-level imports too)."""
    package = parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
            else:  # `from .. import x`: x are top-level modules
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nnrun."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("nnrun."))
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    checked = 0
    for path, parts in modules():
        if parts[0] != layer:
            continue
        checked += 1
        with open(path) as f:
            wrong = imported_layers(f.read(), parts) & FORBIDDEN[layer]
        assert not wrong, f"{'/'.join(parts)}.py imports {sorted(wrong)}"
    assert checked, f"no module of layer {layer!r}"


def test_the_scan_sees_imports_that_reach_up():
    """The scan itself: a relative import two levels up is seen for what it is."""
    source = "def f():\n    from ..compiler.build import compile_graph\nfrom . import registry\n"
    assert imported_layers(source, ["ops", "probe"]) == {"compiler", "ops"}
    assert imported_layers("from ...errors import ModelError\n", ["ops", "tflite", "x"]) == {"errors"}
