"""Run a kernel test on both float32 paths of an op family's C++ extension: the AVX-512 kernels
(where the CPU has AVX-512F) and the portable ones. The extension exposes ``avx512()`` (whether
the AVX-512 kernels run) and ``disable_avx512(off)`` (tests: force the portable path)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

import pytest

__all__ = ["PATHS", "has_avx512", "kernel_path"]

PATHS = ["avx512", "portable"]


def has_avx512(ext: ModuleType) -> bool:
    """Whether the AVX-512 kernels run here when not disabled (leaves them enabled)."""
    ext.disable_avx512(False)
    return bool(ext.avx512())


@contextlib.contextmanager
def kernel_path(ext: ModuleType, path: str, what: str) -> Iterator[str]:
    """Within the block ``ext`` runs ``path`` ("avx512" or "portable"; the test is skipped when the
    CPU has no AVX-512F for "avx512"); the default is restored afterwards. ``what`` names the
    kernels in the skip reason."""
    if path == "avx512" and not has_avx512(ext):
        pytest.skip(f"this CPU has no AVX-512F: {what} runs the portable path only")
    ext.disable_avx512(path == "portable")
    assert ext.avx512() == (path == "avx512")  # the path under test is the one taken
    try:
        yield path
    finally:
        ext.disable_avx512(False)
