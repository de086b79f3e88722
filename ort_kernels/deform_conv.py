"""Kernel of ``onnx_custom::DeformConv2d`` (emitted for ``deform_conv2d`` below opset 19), generated
from the op's spec (``onnx_custom/ops/deform_conv.py``, ``kernel=EAGER``).

The node carries torchvision's schema: inputs (input, weight, offset, mask, bias), INT attributes
stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask. The
kernel runs the eager op ``onnx_custom::deform_conv2d`` on torch views of ORT's buffers (no copy),
so eager and ONNX Runtime share one implementation. ``make_kernels(domain)`` registers the same
kernel for another domain (see ``symbolics.deform_conv.make_registry``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onnx_custom.ops.deform_conv import DEFORM_CONV2D
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.types import TensorInfo
from onnx_custom.spec import spec_kernels

__all__ = ["ATTRS", "deform_conv2d_shape", "deform_conv2d_torch", "kernels", "make_kernels"]

DEFAULT_DOMAIN = str(DEFORM_CONV2D.domain)
NODE_TYPE = str(DEFORM_CONV2D.op_type)


def make_kernels(domain: str = DEFAULT_DOMAIN) -> KernelRegistry:
    """A registry with the ``{domain}::DeformConv2d`` kernel."""
    return spec_kernels(dataclasses.replace(DEFORM_CONV2D, domain=domain))


kernels = make_kernels()
_KERNEL = kernels[f"{DEFAULT_DOMAIN}::{NODE_TYPE}"]
ATTRS: dict[str, Any] = {a.name: (a.type, a.default) for a in _KERNEL.attrs}
"""The node's attributes: ``{name: (ONNX type, what a node without it means)}``."""
deform_conv2d_torch = _KERNEL.fn
"""The node's math: the eager op (same validation, same C++ kernel) on torch tensors."""


def deform_conv2d_shape(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> TensorInfo:
    """Output (N, Cout, Ho, Wo) from the spec's shape rule; Ho/Wo are the offset's dims 2 and 3."""
    (out,) = _KERNEL.infer(inputs, attrs)
    assert out is not None
    return out
