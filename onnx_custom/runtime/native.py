"""The torch-free native kernel library ``libonnx_custom_ops.so``: build on first use, locate, load.

The C++ sources live in ``onnx_custom/ort_kernels/native/`` (one file per op family; ORT's C ABI
declared in ``onnx_custom/runtime/include/onnx_custom_ort_abi.h``). They need only a C++17 compiler:
no Python, no torch, no ONNX Runtime headers or libraries (ORT hands the library its function table
when it loads it). :func:`library_path` compiles them once into the cache
(``$ONNX_CUSTOM_CACHE_DIR``, default ``~/.cache/onnx_custom``, folder ``native/<key>`` keyed by
the sources, the compiler and the flags; built in a temporary file, then renamed into place) and
returns the ``.so``, which loads in plain ONNX Runtime from any language::

    so = onnxruntime.SessionOptions()
    so.register_custom_ops_library(onnx_custom.library_path())

Without Python: ``make -C ort_kernels/native`` or the one-line command in :data:`ONE_LINE`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onnx_custom.common.native_build import announce_build, cache_root, find_compiler, process_lock
from onnx_custom.errors import (
    ExtensionBuildError,
    InvalidArgumentError,
    KernelError,
    NativeCompileError,
)
from onnx_custom.runtime.shim_build import abi_include_dir

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

    from onnx_custom.runtime.kernel_spec import KernelSpec
    from onnx_custom.runtime.registry import KernelRegistry

__all__ = [
    "DOMAINS_KEY",
    "LIBRARY_NAME",
    "ONE_LINE",
    "NativeFallbackWarning",
    "NativeLibrary",
    "build_library",
    "compile_library",
    "library_domains_key",
    "library_path",
    "native_ops",
    "plan_kernels",
    "plan_native",
    "register_library",
    "shipped_library",
    "sources_dir",
]

LIBRARY_NAME = "libonnx_custom_ops.so"
# Portable x86-64/aarch64 code; the AVX2/AVX-512 kernels are picked at run time.
_FLAGS: dict[str, tuple[str, ...]] = {
    "release": ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-pthread"),
    # for fuzzing under AddressSanitizer/UBSan (tests): same code, checks on
    "sanitize": (
        "-std=c++17",
        "-O1",
        "-g",
        "-fPIC",
        "-fvisibility=hidden",
        "-pthread",
        "-fsanitize=address,undefined",
        "-fno-omit-frame-pointer",
        "-fno-sanitize-recover=undefined",
    ),
}
_LINK = ("-shared", "-Wl,-z,nodelete")  # never unmapped: ORT threads may outlive a dlclose
ONE_LINE = (
    "c++ -std=c++17 -O3 -fPIC -shared -fvisibility=hidden -pthread -Wl,-z,nodelete "
    "-I onnx_custom/runtime/include ort_kernels/native/*.cpp -o libonnx_custom_ops.so"
)
_NAME_MACROS = ("OC_LIBRARY_NAME=", "OC_DOMAINS_KEY=")
_lock = threading.Lock()
_built: dict[str, Path] = {}


def sources_dir() -> Path:
    """Folder of the C++ sources (``ort_kernels/native`` in the repository).

    Found by name, without importing ``onnx_custom.ort_kernels`` (a higher layer): one of the
    two documented by-name lookups of ``tests/test_import_layers.py``.
    """
    spec = importlib.util.find_spec("onnx_custom.ort_kernels")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "native").is_dir():
            return Path(location) / "native"
    raise ExtensionBuildError(
        "the native kernel sources are missing: expected the folder ort_kernels/native inside the"
        " onnx_custom package, found none; fix: reinstall onnx-custom (the sources ship as package"
        " data)."
    )


def _sources() -> list[Path]:
    folder = sources_dir()
    files = sorted(folder.glob("*.cpp"))
    if not files:
        raise ExtensionBuildError(
            f"the native kernel sources are missing: expected C++ files in {folder}, found none; "
            "fix: reinstall onnx-custom (the sources ship as package data)."
        )
    return files


def _compiler() -> str:
    return find_compiler(
        "CXX",
        ("c++", "g++", "clang++"),
        language="C++17",
        needed_for=f"building {LIBRARY_NAME}",
        package="g++",
    )


@functools.cache
def _compiler_identity(cxx: str) -> str:
    try:
        proc = subprocess.run(
            [*cxx.split(), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise ExtensionBuildError(
            f"the C++ compiler {cxx!r} cannot run ({exc}); fix: set CXX to a working compiler."
        ) from exc
    return f"{shutil.which(cxx.split()[0])}|{proc.stdout.strip()}"


def _build_key(
    cxx: str, flags: Sequence[str], files: Sequence[Path] | None = None, defines: Sequence[str] = ()
) -> str:
    h = hashlib.sha256()
    for path in _shipped_inputs() if files is None else files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for part in (
        _compiler_identity(cxx),
        " ".join(flags),
        " ".join(_LINK),
        " ".join(defines),
        sys.platform,
    ):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _shipped_inputs() -> list[Path]:
    """Every file the shipped build reads (sources, headers, the ABI and kernel headers)."""
    folder = sources_dir()
    headers = sorted(abi_include_dir().rglob("*.h"))
    return [p for p in [*sorted(folder.rglob("*")), *headers] if p.suffix in (".cpp", ".h")]


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    try:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd
        )
    except OSError as exc:
        raise ExtensionBuildError(
            f"cannot run the C++ compiler for {what} ({exc}); command: {' '.join(cmd)}"
        ) from exc


def _finish(proc: subprocess.Popen[str], cmd: list[str], what: str) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise NativeCompileError(
            f"compiling {what} failed (exit {proc.returncode}).\ncommand:"
            f" {' '.join(cmd)}\n{err[-4000:]}",
            file=what,
            output=err,
        )


def _compile(
    cxx: str,
    flags: Sequence[str],
    target: Path,
    sources: Sequence[Path],
    includes: Sequence[Path] = (),
    defines: Sequence[str] = (),
    cached: Sequence[Path | None] = (),
) -> None:
    """Objects in parallel (one compiler per source, as many at once as CPUs), then one link.
    ``cached[i]``: where source i's object is kept between builds (reused when present)."""
    include = [f"-I{abi_include_dir()}", *(f"-I{d}" for d in includes)]
    macros = [f"-D{d}" for d in defines]
    keep = list(cached) or [None] * len(sources)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [
            kept if kept is not None and kept.exists() else Path(tmp) / f"{i:02d}-{src.stem}.o"
            for i, (src, kept) in enumerate(zip(sources, keep, strict=True))
        ]
        jobs = [
            ([*cxx.split(), *flags, *include, *macros, "-c", str(src), "-o", str(obj)], src.name)
            for src, obj in zip(sources, objects, strict=True)
            if obj.parent == Path(tmp)
        ]
        width = max(1, os.cpu_count() or 1)
        running: list[tuple[subprocess.Popen[str], list[str], str]] = []
        try:
            for cmd, name in jobs:
                running.append((_run(cmd, name), cmd, name))
                if len(running) >= width:
                    _finish(*running.pop(0))
            while running:
                _finish(*running.pop(0))
        finally:
            for proc, _, _ in running:  # a failed source: stop the others before the folder goes
                proc.kill()
                proc.communicate()
        for obj, kept in zip(objects, keep, strict=True):
            if kept is not None and obj != kept:  # keep it for the next library using this source
                kept.parent.mkdir(parents=True, exist_ok=True)
                part = kept.with_name(f".{kept.name}.{os.getpid()}")
                shutil.copyfile(obj, part)
                os.replace(part, kept)
        out = Path(tmp) / target.name
        link = [*cxx.split(), *flags, *(str(o) for o in objects), *_LINK, "-o", str(out)]
        _finish(_run(link, target.name), link, target.name)
        os.replace(out, target)  # atomic: readers see no file or the whole library


