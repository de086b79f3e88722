"""Typed errors. Every message names what was expected, what was received, and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CliInputError",
    "CompileError",
    "DeformConv2dDtypeError",
    "DeformConv2dError",
    "DynamicShapesError",
    "ExtensionBuildError",
    "FakeKernelError",
    "FuseProofError",
    "HalfPrecisionError",
    "InvalidArgumentError",
    "KernelError",
    "MixedFloatTypesError",
    "ModelLoadError",
    "ModelNotFoundError",
    "MultiScaleDeformableAttnDtypeError",
    "MultiScaleDeformableAttnError",
    "NativeCompileError",
    "NodeDeclarationError",
    "OnnxCustomError",
    "OpsetError",
    "OutputPathError",
    "ShapeSpecError",
    "SpecError",
    "SymbolicError",
    "UnsupportedOpError",
    "VerificationError",
]

# One catalog: every error class lives here (plain Python, importable without torch or
# onnxruntime), except `onnx_custom.runtime.failures.KernelRunError`, which also subclasses
# onnxruntime's own Fail exception so code catching ORT's errors keeps working.


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
    """A translation or its registration is malformed (bad target name, bad attribute,
    wrong arity)."""


class HalfPrecisionError(SymbolicError):
    """A float16/bfloat16 node ONNX Runtime's CPU provider cannot run, and the export may not (or
    cannot) compute it in float32 (``half_precision=``): raised at export, before anything is
    written, naming the op, the dtype and the provider."""


class FakeKernelError(SymbolicError):
    """A custom op's fake (meta) kernel declares outputs of another rank or dtype than its real
    kernel returns: the dynamo exporter writes the fake's types into the file, so it is refused
    at export. Names the op, both declarations and the fix."""


class MixedFloatTypesError(SymbolicError):
    """A node mixing float element types (a float64 ``GridSample`` grid beside a float32 image)
    that ONNX Runtime's CPU provider cannot run, and the export may not (``half_precision=
    'strict'``) or cannot repair with a ``Cast``: raised at export, before anything is written."""


class DynamicShapesError(OnnxCustomError, ValueError):
    """``dynamic_shapes``/``dynamic_axes`` do not fit the model or its example inputs (unknown
    input or dim name, a range excluding the example size, a dim the model specializes)."""


class KernelError(OnnxCustomError):
    """A runtime kernel is missing, malformed, or failed."""


class VerificationError(OnnxCustomError):
    """PyTorch and ONNX outputs disagree (or cannot be compared). ``report`` holds the details;
    ``kept`` is where the failing model was written (``export(..., keep_failed=path)``), else None.
    """

    def __init__(
        self, message: str, report: object | None = None, *, kept: str | None = None
    ) -> None:
        super().__init__(message)
        # VerificationReport or testing.CheckReport (Any: this catalogue imports no layer above)
        self.report: Any = report
        self.kept = kept


class InvalidArgumentError(OnnxCustomError, TypeError, ValueError):
    """An argument of a public call has the wrong type or value (a model class instead of an
    instance, ``args`` that are not a tuple, an opset that is not an int, ...). A `TypeError` and a
    `ValueError` too, so code written against the built-in errors keeps working."""


class OpsetError(OnnxCustomError, ValueError):
    """The requested opset is outside what the chosen exporter can produce honestly.

    ``exporter``, ``minimum`` and ``maximum`` say what is supported.
    """

    def __init__(
        self,
        message: str,
        *,
        exporter: str = "",
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> None:
        super().__init__(message)
        self.exporter = exporter
        self.minimum = minimum
        self.maximum = maximum


class OutputPathError(OnnxCustomError, OSError):
    """A file cannot be written where it was asked for (missing or read-only folder, a folder
    where a file was expected, not a path). Raised before any work starts; an `OSError` too."""


class ExtensionBuildError(OnnxCustomError):
    """A native piece (C shim, C++ extension) could not be built; names the missing tool."""


class NativeCompileError(ExtensionBuildError):
    """The C++ compiler rejected a native kernel library's sources. ``op`` names the op spec the
    first error belongs to (when known), ``file``/``line`` where the compiler placed it, and
    ``output`` holds the compiler's full output."""

    def __init__(
        self,
        message: str,
        *,
        op: str = "",
        file: str = "",
        line: int | None = None,
        output: str = "",
    ) -> None:
        super().__init__(message)
        self.op, self.file, self.line, self.output = op, file, line, output


class SpecError(SymbolicError):
    """A malformed op spec (or YAML file): names the op, the key, what was expected and the fix.

    ``op`` is the qualified op name (when known), ``key`` the path of the offending entry in the
    declaration's terms (``("inputs", 1, "dtype")``), and ``file``/``line`` where a YAML file
    declared it.
    """

    def __init__(
        self,
        message: str,
        *,
        op: str = "",
        key: tuple[Any, ...] = (),
        file: str = "",
        line: int | None = None,
    ) -> None:
        where = f"{file}:{line}: " if file and line is not None else f"{file}: " if file else ""
        super().__init__(f"{where}{message}")
        self.op, self.key, self.file, self.line, self.detail = op, key, file, line, message


class NodeDeclarationError(KernelError, ValueError):
    """Custom nodes disagree with their kernels' declarations (arity, attribute names or types)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class ModelLoadError(OnnxCustomError, ValueError):
    """The model given to onnx-custom is not a readable ONNX model."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The ONNX file given by path does not exist (a `FileNotFoundError` too)."""


class ShapeSpecError(VerificationError, ValueError):
    """``shapes=`` or ``dynamic_shapes=`` of `verify` do not fit the file or the arguments."""


class DeformConv2dError(InvalidArgumentError, RuntimeError):
    """A deform_conv2d argument has the wrong shape, layout or value. Also a RuntimeError, as
    torchvision's errors are, so a drop-in keeps ``except RuntimeError`` working."""


class DeformConv2dDtypeError(InvalidArgumentError, RuntimeError):
    """A deform_conv2d tensor has an unsupported dtype, or the tensors' dtypes differ (a
    TypeError, and a RuntimeError like torchvision's)."""


class MultiScaleDeformableAttnError(OnnxCustomError, ValueError, RuntimeError):
    """A multi_scale_deformable_attn argument has the wrong shape, layout or value (also a
    ``RuntimeError``, what mmcv's compiled op raises, so code catching either keeps working)."""


class MultiScaleDeformableAttnDtypeError(OnnxCustomError, TypeError, RuntimeError):
    """A multi_scale_deformable_attn tensor has an unsupported dtype, or the float dtypes differ."""


class CliInputError(OnnxCustomError, ValueError):
    """A command-line input (model spec, ``--import``, ``--input``, path, flag) is unusable."""


class CompileError(OnnxCustomError):
    """``torch.compile(backend="onnx_custom")`` could not run a graph as asked: a node without a
    translation under ``fallback="error"``, inputs on a device the chosen providers cannot take,
    or a torch version whose private exporter API the backend's adapter does not know."""


class FuseProofError(VerificationError):
    """``fuse_file`` fused a subgraph but the fused file's ONNX Runtime outputs differ from the
    original's (or either file does not run): nothing was written. ``report`` is the
    `onnx_custom.rewrite.FuseReport` with the differences."""
