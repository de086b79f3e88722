"""ONNX math of ``onnx_custom::numpy_sin`` (declared in ``onnx_custom/ops/numpy_sin.py``):
``Sin``."""

from __future__ import annotations

from typing import Any

from onnx_custom.ops.numpy_sin import SPECS
from onnx_custom.spec import spec_translations

__all__ = ["numpy_sin_onnx", "registry"]


def numpy_sin_onnx(g: Any, x: Any) -> Any:
    return g.op("Sin", x)


registry = spec_translations(*SPECS)
