"""Checks on `export`'s arguments, run before any tracing: a bad argument costs nothing.

Each check raises a typed error whose message says what was expected, what was received and
the fix. The opset ranges are the honest ones: what each exporter really produces (torch's
dynamo exporter keeps opset 18 *silently* when asked for an opset its version converter lacks).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import io
from collections.abc import Mapping
from typing import Any

import torch

from onnx_custom.common.atomic import check_output_path, is_file_object
from onnx_custom.errors import InvalidArgumentError, OpsetError
from onnx_custom.exporter.torchscript import TS_MAX_OPSET, TS_MIN_OPSET
from onnx_custom.translate.registry import Registry

__all__ = [
    "EXPORTERS",
    "ORT_MAX_OPSET",
    "TS_MAX_OPSET",
    "TS_MIN_OPSET",
    "check_args",
    "check_exporter",
    "check_exporter_kwargs",
    "check_model",
    "check_names",
    "check_opset",
    "check_output",
    "check_registry",
    "dynamo_max_opset",
    "opset_range",
]

EXPORTERS = ("dynamo", "torchscript")
DYNAMO_MIN_OPSET = (
    7  # below 18 we relabel ourselves (`_opset_compat`), refusing what changed meaning
)
ORT_MAX_OPSET = 26  # onnxruntime 1.31 refuses default-domain opsets above 26 (measured)
_ONNXSCRIPT_MAX_FALLBACK = 25  # onnxscript 0.7's version converter

# export()'s own parameters that torch.onnx.export also has: passing them through would clash.
_OURS = {
    "opset_version": "opset=",
    "dynamo": "exporter='dynamo' or exporter='torchscript'",
    "f": "f=",
    "input_names": "input_names=",
    "output_names": "output_names=",
    "dynamic_shapes": "dynamic_shapes=",
    "dynamic_axes": "dynamic_axes=",
    "custom_translation_table": "registry= (a onnx_custom.Registry)",
    "model": "the first argument",
    "args": "the second argument",
}


@functools.lru_cache(maxsize=1)
def dynamo_max_opset() -> int:
    """The highest opset the dynamo exporter reaches for real: its version converter's limit
    (past it torch falls back to onnx's C converter, which keeps opset 18 on any op it lacks an
    adapter for), capped by what onnxruntime loads."""
    try:
        from onnxscript.version_converter import _version_converter

        converter_max = int(_version_converter.SUPPORTED_MAX_ONNX_OPSET)
    except (ImportError, AttributeError):  # pragma: no cover - other onnxscript versions
        converter_max = _ONNXSCRIPT_MAX_FALLBACK
    return min(converter_max, ORT_MAX_OPSET)


def opset_range(exporter: str) -> tuple[int, int]:
    """(lowest, highest) opset ``exporter`` produces."""
    if exporter == "torchscript":
        return TS_MIN_OPSET, TS_MAX_OPSET
    return DYNAMO_MIN_OPSET, dynamo_max_opset()


def _kind(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return f"the function {getattr(value, '__qualname__', repr(value))}"
    return f"{type(value).__name__} ({value!r:.80})"


def check_exporter(exporter: Any) -> str:
    if isinstance(exporter, str) and exporter in EXPORTERS:
        return exporter
    close = difflib.get_close_matches(str(exporter).lower(), EXPORTERS, n=1, cutoff=0.4)
    hint = (
        f"exporter={close[0]!r}"
        if close
        else "exporter='dynamo' (torch.export) or exporter='torchscript'"
    )
    raise InvalidArgumentError(
        f"exporter must be one of {EXPORTERS}; received {exporter!r}. Fix: pass {hint}."
    )


def check_opset(exporter: str, opset: Any) -> int:
    if not isinstance(opset, int) or isinstance(opset, bool):
        raise InvalidArgumentError(
            f"opset must be an int such as 18; received {_kind(opset)}. Fix: pass"
            f" opset={_as_int_hint(opset)}."
        )
    low, high = opset_range(exporter)
    if not low <= opset <= high:
        other = "dynamo" if exporter == "torchscript" else "torchscript"
        other_low, other_high = opset_range(other)
        alternative = (
            f", or exporter={other!r} (opsets {other_low}..{other_high})"
            if other_low <= opset <= other_high
            else ""
        )
        name = "TorchScript" if exporter == "torchscript" else "dynamo"
        raise OpsetError(
            f"The {name} exporter supports opsets {low}..{high} (maximum {high}); received "
            f"opset={opset}. Fix: pass an opset in {low}..{high}{alternative}.",
            exporter=exporter,
            minimum=low,
            maximum=high,
        )
    return opset


def _as_int_hint(value: Any) -> str:
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return "18"


def check_model(model: Any, exporter: str = "dynamo") -> None:
    """An ``nn.Module`` instance or (dynamo exporter) a ``torch.export.ExportedProgram``."""
    if isinstance(model, torch.export.ExportedProgram) and exporter == "torchscript":
        raise InvalidArgumentError(
            "The TorchScript exporter traces an nn.Module; received a torch.export.ExportedProgram."
            " Fix: pass exporter='dynamo', or export program.module() with exporter='torchscript'."
        )
    if isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        return
    expected = "model must be a torch.nn.Module instance (or a torch.export.ExportedProgram)"
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        raise InvalidArgumentError(
            f"{expected}; you passed the class {model.__qualname__}. Fix: instantiate it: "
            f"{model.__qualname__}() (with its constructor arguments)."
        )
    if callable(model) and not isinstance(model, type):
        name = getattr(model, "__name__", type(model).__name__)
        raise InvalidArgumentError(
            f"{expected}; received {_kind(model)}. Fix: wrap it in a module: class M(torch.nn."
            f"Module): def forward(self, *args): return {name}(*args); then export M()."
        )
    raise InvalidArgumentError(
        f"{expected}; received {_kind(model)}. Fix: pass the model object, e.g. export(MyModel(),"
        " (x,))."
    )


def check_args(args: Any) -> tuple[Any, ...]:
    """The example inputs as a tuple (one tensor is accepted alone)."""
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, tuple):
        return args
    hint = (
        "args=tuple(args)"
        if isinstance(args, list)
        else "args=(x,) (a tuple, one entry per forward parameter)"
    )
    raise InvalidArgumentError(
        f"args must be a tuple of example inputs (or one tensor); received {_kind(args)}. Fix: pass"
        f" {hint}; keyword inputs go in kwargs={{...}}."
    )


def check_names(names: Any, what: str) -> None:
    """``input_names``/``output_names``: None or a list of strings (a bare string would be split
    into one name per character)."""
    if names is None:
        return
    if (
        isinstance(names, str)
        or not isinstance(names, (list, tuple))
        or not all(isinstance(n, str) and n for n in names)
    ):
        example = [names] if isinstance(names, str) and names else ["x"]
        raise InvalidArgumentError(
            f"{what} must be a list of non-empty strings, one per tensor; received {_kind(names)}. "
            f"Fix: pass {what}={example!r}."
        )


def check_registry(registry: Any) -> None:
    if registry is None or isinstance(registry, Registry):
        return
    raise InvalidArgumentError(
        f"registry must be an onnx_custom.Registry or None; received {_kind(registry)}. Fix: build "
        "one with onnx_custom.Registry() or onnx_custom.default_registry().copy(), or leave it out."
    )


def check_exporter_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Extra keywords go to ``torch.onnx.export``: they must be its parameters and not ours."""
    if not kwargs:
        return  # the common case: no need to read torch.onnx.export's (long) signature
    known = set(inspect.signature(torch.onnx.export).parameters)
    for name in kwargs:
        if name in _OURS:
            raise InvalidArgumentError(
                f"{name}= is set by onnx_custom.export itself; received it among the extra "
                f"keywords passed to torch.onnx.export. Fix: use {_OURS[name]} instead."
            )
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known - set(_OURS)), n=3)
            hint = f"did you mean {'=, '.join(close)}=? " if close else ""
            raise InvalidArgumentError(
                f"export() got the unknown keyword {name}=; extra keywords must be parameters of"
                f" torch.onnx.export ({', '.join(sorted(known - set(_OURS)))}). Fix: {hint}Rename"
                " or remove it."
            )


