"""Typed errors. Every message names what was expected, what was received, and the fix."""

from __future__ import annotations

__all__ = [
    "DynamicShapesError",
    "ExtensionBuildError",
    "InvalidArgumentError",
    "KernelError",
    "OnnxCustomError",
    "OpsetError",
    "OutputPathError",
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
    """PyTorch and ONNX outputs disagree (or cannot be compared). ``report`` holds the details;
    ``kept`` is where the failing model was written (``export(..., keep_failed=path)``), else None.
    """

    def __init__(self, message: str, report: object | None = None, *, kept: str | None = None) -> None:
        super().__init__(message)
        self.report = report
        self.kept = kept


class InvalidArgumentError(OnnxCustomError, TypeError, ValueError):
    """An argument of a public call has the wrong type or value (a model class instead of an
    instance, ``args`` that are not a tuple, an opset that is not an int, ...). A `TypeError` and a
    `ValueError` too, so code written against the built-in errors keeps working."""


class OpsetError(OnnxCustomError, ValueError):
    """The requested opset is outside what the chosen exporter can produce honestly.

    ``exporter``, ``minimum`` and ``maximum`` say what is supported.
    """

    def __init__(self, message: str, *, exporter: str = "", minimum: int | None = None, maximum: int | None = None) -> None:
        super().__init__(message)
        self.exporter = exporter
        self.minimum = minimum
        self.maximum = maximum


class OutputPathError(OnnxCustomError, OSError):
    """A file cannot be written where it was asked for (missing or read-only folder, a folder
    where a file was expected, not a path). Raised before any work starts; an `OSError` too."""


class ExtensionBuildError(OnnxCustomError):
    """A native piece (C shim, C++ extension) could not be built; names the missing tool."""
