"""Where the built-in translations and kernels live.

The default registries are assembled lazily from these modules (each module owns a local
``registry`` / ``kernels`` object), so importing a family module twice never double-registers
and nothing global is mutated at import time. Add a module here to ship it.
"""

from __future__ import annotations

__all__ = ["KERNEL_MODULES", "OP_MODULES", "SYMBOLIC_MODULES"]

# Each module defines `registry: onnx_custom.translate.registry.Registry`.
SYMBOLIC_MODULES: tuple[str, ...] = (
    "onnx_custom.symbolics.aten",
    "onnx_custom.symbolics.seed",
    "onnx_custom.symbolics.extension",
    "onnx_custom.symbolics.numpy_sin",
    "onnx_custom.symbolics.multi_out3",
    "onnx_custom.symbolics.bev_pool",
    "onnx_custom.symbolics.custom_linear",
    "onnx_custom.symbolics.deform_conv",
    "onnx_custom.symbolics.msda",
)

# Each module defines `kernels: onnx_custom.runtime.KernelRegistry`.
KERNEL_MODULES: tuple[str, ...] = (
    "onnx_custom.ort_kernels.seed",
    "onnx_custom.ort_kernels.multi_out3",
    "onnx_custom.ort_kernels.bev_pool",
    "onnx_custom.ort_kernels.custom_linear",
    "onnx_custom.ort_kernels.deform_conv",
    "onnx_custom.ort_kernels.msda",
)

# The modules that define the shipped ``onnx_custom::`` torch ops when imported;
# ``torch.ops.onnx_custom`` imports them on its first miss (`onnx_custom.common.op_namespace`).
OP_MODULES: tuple[str, ...] = (
    "onnx_custom.ops",  # deform_conv2d, multi_scale_deformable_attn
    "onnx_custom.ops.seed",
    "onnx_custom.ops.numpy_sin",
    "onnx_custom.ops.multi_out3",
    "onnx_custom.ops.bev_pool",
    "onnx_custom.ops.custom_linear",
)
