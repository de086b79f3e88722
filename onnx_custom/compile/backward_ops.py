"""Backward ops of our shipped ops inside ORT partitions, so a training step's backward graph is
one partition instead of several split around eager nodes.

``onnx_custom::_deform_conv2d_backward`` (what aot_autograd puts in the backward graph of
``deform_conv2d``) becomes one ``onnx_custom.compile::DeformConv2dBackward`` node whose Python
kernel runs the same C++ backward as eager, on torch views of ORT's buffers (no copy). The
kernel is registered in the default kernel registry (its domain is ours alone); with
``kernels="native"`` it is served by Python too (the native library has no backward kernels).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from onnx_custom.runtime import kernel
from onnx_custom.runtime.types import TensorInfo
from onnx_custom.translate.registry import Registry

__all__ = ["DOMAIN", "backward_registry"]

DOMAIN = "onnx_custom.compile"
_ATTRS = (
    "stride_h",
    "stride_w",
    "pad_h",
    "pad_w",
    "dilation_h",
    "dilation_w",
    "groups",
    "offset_groups",
    "use_mask",
)
_TENSORS = ("grad", "input", "weight", "offset", "mask", "bias")


def _like_inputs(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> list[TensorInfo | None]:
    """Each gradient has its input's dtype and shape (input, weight, offset, mask, bias)."""
    return list(inputs[1:6])


@functools.cache
def _register_kernel() -> None:
    @kernel(
        f"{DOMAIN}::DeformConv2dBackward",
        inputs=list(_TENSORS),
        outputs=["grad_input", "grad_weight", "grad_offset", "grad_mask", "grad_bias"],
        attrs={name: "int" for name in _ATTRS},
        tensor_type="torch",
        shape_fn=_like_inputs,
    )
    def deform_conv2d_backward(
        grad: torch.Tensor,
        input: torch.Tensor,
        weight: torch.Tensor,
        offset: torch.Tensor,
        mask: torch.Tensor,
        bias: torch.Tensor,
        **attrs: int,
    ) -> tuple[torch.Tensor, ...]:
        args = [attrs[name] for name in _ATTRS]
        args[-1] = bool(args[-1])
        return tuple(
            torch.ops.onnx_custom._deform_conv2d_backward(
                grad, input, weight, offset, mask, bias, *args
            )
        )


def _deform_conv2d_backward(
    g: Any, grad: Any, input: Any, weight: Any, offset: Any, mask: Any, bias: Any, **params: Any
) -> Any:
    """onnx_custom::_deform_conv2d_backward(grad, input, weight, offset, mask, bias, 9 ints/bools)
    -> 5 grads"""
    attrs = {name: int(params[name]) for name in _ATTRS}
    return g.op(
        f"{DOMAIN}::DeformConv2dBackward",
        grad,
        input,
        weight,
        offset,
        mask,
        bias,
        outputs=5,
        **attrs,
    )


def backward_registry() -> Registry:
    """Translations of our ops' backward ops that exist in this process (as for every
    translation: an op defined after a backend's first compile is not seen by that backend)."""
    registry = Registry()
    if hasattr(torch.ops.onnx_custom, "_deform_conv2d_backward"):
        _register_kernel()
        registry.symbolic("onnx_custom::_deform_conv2d_backward", opset=13)(_deform_conv2d_backward)
    return registry
