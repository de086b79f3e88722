"""Op specs with C++ kernels -> one native ONNX Runtime library (``lib<name>_ops.so``).

```python
from onnx_custom.spec import parse_specs, build_native_library
lib = build_native_library(parse_specs("acme.yaml"), "dist/")   # dist/libacme_ops.so
onnx_custom.InferenceSession("m.onnx", kernels=lib)               # or plain onnxruntime:
so.register_custom_ops_library("dist/libacme_ops.so")
```

Every spec whose ``native`` is ``{source, function}`` gets generated registration code
(`onnx_custom.spec.native_codegen`), compiled with the user's source, the small runtime in
``ort_kernels/native`` (common, binding, library) and, with ``include_shipped=True``, the shipped
kernels. Builds are cached by content (sources, the headers beside them, generated code,
compiler, flags). `write_cmake_project` writes the same sources as a CMake project that builds
with ``cmake`` alone (another toolchain, cross-compiling, no Python).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from onnx_custom.errors import ExtensionBuildError, NativeCompileError, SpecError
from onnx_custom.runtime.native import (
    NativeLibrary,
    compile_library,
    library_domains_key,
    shipped_library,
    sources_dir,
)
from onnx_custom.runtime.shim_build import abi_include_dir
from onnx_custom.spec.native_codegen import (
    GeneratedOp,
    GeneratedSource,
    check_sources,
    expected_signature,
    generate_source,
    user_ops_source,
)
from onnx_custom.spec.native_source import NativeKernel
from onnx_custom.spec.spec import OpSpec

__all__ = ["RUNTIME_SOURCES", "build_native_library", "write_cmake_project"]

# The part of ort_kernels/native every library needs; the other files are the shipped kernels.
RUNTIME_SOURCES = ("common.cpp", "binding.cpp", "library.cpp")
_HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inl", ".inc")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _selected(specs: Sequence[OpSpec], include_shipped: bool) -> list[OpSpec]:
    if isinstance(specs, OpSpec):
        specs = [specs]
    if not isinstance(specs, (list, tuple)) or not all(isinstance(s, OpSpec) for s in specs):
        raise SpecError(
            "build_native_library expects a list of OpSpec (e.g. parse_specs('acme.yaml'));"
            f" received {type(specs).__name__}."
        )
    user = [s for s in specs if isinstance(s.native, NativeKernel)]
    if (
        include_shipped
    ):  # shipped ops declared with native: {source, function} are in the shipped set already
        own = sources_dir().resolve()
        user = [s for s in user if not _is_shipped(s.native, own)]
    others = [
        s.name
        for s in specs
        if not isinstance(s.native, NativeKernel) and not (s.native and include_shipped)
    ]
    if others:
        raise SpecError(
            f"op(s) {', '.join(others)} have no C++ kernel: expected native: {{source: file.cpp,"
            " function: name} in each spec (native: true ops need include_shipped=True); fix: add"
            " native: to them or leave them out.",
            op=others[0],
        )
    if not user and not include_shipped:
        raise SpecError(
            "no op spec with a C++ kernel (native: {source, function}) was given; fix: pass the"
            " specs whose kernels the library should hold."
        )
    nodes: dict[str, str] = {}
    for spec in user:
        node = str(spec.node_type)
        if node in nodes:
            raise SpecError(
                f"ops {nodes[node]} and {spec.name} both emit node {node}; one library serves a"
                " node once; fix: give them different op_type.",
                op=spec.name,
            )
        nodes[node] = spec.name
    return user


def _is_shipped(kernel: bool | str | NativeKernel, own: Path) -> bool:
    return isinstance(kernel, NativeKernel) and kernel.path().resolve().parent == own


def _library_name(name: str | None, specs: Sequence[OpSpec]) -> str:
    value = name if name is not None else (specs[0].namespace if specs else "onnx_custom_user")
    if not isinstance(value, str) or not _NAME.match(value):
        raise SpecError(
            f"library name {value!r} is not an identifier; expected e.g. 'acme' (gives"
            " libacme_ops.so)."
        )
    return value


def _headers_beside(sources: Sequence[Path]) -> list[Path]:
    """Headers next to the user's sources (they may include them): part of the cache key."""
    found: set[Path] = set()
    for source in sources:
        found |= {
            p for p in source.parent.iterdir() if p.suffix in _HEADER_SUFFIXES and p.is_file()
        }
    return sorted(found)


