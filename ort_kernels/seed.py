"""Kernel math of the seed nodes ``custom::my_add`` and ``custom::multi_out`` (declared with
their torch ops in ``onnx_custom/ops/seed.yaml``), NumPy."""

from __future__ import annotations

import numpy as np

from onnx_custom.ops.seed import SPECS
from onnx_custom.spec import spec_kernels

__all__ = ["kernels", "multi_out", "multi_out_math", "my_add", "my_add_into", "my_add_math"]


def my_add_math(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """y = alpha * a + b, in a's dtype."""
    return (a * np.asarray(alpha, dtype=a.dtype) + b).astype(a.dtype, copy=False)


def my_add_into(a: np.ndarray, b: np.ndarray, alpha: float, y: np.ndarray) -> None:
    """y[...] = alpha * a + b without temporaries (y has the broadcast shape, a's dtype)."""
    np.multiply(a, np.asarray(alpha, dtype=y.dtype), out=y)
    np.add(y, b, out=y)


def multi_out_math(x: np.ndarray, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """(x * scale, x + shift), in x's dtype."""
    return (x * np.asarray(scale, dtype=x.dtype)).astype(x.dtype, copy=False), (
        x + np.asarray(shift, dtype=x.dtype)
    ).astype(x.dtype, copy=False)


def my_add(a: np.ndarray, b: np.ndarray, *, alpha: float, out: tuple[np.ndarray, ...]) -> None:
    my_add_into(a, b, alpha, out[0])  # straight into ORT's output buffer: no result copy


def multi_out(x: np.ndarray, *, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    return multi_out_math(x, scale, shift)


kernels = spec_kernels(*SPECS)
