"""``onnx_custom_ext::my_add`` (2a + b) as a C++ extension op, built on demand and cached on disk.

The C++ source (``csrc/extension.cpp``) defines the op with ``TORCH_LIBRARY`` and a CPU kernel;
this module builds it with ``torch.utils.cpp_extension.load(is_python_module=False)`` into
``<cache>/torch_ext/<hash>/`` (compiled once, reused by every later process). The op is declared
once below (`MY_ADD`) without ``impl``: the spec adopts the op the C++ library defines (whose
schema must agree), and loading the library adopts it, which registers the fake kernel and the
autograd formula. It emits the node of ``onnx_custom::my_add`` (``onnx_custom::my_add``), served by
that op's kernel (``ort_kernels/seed.py``), and shares its dtype list and backward.

Nothing is compiled at import time: call :func:`load_my_ops` first. When no compiler or ninja
is available it raises :class:`~onnx_custom.errors.ExtensionBuildError` naming the tool, and the
rest of onnx-custom keeps working.

``MyAddFunction`` is the "seed article" pattern (an ``autograd.Function`` whose forward calls the
C++ op). Its ONNX ``symbolic`` comes from our registry (``symbolics/extension.py``) and applies to
the TorchScript exporter only: the dynamo exporter traces through ``autograd.Function`` and sees
``onnx_custom_ext::my_add`` itself, which is how it must be exported there.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch

from onnx_custom.common.native_build import build_torch_extension, cache_root, extension_directory
from onnx_custom.errors import ExtensionBuildError
from onnx_custom.ops.seed import MY_ADD as SEED_MY_ADD
from onnx_custom.ops.seed import my_add_backward
from onnx_custom.spec import OpSpec, define_op, op_arguments

__all__ = [
    "EXTENSION_NAME",
    "MY_ADD",
    "SOURCE",
    "SPECS",
    "MyAddFunction",
    "build_directory",
    "cache_root",
    "check_my_add_inputs",
    "extension_available",
    "load_my_ops",
    "my_add",
    "my_add_reference",
]

EXTENSION_NAME = "onnx_custom_ext"
SOURCE = Path(__file__).resolve().parent / "csrc" / "extension.cpp"
QUALNAME = "onnx_custom_ext::my_add"

_CFLAGS = ("-O2",)
_lock = threading.Lock()
_loaded_path: str | None = None
_failure: ExtensionBuildError | None = None

# onnx_custom::my_add's declaration (signature, dtypes, node, translations, kernel, backward), for
# the op the C++ library defines: no impl (adopted), its own validator.
MY_ADD = OpSpec(
    QUALNAME,
    doc="y = 2a + b, a C++ kernel (TORCH_LIBRARY)",
    inputs=SEED_MY_ADD.inputs,
    outputs=SEED_MY_ADD.outputs,
    node_attributes=SEED_MY_ADD.node_attributes,
    check="onnx_custom.ops.extension:check_my_add_inputs",
    backward="onnx_custom.ops.seed:my_add_backward",
    op_type=SEED_MY_ADD.op_type,
    domain=SEED_MY_ADD.domain,
    kernel="onnx_custom.ort_kernels.seed:kernels",  # onnx_custom::my_add's kernel serves the node
    native=True,
    translations=SEED_MY_ADD.translations,
)
SPECS = (MY_ADD,)


# --------------------------------------------------------------------------- validation / math
@op_arguments(MY_ADD)
def check_my_add_inputs(args: Any) -> None:
    """Shared by the fake kernel and the Python reference (the C++ kernel mirrors the wording)."""
    a, b = args.a, args.b
    if a.shape != b.shape:
        raise ValueError(
            f"onnx_custom_ext::my_add expects a and b of the same shape, got a {list(a.shape)} "
            f"and b {list(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise TypeError(
            f"onnx_custom_ext::my_add expects a and b of the same dtype, got a {a.dtype} and b"
            f" {b.dtype}"
        )
    if str(a.dtype).removeprefix("torch.") not in MY_ADD.inputs[0].dtypes:
        raise TypeError(
            "onnx_custom_ext::my_add expects tensors of float32, float64, float16, bfloat16, int8,"
            f" int16, int32, int64 or uint8, got {a.dtype}"
        )


def my_add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pure-PyTorch 2a + b, the ground truth for tests."""
    check_my_add_inputs(a, b)
    return 2 * a + b


# --------------------------------------------------------------------------- build / load
def build_directory() -> Path:
    """Cache folder keyed by everything that changes the binary (source, torch, python,
    compiler)."""
    return extension_directory(EXTENSION_NAME, SOURCE, _CFLAGS)


def _build(verbose: bool) -> str:
    return str(
        build_torch_extension(
            EXTENSION_NAME, SOURCE, extra_cflags=_CFLAGS, is_python_module=False, verbose=verbose
        )
    )


def load_my_ops(verbose: bool = False) -> str:
    """Build (once, cached on disk) and load ``onnx_custom_ext``; returns the shared library's path.

    Raises ExtensionBuildError when a tool is missing or the build fails; the failure is
    remembered so later calls fail fast. Set ``ONNX_CUSTOM_DISABLE_EXTENSIONS=1`` to refuse.
    """
    global _loaded_path, _failure
    with _lock:
        if _loaded_path is not None:
            return _loaded_path
        if _failure is not None:
            raise _failure
        if os.environ.get("ONNX_CUSTOM_DISABLE_EXTENSIONS") == "1":
            raise ExtensionBuildError(
                f"C++ extension {EXTENSION_NAME!r} disabled by ONNX_CUSTOM_DISABLE_EXTENSIONS=1"
            )
        try:
            path = _loaded_path_if_defined() or _build(verbose)
        except ExtensionBuildError as exc:
            _failure = exc
            raise
        define_op(MY_ADD)  # adopt the C++ op: fake kernel and autograd formula from the spec
        _loaded_path = path
        return path


def extension_available() -> tuple[bool, str]:
    """``(True, path)`` after a successful load, else ``(False, reason)`` — for pytest skips."""
    try:
        return True, load_my_ops()
    except ExtensionBuildError as exc:
        return False, str(exc)


def _op_defined() -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(QUALNAME, "CPU")
    except RuntimeError:  # "operator onnx_custom_ext::my_add does not exist"
        return False


def _loaded_path_if_defined() -> str | None:
    # Someone already called torch.ops.load_library on our binary (or built it differently).
    return "<already loaded>" if _op_defined() else None


# The C++ library points torch here (m.set_python_module); if it was loaded by someone else
# before this import, adopt the op now.
if _op_defined():
    define_op(MY_ADD)


# --------------------------------------------------------------------------- user-facing API
def _ensure_loaded() -> None:
    # A plain global read first: under torch.compile this is a guard, not load_my_ops' lock (a
    # context manager dynamo cannot trace: two graph breaks per call).
    if _loaded_path is None:
        load_my_ops()


def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Call the C++ op (building/loading it on first use)."""
    _ensure_loaded()
    return torch.ops.onnx_custom_ext.my_add(a, b)


class MyAddFunction(torch.autograd.Function):
    """The article's pattern: forward calls the C++ op; ``symbolic`` comes from our registry.

    TorchScript export only. Under ``torch.export``/dynamo the Function is traced through and
    the graph holds ``onnx_custom_ext::my_add``, which is what the dynamo route translates.
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _ensure_loaded()
        return torch.ops.onnx_custom_ext.my_add(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return my_add_backward(ctx, grad)  # type: ignore[return-value]
