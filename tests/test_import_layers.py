"""The package imports in one direction: a layer order over every folder, no cycles, no private
names across subpackages, and the two documented by-name lookups checked where they are.

The order is written in docs/design.md ("Layers"); this test is its enforcement. Every import
counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import is still a
dependency a newcomer has to follow.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# (layer index, groups in it): a module may import its own group and any group of a lower
# layer; groups that share a layer are siblings and never import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("common",),
    ("translate", "runtime"),
    ("exporter", "function_bodies"),
    ("spec",),
    ("ops",),
    ("symbolics", "ort_kernels"),
    ("verification",),
    ("compile",),
    ("api",),
    ("testing",),
    ("models",),
    ("zoo",),
    ("cli",),
)
LAYER_OF = {group: i for i, groups in enumerate(LAYERS) for group in groups}

# The documented exceptions, each a lookup by name (no import statement):
# - the registries load the built-in family modules listed in common.builtins by name;
# - runtime.native finds the native library's C++ sources in ort_kernels/native by name.
# - runtime.function_builder is the README's old path of function_bodies.builder (an alias).
BY_NAME = {
    "onnx_custom.translate.registry": "onnx_custom.common.builtins",
    "onnx_custom.runtime.registry": "onnx_custom.common.builtins",
    "onnx_custom.runtime.native": "onnx_custom.ort_kernels",
}
ALIASES = {"onnx_custom.runtime.function_builder": {"onnx_custom.function_bodies.builder"}}


def _roots() -> dict[str, Path]:
    """Import name -> folder for the package and the three folders installed into it."""
    roots = {}
    for name in (
        "onnx_custom",
        "onnx_custom.symbolics",
        "onnx_custom.ort_kernels",
        "onnx_custom.models",
    ):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        roots[name] = Path(next(iter(spec.submodule_search_locations)))
    return roots


def _modules() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for package, folder in _roots().items():
        for path in folder.rglob("*.py"):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


MODULES = _modules()


def _group(module: str) -> str:
    """``onnx_custom.translate.registry`` -> ``translate``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) for every absolute import of our package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
    return [f for f in found if f[0] == "onnx_custom" or f[0].startswith("onnx_custom.")]


def _targets(module: str, names: list[str]) -> set[str]:
    """The modules an import statement reaches (``from pkg import sub`` reaches ``pkg.sub``)."""
    reached = {module}
    reached |= {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
    return reached


def _layer_violations() -> list[str]:
    problems = []
    for module, path in sorted(MODULES.items()):
        group = _group(module)
        if group == "":
            continue  # the package's lazy façade re-exports for users; nothing imports it back
        for target_module, names, line in _imports(path):
            for target in sorted(_targets(target_module, names)):
                target_group = _group(target)
                if target in ALIASES.get(module, ()):
                    continue
                if target_group == "":
                    if group == "cli":  # the top layer may use the public façade like a user
                        continue
                    problems.append(
                        f"{path.name}:{line} {module} imports the package façade {target}"
                    )
                elif target_group == group:
                    continue
                elif LAYER_OF[target_group] >= LAYER_OF[group]:
                    kind = (
                        "its sibling"
                        if LAYER_OF[target_group] == LAYER_OF[group]
                        else "a higher layer"
                    )
                    problems.append(
                        f"{path.name}:{line} {module} ({group}) imports {kind} {target}"
                        f" ({target_group})"
                    )
    return problems


def test_every_folder_has_a_layer() -> None:
    groups = {_group(m) for m in MODULES} - {""}
    assert groups <= set(LAYER_OF), f"folders without a layer: {sorted(groups - set(LAYER_OF))}"


def test_imports_follow_the_layer_order() -> None:
    problems = _layer_violations()
    assert problems == [], "imports against the layer order (docs/design.md):\n" + "\n".join(
        problems
    )


def test_no_private_name_crosses_a_subpackage() -> None:
    problems = []
    for module, path in sorted(MODULES.items()):
        for target, names, line in _imports(path):
            same = _group(target) == _group(module)
            private_module = any(
                p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:]
            )
            private_names = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if not same and (private_module or private_names):
                problems.append(
                    f"{path.name}:{line} {module} imports {target} {private_names or ''}"
                )
    assert problems == [], "\n".join(problems)


