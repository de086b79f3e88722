"""Translations of ``deform_conv2d`` (ours: ``onnx_custom::deform_conv2d``; torchvision's
``torchvision::deform_conv2d`` too when torchvision's compiled ops load), generated from their
specs (``onnx_custom/ops/deform_conv.py``) except for the ONNX math below.

- opset >= 19: the standard ONNX ``DeformConv`` (pads ``[pad_h, pad_w, pad_h, pad_w]``,
  ``strides``, ``dilations``, ``group``, ``offset_group``, ``kernel_shape`` when the weight's
  shape is static, else ONNX infers it from W); bias always passed, mask only when ``use_mask``.
  Both use torchvision's offset layout (``offset[:, 2*(g*kh*kw + k)]`` = dy, ``+1`` = dx).
  float32, float64 and float16 only (``DEFORMCONV_DTYPES``: what ONNX Runtime's CPU
  ``DeformConv`` runs); a bfloat16 model raises `SymbolicError` naming the alternatives.
- opset < 19: one custom node ``onnx_custom::DeformConv2d`` with all five inputs (input, weight,
  offset, mask, bias) and the nine scalar arguments as INT attributes named like the torch schema.
  Its kernel lives in ``onnx_custom.ort_kernels.deform_conv``. The default domain is
  ``"onnx_custom"`` (``DEFAULT_DOMAIN``); ``make_registry(domain="acme")`` builds a registry
  emitting ``acme::DeformConv2d`` instead (pair it with
  ``ort_kernels.deform_conv.make_kernels("acme")``).
- variant ``"standard"`` below opset 19: the standard-op decomposition
  (``symbolics/deform_conv_decomposed.py``), also the custom node's function body.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from onnx_custom.errors import SymbolicError
from onnx_custom.ops.deform_conv import DEFORM_CONV2D, SPECS, torchvision_ops_available
from onnx_custom.spec import spec_translations
from onnx_custom.translate.registry import Registry

__all__ = [
    "DEFAULT_DOMAIN",
    "DEFORMCONV_DTYPES",
    "NODE_TYPE",
    "SCHEMA",
    "TARGETS",
    "deform_conv2d",
    "make_registry",
    "registry",
    "torchvision_ops_available",
]

DEFAULT_DOMAIN = str(DEFORM_CONV2D.domain)
NODE_TYPE = str(DEFORM_CONV2D.op_type)
SCHEMA = f"{DEFORM_CONV2D.op_name}{DEFORM_CONV2D.schema}"
TARGETS: tuple[str, ...] = tuple(spec.name for spec in SPECS)


# dtypes ONNX Runtime 1.31's CPU DeformConv implements (measured: bfloat16 is refused by the
# opset-19 schema, and at opset 22, whose schema allows it, ORT has no kernel).
DEFORMCONV_DTYPES = (torch.float32, torch.float64, torch.float16)


def _check_deformconv_dtype(g: Any, input: Any) -> None:
    dtype = g.dtype(input)
    if dtype is None or dtype in DEFORMCONV_DTYPES:
        return
    name = str(dtype).removeprefix("torch.")
    raise SymbolicError(
        f"{g.target}: ONNX DeformConv (opset {g.opset}) cannot run {name}: ONNX Runtime's CPU "
        "DeformConv supports float32, float64 and float16, and opset 19's DeformConv schema does "
        f"not allow {name}. Export with opset 18 or lower to get the custom node "
        f"{DEFAULT_DOMAIN}::{NODE_TYPE} (onnx-custom's kernel runs {name}), or cast the model "
        "to float16 or float32 (model.half() / model.float()) before exporting."
    )


def deform_conv2d(
    g: Any,
    input: Any,
    weight: Any,
    offset: Any,
    mask: Any,
    bias: Any,
    *,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> Any:
    _check_deformconv_dtype(g, input)
    shape = g.shape(weight)
    static = shape is not None and len(shape) == 4 and None not in shape
    return g.op(
        "DeformConv",
        input,
        weight,
        offset,
        bias,
        mask if use_mask else None,
        kernel_shape=list(shape[2:]) if static else None,  # type: ignore[index]
        strides=[stride_h, stride_w],
        pads=[pad_h, pad_w, pad_h, pad_w],
        dilations=[dilation_h, dilation_w],
        group=groups,
        offset_group=offset_groups,
    )


deform_conv2d.__doc__ = SCHEMA


def make_registry(domain: str = DEFAULT_DOMAIN) -> Registry:
    """Translations for every target in ``TARGETS``; custom nodes (opset < 19) in ``domain``."""
    return spec_translations(*(dataclasses.replace(spec, domain=domain) for spec in SPECS))


registry = make_registry()
