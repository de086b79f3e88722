"""Helpers for the compile tests: zoo models by name, a fresh dynamo state per test."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from onnx_custom.zoo import discover

ZOO_MODELS = sorted(discover())


def load_zoo(name: str) -> Any:
    """The zoo model module, or a pytest skip with the module's own reason (e.g. no compiler)."""
    try:
        return importlib.import_module(discover([name])[name])
    except Exception as exc:
        reason = getattr(exc, "skip_reason", None)
        if reason:
            pytest.skip(reason)
        raise


def has_parameters(module: Any) -> bool:
    return any(p.requires_grad for p in module.Model().parameters())


def fresh_dynamo() -> None:
    """Each test compiles the same forward code with a new backend: without a reset, dynamo's
    per-code cache limit (8) would silently run later tests in eager."""
    torch._dynamo.reset()
