"""``onnx_custom::custom_linear``: the NPU article's linear op, ``F.linear`` semantics.

    y[..., out] = x[..., in] @ weight[out, in].T (+ bias[out])

The point of the article is the Meta function: output shape and dtype computed from x and weight
alone, so the op traces (and exports) on device="meta"/fake tensors without running a kernel;
here it is the spec's shape rule ``x[:-1] + [weight.0]``. Declared once below (`CUSTOM_LINEAR`);
translated to MatMul(+Add), Gemm (2-D x) or a namespaced ``onnx_custom::CustomLinear`` node
(``symbolics/custom_linear.py``), whose kernel math is in ``ort_kernels/custom_linear.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.spec import Input, OpSpec, Output, define_op, op_arguments

__all__ = ["CUSTOM_LINEAR", "SPECS", "check_linear_inputs", "custom_linear", "linear_output_shape"]

FLOATS = ("float32", "float64", "float16", "bfloat16")
_LINEAR = "onnx_custom.symbolics.custom_linear"

CUSTOM_LINEAR = OpSpec(
    "onnx_custom::custom_linear",
    doc="F.linear: y[..., out] = x[..., in] @ weight[out, in].T (+ bias[out])",
    inputs=[Input("x", FLOATS), Input("weight", FLOATS), Input("bias?", FLOATS)],
    outputs=[Output("y", shape="x[:-1] + [weight.0]")],
    impl="torch.nn.functional:linear",  # stands in for the vendor kernel
    check="onnx_custom.ops.custom_linear:check_linear_inputs",
    backward="onnx_custom.ops.custom_linear:linear_backward",
    setup_context="onnx_custom.ops.custom_linear:linear_save",
    op_type="CustomLinear",  # the stand-in for the vendor's NPU kernel, in our domain
    kernel="onnx_custom.ort_kernels.custom_linear:custom_linear",
    native=True,  # ort_kernels/native/custom_linear.cpp
    # one Gemm on x flattened to 2-D: serves nodes with and without a bias (Gemm's C is optional)
    function=TranslationBody(f"{_LINEAR}:linear_any_rank_gemm", min_opset=11),
    # every variant from opset 11 (optional Gemm C): the registry picks the highest opset first
    # and the preferred variant only among the entries at that opset
    translations={
        11: {
            "default": f"{_LINEAR}:custom_linear",
            "gemm": f"{_LINEAR}:custom_linear_gemm",
            "custom": "node",
        }
    },
)
SPECS = (CUSTOM_LINEAR,)


def linear_output_shape(x_shape: tuple[int, ...], weight_shape: tuple[int, ...]) -> list[int]:
    """[..., in] x [out, in] -> [..., out]: the spec's shape rule as a plain function."""
    return [*x_shape[:-1], weight_shape[0]]


@op_arguments(CUSTOM_LINEAR)
def check_linear_inputs(args: Any) -> None:
    """Shared by the eager and fake kernels; messages name the shapes."""
    x, weight, bias = args.x, args.weight, args.bias
    if x.dim() < 1:
        raise ValueError(
            "onnx_custom::custom_linear expects x with at least 1 dimension, got a 0-d tensor"
        )
    if weight.dim() != 2:
        raise ValueError(
            "onnx_custom::custom_linear expects a 2-D weight [out, in], got shape"
            f" {list(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"onnx_custom::custom_linear: x {list(x.shape)} has {x.shape[-1]} input features but "
            f"weight {list(weight.shape)} expects {weight.shape[1]}"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(
            f"onnx_custom::custom_linear expects bias of shape [{weight.shape[0]}], got"
            f" {list(bias.shape)}"
        )
    dtypes = {t.dtype for t in (x, weight, bias) if t is not None}
    if len(dtypes) != 1:
        raise TypeError(
            "onnx_custom::custom_linear expects x, weight and bias of one dtype, got "
            f"x {x.dtype}, weight {weight.dtype}, bias {None if bias is None else bias.dtype}"
        )
    if not x.dtype.is_floating_point:
        raise TypeError(f"onnx_custom::custom_linear expects floating-point tensors, got {x.dtype}")


def linear_save(ctx: Any, inputs: Any, output: Any) -> None:
    ctx.save_for_backward(inputs.x, inputs.weight)
    ctx.has_bias = inputs.bias is not None


def linear_backward(ctx: Any, grad: torch.Tensor) -> dict[str, torch.Tensor | None]:
    x, weight = ctx.saved_tensors
    rows = grad.reshape(-1, grad.shape[-1])
    return {
        "x": grad @ weight,
        "weight": rows.T @ x.reshape(-1, x.shape[-1]),
        "bias": rows.sum(0) if ctx.has_bias else None,
    }


custom_linear = define_op(CUSTOM_LINEAR)
