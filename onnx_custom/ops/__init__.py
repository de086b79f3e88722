"""Eager PyTorch ops shipped with onnx-custom (each module registers its ops on import).

``DeformConv2d`` and ``deform_conv2d`` are drop-ins for ``torchvision.ops``' (same signatures,
scriptable), backed by ``onnx_custom::deform_conv2d``. ``MultiScaleDeformableAttention`` and
``multi_scale_deformable_attn`` are drop-ins for mmcv's, backed by
``onnx_custom::multi_scale_deformable_attn``.
"""

from onnx_custom.ops.deform_conv import DeformConv2d, deform_conv2d
from onnx_custom.ops.msda import MultiScaleDeformableAttention, multi_scale_deformable_attn

__all__ = [
    "DeformConv2d",
    "MultiScaleDeformableAttention",
    "deform_conv2d",
    "multi_scale_deformable_attn",
]
