"""A deliberately wrong DeformConv translation for the localization tests (mask dropped)."""

from __future__ import annotations

from typing import Any

import onnx_custom
from onnx_custom.symbolics import deform_conv as deform_conv_symbolics


def planted_deform_conv2d(
    g: Any, input: Any, weight: Any, offset: Any, mask: Any, bias: Any, **attrs: Any
) -> Any:
    """Wrong on purpose: drops the modulation mask (use_mask=False)."""
    return deform_conv_symbolics.deform_conv2d(
        g, input, weight, offset, mask, bias, **{**attrs, "use_mask": False}
    )


def planted_registry() -> onnx_custom.Registry:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::deform_conv2d", opset=19, replace=True)(planted_deform_conv2d)
    return registry