def compile_library(
    name: str,
    sources: Sequence[Path],
    *,
    includes: Sequence[Path] = (),
    defines: Sequence[str] = (),
    hashed: Sequence[Path] = (),
    sanitize: bool = False,
) -> Path:
    """Compile ``sources`` into the shared library ``name`` in the build cache, keyed by the
    content of ``sources`` and ``hashed`` (headers they include), the defines, the compiler and
    the flags; a second call with the same inputs returns the cached file without compiling.
    Include path: the ABI/kernel headers, then ``includes``. Raises `NativeCompileError` with
    the compiler's output (``.output``) when a source does not compile."""
    variant = "sanitize" if sanitize else "release"
    cxx = _compiler()
    flags = _FLAGS[variant]
    files = sorted({*sources, *hashed, *_shipped_inputs()})
    folder = cache_root() / "native" / f"{variant}-{_build_key(cxx, flags, files, defines)}"
    target = folder / name
    if target.exists():
        return target.resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExtensionBuildError(
            f"cannot create the build cache {folder} ({exc}); fix: set ONNX_CUSTOM_CACHE_DIR to a"
            " writable folder."
        ) from exc
    # Our own sources do not see the user's files: their objects are shared by every library
    # built with the same flags and defines (a user library then compiles only its own code).
    # Only library.cpp reads the library's name macros (OC_LIBRARY_NAME, OC_DOMAINS_KEY).
    own, shipped = sources_dir().resolve(), _shipped_inputs()

    def object_key(src: Path) -> str:
        used = (
            defines
            if src.name == "library.cpp"
            else [d for d in defines if not d.startswith(_NAME_MACROS)]
        )
        return _build_key(cxx, flags, shipped, [*used, *map(str, includes[:1])])

    cached = [
        (
            cache_root() / "native" / "objects" / f"{variant}-{src.stem}-{object_key(src)}.o"
            if src.resolve().parent == own
            else None
        )
        for src in sources
    ]
    with process_lock(folder):
        if not target.exists():  # another process may have built it while we waited
            with announce_build(f"{name} (the native kernel library, {variant} build)", "15-45 s"):
                _compile(cxx, flags, target, list(sources), includes, defines, cached)
    return target.resolve()


