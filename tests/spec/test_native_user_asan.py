"""The user kernels' library built with AddressSanitizer + UBSan and driven through plain
onnxruntime with valid and invalid inputs (slow: a sanitizer build of the runtime)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onnx_custom.spec import build_native_library, parse_specs

DATA = Path(__file__).parent / "native_user"


@pytest.mark.slow
def test_user_kernels_under_address_sanitizer() -> None:
    from test_native_fuzz import _sanitizer_runtime  # the shipped library's fuzz test: same runtime

    lib = build_native_library(parse_specs(DATA / "acme.yaml"), name="acme_asan", sanitize=True)
    env = {
        **os.environ,
        "LD_PRELOAD": _sanitizer_runtime(),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:strict_string_checks=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    proc = subprocess.run(
        [sys.executable, str(DATA / "asan_driver.py"), str(lib.path)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    report = proc.stdout[-4000:] + proc.stderr[-6000:]
    assert proc.returncode == 0 and "asan ok" in proc.stdout, report
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, report


def test_driver_passes_on_the_release_build() -> None:
    lib = build_native_library(parse_specs(DATA / "acme.yaml"), name="acme_test")
    proc = subprocess.run(
        [sys.executable, str(DATA / "asan_driver.py"), str(lib.path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "asan ok" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )
