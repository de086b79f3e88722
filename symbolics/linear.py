"""Translations of ``npu::custom_linear`` (F.linear semantics).

Default: MatMul(x, Transpose(weight)) (+ Add bias), any rank of x. Variant ``"gemm"``: one Gemm
with transB=1 (x must be 2-D). Variant ``"custom"``: a ``npu::CustomLinear`` node, the stand-in
for the vendor's NPU kernel (kernel in ``ort_kernels/linear.py``).

All variants start at opset 11 (optional Gemm C): the registry picks the highest opset first and
the preferred variant only among entries at that opset.
"""

from __future__ import annotations

from typing import Any

import onnx_custom.ops.custom_linear  # noqa: F401  (defines the torch op)
from onnx_custom.registry import Registry

__all__ = ["registry"]

registry = Registry()


@registry.symbolic("npu::custom_linear", opset=11)
def custom_linear(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """npu::custom_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor"""
    y = g.op("MatMul", x, g.op("Transpose", weight, perm=[1, 0]))
    return y if bias is None else g.op("Add", y, bias)


@registry.symbolic("npu::custom_linear", opset=11, variant="gemm")
def custom_linear_gemm(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """npu::custom_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor  (2-D x only)"""
    return g.op("Gemm", x, weight, bias, transB=1)  # C is optional from opset 11


@registry.symbolic("npu::custom_linear", opset=11, variant="custom", emits=["npu::CustomLinear"])
def custom_linear_npu(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """npu::custom_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor"""
    return g.op("npu::CustomLinear", x, weight, bias)
