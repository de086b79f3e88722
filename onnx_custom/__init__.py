"""onnx-custom: declare once how PyTorch custom ops map to ONNX, export with either exporter,
run custom nodes in ONNX Runtime with Python kernels, and verify against PyTorch."""

from __future__ import annotations

from typing import Any

from onnx_custom import attributes as attr
from onnx_custom._torchscript import registered
from onnx_custom.errors import (
    DynamicShapesError,
    ExtensionBuildError,
    KernelError,
    OnnxCustomError,
    SymbolicError,
    UnsupportedOpError,
    VerificationError,
)
from onnx_custom.export import export
from onnx_custom.registry import Registry, SymbolicEntry, default_registry, symbolic
from onnx_custom.spec import OpSpec, load_specs, register_spec
from onnx_custom.verify import VerificationReport, verify

__version__ = "0.1.0"

__all__ = [
    "DynamicShapesError",
    "ExtensionBuildError",
    "InferenceSession",
    "KernelError",
    "OnnxCustomError",
    "OpSpec",
    "Registry",
    "SymbolicEntry",
    "SymbolicError",
    "UnsupportedOpError",
    "VerificationError",
    "VerificationReport",
    "attr",
    "default_registry",
    "export",
    "kernel",
    "library_path",
    "load_specs",
    "register_spec",
    "registered",
    "session_options",
    "symbolic",
    "translation_table",
    "verify",
]


def translation_table(opset: int = 18, registry: Registry | None = None) -> dict[Any, Any]:
    """``custom_translation_table`` for your own ``torch.onnx.export(..., dynamo=True)``."""
    from onnx_custom._dynamo import translation_table as build

    return build(opset, registry)


def __getattr__(name: str) -> Any:
    # The kernel host pulls in onnxruntime and a compiled shim: load it only when asked for.
    if name in ("InferenceSession", "session_options", "kernel", "KernelRegistry", "reference_evaluator"):
        from onnx_custom import runtime

        return getattr(runtime, name)
    if name == "library_path":  # the native kernel library (compiled on first use)
        from onnx_custom.runtime.native import library_path

        return library_path
    if name == "check":
        from onnx_custom.preflight import check

        return check
    if name == "testing":  # onnx_custom.testing.check_op without an explicit submodule import
        import importlib

        return importlib.import_module("onnx_custom.testing")
    raise AttributeError(f"module 'onnx_custom' has no attribute {name!r}")
