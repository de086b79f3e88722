"""The package imports in one direction: a layer order over every folder, no cycles, no private
names across subpackages, and the two documented by-name lookups checked where they are.

The order is written in docs/design.md ("Layers"); this test is its enforcement. Every import
counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import is still a
dependency a newcomer has to follow. So do the two other kinds of edge between our folders: a
C/C++ ``#include`` (the eager ops' sources in ``ops/csrc``, the native kernels in
``ort_kernels/native``, the runtime's headers) and an op spec's ``"module:function"`` reference
(Python constants, f-strings built from module constants, and YAML specs).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
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
    ("fusion", "rewrite"),
    ("verification",),
    ("compile",),
    ("api",),
    ("testing",),
    ("models",),
    ("zoo",),
    ("hf_zoo",),
    ("cli",),
)
LAYER_OF = {group: i for i, groups in enumerate(LAYERS) for group in groups}

# The documented exceptions, each a lookup by name (no import statement):
# - the registries load the built-in family modules listed in common.builtins by name;
# - runtime.native finds the native library's C++ sources in ort_kernels/native by name.
# - common.op_namespace defines the shipped torch ops (common.builtins.OP_MODULES) on demand.
BY_NAME = {
    "onnx_custom.translate.registry": "onnx_custom.common.builtins",
    "onnx_custom.runtime.registry": "onnx_custom.common.builtins",
    "onnx_custom.common.op_namespace": "onnx_custom.common.builtins",
    "onnx_custom.runtime.native": "onnx_custom.ort_kernels",
}
# Old import paths kept as aliases of a module in a higher layer (none at present).
ALIASES: dict[str, set[str]] = {}


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


# --- C/C++ includes ----------------------------------------------------------------------------

_C_SUFFIXES = (".c", ".h", ".cpp")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def _folder_module(path: Path) -> str:
    """The dotted name of the folder a file sits in (``onnx_custom.runtime.include....``)."""
    for package, folder in sorted(_roots().items(), key=lambda item: -len(str(item[1]))):
        if path.is_relative_to(folder):
            return ".".join([*package.split("."), *path.parent.relative_to(folder).parts])
    raise AssertionError(f"{path} is outside the package")


def _include_dirs() -> list[Path]:
    """The include path every build of ours uses besides the including file's own folder: the
    runtime's header folder (the eager ops get a copy of it; the native build and the shim
    ``-I`` it)."""
    return [_roots()["onnx_custom"] / "runtime" / "include"]


def _c_files() -> list[Path]:
    files = {
        p for folder in _roots().values() for p in folder.rglob("*") if p.suffix in _C_SUFFIXES
    }
    return sorted(files)


def _c_include_edges(path: Path) -> list[tuple[str, Path | None, int]]:
    """(include name, the file it resolves to or None, line) for every include of one file:
    quoted ones always, ``<...>`` ones when they name one of our headers."""
    edges = []
    text = path.read_text(errors="replace")
    for match in _INCLUDE.finditer(text):
        bracket, name = match.groups()
        line = text.count("\n", 0, match.start()) + 1
        folders = [path.parent, *_include_dirs()] if bracket == '"' else _include_dirs()
        found = next((f / name for f in folders if (f / name).is_file()), None)
        if found is not None or bracket == '"':
            edges.append((name, found, line))
    return edges


def _c_include_violations(files: list[tuple[Path, str]]) -> list[str]:
    """Problems of (file, its group) pairs: an include found nowhere, or reaching up or sideways."""
    problems = []
    for path, group in files:
        for name, found, line in _c_include_edges(path):
            if found is None:
                problems.append(f'{path.name}:{line} includes "{name}", found on no include path')
                continue
            target_group = _group(_folder_module(found))
            if target_group != group and LAYER_OF[target_group] >= LAYER_OF[group]:
                problems.append(
                    f"{path.name}:{line} ({group}) includes {name} from a higher layer or a"
                    f" sibling ({target_group})"
                )
    return problems


def test_c_includes_follow_the_layer_order() -> None:
    files = _c_files()
    assert any(p.suffix == ".cpp" for p in files), "no C++ sources found"
    problems = _c_include_violations([(p, _group(_folder_module(p))) for p in files])
    assert problems == [], "C/C++ includes against the layer order:\n" + "\n".join(problems)


def test_shared_kernel_headers_are_included_by_both_users() -> None:
    """Each header in ``onnx_custom/kernels`` holds the math of one op family for its eager op and
    its native kernel: both include it (one copy of the math)."""
    kernels = _include_dirs()[0] / "onnx_custom" / "kernels"
    headers = sorted(kernels.glob("*.h"))
    assert headers, f"no shared kernel headers in {kernels}"
    for header in headers:
        users = {
            _group(_folder_module(p))
            for p in _c_files()
            if any(found == header for _, found, _ in _c_include_edges(p))
        }
        assert users >= {"ops", "ort_kernels"}, f"{header.name} is included only by {users}"


def test_c_include_check_finds_a_planted_upward_include(tmp_path: Path) -> None:
    # a runtime header reaching into the native kernels' folder, and a name found nowhere
    numeric = _roots()["onnx_custom.ort_kernels"] / "native" / "numeric.h"
    planted = tmp_path / "planted.h"
    planted.write_text(f'#include "{numeric}"\n#include "missing.h"\n#include <vector>\n')
    problems = _c_include_violations([(planted, "runtime")])
    assert any("numeric.h from a higher layer" in p for p in problems), problems
    assert any('"missing.h", found on no include path' in p for p in problems), problems
    assert len(problems) == 2, problems


# --- spec "module:function" references ---------------------------------------------------------

_REFERENCE = re.compile(r"^(onnx_custom(?:\.\w+)+):(\w+)$")

# An op spec names the parts of its family by string, resolved when first used: its translations
# (symbolics) and its Python kernels (ort_kernels) sit a layer above the op (ops), so these two
# upward references are the documented ones; every other reference follows the layer order.
SPEC_REFERENCES_UP = {"ops": {"symbolics", "ort_kernels"}}


def _module_constants(tree: ast.Module) -> dict[str, str]:
    constants = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            constants[node.targets[0].id] = node.value.value
    return constants


def _string_value(node: ast.AST, constants: dict[str, str]) -> str | None:
    """A string constant, or an f-string whose parts are module-level string constants."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif (
                isinstance(value, ast.FormattedValue)
                and isinstance(value.value, ast.Name)
                and value.value.id in constants
                and value.format_spec is None
            ):
                parts.append(constants[value.value.id])
            else:
                return None
        return "".join(parts)
    return None


