"""Translation of ``onnx_custom::numpy_sin`` (NumPy kernel in eager) to ONNX ``Sin``."""

from __future__ import annotations

from typing import Any

import onnx_custom.ops.numpy_sin  # noqa: F401  (defines the torch op)
from onnx_custom.registry import Registry

__all__ = ["registry"]

registry = Registry()


@registry.symbolic("onnx_custom::numpy_sin", opset=7)
def numpy_sin(g: Any, x: Any) -> Any:
    """onnx_custom::numpy_sin(Tensor x) -> Tensor"""
    return g.op("Sin", x)
