"""Kernels of ``onnx_custom::MultiScaleDeformableAttn`` and
``mmdeploy::MMCVMultiScaleDeformableAttention``, generated from the op's spec
(``onnx_custom/ops/msda.py``, ``kernel=msda_ort_kernel``).

Both nodes carry mmcv's signature: inputs (value, spatial_shapes, level_start_index,
sampling_locations, attention_weights), INT attribute ``im2col_step``. The kernel runs the eager
op's validation (including the spatial_shapes / level_start_index / num_keys contract, read from
the actual tensors) and its C++ forward on torch views of ORT's buffers (no copy), writing into
ORT's output buffer, so eager and ONNX Runtime share one implementation. The mmdeploy
node gets the same kernel: files made for mmdeploy's TensorRT plugin also run in ONNX Runtime.

The native kernel (``native/msda.cpp``) is written against the user kernel API
(``onnx_custom/kernel.h``) and named by the spec's ``native:``; its registration in the shipped
library, ``native/msda_generated.cpp``, is `native_binding`'s output: the code generator user specs
go through (`onnx_custom.spec.native_codegen`), checked in so ``make`` and the one-line build need
no Python. ``python -m onnx_custom.ort_kernels.msda`` rewrites it after a change to the spec.
"""

from __future__ import annotations

from pathlib import Path

from onnx_custom.common.atomic import atomic_write
from onnx_custom.ops.msda import MSDA
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.native import sources_dir
from onnx_custom.spec import spec_kernels
from onnx_custom.spec.native_codegen import GeneratedSource, generate_source

__all__ = [
    "MMDEPLOY_NODE",
    "NATIVE_BINDING",
    "NODE",
    "kernels",
    "make_kernels",
    "native_binding",
    "write_native_binding",
]

NODE = f"{MSDA.domain}::{MSDA.op_type}"
MMDEPLOY_NODE = "mmdeploy::MMCVMultiScaleDeformableAttention"


def make_kernels() -> KernelRegistry:
    """A registry with both nodes' kernel."""
    registry = spec_kernels(MSDA)
    registry.alias(MMDEPLOY_NODE, NODE)
    return registry


kernels = make_kernels()

NATIVE_BINDING = "msda_generated.cpp"
"""The generated registration of the native kernel, in ``ort_kernels/native``."""


def native_binding() -> GeneratedSource:
    """The shipped library's registration of both nodes, generated from `MSDA` like a user's op."""
    source = Path(MSDA.native.path())  # type: ignore[union-attr]
    return generate_source(
        source,
        [MSDA],
        0,
        filename=NATIVE_BINDING,
        adder="add_msda_ops",
        aliases={MSDA.name: (MMDEPLOY_NODE,)},
    )


def write_native_binding() -> Path:
    """Rewrite ``ort_kernels/native/msda_generated.cpp`` from the spec; returns its path."""
    target = sources_dir() / NATIVE_BINDING
    atomic_write(target, native_binding().text.encode("utf-8"))
    return target


if __name__ == "__main__":
    print(write_native_binding())
