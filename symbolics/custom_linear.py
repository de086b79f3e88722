"""ONNX math of ``onnx_custom::custom_linear`` (F.linear semantics; declared in
``onnx_custom/ops/custom_linear.py``).

Default: MatMul(x, Transpose(weight)) (+ Add bias), any rank of x. Variant ``"gemm"``: one Gemm
with transB=1 (x must be 2-D). Variant ``"custom"``: the ``onnx_custom::CustomLinear`` node
(generated from the spec; kernel in ``ort_kernels/custom_linear.py``), whose function body is
`linear_any_rank_gemm`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx_custom.ops.custom_linear import SPECS
from onnx_custom.spec import spec_translations

__all__ = ["custom_linear", "custom_linear_gemm", "linear_any_rank_gemm", "registry"]


def custom_linear(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """MatMul(x, weight^T) (+ bias), any rank of x."""
    y = g.op("MatMul", x, g.op("Transpose", weight, perm=[1, 0]))
    return y if bias is None else g.op("Add", y, bias)


def custom_linear_gemm(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """One Gemm for 2-D x; any other rank (or an unknown one) through x flattened to 2-D and
    the result reshaped back (`linear_any_rank_gemm`): Gemm itself takes rank 2 only."""
    shape = g.shape(x)
    if shape is None or len(shape) != 2:
        return linear_any_rank_gemm(g, x, weight, bias)
    return g.op("Gemm", x, weight, bias, transB=1)  # C is optional from opset 11


def linear_any_rank_gemm(g: Any, x: Any, weight: Any, bias: Any) -> Any:
    """F.linear for x of any rank as one Gemm on x flattened to 2-D: the function body of
    ``onnx_custom::CustomLinear``. Gemm's C input is optional, so one body serves nodes with and
    without a bias (a MatMul + Add body could not: the Add would have no second input)."""
    x_2d = g.op("Flatten", x, axis=-1)  # (prod(leading dims), in); 1-D x gives (1, in)
    y_2d = g.op("Gemm", x_2d, weight, bias, transB=1)
    lead = g.op("Slice", g.op("Shape", x), _i64(g, [0]), _i64(g, [-1]))
    out = g.op("Slice", g.op("Shape", weight), _i64(g, [0]), _i64(g, [1]))
    return g.op("Reshape", y_2d, g.op("Concat", lead, out, axis=0))


def _i64(g: Any, values: list[int]) -> Any:
    return g.constant(np.asarray(values, dtype=np.int64))


registry = spec_translations(*SPECS)
