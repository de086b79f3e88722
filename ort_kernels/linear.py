"""Kernel of ``npu::CustomLinear`` (from ``npu::custom_linear``): the NPU kernel's CPU stand-in."""

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


def _shape(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> TensorInfo:
    x, weight = inputs[0], inputs[1]
    if x is None or weight is None:
        raise KernelError("npu::CustomLinear: inputs x and weight are required")
    if x.shape is None or weight.shape is None:
        return TensorInfo(x.dtype, None)
    return TensorInfo(x.dtype, (*x.shape[:-1], weight.shape[0]))


@kernels.kernel(
    "npu::CustomLinear",
    inputs=["x", "weight", "bias?"],
    outputs=["y"],
    dtypes=_FLOATS,
    shape_fn=_shape,
    function=TranslationBody("onnx_custom.symbolics.linear:linear_any_rank_gemm", min_opset=11),
)
def custom_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y = x @ weight.T (+ bias), F.linear semantics."""
    if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"npu::CustomLinear: x {list(x.shape)} and weight {list(weight.shape)} do not match "
            "([..., in] x [out, in])"
        )
    y = np.matmul(x, weight.T)
    return y if bias is None else y + bias