def _runtime_files(include_shipped: bool) -> list[Path]:
    folder = sources_dir()
    if include_shipped:
        return sorted(folder.glob("*.cpp"))
    return [folder / n for n in RUNTIME_SOURCES]


def _defines(name: str, include_shipped: bool, has_user_ops: bool) -> list[str]:
    out = [
        f'OC_LIBRARY_NAME="lib{name}_ops"',
        f'OC_DOMAINS_KEY="{library_domains_key(name + "_ops")}"',
    ]
    if has_user_ops:
        out.append("OC_WITH_USER_OPS")
    if not include_shipped:
        out.append("OC_WITHOUT_SHIPPED_OPS")
    return out


def _generate(user: Sequence[OpSpec]) -> tuple[list[GeneratedSource], str]:
    by_source = check_sources(user)
    generated = [generate_source(path, ops, i) for i, (path, ops) in enumerate(by_source.items())]
    return generated, user_ops_source(generated)


_DIAGNOSTIC = re.compile(
    r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<kind>fatal error|error):"
    r" (?P<msg>.*)$",
    re.M,
)
_CONTEXT = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)? ", re.M)


def _attribute_error(
    exc: NativeCompileError, generated: Sequence[GeneratedSource]
) -> NativeCompileError:
    """The compiler's first error, attributed to the op spec (and dtype) it belongs to."""
    output = exc.output or str(exc)
    first = _DIAGNOSTIC.search(output)
    if first is None:
        return exc
    file, line = Path(first["file"]).name, int(first["line"])
    where = f"{file}:{line}{':' + first['col'] if first['col'] else ''}"
    gen = next((g for g in generated if g.filename == file), None)
    if gen is None and any(g.source.name == file for g in generated):  # in the user's source
        gen = next(g for g in generated if g.source.name == file)
        file_lines = [
            int(m["line"])
            for m in _CONTEXT.finditer(output)
            if Path(m["file"]).name == gen.filename
        ]
    elif gen is None:  # in a header: find the op through the notes naming generated lines
        for match in _CONTEXT.finditer(output):
            gen = next((g for g in generated if g.filename == Path(match["file"]).name), None)
            if gen is not None:
                file_lines = [
                    int(m["line"])
                    for m in _CONTEXT.finditer(output)
                    if Path(m["file"]).name == gen.filename
                ]
                break
        else:
            file_lines = []
    else:
        file_lines = [line] + [
            int(m["line"])
            for m in _CONTEXT.finditer(output)
            if Path(m["file"]).name == gen.filename
        ]
    op = None
    dtypes: tuple[str, ...] | None = None
    if gen is not None:
        for candidate in gen.ops:
            if any(candidate.first_line <= n <= candidate.last_line for n in file_lines):
                op = candidate
                dtypes = next((combo for n, combo in candidate.dispatch if n in file_lines), None)
                break
        if op is None and file == gen.source.name:
            op = _defined_before(
                gen, line
            )  # an error in a kernel's own code (no instantiation note)
        if op is None and len(gen.ops) == 1:
            op = gen.ops[0]
    errors = [m.group(0) for m in _DIAGNOSTIC.finditer(output)]
    shown = "\n".join(f"  {e}" for e in errors[:5]) + (
        f"\n  ... {len(errors) - 5} more errors" if len(errors) > 5 else ""
    )
    if op is None:
        return NativeCompileError(
            f"the native kernel library does not compile: {where}: {first['msg']}\n{shown}\n(full"
            " compiler output: .output)",
            file=file,
            line=line,
            output=output,
        )
    spec = op.spec
    assert isinstance(spec.native, NativeKernel)
    label = f"op {spec.name}{f' ({spec.source})' if spec.source else ''}"
    dtype_text = f" at dtype {', '.join(dtypes)}" if dtypes else ""
    if (
        gen is not None
        and file == gen.filename
        and (line == op.call_line or "no matching function" in first["msg"])
    ):
        detail = (
            f"the C++ function {spec.native.function} in {Path(spec.native.source).name} cannot be"
            f" called as the spec declares it{dtype_text}; expected"
            f" {expected_signature(spec, dtypes or ())}; fix: change the function's signature (or"
            " make it a template) or the spec's inputs, outputs, attributes and dtype lists."
        )
    else:
        detail = f"its C++ kernel{dtype_text} does not compile: {where}: {first['msg']}"
    return NativeCompileError(
        f"{label}: {detail}\ncompiler errors:\n{shown}\n(full compiler output: .output)",
        op=spec.name,
        file=file,
        line=line,
        output=output,
    )


