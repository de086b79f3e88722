"""Eager PyTorch ops shipped with onnx-custom (each module registers its ops on import).

``DeformConv2d`` and ``deform_conv2d`` are drop-ins for ``torchvision.ops``' (same signatures,
scriptable), backed by ``onnx_custom::deform_conv2d``.
"""

from onnx_custom.ops.deform_conv import DeformConv2d, deform_conv2d

__all__ = ["DeformConv2d", "deform_conv2d"]
