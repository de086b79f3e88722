"""Modules of the core import in one direction: no cycles, also through function-local imports.

The verify path once read ``export -> verify -> localize -> export``; the lower modules
(`compare`, `runner`, `_exporters`) exist so that it reads one way. This test parses every module
of the package (imports inside functions included) and fails on any cycle between them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import onnx_custom

PACKAGE = Path(onnx_custom.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def _graph() -> dict[str, set[str]]:
    # Package __init__ files re-export for users and are never imported by core modules.
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    known = set(files)
    return {name: _imports(path, known) - {name} for name, path in files.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_core_modules_import_in_one_direction() -> None:
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_verify_path_layers() -> None:
    graph = _graph()
    assert "onnx_custom.api" not in graph["onnx_custom.verification.localize"]
    assert "onnx_custom.verification.verifier" not in graph["onnx_custom.verification.localize"]
    assert graph["onnx_custom.verification.compare"] <= {"onnx_custom.errors"}


def test_cycle_finder_finds_a_planted_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
