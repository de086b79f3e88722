"""Where the built-in translations and kernels live.

The default registries are assembled lazily from these modules (each module owns a local
``registry`` / ``kernels`` object), so importing a family module twice never double-registers
and nothing global is mutated at import time. Add a module here to ship it.
"""

from __future__ import annotations

__all__ = ["KERNEL_MODULES", "SYMBOLIC_MODULES"]

# Each module defines `registry: onnx_custom.registry.Registry`.
SYMBOLIC_MODULES: tuple[str, ...] = (
    "onnx_custom.symbolics.aten",
    "onnx_custom.symbolics.seed",
    "onnx_custom.symbolics.extension",
    "onnx_custom.symbolics.numpy_sin",
    "onnx_custom.symbolics.multi_output",
    "onnx_custom.symbolics.bev",
    "onnx_custom.symbolics.linear",
    "onnx_custom.symbolics.vision",
)

# Each module defines `kernels: onnx_custom.runtime.KernelRegistry`.
KERNEL_MODULES: tuple[str, ...] = (
    "onnx_custom.ort_kernels.seed",
    "onnx_custom.ort_kernels.multi_output",
    "onnx_custom.ort_kernels.bev",
    "onnx_custom.ort_kernels.linear",
    "onnx_custom.ort_kernels.vision",
)
