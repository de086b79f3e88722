"""Fixtures every test shares, the test tree's import path, and the ORT log guard.

Tests mirror the package (``tests/<stage>/``, ``tests/integration/`` for end to end). Test modules
share cases by plain name (``from test_deform_conv_reference import Geometry``) and helpers such
as ``_native_util``: every folder of the tree is put on ``sys.path`` here, so those imports do not
depend on which folder pytest happened to collect first.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

_TESTS = Path(__file__).resolve().parent
for _folder in sorted(
    p for p in _TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

# The whole-suite guard: a test that lets an ONNX Runtime log line reach stderr fails.
from ort_log_guard import (  # noqa: E402
    pytest_configure,  # noqa: F401
    pytest_runtest_makereport,  # noqa: F401
    pytest_unconfigure,  # noqa: F401
)


@pytest.fixture(autouse=True)
def _seed_and_quiet() -> None:
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*training mode.*")