def library_path(*, sanitize: bool = False) -> Path:
    """Absolute path of ``libonnx_custom_ops.so``, compiling it on first use (cached on disk).

    ``sanitize=True`` builds a separate AddressSanitizer/UBSan copy (for fuzzing; it must be
    loaded into a process started with the sanitizer runtime preloaded).
    Raises :class:`ExtensionBuildError` naming the missing tool or the compiler's error.
    """
    if not isinstance(sanitize, bool):
        raise InvalidArgumentError(
            f"sanitize must be True or False; received {sanitize!r}. Fix: pass sanitize=True for"
            " the AddressSanitizer build, or leave it out."
        )
    variant = "sanitize" if sanitize else "release"
    with _lock:
        hit = _built.get(variant)
        if hit is not None and hit.exists():
            return hit
        _built[variant] = compile_library(LIBRARY_NAME, _sources(), sanitize=sanitize)
        return _built[variant]


def build_library(output_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or reuse) the library; with ``output_dir``, copy it there. Returns the final path.

    The folder is checked before building: a first build takes a minute, a typo in ``-o`` must
    not wait for it."""
    folder = None if output_dir is None else Path(output_dir)
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK):
                raise PermissionError(f"{folder} is not writable")
        except OSError as exc:
            raise ExtensionBuildError(
                f"cannot write {LIBRARY_NAME} into {folder}: expected a writable folder ({exc});"
                " fix: pass a writable folder."
            ) from exc
    built = library_path()
    if folder is None:
        return built
    try:
        fd, tmp = tempfile.mkstemp(prefix=".libonnx_custom_ops-", dir=folder)
        os.close(fd)
        shutil.copyfile(built, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, folder / LIBRARY_NAME)
    except OSError as exc:
        raise ExtensionBuildError(
            f"cannot write {LIBRARY_NAME} into {folder}: expected a writable folder ({exc}); fix:"
            " pass a writable folder."
        ) from exc
    return (folder / LIBRARY_NAME).resolve()


@dataclasses.dataclass(frozen=True)
class NativeLibrary:
    """A built custom-op library: its file, the session config entry its RegisterCustomOps reads
    to pick domains, and the ``domain::OpType`` nodes it serves (asked from the library)."""

    path: Path
    domains_key: str = "onnx_custom.native.domains"
    ops: tuple[str, ...] = ()

    @property
    def domains(self) -> frozenset[str]:
        return frozenset(op.split("::")[0] for op in self.ops)

    @classmethod
    def load(cls, path: str | os.PathLike[str], domains_key: str | None = None) -> NativeLibrary:
        """Describe the library at ``path`` (its op list comes from the library itself)."""
        file = Path(path)
        if not file.is_file():
            raise KernelError(
                f"native library {str(file)!r} does not exist; expected the .so that"
                " build_native_library or `onnx-custom build-library --spec` wrote; fix: build it"
                " first."
            )
        try:
            lib = ctypes.CDLL(str(file.resolve()))
            lib.OnnxCustomNativeOps.restype = ctypes.c_char_p
            names = lib.OnnxCustomNativeOps().decode()
        except (OSError, AttributeError) as exc:
            raise KernelError(
                f"{str(file)!r} is not an onnx-custom native library ({exc}); expected a library"
                " built by onnx-custom (it exports OnnxCustomNativeOps)."
            ) from exc
        key = (
            domains_key
            or f"onnx_custom.native.{file.name.removeprefix('lib').removesuffix('.so')}.domains"
        )
        return cls(file.resolve(), key, tuple(n for n in names.split(",") if n))


def library_domains_key(name: str) -> str:
    """Session config entry a library built as ``lib<name>.so`` reads to pick its domains."""
    return f"onnx_custom.native.{name}.domains"


@functools.cache
def shipped_library() -> NativeLibrary:
    """``libonnx_custom_ops.so`` (built on first use) as a `NativeLibrary`."""
    return NativeLibrary.load(library_path(), DOMAINS_KEY)


def native_ops() -> tuple[str, ...]:
    """``domain::OpType`` of every node the native library serves (asked from the library)."""
    return shipped_library().ops


_REGISTERED_KEY = "onnx_custom.native_library"
DOMAINS_KEY = "onnx_custom.native.domains"  # read by the library's RegisterCustomOps


def register_library(
    so: ort.SessionOptions,
    domains: Iterable[str] | None = None,
    library: NativeLibrary | None = None,
) -> ort.SessionOptions:
    """Load a native library (default: the shipped one) into ``so``: all its domains, or only
    ``domains``.

    ONNX Runtime takes one definition per domain and session, so a session that serves some
    domain with other kernels leaves that domain out. A second call on the same options is a no-op.
    """
    lib = shipped_library() if library is None else library
    mark = _REGISTERED_KEY if library is None else f"{_REGISTERED_KEY}.{lib.domains_key}"
    if _config(so, mark) is not None:
        return so
    if domains is not None:
        so.add_session_config_entry(lib.domains_key, ",".join(sorted(domains)))
    so.register_custom_ops_library(str(lib.path))
    so.add_session_config_entry(mark, str(lib.path))
    return so


def _config(so: ort.SessionOptions, key: str) -> str | None:
    try:
        return str(so.get_session_config_entry(key))
    except Exception:  # onnxruntime raises when the entry is absent
        return None


def plan_kernels(
    model: onnx.ModelProto, kernels: KernelRegistry | None = None
) -> tuple[frozenset[str], list[KernelSpec]]:
    """``(domains served natively, Python kernels for the rest)`` for the model's custom nodes,
    with the shipped library (see `plan_native`)."""
    chosen, specs = plan_native(model, kernels)
    return frozenset(chosen), specs


def plan_native(
    model: onnx.ModelProto,
    kernels: KernelRegistry | None = None,
    libraries: Sequence[NativeLibrary] = (),
) -> tuple[dict[str, NativeLibrary], list[KernelSpec]]:
    """``({domain: library serving it natively}, Python kernels for the rest)``.

    A domain runs natively when one library serves every one of the model's node types in it
    (``libraries`` first, in order, then the shipped library); otherwise the whole domain falls
    back to Python kernels (one definition per domain and session). Raises :class:`KernelError`
    naming every node nothing serves.
    """
    from onnx_custom.common.onnx_utils import iter_nodes
    from onnx_custom.runtime.kernel_spec import RESERVED_DOMAINS
    from onnx_custom.runtime.registry import default_kernel_registry

    registry = default_kernel_registry() if kernels is None else kernels
    candidates = [*libraries, shipped_library()]
    local = {(f.domain, f.name) for f in model.functions}
    nodes = [
        n
        for n in iter_nodes(model)
        if n.domain not in RESERVED_DOMAINS and (n.domain, n.op_type) not in local
    ]
    by_domain: dict[str, set[str]] = {}
    for node in nodes:
        by_domain.setdefault(node.domain, set()).add(node.op_type)
    chosen: dict[str, NativeLibrary] = {}
    for domain, ops in by_domain.items():
        for lib in candidates:
            if all(f"{domain}::{op}" in lib.ops for op in ops):
                chosen[domain] = lib
                break
    specs: dict[str, KernelSpec] = {}
    missing: list[str] = []
    for node in nodes:
        if node.domain in chosen:
            continue
        spec = registry.lookup(node.domain, node.op_type)
        name = f"{node.domain}::{node.op_type}"
        if spec is not None:
            specs.setdefault(spec.name, spec)
        elif name not in missing:
            missing.append(name)
    if missing:
        served = sorted({op for lib in candidates for op in lib.ops})
        raise KernelError(
            f"{len(missing)} custom op type(s) in the model have neither a native nor a Python "
            f"kernel: {', '.join(missing)}; the native libraries serve {', '.join(served)}; fix: "
            "build a library for them (onnx-custom build-library --spec), register Python kernels "
            "(@onnx_custom.runtime.kernel) or embed function bodies (export(..., functions=True))."
        )
    fallback = sorted({f"{n.domain}::{n.op_type}" for n in nodes if n.domain not in chosen})
    if fallback:
        # said once, when the session is made: native kernels were asked for, not Python in the loop
        warnings.warn(
            f"native kernels: {len(fallback)} custom op type(s) run Python kernels, not a native "
            f"library: {', '.join(fallback)} (a domain runs natively only when one library serves "
            "every op type of it in the model). Fix: add native kernels for them (onnx-custom "
            "build-library --spec), or expect Python in the loop.",
            NativeFallbackWarning,
            stacklevel=3,
        )
    return chosen, list(specs.values())


class NativeFallbackWarning(UserWarning):
    """Native kernels were asked for, but some custom nodes run Python kernels."""
