"""Kernel math of the seed nodes ``onnx_custom::my_add`` and ``onnx_custom::multi_out`` (declared
with their torch ops in ``onnx_custom/ops/seed.yaml``), NumPy."""

from __future__ import annotations

import numpy as np

from onnx_custom.ops.seed import SPECS
from onnx_custom.spec import spec_kernels

__all__ = ["kernels", "multi_out", "my_add"]


def my_add(a: np.ndarray, b: np.ndarray, *, alpha: float, out: tuple[np.ndarray, ...]) -> None:
    """y = alpha * a + b in a's dtype, straight into ORT's output buffer (broadcast shape): no
    temporaries, no result copy."""
    y = out[0]
    np.multiply(a, np.asarray(alpha, dtype=y.dtype), out=y)
    np.add(y, b, out=y)


def multi_out(x: np.ndarray, *, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """(x * scale, x + shift), in x's dtype."""
    scaled = (x * np.asarray(scale, dtype=x.dtype)).astype(x.dtype, copy=False)
    return scaled, (x + np.asarray(shift, dtype=x.dtype)).astype(x.dtype, copy=False)


kernels = spec_kernels(*SPECS)