def _defined_before(gen: GeneratedSource, line: int) -> GeneratedOp:
    """The op whose kernel function is named last before ``line`` of its source."""
    text = gen.source.read_text(encoding="utf-8", errors="replace").splitlines()[:line]
    best, best_line = gen.ops[0], -1
    for op in gen.ops:
        assert isinstance(op.spec.native, NativeKernel)
        pattern = re.compile(rf"\b{re.escape(op.spec.native.function.split('::')[-1])}\s*\(")
        hits = [i for i, row in enumerate(text) if pattern.search(row)]
        if hits and hits[-1] > best_line:
            best, best_line = op, hits[-1]
    return best


def build_native_library(
    specs: Sequence[OpSpec],
    output_dir: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    include_shipped: bool = False,
    sanitize: bool = False,
) -> NativeLibrary:
    """Build ``lib<name>_ops.so`` holding the C++ kernels of ``specs`` (and, with
    ``include_shipped``, every shipped native kernel); cached by content. With ``output_dir``,
    the library is copied there (atomically). ``name`` defaults to the first spec's namespace.
    ``sanitize=True`` builds with AddressSanitizer/UBSan (load it in a process started with the
    sanitizer runtime preloaded). Returns a `NativeLibrary` (pass it as ``kernels=`` to
    `onnx_custom.InferenceSession` or `onnx_custom.verify`).

    Raises `SpecError` (a missing source or function, an untranslatable shape rule) and
    `NativeCompileError` (the compiler's first error, attributed to the op and dtype).
    """
    user = _selected(specs, include_shipped)
    lib_name = _library_name(name, user)
    generated, entry = _generate(user)
    user_sources = [g.source for g in generated]
    with tempfile.TemporaryDirectory(prefix="onnx_custom_gen_") as tmp:
        folder = Path(tmp)
        files = []
        for g in generated:
            (folder / g.filename).write_text(g.text, encoding="utf-8")
            files.append(folder / g.filename)
        if user:
            (folder / "user_ops.cpp").write_text(entry, encoding="utf-8")
            files.append(folder / "user_ops.cpp")
        includes = [sources_dir(), *dict.fromkeys(p.parent for p in user_sources)]
        try:
            built = compile_library(
                f"lib{lib_name}_ops.so",
                [*files, *_runtime_files(include_shipped)],
                includes=includes,
                defines=_defines(lib_name, include_shipped, bool(user)),
                hashed=[*user_sources, *_headers_beside(user_sources)],
                sanitize=sanitize,
            )
        except NativeCompileError as exc:
            raise _attribute_error(exc, generated) from None
    ops = [str(s.node_type) for s in user] + (
        list(shipped_library().ops) if include_shipped else []
    )
    library = NativeLibrary(built, library_domains_key(f"{lib_name}_ops"), tuple(ops))
    if output_dir is None:
        return library
    return NativeLibrary(_copy_into(built, Path(output_dir)), library.domains_key, library.ops)


