"""Kernel host: run Python kernels for custom ONNX nodes inside ONNX Runtime.

Declare kernels with :func:`kernel` (default registry) or a :class:`KernelRegistry`, then run
models with :class:`InferenceSession` (or :func:`session_options` for your own sessions). The
C shim is compiled on first use (see :mod:`onnx_custom.runtime.shim_build`).
Function bodies (ONNX functions standing in for kernels) live in :mod:`onnx_custom.function_bodies`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onnx_custom.runtime.registry import (
    AttrSpec,
    KernelRegistry,
    KernelSpec,
    ParamSpec,
    default_kernel_registry,
    kernel,
)
from onnx_custom.runtime.types import TensorInfo, broadcast_shapes

if TYPE_CHECKING:  # real types for checkers; at run time these load lazily (see __getattr__)
    from onnx_custom.runtime.failures import KernelRunError
    from onnx_custom.runtime.reference import make_op_run, reference_evaluator
    from onnx_custom.runtime.schemas import make_schema, register_schema, register_schemas
    from onnx_custom.runtime.session import (
        InferenceSession,
        ModelLoadError,
        missing_kernels,
        required_kernels,
        session_options,
    )

__all__ = [
    "AttrSpec",
    "InferenceSession",
    "KernelRegistry",
    "KernelRunError",
    "KernelSpec",
    "ModelLoadError",
    "ParamSpec",
    "TensorInfo",
    "broadcast_shapes",
    "default_kernel_registry",
    "kernel",
    "make_op_run",
    "make_schema",
    "missing_kernels",
    "reference_evaluator",
    "register_schema",
    "register_schemas",
    "required_kernels",
    "session_options",
]

# onnxruntime/onnx-heavy pieces load on first use so that `import onnx_custom.runtime` (done by
# every kernel module) stays cheap and free of import cycles.
_LAZY = {
    "InferenceSession": "session",
    "KernelRunError": "failures",
    "ModelLoadError": "session",
    "missing_kernels": "session",
    "required_kernels": "session",
    "session_options": "session",
    "make_op_run": "reference",
    "reference_evaluator": "reference",
    "make_schema": "schemas",
    "register_schema": "schemas",
    "register_schemas": "schemas",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'onnx_custom.runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"onnx_custom.runtime.{mod}"), name)
    globals()[name] = value
    return value
