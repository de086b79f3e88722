"""Building native pieces on first use, cached on disk: one place for every C/C++ build.

Everything lives under ``$ONNX_CUSTOM_CACHE_DIR`` (default ``~/.cache/onnx_custom``) in a folder
keyed by whatever changes the binary, so a fresh machine builds once and later processes (and
test runs) reuse the result. Missing tools raise `ExtensionBuildError` naming the tool.

Every first-time build says so on stderr wherever it happens (export, verify, check, a session,
the zoo): one line before (what, how long it usually takes, where it is cached) and one after
(how long it took), so a first ``export`` never sits silent for a minute. `announce_build` is
the one place that prints them; a caller that reports builds itself (the zoo's console) wraps
its work in `builds_announced_by_caller`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from onnx_custom.common.torch_notices import drop_cuda_home_notice
from onnx_custom.errors import ExtensionBuildError

__all__ = [
    "KernelModule",
    "announce_build",
    "build_torch_extension",
    "builds_announced_by_caller",
    "cache_root",
    "extension_built",
    "find_compiler",
]


_COMPLETE = ".complete"  # written into a build folder once its build succeeded


_caller_announces = threading.local()


@contextlib.contextmanager
def builds_announced_by_caller() -> Iterator[None]:
    """Inside the block (this thread), `announce_build` stays silent: the caller reports builds."""
    before = getattr(_caller_announces, "on", False)
    _caller_announces.on = True
    try:
        yield
    finally:
        _caller_announces.on = before


@contextlib.contextmanager
def announce_build(what: str, usual: str) -> Iterator[None]:
    """Wrap an actual compile (never a cache hit): one stderr line before and one after."""
    if getattr(_caller_announces, "on", False):
        yield
        return
    start = time.perf_counter()
    print(
        f"onnx-custom: building {what} (one time, usually {usual}; cached in {cache_root()}) ...",
        file=sys.stderr,
        flush=True,
    )
    ok = False
    try:
        yield
        ok = True
    finally:
        seconds = time.perf_counter() - start
        verb = "built" if ok else "failed to build"
        print(f"onnx-custom: {verb} {what} in {seconds:.1f} s", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """Folder holding cached native builds (override with ``ONNX_CUSTOM_CACHE_DIR``)."""
    env = os.environ.get("ONNX_CUSTOM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "onnx_custom"


def find_compiler(
    env_var: str, names: Sequence[str], *, language: str, needed_for: str, package: str
) -> str:
    """The compiler ``$env_var`` names, else the first of ``names`` on PATH (it may carry flags,
    as ``CXX="ccache g++"`` does); `ExtensionBuildError` naming them all and the fix otherwise."""
    for name in (os.environ.get(env_var), *names):
        if name and shutil.which(name.split()[0]):
            return name
    listed = ", ".join(f"`{n}`" for n in names)
    raise ExtensionBuildError(
        f"{needed_for} needs a {language} compiler: expected ${env_var}, {listed} on PATH, found "
        f"none; fix: install one (e.g. `apt-get install {package}`) or set {env_var}."
    )


def _cxx() -> str:
    return os.environ.get("CXX", "c++")


@contextlib.contextmanager
def _tools_on_path(name: str) -> Iterator[None]:
    """Check the compiler and ninja; use the venv's ninja (pip ``ninja``) when PATH lacks one."""
    drop_cuda_home_notice()
    from torch.utils import cpp_extension

    if shutil.which(_cxx()) is None:
        raise ExtensionBuildError(
            f"cannot build the C++ extension {name!r}: C++ compiler {_cxx()!r} not found on PATH "
            "(install g++ or clang++, or set CXX)"
        )
    old_path = os.environ.get("PATH", "")
    venv_bin = os.path.dirname(sys.executable)
    if not cpp_extension.is_ninja_available() and shutil.which("ninja", path=venv_bin):
        os.environ["PATH"] = venv_bin + os.pathsep + old_path
    try:
        if not cpp_extension.is_ninja_available():
            raise ExtensionBuildError(
                f"cannot build the C++ extension {name!r}: 'ninja' not found on PATH (pip install"
                " ninja)"
            )
        yield
    finally:
        os.environ["PATH"] = old_path


@contextlib.contextmanager
def process_lock(directory: Path) -> Iterator[None]:
    """Inter-process lock that the OS drops if its holder dies.

    cpp_extension's own baton is a plain ``lock`` file that stays behind when a build is killed,
    making every later build wait forever. Builders hold this flock first, so a baton found while
    holding it is stale and is removed.
    """
    try:
        import fcntl
    except ImportError:  # Windows: fall back to cpp_extension's baton alone
        yield
        return
    with open(directory / ".onnx_custom.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                stale.unlink()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def extension_directory(
    name: str, source: Path, flags: Sequence[str], headers: Sequence[tuple[str, Path]] = ()
) -> Path:
    """Cache folder keyed by source, headers (include name and content), flags, torch, python and
    compiler."""
    import torch

    key = hashlib.sha256(source.read_bytes())
    for include_name, header in headers:
        key.update(include_name.encode())
        key.update(header.read_bytes())
    # torch's location too: build.ninja names its include paths, so two venvs sharing one cache
    # would otherwise keep rebuilding each other's copy.
    for part in (
        torch.__version__,
        os.path.dirname(torch.__file__),
        sys.version,
        sys.platform,
        _cxx(),
        " ".join(flags),
    ):
        key.update(part.encode())
    return cache_root() / "torch_ext" / f"{name}-{key.hexdigest()[:16]}"


