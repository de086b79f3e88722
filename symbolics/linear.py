"""Translations of ``npu::custom_linear`` (F.linear semantics).

Default: MatMul(x, Transpose(weight)) (+ Add bias), any rank of x. Variant ``"gemm"``: one Gemm
with transB=1 (x must be 2-D). Variant ``"custom"``: a ``npu::CustomLinear`` node, the stand-in
for the vendor's NPU kernel (kernel in ``ort_kernels/linear.py``).

All variants start at opset 11 (optional Gemm C): the registry picks the highest opset first and
the preferred variant only among entries at that opset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import onnx_custom.ops.custom_linear  # noqa: F401  (defines the torch op)
from onnx_custom.registry import Registry

__all__ = ["linear_any_rank_gemm", "registry"]

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


def linear_any_rank_gemm(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """F.linear for x of any rank as one Gemm on x flattened to 2-D: the function body of
    ``npu::CustomLinear``. Gemm's C input is optional, so one body serves nodes with and without
    a bias (a MatMul + Add body could not: the Add would have no second input)."""
    x_2d = g.op("Flatten", x, axis=-1)  # (prod(leading dims), in); 1-D x gives (1, in)
    y_2d = g.op("Gemm", x_2d, weight, bias, transB=1)
    lead = g.op("Slice", g.op("Shape", x), _i64(g, [0]), _i64(g, [-1]))
    out = g.op("Slice", g.op("Shape", weight), _i64(g, [0]), _i64(g, [1]))
    return g.op("Reshape", y_2d, g.op("Concat", lead, out, axis=0))


def _i64(g: Any, values: list[int]) -> Any:
    return g.constant(np.asarray(values, dtype=np.int64))
