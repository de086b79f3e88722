"""onnx-custom: declare once how PyTorch custom ops map to ONNX, export with either exporter,
run custom nodes in ONNX Runtime with Python kernels, and verify against PyTorch.

Every public name loads on first use (module ``__getattr__``): ``import onnx_custom`` costs no
torch import, so ``onnx-custom --help`` answers at once. The shipped torch ops
(``torch.ops.onnx_custom.<op>``) are defined on the namespace's first lookup of a name it lacks
(`onnx_custom.common.op_namespace`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from onnx_custom import errors as _errors
from onnx_custom.common import op_namespace as _op_namespace

if TYPE_CHECKING:
    from collections.abc import Mapping

    from onnx_custom import fusion as fusion
    from onnx_custom import testing as testing
    from onnx_custom.api import export
    from onnx_custom.compile import compile_backend, explain_compile
    from onnx_custom.errors import (
        CliInputError,
        CompileError,
        DeformConv2dDtypeError,
        DeformConv2dError,
        DynamicShapesError,
        ExtensionBuildError,
        FakeKernelError,
        FuseProofError,
        HalfPrecisionError,
        InvalidArgumentError,
        KernelError,
        MixedFloatTypesError,
        ModelLoadError,
        ModelNotFoundError,
        MultiScaleDeformableAttnDtypeError,
        MultiScaleDeformableAttnError,
        NativeCompileError,
        NodeDeclarationError,
        OnnxCustomError,
        OpsetError,
        OutputPathError,
        ShapeSpecError,
        SpecError,
        SymbolicError,
        UnsupportedOpError,
        VerificationError,
    )
    from onnx_custom.exporter.torchscript import registered
    from onnx_custom.rewrite import FuseReport, fuse_file
    from onnx_custom.runtime import InferenceSession, kernel, session_options
    from onnx_custom.runtime import KernelRegistry as KernelRegistry
    from onnx_custom.runtime import reference_evaluator as reference_evaluator
    from onnx_custom.runtime.failures import KernelRunError
    from onnx_custom.runtime.native import NativeLibrary, library_path
    from onnx_custom.spec import (
        OpSpec,
        build_native_library,
        load_specs,
        parse_specs,
        register_spec,
    )
    from onnx_custom.translate import attributes as attr
    from onnx_custom.translate.registry import Registry, SymbolicEntry, default_registry, symbolic
    from onnx_custom.translate.torch_symbolics import (
        import_torch_symbolics,
        register_custom_op_symbolic,
        unregister_custom_op_symbolic,
    )
    from onnx_custom.verification.preflight import check as check
    from onnx_custom.verification.verifier import VerificationReport, verify

__version__ = "0.1.0"

__all__ = [
    "CliInputError",
    "CompileError",
    "DeformConv2dDtypeError",
    "DeformConv2dError",
    "DynamicShapesError",
    "ExtensionBuildError",
    "FakeKernelError",
    "FuseProofError",
    "FuseReport",
    "HalfPrecisionError",
    "InferenceSession",
    "InvalidArgumentError",
    "KernelError",
    "KernelRegistry",
    "KernelRunError",
    "MixedFloatTypesError",
    "ModelLoadError",
    "ModelNotFoundError",
    "MultiScaleDeformableAttnDtypeError",
    "MultiScaleDeformableAttnError",
    "NativeCompileError",
    "NativeLibrary",
    "NodeDeclarationError",
    "OnnxCustomError",
    "OpSpec",
    "OpsetError",
    "OutputPathError",
    "Registry",
    "ShapeSpecError",
    "SpecError",
    "SymbolicEntry",
    "SymbolicError",
    "UnsupportedOpError",
    "VerificationError",
    "VerificationReport",
    "attr",
    "build_native_library",
    "check",
    "compile_backend",
    "default_registry",
    "explain_compile",
    "export",
    "fuse_file",
    "fusion",
    "import_torch_symbolics",
    "kernel",
    "library_path",
    "load_specs",
    "parse_specs",
    "reference_evaluator",
    "register_custom_op_symbolic",
    "register_spec",
    "registered",
    "session_options",
    "symbolic",
    "testing",
    "translation_table",
    "unregister_custom_op_symbolic",
    "verify",
]

# public name -> (module, attribute); attribute None: the module itself.
# Every error class a user may catch: the catalog's own list (errors.py is plain Python, no torch).
_ERRORS = tuple(_errors.__all__)
_RUNTIME = (
    "InferenceSession",
    "session_options",
    "kernel",
    "KernelRegistry",
    "reference_evaluator",
)
_LAZY: dict[str, tuple[str, str | None]] = {
    "attr": ("onnx_custom.translate.attributes", None),
    "registered": ("onnx_custom.exporter.torchscript", "registered"),
    **{name: ("onnx_custom.errors", name) for name in _ERRORS},
    "export": ("onnx_custom.api", "export"),
    "Registry": ("onnx_custom.translate.registry", "Registry"),
    "SymbolicEntry": ("onnx_custom.translate.registry", "SymbolicEntry"),
    "default_registry": ("onnx_custom.translate.registry", "default_registry"),
    "symbolic": ("onnx_custom.translate.registry", "symbolic"),
    **{
        name: ("onnx_custom.translate.torch_symbolics", name)
        for name in (
            "register_custom_op_symbolic",
            "unregister_custom_op_symbolic",
            "import_torch_symbolics",
        )
    },
    "OpSpec": ("onnx_custom.spec", "OpSpec"),
    "load_specs": ("onnx_custom.spec", "load_specs"),
    "parse_specs": ("onnx_custom.spec", "parse_specs"),
    "build_native_library": ("onnx_custom.spec", "build_native_library"),  # your C++ kernels
    "NativeLibrary": ("onnx_custom.runtime.native", "NativeLibrary"),
    "register_spec": ("onnx_custom.spec", "register_spec"),
    "VerificationReport": ("onnx_custom.verification.verifier", "VerificationReport"),
    "verify": ("onnx_custom.verification.verifier", "verify"),
    "fuse_file": ("onnx_custom.rewrite", "fuse_file"),  # fuse MSDA in an existing ONNX file
    "FuseReport": ("onnx_custom.rewrite", "FuseReport"),
    **{name: ("onnx_custom.runtime", name) for name in _RUNTIME},  # onnxruntime + the compiled shim
    "library_path": ("onnx_custom.runtime.native", "library_path"),  # compiled on first use
    "KernelRunError": (
        "onnx_custom.runtime.failures",
        "KernelRunError",
    ),  # subclasses onnxruntime's Fail
    "check": ("onnx_custom.verification.preflight", "check"),
    "testing": ("onnx_custom.testing", None),
    "fusion": ("onnx_custom.fusion", None),  # fuse=: FusionReport, fusion_report, register_fusion
    "compile_backend": ("onnx_custom.compile", "compile_backend"),  # torch.compile(backend=...)
    "explain_compile": (
        "onnx_custom.compile",
        "explain_compile",
    ),  # onnx_custom.testing.check_op without importing it
}


def translation_table(
    opset: int | None = None,
    registry: Registry | None = None,
    *,
    extra: Mapping[Any, Any] | None = None,
) -> dict[Any, Any]:
    """``custom_translation_table`` for your own ``torch.onnx.export(..., dynamo=True)``;
    ``extra`` merges your own entries (``@onnxscript.script`` functions included) over ours.
    ``opset`` None: translations are chosen for the opset the export records at (torch's default
    or your ``opset_version``); an explicit opset refuses an export recording at another."""
    from onnx_custom.exporter.dynamo import translation_table as build

    return build(opset, registry, extra=extra)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'onnx_custom' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


_op_namespace.install()
