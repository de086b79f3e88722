"""The kernel shim and the native library share one declaration of ONNX Runtime's C ABI.

``onnx_custom_ort_abi.h`` holds every OrtApi slot index and struct layout; the Python kernel shim
(``runtime/shim.c``) includes it instead of declaring its own, its build puts the header's folder
on the include path, and the header's content is part of the shim's cache key (a corrected slot
rebuilds the shim rather than reusing a stale build).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from onnx_custom.errors import ExtensionBuildError
from onnx_custom.runtime import shim_build

HEADER = shim_build.abi_include_dir() / shim_build.ABI_HEADER
SHIM = shim_build.SOURCE
SHIM_TEXT = "".join(p.read_text() for p in shim_build.shim_sources())  # shim.c and its parts


def test_header_is_package_data_of_runtime() -> None:
    """The shim (runtime/) must not reach into ort_kernels/ for its header (layer order)."""
    assert HEADER.is_file()
    assert HEADER.parent.parts[-3:] == ("onnx_custom", "runtime", "include")


@pytest.mark.parametrize(
    "pattern",
    [
        r"\bS_\w+\s*=\s*\d+",  # private slot enum (S_CreateStatus = 0, ...)
        r"typedef\s+\w[\w\s*]*\(\*fn_\w+\)",  # private function pointer types
        r"struct\s+CustomOpAbi\b",  # private OrtCustomOp layout
        r"struct\s+AllocatorAbi\b",  # private OrtAllocator layout
        r"struct\s+OrtApiBase\s*\{",  # private OrtApiBase layout
    ],
    ids=["slot-enum", "fn-typedefs", "custom-op-struct", "allocator-struct", "api-base-struct"],
)
def test_shim_declares_no_abi_of_its_own(pattern: str) -> None:
    assert f'#include "{shim_build.ABI_HEADER}"' in SHIM.read_text()
    assert not re.search(pattern, SHIM_TEXT), f"the shim declares ORT ABI itself: {pattern}"


def test_shim_c_includes_every_part_once() -> None:
    """shim.c is the one translation unit: every file in shim/ is included, in a fixed order."""
    parts = [p.name for p in shim_build.shim_sources()[1:]]
    on_disk = sorted(p.name for p in (SHIM.parent / "shim").glob("*.c"))
    assert sorted(parts) == on_disk and len(set(parts)) == len(parts) > 5


def test_cache_key_covers_every_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing one part (not shim.c itself) must rebuild the shim, not reuse the cached one."""
    before = shim_build._cached_shim()[0]
    copy = tmp_path / "runtime"
    (copy / "shim").mkdir(parents=True)
    for path in shim_build.shim_sources():
        (copy / path.relative_to(SHIM.parent)).write_bytes(path.read_bytes())
    monkeypatch.setattr(shim_build, "SOURCE", copy / "shim.c")
    assert shim_build._cached_shim()[0] == before  # same bytes, same key
    gil = copy / "shim" / "gil.c"
    gil.write_text(gil.read_text() + "\n/* changed */\n")
    assert shim_build._cached_shim()[0] != before


def test_every_slot_the_shim_calls_is_declared_once_in_the_header() -> None:
    called = set(re.findall(r"OC_API\(g_api,\s*(\w+)\)", SHIM_TEXT))
    header = HEADER.read_text()
    assert len(called) > 30  # the shim really goes through OC_API
    for name in sorted(called):
        assert len(re.findall(rf"\bOC_SLOT_{name}\s*=\s*\d+", header)) == 1, name
        assert len(re.findall(rf"\(\*OcFn_{name}\)", header)) == 1, name


def test_slot_indices_are_unique() -> None:
    slots = [int(v) for v in re.findall(r"\bOC_SLOT_\w+\s*=\s*(\d+)", HEADER.read_text())]
    assert len(slots) == len(set(slots))


def test_cache_key_covers_the_header() -> None:
    source, header = shim_build._source_bytes(), HEADER.read_bytes()
    key = shim_build._build_key(source, header)
    assert shim_build._build_key(source, header) == key
    assert shim_build._build_key(source, header + b"\n/* changed */\n") != key


def test_shim_build_uses_the_shared_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Build once, then swap in a header that cannot compile: the shim must be rebuilt against
    it (and fail), not served from the cache of the first build."""
    monkeypatch.setenv("ONNX_CUSTOM_CACHE_DIR", str(tmp_path / "cache"))
    good = shim_build.shim_path()
    assert good.is_file()
    assert shim_build.shim_path() == good  # cached

    broken = tmp_path / "include"
    broken.mkdir()
    (broken / shim_build.ABI_HEADER).write_text(
        HEADER.read_text() + '\n#error "onnx-custom test: this header was included"\n'
    )
    monkeypatch.setattr(shim_build, "abi_include_dir", lambda: broken)
    with pytest.raises(ExtensionBuildError, match="onnx-custom test: this header was included"):
        shim_build.shim_path()


@pytest.mark.parametrize(
    "compiler,flags",
    [
        ("gcc", ["-x", "c", "-std=c99"]),
        ("gcc", ["-x", "c", "-std=c11"]),
        ("g++", ["-x", "c++", "-std=c++17"]),
    ],
    ids=["c99", "c11", "c++17"],
)
def test_header_compiles_alone(compiler: str, flags: list[str]) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} not on PATH")
    cmd = [
        compiler,
        *flags,
        "-Wall",
        "-Wextra",
        "-Wpedantic",
        "-Werror",
        "-fsyntax-only",
        str(HEADER),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
