"""``my_ops::my_add`` (2a + b) as a C++ extension op, built on demand and cached on disk.

The C++ source (``csrc/my_ops.cpp``) defines the op with ``TORCH_LIBRARY`` and a CPU kernel;
this module builds it with ``torch.utils.cpp_extension.load(is_python_module=False)`` into
``<cache>/torch_ext/<hash>/`` (compiled once, reused by every later process), and registers the
Python side: the fake kernel and the autograd formula.

Nothing is compiled at import time: call :func:`load_my_ops` first. When no compiler or ninja
is available it raises :class:`~onnx_custom.errors.ExtensionBuildError` naming the tool, and the
rest of onnx-custom keeps working.

``MyAddFunction`` is the "seed article" pattern (an ``autograd.Function`` whose forward calls the
C++ op). Its ONNX ``symbolic`` comes from our registry (``symbolics/extension.py``) and applies to
the TorchScript exporter only: the dynamo exporter traces through ``autograd.Function`` and sees
``my_ops::my_add`` itself, which is how it must be exported there.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch

from onnx_custom._native import build_torch_extension, cache_root, extension_directory
from onnx_custom.errors import ExtensionBuildError

__all__ = [
    "EXTENSION_NAME",
    "SOURCE",
    "MyAddFunction",
    "build_directory",
    "cache_root",
    "check_my_add_inputs",
    "extension_available",
    "load_my_ops",
    "my_add",
    "my_add_reference",
]

EXTENSION_NAME = "my_ops"
SOURCE = Path(__file__).resolve().parent / "csrc" / "my_ops.cpp"
QUALNAME = "my_ops::my_add"

_CFLAGS = ("-O2",)
_lock = threading.Lock()
_loaded_path: str | None = None
_failure: ExtensionBuildError | None = None
_python_impls_registered = False


# --------------------------------------------------------------------------- validation / math
def check_my_add_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
    """Shared by the fake kernel and the Python reference (the C++ kernel mirrors the wording)."""
    if a.shape != b.shape:
        raise ValueError(
            f"my_ops::my_add expects a and b of the same shape, got a {list(a.shape)} "
            f"and b {list(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise TypeError(
            f"my_ops::my_add expects a and b of the same dtype, got a {a.dtype} and b {b.dtype}"
        )
    if not a.dtype.is_floating_point:
        raise TypeError(f"my_ops::my_add expects floating-point tensors, got {a.dtype}")


def my_add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pure-PyTorch 2a + b, the ground truth for tests."""
    check_my_add_inputs(a, b)
    return 2 * a + b


# --------------------------------------------------------------------------- build / load
def build_directory() -> Path:
    """Cache folder keyed by everything that changes the binary (source, torch, python, compiler)."""
    return extension_directory(EXTENSION_NAME, SOURCE, _CFLAGS)


def _build(verbose: bool) -> str:
    return str(build_torch_extension(EXTENSION_NAME, SOURCE, extra_cflags=_CFLAGS, is_python_module=False, verbose=verbose))


def load_my_ops(verbose: bool = False) -> str:
    """Build (once, cached on disk) and load ``my_ops``; returns the shared library's path.

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
        _register_python_impls()
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
    except RuntimeError:  # "operator my_ops::my_add does not exist"
        return False


def _loaded_path_if_defined() -> str | None:
    # Someone already called torch.ops.load_library on our binary (or built it differently).
    return "<already loaded>" if _op_defined() else None


# --------------------------------------------------------------------------- Python-side impls
def _fake_my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_my_add_inputs(a, b)
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    del ctx, inputs, output  # d(2a + b) needs nothing saved


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return 2 * grad, grad


def _register_python_impls() -> None:
    global _python_impls_registered
    if _python_impls_registered:
        return
    torch.library.register_fake(QUALNAME, _fake_my_add)
    torch.library.register_autograd(QUALNAME, _backward, setup_context=_setup_context)
    _python_impls_registered = True


# The C++ library points torch here (m.set_python_module); if it was loaded by someone else
# before this import, register the Python side now.
if _op_defined():
    _register_python_impls()


# --------------------------------------------------------------------------- user-facing API
def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Call the C++ op (building/loading it on first use)."""
    load_my_ops()
    return torch.ops.my_ops.my_add(a, b)


class MyAddFunction(torch.autograd.Function):
    """The article's pattern: forward calls the C++ op; ``symbolic`` comes from our registry.

    TorchScript export only. Under ``torch.export``/dynamo the Function is traced through and
    the graph holds ``my_ops::my_add``, which is what the dynamo route translates.
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        load_my_ops()
        return torch.ops.my_ops.my_add(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 2 * grad, grad