def extension_built(directory: Path) -> bool:
    """Whether `build_torch_extension` finished a build in ``directory`` (`extension_directory`)."""
    return (directory / _COMPLETE).exists() and any(directory.glob("*.so"))


def _load_library(library: Path) -> Path:
    import torch

    try:
        torch.ops.load_library(str(library))
    except OSError as exc:
        raise ExtensionBuildError(
            f"the cached C++ extension {library} could not be loaded ({exc}); delete"
            f" {library.parent} to rebuild it"
        ) from exc
    return library


def _import_extension(name: str, library: Path) -> ModuleType:
    import importlib.machinery
    import importlib.util

    import torch  # noqa: F401  (the extension links against torch's libraries)

    loader = importlib.machinery.ExtensionFileLoader(name, str(library))
    spec = importlib.util.spec_from_file_location(name, str(library), loader=loader)
    if spec is None:
        raise ExtensionBuildError(
            f"the cached C++ extension {library} could not be loaded; delete {library.parent} to"
            " rebuild it"
        )
    module = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(module)
    except ImportError as exc:
        raise ExtensionBuildError(
            f"the cached C++ extension {library} could not be loaded ({exc}); delete"
            f" {library.parent} to rebuild it"
        ) from exc
    return module


def build_torch_extension(
    name: str,
    source: Path,
    *,
    extra_cflags: Sequence[str] = ("-O2",),
    is_python_module: bool,
    verbose: bool = False,
    usual: str = "30-60 s",
    headers: Sequence[tuple[str, Path]] = (),
) -> ModuleType | Path:
    """Build (first call) or load ``source`` with ``torch.utils.cpp_extension.load``.

    ``headers``: (include name, file) pairs the source includes as ``#include "<include name>"``
    (e.g. ``onnx_custom/kernels/deform_conv.h``, the kernels the eager op shares with the native
    library), copied under ``include/`` in the build folder, which is on the include path, and
    part of its key. Returns the Python module, or with ``is_python_module=False`` (a
    ``TORCH_LIBRARY`` op library) the loaded shared library's path.
    """
    drop_cuda_home_notice()
    from torch.utils import cpp_extension

    directory = extension_directory(name, source, extra_cflags, headers)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExtensionBuildError(
            f"cannot create the build cache {directory} ({exc}); set ONNX_CUSTOM_CACHE_DIR to a"
            " writable folder"
        ) from exc
    marker = directory / _COMPLETE
    library = directory / f"{name}.so"
    # Built by an earlier process: load it without the build lock or cpp_extension.load, which
    # would serialize every process behind whoever holds the lock.
    if marker.exists() and library.exists():
        return _import_extension(name, library) if is_python_module else _load_library(library)
    with _tools_on_path(name), process_lock(directory):
        if marker.exists() and library.exists():  # built while we waited
            return _import_extension(name, library) if is_python_module else _load_library(library)
        # Build from a copy inside the keyed folder: build.ninja then names the same path for
        # every checkout/venv sharing the cache, so identical sources never rebuild each other.
        include = directory / "include"
        copies = [(directory / source.name, source)]
        copies += [(include / rel, header) for rel, header in headers]
        for local, file in copies:
            if not local.exists() or local.read_bytes() != file.read_bytes():
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_bytes(file.read_bytes())
        local = directory / source.name
        try:
            with announce_build(f"the C++ extension {name}", usual):
                result = cpp_extension.load(
                    name=name,
                    sources=[str(local)],
                    extra_cflags=list(extra_cflags),
                    extra_include_paths=[str(include)] if headers else None,
                    build_directory=str(directory),
                    is_python_module=is_python_module,
                    verbose=verbose,
                )
        except (RuntimeError, OSError, ImportError, Exception) as exc:
            detail = str(exc).strip().splitlines()[-20:]
            raise ExtensionBuildError(
                f"building the C++ extension {name!r} in {directory} failed:\n" + "\n".join(detail)
            ) from exc
        marker.write_text("ok")
    return result if is_python_module else library


class KernelModule:
    """An op family's C++ kernels as a Python module (`build_torch_extension` with
    ``is_python_module=True``): built on the first `load` (one thread builds while the
    others wait), then served from memory without a lock. ``cflags`` is called when needed, not
    at import (it may ask torch about the CPU)."""

    def __init__(
        self,
        name: str,
        source: Path,
        cflags: Callable[[], Sequence[str]],
        usual: str = "30-60 s",
        headers: Callable[[], Sequence[tuple[str, Path]]] = tuple,
    ) -> None:
        self.name, self.source, self._cflags, self.usual = name, source, cflags, usual
        self._headers = headers  # called when needed: finding them may import a sibling package
        self._lock = threading.Lock()
        self._module: ModuleType | None = None

    def directory(self) -> Path:
        """The build-cache folder (`extension_built` tells whether the first load still
        compiles)."""
        return extension_directory(self.name, self.source, self._cflags(), self._headers())

    def load(self) -> ModuleType:
        """Build (first call) or load the cached kernels."""
        module = self._module
        if module is None:
            with self._lock:
                if self._module is None:
                    built = build_torch_extension(
                        self.name,
                        self.source,
                        extra_cflags=self._cflags(),
                        is_python_module=True,
                        usual=self.usual,
                        headers=self._headers(),
                    )
                    assert isinstance(built, ModuleType)
                    self._module = built
                module = self._module
        return module