def check_output(f: Any, *, what: str = "f") -> None:
    """``f``: None, a writable binary file object, or a path we can create a file at."""
    if f is None:
        return
    if is_file_object(f):
        mode = getattr(f, "mode", "b")  # an int for gzip files: binary
        if isinstance(getattr(f, "file", f), io.TextIOBase) or (
            isinstance(mode, str) and "b" not in mode
        ):
            raise InvalidArgumentError(
                f"{what} is a text stream; expected a binary file object (ONNX files are bytes). "
                "Fix: open it with mode 'wb', or pass io.BytesIO() or a path."
            )
        closed = bool(getattr(f, "closed", False))
        writable = getattr(f, "writable", None)
        if closed or (callable(writable) and not writable()):
            raise InvalidArgumentError(
                f"{what} is a file object that is {'closed' if closed else 'not writable'}; "
                "expected one open for writing. Fix: open(path, 'wb'), or pass the path itself."
            )
        return
    check_output_path(f, what=what)


def check_dynamic_for_program(model: Any, dynamic_shapes: Any, dynamic_axes: Any) -> None:
    """An ExportedProgram's dims are fixed: dynamic_shapes/axes cannot change them."""
    from onnx_custom.errors import DynamicShapesError

    if isinstance(model, torch.export.ExportedProgram) and (
        dynamic_shapes is not None or dynamic_axes is not None
    ):
        given = "dynamic_shapes" if dynamic_shapes is not None else "dynamic_axes"
        raise DynamicShapesError(
            f"An ExportedProgram's dims were fixed by torch.export.export; received {given}="
            f"{(dynamic_shapes if dynamic_shapes is not None else dynamic_axes)!r:.120} as well. "
            "Fix: pass them to torch.export.export, or pass the nn.Module to onnx_custom.export "
            "together with dynamic_shapes."
        )
