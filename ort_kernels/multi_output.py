"""Kernel of ``custom::MultiOut3`` (from ``mylib::multi_out3``): 3 outputs, INTS + FLOAT attrs."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx_custom.errors import KernelError
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.function_builder import TranslationBody
from onnx_custom.runtime.types import TensorInfo

__all__ = ["kernels"]

kernels = KernelRegistry()

_FLOATS = ("float32", "float64", "float16")


def _tiled_dim(size: Any, reps: int) -> Any:
    if isinstance(size, int):
        return size * reps
    return size if reps == 1 else None  # a symbolic dim times r has no name


def _shapes(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> list[TensorInfo]:
    x = inputs[0]
    if x is None:
        raise KernelError("custom::MultiOut3: input x is required")
    if x.shape is None:
        return [TensorInfo(x.dtype, None)] * 3
    repeats = list(attrs["repeats"])
    tiled = tuple(_tiled_dim(s, int(r)) for s, r in zip(x.shape, repeats, strict=False))
    return [TensorInfo(x.dtype, x.shape), TensorInfo(x.dtype, tiled), TensorInfo(x.dtype, x.shape[:-1])]


@kernels.kernel(
    "custom::MultiOut3",
    inputs=["x"],
    outputs=["scaled", "tiled", "summed"],
    attrs={"repeats": "ints", "scale": "float"},
    dtypes=_FLOATS,
    shape_fn=_shapes,
    function=TranslationBody("onnx_custom.symbolics.multi_output:multi_out3", min_opset=12),
)
def multi_out3(x: np.ndarray, *, repeats: list[int], scale: float) -> tuple[np.ndarray, ...]:
    """(x * scale, tile(x, repeats), x.sum(-1))"""
    if len(repeats) != x.ndim:
        raise ValueError(
            f"custom::MultiOut3 expects one repeat per dimension of x: x has shape "
            f"{list(x.shape)} but repeats is {list(repeats)}"
        )
    return x * x.dtype.type(scale), np.tile(x, repeats), x.sum(axis=-1, dtype=x.dtype)
