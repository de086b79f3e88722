"""Kernel math of ``onnx_custom::CustomLinear`` (the node of ``onnx_custom::custom_linear``,
declared in ``onnx_custom/ops/custom_linear.py``): the NPU kernel's CPU stand-in, NumPy."""

from __future__ import annotations

import numpy as np

from onnx_custom.ops.custom_linear import SPECS
from onnx_custom.spec import spec_kernels

__all__ = ["custom_linear", "kernels"]


def custom_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y = x @ weight.T (+ bias), F.linear semantics; half types accumulate in float32 and round
    once, as torch's CPU kernel does."""
    if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"onnx_custom::CustomLinear: x {list(x.shape)} and weight {list(weight.shape)} do not"
            " match ([..., in] x [out, in])"
        )
    wide = np.float64 if x.dtype == np.float64 else np.float32
    y = np.matmul(x.astype(wide, copy=False), weight.astype(wide, copy=False).T)
    if bias is not None:
        y += bias.astype(wide, copy=False)
    return y.astype(x.dtype, copy=False)


kernels = spec_kernels(*SPECS)