def _copy_into(built: Path, folder: Path) -> Path:
    target = folder / built.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{built.stem}-", dir=folder)
        os.close(fd)
        shutil.copyfile(built, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except OSError as exc:
        raise ExtensionBuildError(
            f"cannot write {built.name} into {folder}: expected a writable folder ({exc}); fix:"
            " pass a writable folder."
        ) from exc
    return target.resolve()


_CMAKE = """\
# {lib} from op specs with C++ kernels, generated by onnx-custom. Needs CMake and a C++17 compiler
# only (no Python, no ONNX Runtime files: ORT hands the library its API when it loads it).
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build   # -> build/{lib}.so
# Cross-compile with your toolchain file: cmake -S . -B build -DCMAKE_TOOLCHAIN_FILE=...
cmake_minimum_required(VERSION 3.13)
project({name}_ops CXX)
file(GLOB SOURCES
  ${{CMAKE_CURRENT_SOURCE_DIR}}/generated/*.cpp ${{CMAKE_CURRENT_SOURCE_DIR}}/runtime/*.cpp)
add_library({name}_ops SHARED ${{SOURCES}})
target_include_directories({name}_ops PRIVATE
  ${{CMAKE_CURRENT_SOURCE_DIR}}/include
  ${{CMAKE_CURRENT_SOURCE_DIR}}/runtime
  ${{CMAKE_CURRENT_SOURCE_DIR}}/kernels)
target_compile_definitions({name}_ops PRIVATE {defines})
set_target_properties({name}_ops PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                      CXX_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON)
if(NOT CMAKE_BUILD_TYPE)
  target_compile_options({name}_ops PRIVATE -O3)
endif()
find_package(Threads REQUIRED)
target_link_libraries({name}_ops PRIVATE Threads::Threads "-Wl,-z,nodelete")
"""


def write_cmake_project(
    specs: Sequence[OpSpec],
    folder: str | os.PathLike[str],
    *,
    name: str | None = None,
    include_shipped: bool = False,
) -> Path:
    """Write a standalone CMake project building the same library as `build_native_library`:
    ``kernels/`` (the user's sources and the headers beside them), ``generated/`` (registration
    code), ``runtime/`` (our runtime and, with ``include_shipped``, the shipped kernels) and
    ``include/`` (``onnx_custom/kernel.h`` and the ORT ABI header). Returns the folder."""
    user = _selected(specs, include_shipped)
    lib_name = _library_name(name, user)
    generated, entry = _generate(user)
    root = Path(folder)
    sources = [g.source for g in generated]
    copies: dict[Path, bytes] = {}
    for g in generated:
        copies[root / "generated" / g.filename] = g.text.encode()
    if user:
        copies[root / "generated" / "user_ops.cpp"] = entry.encode()
    for path in [*sources, *_headers_beside(sources)]:
        copies[root / "kernels" / path.name] = path.read_bytes()
    runtime = sources_dir()
    runtime_files = _runtime_files(include_shipped) + sorted(runtime.glob("*.h"))
    for path in runtime_files:
        copies[root / "runtime" / path.name] = path.read_bytes()
    include = abi_include_dir()
    for path in sorted(include.rglob("*.h")):
        copies[root / "include" / path.relative_to(include)] = path.read_bytes()
    defines = " ".join(
        '"' + d.replace('"', '\\"') + '"' for d in _defines(lib_name, include_shipped, bool(user))
    )
    copies[root / "CMakeLists.txt"] = _CMAKE.format(
        name=lib_name, lib=f"lib{lib_name}_ops", defines=defines
    ).encode()
    try:
        for path, data in copies.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
    except OSError as exc:
        raise ExtensionBuildError(
            f"cannot write the CMake project into {root}: expected a writable folder ({exc}); fix:"
            " pass a writable folder."
        ) from exc
    return root
