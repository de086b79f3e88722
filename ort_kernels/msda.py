"""Kernels of ``onnx_custom::MultiScaleDeformableAttn`` and ``mmdeploy::MMCVMultiScaleDeformableAttention``,
generated from the op's spec (``onnx_custom/ops/msda.py``, ``kernel=EAGER``).

Both nodes carry mmcv's signature: inputs (value, spatial_shapes, level_start_index,
sampling_locations, attention_weights), INT attribute ``im2col_step``. The kernel runs the eager
op ``onnx_custom::multi_scale_deformable_attn`` on torch views of ORT's buffers (no copy), with
the eager op's validation (including the spatial_shapes / level_start_index / num_keys contract,
read from the actual tensors), so eager and ONNX Runtime share one implementation. The mmdeploy
node gets the same kernel: files made for mmdeploy's TensorRT plugin also run in ONNX Runtime.
"""

from __future__ import annotations

from onnx_custom.ops.msda import MSDA
from onnx_custom.runtime import KernelRegistry
from onnx_custom.spec import spec_kernels

__all__ = ["MMDEPLOY_NODE", "NODE", "kernels", "make_kernels"]

NODE = f"{MSDA.domain}::{MSDA.op_type}"
MMDEPLOY_NODE = "mmdeploy::MMCVMultiScaleDeformableAttention"


def make_kernels() -> KernelRegistry:
    """A registry with both nodes' kernel."""
    registry = spec_kernels(MSDA)
    registry.alias(MMDEPLOY_NODE, NODE)
    return registry


kernels = make_kernels()
