"""The torch-free native kernel library ``libonnx_custom_ops.so``: build on first use, locate, load.

The C++ sources live in ``onnx_custom/ort_kernels/native/`` (one file per op family; ORT's C ABI
declared in ``onnx_custom/runtime/include/onnx_custom_ort_abi.h``). They need only a C++17 compiler: no Python, no
torch, no ONNX Runtime headers or libraries (ORT hands the library its function table when it
loads it). :func:`library_path` compiles them once into the cache
(``$ONNX_CUSTOM_CACHE_DIR``, default ``~/.cache/onnx_custom``, folder ``native/<key>`` keyed by
the sources, the compiler and the flags; built in a temporary file, then renamed into place) and
returns the ``.so``, which loads in plain ONNX Runtime from any language::

    so = onnxruntime.SessionOptions()
    so.register_custom_ops_library(onnx_custom.library_path())

Without Python: ``make -C ort_kernels/native`` or the one-line command in :data:`ONE_LINE`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
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
from onnx_custom.errors import ExtensionBuildError, InvalidArgumentError, KernelError
from onnx_custom.runtime.shim_build import ABI_HEADER, abi_include_dir

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

    from onnx_custom.runtime.registry import KernelRegistry, KernelSpec

__all__ = [
    "DOMAINS_KEY",
    "LIBRARY_NAME",
    "ONE_LINE",
    "NativeFallbackWarning",
    "build_library",
    "library_path",
    "native_ops",
    "plan_kernels",
    "register_library",
    "sources_dir",
]

LIBRARY_NAME = "libonnx_custom_ops.so"
# Portable x86-64/aarch64 code; the AVX2/AVX-512 kernels are picked at run time.
_FLAGS: dict[str, tuple[str, ...]] = {
    "release": ("-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-pthread"),
    # for fuzzing under AddressSanitizer/UBSan (tests): same code, checks on
    "sanitize": ("-std=c++17", "-O1", "-g", "-fPIC", "-fvisibility=hidden", "-pthread",
                 "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                 "-fno-sanitize-recover=undefined"),
}  # fmt: skip
_LINK = ("-shared", "-Wl,-z,nodelete")  # never unmapped: ORT threads may outlive a dlclose
ONE_LINE = (
    "c++ -std=c++17 -O3 -fPIC -shared -fvisibility=hidden -pthread -Wl,-z,nodelete "
    "-I onnx_custom/runtime/include ort_kernels/native/*.cpp -o libonnx_custom_ops.so"
)
_lock = threading.Lock()
_built: dict[str, Path] = {}


def sources_dir() -> Path:
    """Folder of the C++ sources (``ort_kernels/native`` in the repository)."""
    import onnx_custom.ort_kernels as kernels

    return Path(kernels.__file__).parent / "native"


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
    return find_compiler("CXX", ("c++", "g++", "clang++"), language="C++17", needed_for=f"building {LIBRARY_NAME}", package="g++")


@functools.cache
def _compiler_identity(cxx: str) -> str:
    try:
        proc = subprocess.run([*cxx.split(), "--version"], capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
    except OSError as exc:
        raise ExtensionBuildError(f"the C++ compiler {cxx!r} cannot run ({exc}); fix: set CXX to a working compiler.") from exc
    return f"{shutil.which(cxx.split()[0])}|{proc.stdout.strip()}"


def _build_key(cxx: str, flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    folder = sources_dir()
    for path in [*sorted(folder.rglob("*")), abi_include_dir() / ABI_HEADER]:
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    for part in (_compiler_identity(cxx), " ".join(flags), " ".join(_LINK), sys.platform):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _run(cmd: list[str], what: str) -> subprocess.Popen[str]:
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ExtensionBuildError(f"cannot run the C++ compiler for {what} ({exc}); command: {' '.join(cmd)}") from exc


def _finish(proc: subprocess.Popen[str], cmd: list[str], what: str) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise ExtensionBuildError(
            f"compiling {what} failed (exit {proc.returncode}).\ncommand: {' '.join(cmd)}\n"
            f"{err[-4000:]}"
        )


def _compile(cxx: str, flags: Sequence[str], target: Path) -> None:
    """Objects in parallel (one compiler per source, as many at once as CPUs), then one link."""
    sources = _sources()
    include = f"-I{abi_include_dir()}"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / (src.stem + ".o") for src in sources]
        jobs = [[*cxx.split(), *flags, include, "-c", str(src), "-o", str(obj)]
                for src, obj in zip(sources, objects, strict=True)]  # fmt: skip
        width = max(1, os.cpu_count() or 1)
        running: list[tuple[subprocess.Popen[str], list[str], str]] = []
        for cmd, src in zip(jobs, sources, strict=True):
            running.append((_run(cmd, src.name), cmd, src.name))
            if len(running) >= width:
                _finish(*running.pop(0))
        for job in running:
            _finish(*job)
        out = Path(tmp) / LIBRARY_NAME
        link = [*cxx.split(), *flags, *(str(o) for o in objects), *_LINK, "-o", str(out)]
        _finish(_run(link, LIBRARY_NAME), link, LIBRARY_NAME)
        os.replace(out, target)  # atomic: readers see no file or the whole library


def library_path(*, sanitize: bool = False) -> Path:
    """Absolute path of ``libonnx_custom_ops.so``, compiling it on first use (cached on disk).

    ``sanitize=True`` builds a separate AddressSanitizer/UBSan copy (for fuzzing; it must be
    loaded into a process started with the sanitizer runtime preloaded).
    Raises :class:`ExtensionBuildError` naming the missing tool or the compiler's error.
    """
    if not isinstance(sanitize, bool):
        raise InvalidArgumentError(
            f"sanitize must be True or False; received {sanitize!r}. Fix: pass sanitize=True for the "
            "AddressSanitizer build, or leave it out."
        )
    variant = "sanitize" if sanitize else "release"
    with _lock:
        hit = _built.get(variant)
        if hit is not None and hit.exists():
            return hit
        cxx = _compiler()
        flags = _FLAGS[variant]
        folder = cache_root() / "native" / f"{variant}-{_build_key(cxx, flags)}"
        target = folder / LIBRARY_NAME
        if not target.exists():
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ExtensionBuildError(f"cannot create the build cache {folder} ({exc}); fix: set ONNX_CUSTOM_CACHE_DIR to a writable folder.") from exc
            with process_lock(folder):
                if not target.exists():  # another process may have built it while we waited
                    with announce_build(f"{LIBRARY_NAME} (the native kernel library, {variant} build)", "15-45 s"):
                        _compile(cxx, flags, target)
        _built[variant] = target.resolve()
        return _built[variant]


def build_library(output_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or reuse) the library; with ``output_dir``, copy it there. Returns the final path."""
    built = library_path()
    if output_dir is None:
        return built
    folder = Path(output_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".libonnx_custom_ops-", dir=folder)
        os.close(fd)
        shutil.copyfile(built, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, folder / LIBRARY_NAME)
    except OSError as exc:
        raise ExtensionBuildError(f"cannot write {LIBRARY_NAME} into {folder}: expected a writable folder ({exc}); fix: pass a writable folder.") from exc
    return (folder / LIBRARY_NAME).resolve()


