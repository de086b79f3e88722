"""Typed errors. Every message names what was expected, what was received, and the fix."""

from __future__ import annotations

__all__ = [
    "DynamicShapesError",
    "ExtensionBuildError",
    "KernelError",
    "OnnxCustomError",
    "SymbolicError",
    "UnsupportedOpError",
    "VerificationError",
]


class OnnxCustomError(Exception):
    """Base class of every error onnx-custom raises on purpose."""


class UnsupportedOpError(OnnxCustomError):
    """An op has no translation for the requested exporter/opset.

    ``missing`` holds the qualified names of every missing op (all of them, not the first one).
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


class SymbolicError(OnnxCustomError, ValueError):
    """A translation or its registration is malformed (bad target name, bad attribute, wrong arity)."""


class DynamicShapesError(OnnxCustomError, ValueError):
    """``dynamic_shapes``/``dynamic_axes`` do not fit the model or its example inputs (unknown
    input or dim name, a range excluding the example size, a dim the model specializes)."""


class KernelError(OnnxCustomError):
    """A runtime kernel is missing, malformed, or failed."""


class VerificationError(OnnxCustomError):
    """PyTorch and ONNX outputs disagree (or cannot be compared). ``report`` holds the details."""

    def __init__(self, message: str, report: object | None = None) -> None:
        super().__init__(message)
        self.report = report


class ExtensionBuildError(OnnxCustomError):
    """A native piece (C shim, C++ extension) could not be built; names the missing tool."""