def _by_name_lookups(path: Path) -> set[str]:
    """String constants naming our modules in importlib/find_spec calls of one file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("import_module", "find_spec")
        ):
            for arg in node.args:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.startswith("onnx_custom")
                ):
                    found.add(arg.value)
    return found


@pytest.mark.parametrize(("module", "target"), sorted(BY_NAME.items()))
def test_documented_by_name_lookups_are_where_documented(module: str, target: str) -> None:
    path = MODULES[module]
    if target == "onnx_custom.common.builtins":
        # the registry imports the list, then imports each listed module by name
        assert any(t == target for t, _, _ in _imports(path)), f"{module} no longer reads {target}"
        assert "import_module" in path.read_text()
    else:
        assert target in _by_name_lookups(path), f"{module} no longer looks up {target} by name"


def test_by_name_lookups_only_in_documented_places() -> None:
    """A by-name import reaching up or sideways would hide a dependency from the layer test."""
    strays = {}
    for module, path in MODULES.items():
        group = _group(module)
        for target in _by_name_lookups(path):
            target_group = _group(target)
            upward = target_group == "" or (
                target_group != group and LAYER_OF[target_group] >= LAYER_OF.get(group, -1)
            )
            if upward and BY_NAME.get(module) != target:
                strays[module] = target
    assert strays == {}


def test_builtins_list_only_symbolics_and_kernels() -> None:
    from onnx_custom.common import builtins

    assert all(m.startswith("onnx_custom.symbolics.") for m in builtins.SYMBOLIC_MODULES)
    assert all(m.startswith("onnx_custom.ort_kernels.") for m in builtins.KERNEL_MODULES)
    assert set(builtins.SYMBOLIC_MODULES) | set(builtins.KERNEL_MODULES) <= set(MODULES)


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


def test_modules_import_without_cycles() -> None:
    # Package __init__ files re-export for users and are never imported by core modules.
    graph = {}
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        deps = set()
        for target, names, _ in _imports(path):
            deps |= {
                t
                for t in _targets(target, names)
                if t in MODULES and MODULES[t].name != "__init__.py"
            }
        graph[module] = deps - {module}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_verify_path_layers() -> None:
    def deps(module: str) -> set[str]:
        return {
            t for target, names, _ in _imports(MODULES[module]) for t in _targets(target, names)
        }

    assert not deps("onnx_custom.verification.localize") & {
        "onnx_custom.api",
        "onnx_custom.verification.verifier",
    }
    assert deps("onnx_custom.verification.compare") <= {"onnx_custom.errors"}


def test_cycle_finder_finds_a_planted_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_layer_check_finds_a_planted_upward_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from onnx_custom.cli.main import main\nfrom onnx_custom.runtime import registry\n"
    )
    monkeypatch.setitem(MODULES, "onnx_custom.translate.planted", planted)
    problems = [p for p in _layer_violations() if "planted" in p]
    assert any("imports a higher layer onnx_custom.cli.main" in p for p in problems), problems
    assert any("imports its sibling onnx_custom.runtime.registry" in p for p in problems), problems


def test_every_package_folder_is_listed_for_installation() -> None:
    """pyproject lists packages explicitly; a folder missing there is absent from a wheel."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    listed = set(tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert packages == listed, (
        f"not listed: {sorted(packages - listed)}; listed but absent: {sorted(listed - packages)}"
    )


# torch's private modules, each reached through one door (docs/torch-versions.md, "Private seams"):
# torch.onnx._internal only through these two adapters, which find every name by feature.
TORCH_ONNX_INTERNAL_DOORS = {"onnx_custom.common.torch_onnx", "onnx_custom.compile.torch_adapter"}
# Other private torch modules imported by name (import statements), each where its reason is:
PRIVATE_TORCH_IMPORTS = {
    # custom-op registries (fake/autograd kernels of our ops) and the fake-tensor mode the
    # output-metadata probe runs ops in
    "onnx_custom.spec.torch_op": {"torch._library"},
    "onnx_custom.exporter.output_meta": {
        "torch._library",
        "torch._dynamo.source",
        "torch._subclasses.fake_tensor",
    },
    # the compile backend's aot_autograd and fake-mode switches
    "onnx_custom.compile.torch_adapter": {"torch._dynamo.backends.common", "torch._subclasses"},
}
# torch._C (TorchScript graph and value objects, the ONNX log switch) is used as attributes of
# ``torch._C`` by the TorchScript exporter path and the quiet rules; it is not imported by name.


def _torch_private_uses(path: Path) -> list[tuple[str, int]]:
    """(dotted name, line) for every import of ``torch._*``/``torch.onnx._internal`` and every
    ``torch.onnx._internal...`` attribute chain in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if text.startswith("torch.onnx._internal"):
                found.append((text, node.lineno))
    return [
        (name, line)
        for name, line in found
        if name.startswith("torch._") or name.startswith("torch.onnx._internal")
    ]


def test_torch_onnx_internal_only_through_its_adapters() -> None:
    problems = [
        f"{path.name}:{line} {module} uses {name}"
        for module, path in sorted(MODULES.items())
        if module not in TORCH_ONNX_INTERNAL_DOORS
        for name, line in _torch_private_uses(path)
        if name.startswith("torch.onnx._internal")
    ]
    assert not problems, "\n".join(
        [*problems, "Fix: get the module from onnx_custom.common.torch_onnx"]
    )


def test_private_torch_imports_only_where_documented() -> None:
    problems = []
    for module, path in sorted(MODULES.items()):
        allowed = PRIVATE_TORCH_IMPORTS.get(module, set())
        for name, line in _torch_private_uses(path):
            if name.startswith("torch.onnx._internal") or any(
                name == a or name.startswith(a + ".") for a in allowed
            ):
                continue
            problems.append(f"{path.name}:{line} {module} imports {name}")
    assert not problems, "\n".join(problems)


def test_private_torch_check_finds_a_planted_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import torch\nfrom torch.onnx._internal.exporter import _core\n"
        "x = torch.onnx._internal.exporter\n"
    )
    uses = _torch_private_uses(planted)
    assert ("torch.onnx._internal.exporter", 2) in uses
    assert ("torch.onnx._internal.exporter", 3) in uses
    assert {line for _, line in uses} == {2, 3}