@functools.cache
def native_ops() -> tuple[str, ...]:
    """``domain::OpType`` of every node the native library serves (asked from the library)."""
    lib = ctypes.CDLL(str(library_path()))
    lib.OnnxCustomNativeOps.restype = ctypes.c_char_p
    return tuple(lib.OnnxCustomNativeOps().decode().split(","))


_REGISTERED_KEY = "onnx_custom.native_library"
DOMAINS_KEY = "onnx_custom.native.domains"  # read by the library's RegisterCustomOps


def register_library(so: ort.SessionOptions, domains: Iterable[str] | None = None) -> ort.SessionOptions:
    """Load the native library into ``so``: all its domains, or only ``domains``.

    ONNX Runtime takes one definition per domain and session, so a session that serves some
    domain with other kernels leaves that domain out. A second call on the same options is a no-op.
    """
    path = str(library_path())
    if _config(so, _REGISTERED_KEY) is not None:
        return so
    if domains is not None:
        so.add_session_config_entry(DOMAINS_KEY, ",".join(sorted(domains)))
    so.register_custom_ops_library(path)
    so.add_session_config_entry(_REGISTERED_KEY, path)
    return so


def _config(so: ort.SessionOptions, key: str) -> str | None:
    try:
        return str(so.get_session_config_entry(key))
    except Exception:  # onnxruntime raises when the entry is absent
        return None


def plan_kernels(model: onnx.ModelProto, kernels: KernelRegistry | None = None) -> tuple[frozenset[str], list[KernelSpec]]:
    """``(domains served natively, Python kernels for the rest)`` for the model's custom nodes.

    A domain runs natively when the library serves every one of the model's node types in it;
    otherwise the whole domain falls back to Python kernels (one definition per domain and
    session). Raises :class:`KernelError` naming every node nothing serves.
    """
    from onnx_custom.common.onnx_utils import iter_nodes
    from onnx_custom.runtime.registry import RESERVED_DOMAINS, default_kernel_registry

    registry = default_kernel_registry() if kernels is None else kernels
    served = {tuple(name.split("::")) for name in native_ops()}
    local = {(f.domain, f.name) for f in model.functions}
    nodes = [n for n in iter_nodes(model)
             if n.domain not in RESERVED_DOMAINS and (n.domain, n.op_type) not in local]  # fmt: skip
    by_domain: dict[str, set[str]] = {}
    for node in nodes:
        by_domain.setdefault(node.domain, set()).add(node.op_type)
    native = frozenset(d for d, ops in by_domain.items() if all((d, op) in served for op in ops))
    specs: dict[str, KernelSpec] = {}
    missing: list[str] = []
    for node in nodes:
        if node.domain in native:
            continue
        spec = registry.lookup(node.domain, node.op_type)
        name = f"{node.domain}::{node.op_type}"
        if spec is not None:
            specs.setdefault(spec.name, spec)
        elif name not in missing:
            missing.append(name)
    if missing:
        raise KernelError(
            f"{len(missing)} custom op type(s) in the model have neither a native nor a Python "
            f"kernel: {', '.join(missing)}; native library serves {', '.join(native_ops())}; fix: "
            f"register Python kernels for them (@onnx_custom.runtime.kernel) or embed function "
            f"bodies (export(..., functions=True))."
        )
    fallback = sorted({f"{n.domain}::{n.op_type}" for n in nodes if n.domain not in native})
    if fallback:
        # said once, when the session is made: kernels="native" asked for no Python in the loop
        unserved = sorted({f"{n.domain}::{n.op_type}" for n in nodes if (n.domain, n.op_type) not in served})
        warnings.warn(
            f"kernels='native': {len(fallback)} custom op type(s) run Python kernels, not the native "
            f"library: {', '.join(fallback)} (the library does not serve {', '.join(unserved)}, and a "
            "domain runs natively only when every op type of it in the model is served). Fix: add "
            "native kernels for them (ort_kernels/native/), or expect Python in the loop.",
            NativeFallbackWarning,
            stacklevel=3,
        )
    return native, list(specs.values())


class NativeFallbackWarning(UserWarning):
    """``InferenceSession(kernels="native")`` runs some custom nodes with Python kernels."""
