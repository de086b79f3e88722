"""Compile the C shim on first use and load it.

The shared object is both a CPython extension (imported here) and an ONNX Runtime custom-op
library (loaded by ORT from the same absolute path, so both see one copy of its globals). Its
source is ``shim.c``, one translation unit that includes the parts in ``shim/`` (one file per
job). It is cached under ``$ONNX_CUSTOM_CACHE_DIR`` (default
``~/.cache/onnx_custom``)/``ort_shim/<key>/``, where the key hashes the C sources (``shim.c``
and every part it includes), the shared ORT ABI header they include
(``onnx_custom/runtime/include/onnx_custom_ort_abi.h``, also used by the native kernel
library), the Python ABI, numpy's and onnxruntime's versions. A build goes to a temporary file
first and is renamed into place, so concurrent first uses are safe.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from onnx_custom.common.native_build import announce_build, cache_root, find_compiler
from onnx_custom.errors import ExtensionBuildError

__all__ = ["MODULE_NAME", "cache_root", "load_shim", "shim_built", "shim_path", "shim_sources"]

MODULE_NAME = "_onnx_custom_shim"
SOURCE = Path(__file__).with_name("shim.c")
_PART = re.compile(r'^#include "(shim/\w+\.c)"$', re.MULTILINE)
ABI_HEADER = "onnx_custom_ort_abi.h"
_lock = threading.Lock()
_loaded: tuple[ModuleType, str] | None = None


def abi_include_dir() -> Path:
    """Folder holding the shared ORT ABI header (``onnx_custom/runtime/include``).

    The shim, the native library and ``examples/run_model.c`` all compile against it.
    """
    folder = Path(__file__).with_name("include")
    if not (folder / ABI_HEADER).is_file():
        raise ExtensionBuildError(
            f"the ONNX Runtime kernel shim needs the header {ABI_HEADER}: expected it in {folder}, "
            "found no such file; fix: reinstall onnx-custom (the header is package data of "
            "onnx_custom.runtime)."
        )
    return folder


def shim_sources() -> list[Path]:
    """``shim.c`` and the parts it includes, in its include order (what the build compiles)."""
    return [SOURCE, *(SOURCE.parent / part for part in _PART.findall(SOURCE.read_text()))]


def _source_bytes() -> bytes:
    """Every C source of the shim, each under its name: a change to any part rebuilds the shim."""
    return b"".join(p.name.encode() + b"\0" + p.read_bytes() + b"\0" for p in shim_sources())


def _build_key(source: bytes, header: bytes) -> str:
    import numpy
    import onnxruntime

    h = hashlib.sha256(source)
    h.update(hashlib.sha256(header).digest())  # a changed slot or layout rebuilds the shim
    for part in (
        sys.version,
        sysconfig.get_config_var("EXT_SUFFIX") or "",
        numpy.__version__,
        onnxruntime.__version__,
    ):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _compiler() -> str:
    return find_compiler(
        "CC",
        ("cc", "gcc", "clang"),
        language="C",
        needed_for="building the ONNX Runtime kernel shim",
        package="gcc",
    )


def _compile(source: Path, include_dir: Path, target: Path) -> None:
    import numpy

    cc = _compiler()
    py_inc = sysconfig.get_paths()["include"]
    if not (Path(py_inc) / "Python.h").exists():
        raise ExtensionBuildError(
            f"Python headers not found: expected {py_inc}/Python.h; fix: install the Python "
            f"development package (e.g. `apt-get install python{sys.version_info.major}."
            f"{sys.version_info.minor}-dev`)."
        )
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [
        *cc.split(),
        "-shared",
        "-fPIC",
        "-O2",
        "-std=c11",
        "-D_GNUSOURCE",
        f"-I{py_inc}",
        f"-I{numpy.get_include()}",
        f"-I{include_dir}",
        str(source),
        "-o",
        tmp,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ExtensionBuildError(
                f"compiling the ONNX Runtime kernel shim failed (exit {proc.returncode}).\n"
                f"command: {' '.join(cmd)}\n{proc.stderr[-4000:]}"
            )
        os.replace(tmp, target)  # atomic: a concurrent builder's identical file is fine too
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cached_shim() -> tuple[Path, Path]:
    """(where the compiled shim lives in the cache, the ABI header folder it compiles with)."""
    include_dir = abi_include_dir()
    header = (include_dir / ABI_HEADER).read_bytes()
    folder = cache_root() / "ort_shim" / _build_key(_source_bytes(), header)
    return folder / f"{MODULE_NAME}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}", include_dir


def shim_built() -> bool:
    """Whether the shim is already in the build cache (else the first use compiles it)."""
    return _cached_shim()[0].exists()


def shim_path() -> Path:
    """Path of the compiled shim, building it if needed."""
    target, include_dir = _cached_shim()
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with announce_build("the ONNX Runtime kernel shim (C)", "~5 s"):
            _compile(SOURCE, include_dir, target)
    return target


def load_shim() -> tuple[ModuleType, str]:
    """Import the shim (once per process); returns ``(module, absolute_path)``."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = str(shim_path().resolve())
            loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, path)
            spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
            if spec is None:
                raise ExtensionBuildError(f"cannot load the kernel shim from {path}")
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            _loaded = (module, path)
        return _loaded
