from __future__ import annotations

import warnings

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_quiet() -> None:
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*training mode.*")
