"""autograd.Functions with their own ``symbolic`` staticmethod (mmcv's RoIAlign, NMS,
ModulatedDeformConv2d) under ``torch.export``.

Only the TorchScript exporter calls ``symbolic``; ``torch.export`` runs ``forward``, which in
mmcv-style code calls a C++ extension (``ext_module.roi_align_forward``) that fake tensors
cannot enter, and torch's error names neither the Function nor the route that works. While we
trace, `recording_function_failures` notes the innermost such Function whose ``apply`` raised;
`function_symbolic_error` turns the otherwise untyped failure into a `SymbolicError` naming it.
A Function whose ``forward`` traces exports its forward's ops, which verify checks like any
other; `warn_traced_functions` says so (`FunctionSymbolicIgnoredWarning`), since mmdeploy's
export-only Functions (``TRTBatchedNMSop``) have a placeholder forward (``torch.rand`` of the
output shape) and their real computation only in ``symbolic``.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from onnx_custom.errors import SymbolicError

__all__ = [
    "FunctionSymbolicIgnoredWarning",
    "function_symbolic_error",
    "recording_function_failures",
    "warn_traced_functions",
]


def _has_symbolic(cls: type) -> bool:
    return callable(getattr(cls, "symbolic", None))


class FunctionSymbolicIgnoredWarning(UserWarning):
    """An autograd.Function's own ``symbolic`` was not used: the dynamo exporter traced forward."""


@contextlib.contextmanager
def recording_function_failures(
    failed: list[type], traced: list[type] | None = None
) -> Iterator[None]:
    """Inside the block, append to ``failed`` the first (innermost) autograd.Function with a
    ``symbolic`` whose ``apply`` raises on this thread (the exception propagates unchanged), and
    to ``traced`` each such Function whose ``apply`` returned."""
    original = torch.autograd.Function.__dict__["apply"]
    owner = (
        threading.get_ident()
    )  # exports hold a process lock, other threads may still run Functions

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original.__get__(None, cls)(*args, **kwargs)
        except Exception:
            if not failed and threading.get_ident() == owner and _has_symbolic(cls):
                failed.append(cls)
            raise
        if (
            traced is not None
            and cls not in traced
            and threading.get_ident() == owner
            and _has_symbolic(cls)
        ):
            traced.append(cls)
        return result

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
        "exporters (docs: 'Plug in existing torch-style symbolics')."
    )
    error.__cause__ = exc
    return error


def warn_traced_functions(traced: list[type]) -> None:
    """One warning naming the Functions whose ``symbolic`` the dynamo export did not use."""
    if not traced:
        return
    names = ", ".join(cls.__qualname__ for cls in traced)
    warnings.warn(
        f"{names}: torch.autograd.Function with a `symbolic` staticmethod, which the dynamo "
        "exporter does not call: the file holds the ops of its forward instead (verify compares "
        "them with eager). If forward is a placeholder (mmdeploy's export-only Functions return "
        "torch.rand of the output shape), export with exporter='torchscript', or make the "
        "computation a torch.library.custom_op and register the symbolic for it with "
        "onnx_custom.register_custom_op_symbolic('ns::op', Fn.symbolic, 11).",
        FunctionSymbolicIgnoredWarning,
        stacklevel=_outside_the_exporter(),
    )


def _outside_the_exporter() -> int:
    """The stacklevel of the first caller outside ``onnx_custom.exporter``: warnings attributed to
    the export stage's modules are dropped as torch's chatter
    (`common.torch_chatter.OUR_CALLERS`), and export, check and localize reach here through
    different depths."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and re.match(
        r"onnx_custom\.exporter\.", frame.f_globals.get("__name__", "")
    ):
        frame, level = frame.f_back, level + 1
    return level
