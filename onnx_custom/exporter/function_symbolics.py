"""autograd.Functions with their own ``symbolic`` staticmethod (mmcv's RoIAlign, NMS,
ModulatedDeformConv2d) under ``torch.export``.

Only the TorchScript exporter calls ``symbolic``; ``torch.export`` runs ``forward``, which in
mmcv-style code calls a C++ extension (``ext_module.roi_align_forward``) that fake tensors
cannot enter, and torch's error names neither the Function nor the route that works. While we
trace, `recording_function_failures` notes the innermost such Function whose ``apply`` raised;
`function_symbolic_error` turns the otherwise untyped failure into a `SymbolicError` naming it.
A Function whose ``forward`` traces is left alone: its file holds the traced ops, which verify
checks like any other.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from onnx_custom.errors import SymbolicError

__all__ = ["function_symbolic_error", "recording_function_failures"]


def _has_symbolic(cls: type) -> bool:
    return callable(getattr(cls, "symbolic", None))


@contextlib.contextmanager
def recording_function_failures(failed: list[type]) -> Iterator[None]:
    """Inside the block, append to ``failed`` the first (innermost) autograd.Function with a
    ``symbolic`` whose ``apply`` raises on this thread; the exception propagates unchanged."""
    original = torch.autograd.Function.__dict__["apply"]
    owner = threading.get_ident()  # exports hold a process lock, other threads may still run Functions

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original.__func__(cls, *args, **kwargs)
        except Exception:
            if not failed and threading.get_ident() == owner and _has_symbolic(cls):
                failed.append(cls)
            raise

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign]


def function_symbolic_error(cls: type, exc: BaseException) -> SymbolicError:
    """The typed error for ``cls``'s forward failing under ``torch.export``."""
    name = cls.__qualname__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    error = SymbolicError(
        f"{name} is a torch.autograd.Function with a `symbolic` staticmethod, which only the "
        f"TorchScript exporter calls; the dynamo exporter traces {name}.forward instead, and it "
        f"failed under torch.export ({type(exc).__name__}: {first[:300]}). Fix: export with "
        f"exporter='torchscript' (which uses {name}.symbolic), or make forward's computation a "
        "torch.library.custom_op with register_fake and register the same function for that op: "
        f"onnx_custom.register_custom_op_symbolic('ns::op', {name}.symbolic, 11) serves both "
        "exporters (README 'Symbolics you already have')."
    )
    error.__cause__ = exc
    return error
