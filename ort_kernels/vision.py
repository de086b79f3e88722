"""Kernel of ``custom::DeformConv2d`` (emitted for ``deform_conv2d`` below opset 19).

The node carries torchvision's schema: inputs (input, weight, offset, mask, bias), INT attributes
stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask. The
kernel runs the eager op ``onnx_custom::deform_conv2d`` on torch views of ORT's buffers (no copy),
so eager and ONNX Runtime share one implementation. ``make_kernels(domain)`` registers the same
kernel for another domain (see ``symbolics.vision.make_registry``).
"""

from __future__ import annotations

from typing import Any

import torch

from onnx_custom.errors import KernelError
from onnx_custom.ops.deform_conv import DTYPES, deform_conv2d_op, output_size
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.function_builder import TranslationBody
from onnx_custom.runtime.types import Dim, TensorInfo

__all__ = ["ATTRS", "deform_conv2d_shape", "deform_conv2d_torch", "kernels", "make_kernels"]

DEFAULT_DOMAIN = "custom"
NODE_TYPE = "DeformConv2d"
ATTRS: dict[str, Any] = {
    "stride_h": ("int", 1),
    "stride_w": ("int", 1),
    "pad_h": ("int", 0),
    "pad_w": ("int", 0),
    "dilation_h": ("int", 1),
    "dilation_w": ("int", 1),
    "groups": ("int", 1),
    "offset_groups": ("int", 1),
    "use_mask": ("int", 0),
}
# Exactly the eager op's dtypes (float16/bfloat16 compute in float32 inside the op).
_FLOATS = tuple(str(d).removeprefix("torch.") for d in DTYPES)


def _spatial(size: Dim, kernel: Dim, stride: int, pad: int, dilation: int, fallback: Dim) -> Dim:
    if isinstance(size, int) and isinstance(kernel, int):
        return int(output_size(size, kernel, stride, pad, dilation))
    return fallback  # the offset's spatial dims equal the output's by contract


def deform_conv2d_shape(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> TensorInfo:
    """Output (N, Cout, Ho, Wo); symbolic Ho/Wo are taken from the offset's dims 2 and 3."""
    x, w, offset = inputs[0], inputs[1], inputs[2]
    if x is None or w is None or offset is None:
        raise KernelError(f"{NODE_TYPE}: inputs input, weight and offset are required")
    if x.shape is None or w.shape is None or len(x.shape) != 4 or len(w.shape) != 4:
        return TensorInfo(x.dtype, (None,) * 4)  # rank is always 4
    off = offset.shape if offset.shape is not None and len(offset.shape) == 4 else (None,) * 4
    ho = _spatial(
        x.shape[2], w.shape[2], attrs["stride_h"], attrs["pad_h"], attrs["dilation_h"], off[2]
    )
    wo = _spatial(
        x.shape[3], w.shape[3], attrs["stride_w"], attrs["pad_w"], attrs["dilation_w"], off[3]
    )
    return TensorInfo(x.dtype, (x.shape[0], w.shape[0], ho, wo))


def deform_conv2d_torch(
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    *,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: int,
) -> torch.Tensor:
    """The node's math: the eager op (same validation, same C++ kernel)."""
    with torch.inference_mode():
        return deform_conv2d_op(input, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                pad_w, dilation_h, dilation_w, groups, offset_groups,
                                bool(use_mask))  # fmt: skip


def make_kernels(domain: str = DEFAULT_DOMAIN) -> KernelRegistry:
    """A registry with the ``{domain}::DeformConv2d`` kernel."""
    reg = KernelRegistry()
    reg.kernel(
        f"{domain}::{NODE_TYPE}",
        inputs=["input", "weight", "offset", "mask", "bias"],
        outputs=["output"],
        attrs=ATTRS,
        dtypes=_FLOATS,
        shape_fn=deform_conv2d_shape,
        tensor_type="torch",
        function=TranslationBody(
            "onnx_custom.symbolics.vision_decomposed:deform_conv2d_decomposed", min_opset=11
        ),
    )(deform_conv2d_torch)
    return reg


kernels = make_kernels()
