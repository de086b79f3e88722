"""Fuzz every native kernel with random valid and invalid inputs
(tests/runtime/native_fuzz_driver.py).

Default suite: the normal build, a short run. Slow: an AddressSanitizer + UBSan build of the
library loaded into a plain Python (libasan preloaded), a longer run; any out-of-bounds access,
use after free or undefined behaviour aborts the process and fails the test. Invalid inputs must
come back as ONNX Runtime errors naming our kernel and the problem.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnx_custom.runtime.native import library_path

DRIVER = Path(__file__).with_name("native_fuzz_driver.py")


def _fuzz(
    library: Path, seed: int, rounds: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DRIVER), str(library), str(seed), str(rounds)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzz_normal_build(seed: int) -> None:
    proc = _fuzz(library_path(), seed, rounds=6)
    assert proc.returncode == 0 and "fuzz ok" in proc.stdout, (
        proc.stdout[-4000:] + proc.stderr[-4000:]
    )


def _sanitizer_runtime() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.skip(f"{cxx} not found")
    libs = []
    for name in ("libasan.so", "libstdc++.so"):  # libstdc++ too: asan must see __cxa_throw at start
        path = subprocess.run(
            [cxx, f"-print-file-name={name}"], capture_output=True, text=True
        ).stdout.strip()
        if not os.path.isabs(path):
            pytest.skip(f"{cxx} has no {name}")
        libs.append(path)
    return " ".join(libs)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_fuzz_under_address_sanitizer(seed: int) -> None:
    asan = library_path(sanitize=True)
    env = {
        "LD_PRELOAD": _sanitizer_runtime(),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:strict_string_checks=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    proc = _fuzz(asan, seed, rounds=25, env=env)
    report = proc.stdout[-4000:] + proc.stderr[-6000:]
    assert proc.returncode == 0 and "fuzz ok" in proc.stdout, report
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, report
