"""``npu::custom_linear``: the NPU article's linear op, ``F.linear`` semantics.

    y[..., out] = x[..., in] @ weight[out, in].T (+ bias[out])

The point of the article is the Meta function: output shape and dtype computed from x and weight
alone, so the op traces (and exports) on device="meta"/fake tensors without running a kernel.
Translated to MatMul(+Add), Gemm (2-D x), or a namespaced ``npu::CustomLinear`` node.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["check_linear_inputs", "custom_linear", "linear_output_shape"]


def linear_output_shape(x_shape: tuple[int, ...], weight_shape: tuple[int, ...]) -> list[int]:
    """[..., in] x [out, in] -> [..., out] (pure function, shared by the meta/fake kernel)."""
    return [*x_shape[:-1], weight_shape[0]]


def check_linear_inputs(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> None:
    """Shared by the eager and fake kernels; messages name the shapes."""
    if x.dim() < 1:
        raise ValueError("npu::custom_linear expects x with at least 1 dimension, got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(
            f"npu::custom_linear expects a 2-D weight [out, in], got shape {list(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"npu::custom_linear: x {list(x.shape)} has {x.shape[-1]} input features but "
            f"weight {list(weight.shape)} expects {weight.shape[1]}"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(
            f"npu::custom_linear expects bias of shape [{weight.shape[0]}], got {list(bias.shape)}"
        )
    dtypes = {t.dtype for t in (x, weight, bias) if t is not None}
    if len(dtypes) != 1:
        raise TypeError(
            f"npu::custom_linear expects x, weight and bias of one dtype, got "
            f"x {x.dtype}, weight {weight.dtype}, bias {None if bias is None else bias.dtype}"
        )
    if not x.dtype.is_floating_point:
        raise TypeError(f"npu::custom_linear expects floating-point tensors, got {x.dtype}")


@torch.library.custom_op("npu::custom_linear", mutates_args=())
def custom_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias); stands in for the vendor kernel."""
    check_linear_inputs(x, weight, bias)
    return F.linear(x, weight, bias)


@custom_linear.register_fake
def _custom_linear_meta(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    check_linear_inputs(x, weight, bias)
    return x.new_empty(linear_output_shape(tuple(x.shape), tuple(weight.shape)))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(
    ctx: Any, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x, weight = ctx.saved_tensors
    grad_x = grad @ weight
    grad_w = grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_x, grad_w, grad_b


custom_linear.register_autograd(_backward, setup_context=_setup_context)