def _spec_references(path: Path) -> list[tuple[str, str, int]]:
    """(module, attribute, line) for every ``"onnx_custom.x.y:name"`` string in one file."""
    found = []
    if path.suffix == ".py":
        tree = ast.parse(path.read_text())
        constants = _module_constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FormattedValue):
                continue
            text = _string_value(node, constants)
            match = _REFERENCE.match(text or "")
            if match:
                found.append((match[1], match[2], getattr(node, "lineno", 0)))
    else:
        for line, row in enumerate(path.read_text().splitlines(), 1):
            for text in re.findall(r"[\"']([^\"']+)[\"']", row):
                match = _REFERENCE.match(text)
                if match:
                    found.append((match[1], match[2], line))
    return found


def _spec_files() -> list[Path]:
    files = set(MODULES.values())
    files |= {p for folder in _roots().values() for p in folder.rglob("*.yaml")}
    return sorted(files)


def _spec_reference_violations(files: list[tuple[Path, str]]) -> list[str]:
    """Problems of (file, its group) pairs: a reference to no module of ours, or one reaching up
    or sideways other than the documented ones."""
    problems = []
    for path, group in files:
        for module, _, line in _spec_references(path):
            if module not in MODULES:
                problems.append(f"{path.name}:{line} names {module}, which is no module of ours")
                continue
            target_group = _group(module)
            if target_group in ("", group) or target_group in SPEC_REFERENCES_UP.get(group, ()):
                continue
            if group == "" or LAYER_OF[target_group] >= LAYER_OF[group]:
                problems.append(
                    f"{path.name}:{line} ({group or 'package'}) names {module} in a higher layer"
                    f" or a sibling ({target_group})"
                )
    return problems


def test_spec_references_follow_the_layer_order() -> None:
    files = _spec_files()
    assert sum(len(_spec_references(p)) for p in files) >= 20, "spec references not found"
    problems = _spec_reference_violations([(p, _group(_folder_module(p))) for p in files])
    assert problems == [], "spec references against the layer order:\n" + "\n".join(problems)


def test_spec_references_resolve() -> None:
    """Every reference names an existing function (a rename breaks here, not at first use)."""
    missing = []
    for path in _spec_files():
        for module, name, line in _spec_references(path):
            if module in MODULES and not hasattr(importlib.import_module(module), name):
                missing.append(f"{path.name}:{line} {module}:{name}")
    assert missing == [], "\n".join(missing)


def test_spec_reference_check_finds_a_planted_upward_reference(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        '_KERNELS = "onnx_custom.ort_kernels.seed"\n'
        'A = f"{_KERNELS}:my_add"\nB = "onnx_custom.nowhere:f"\nC = "onnx_custom.errors:X"\n'
    )
    problems = _spec_reference_violations([(planted, "translate")])
    assert any("names onnx_custom.ort_kernels.seed in a higher layer" in p for p in problems)
    assert any("onnx_custom.nowhere, which is no module" in p for p in problems), problems
    assert len(problems) == 2, problems


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
    # the pooling output-size helper that torch_fixes mends on older torch
    "onnx_custom.common.torch_onnx": {"torch._meta_registrations"},
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
