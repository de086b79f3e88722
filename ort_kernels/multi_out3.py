"""Kernel math of ``onnx_custom::MultiOut3`` (the node of ``onnx_custom::multi_out3``, declared in
``onnx_custom/ops/multi_out.py``), NumPy: 3 outputs, INTS + FLOAT attributes."""

from __future__ import annotations

import numpy as np

from onnx_custom.ops.multi_out3 import SPECS
from onnx_custom.spec import spec_kernels

__all__ = ["kernels", "multi_out3"]


def multi_out3(x: np.ndarray, *, repeats: list[int], scale: float) -> tuple[np.ndarray, ...]:
    """(x * scale, tile(x, repeats), x.sum(-1)); half types sum in float32, as torch does."""
    if len(repeats) != x.ndim:
        raise ValueError(
            "onnx_custom::MultiOut3 expects one repeat per dimension of x: x has shape "
            f"{list(x.shape)} but repeats is {list(repeats)}"
        )
    wide = np.float64 if x.dtype == np.float64 else np.float32
    return x * x.dtype.type(scale), np.tile(x, repeats), x.sum(axis=-1, dtype=wide).astype(x.dtype)


kernels = spec_kernels(*SPECS)
