"""The one door to torch.onnx's private modules (``torch.onnx._internal``).

Every other module of the package gets them from here (tests/test_import_layers.py checks it;
the compile backend's translator pieces go through `onnx_custom.compile.torch_adapter`, which
checks each name it needs). Modules are found by where they live on the installed torch, not by
its version string:

- the dynamo exporter's internals (``_building``, ``_tensors``, ``_flags``, ``_decomp``,
  ``_registration``, ``_dynamic_shapes``): ``torch.onnx._internal.exporter.<name>``;
- the TorchScript exporter's symbolic machinery (``registration``, ``symbolic_helper``,
  ``_type_utils``, ``utils``): ``torch.onnx._internal.torchscript_exporter.<name>``, where torch
  2.9 and later keep it; older releases kept the same modules at ``torch.onnx.<name>`` or
  ``torch.onnx._internal.<name>``, which are tried next.

Typed ``Any``: the modules are private and patched in places (quiet, mutation checks). Checked
on torch 2.11 to 2.15. A torch lacking a module raises `OnnxCustomError` naming the torch
version and the module.

`torch_fixes` mends, for the length of an export or a compiled graph's preparation, two pieces
of older torch that the later releases rewrote; each is recognised by its form, not by version.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from onnx_custom.errors import OnnxCustomError

__all__ = [
    "dynamo_exporter",
    "optional_torchscript_exporter",
    "torch_fixes",
    "torchscript_exporter",
]

_DYNAMO = ("torch.onnx._internal.exporter.{}",)
_TORCHSCRIPT = (
    "torch.onnx._internal.torchscript_exporter.{}",
    "torch.onnx.{}",
    "torch.onnx._internal.{}",
)


def _find(places: tuple[str, ...], name: str) -> ModuleType | None:
    for place in places:
        try:
            return importlib.import_module(place.format(name))
        except ImportError:
            continue
    return None


def _missing(what: str, places: tuple[str, ...], name: str) -> OnnxCustomError:
    tried = ", ".join(p.format(name) for p in places)
    return OnnxCustomError(
        f"torch {torch.__version__} lacks the {what} module {name!r} (looked for {tried}), which"
        " onnx_custom uses on torch 2.11 to 2.15. Fix: install a supported torch"
        " (pip install 'torch>=2.11,<2.16')."
    )


@functools.cache
def dynamo_exporter(name: str) -> Any:
    """``torch.onnx._internal.exporter.<name>`` (the ``dynamo=True`` exporter's internals)."""
    module = _find(_DYNAMO, name)
    if module is None:
        raise _missing("dynamo exporter", _DYNAMO, name)
    return module


@functools.cache
def optional_torchscript_exporter(name: str) -> Any:
    """The TorchScript exporter's module ``name``, or None where this torch has none."""
    return _find(_TORCHSCRIPT, name)


def torchscript_exporter(name: str) -> Any:
    """The TorchScript exporter's module ``name`` (``registration``, ``symbolic_helper``, ...)."""
    module = optional_torchscript_exporter(name)
    if module is None:
        raise _missing("TorchScript exporter", _TORCHSCRIPT, name)
    return module


def _floor_division(x: Any, y: Any) -> Any:
    """Integer division rounding toward negative infinity, which Python's ``//`` already does
    (also on symbolic sizes, without a guard)."""
    return x // y


def _overload_by_schema(packet: Any, args: Any, kwargs: Any) -> Any:
    """The first overload of ``packet`` whose schema accepts ``args``/``kwargs``."""
    refusals = []
    for name in packet.overloads():
        overload = getattr(packet, name)
        try:
            torch._C._check_schema_allow_fake_script_object(overload._schema, *args, **kwargs)
        except RuntimeError as exc:
            refusals.append(f"{name}: {exc}")
            continue
        return overload
    raise RuntimeError(
        f"no overload of {packet} accepts these arguments; the overloads said: "
        + "; ".join(refusals)
    )


def _patches() -> list[tuple[Any, str, Any]]:
    """(module, attribute, replacement) for each older-torch piece this torch still has."""
    import torch._meta_registrations as meta

    patches: list[tuple[Any, str, Any]] = []
    div_rtn = getattr(meta, "div_rtn", None)
    # The pooling output size (``div_rtn``) tests the remainder's sign in its older form (torch
    # 2.11), which on a dynamic height or width adds a guard that the size is even, so
    # torch.export refuses a dynamic dim under MaxPool2d(2). Python's ``//`` floors already.
    if div_rtn is not None and div_rtn.__code__.co_nlocals > 2:
        patches.append((meta, "div_rtn", _floor_division))
    # The dynamo exporter's type promotion re-finds a promoted node's overload by running the op
    # under a dispatch mode and taking the first op dispatched (torch 2.11); on a tensor that
    # requires grad (a parameter, ``x * 2`` of a leaf) that is ``prim.device``, and the export
    # fails with "Expected same OpOverload packet". Matching the schemas finds the overload.
    promotion = _find(("torch.onnx._internal.fx.passes.{}",), "type_promotion")
    if promotion is not None and hasattr(promotion, "_OpTraceDispatchMode"):
        patches.append((promotion, "find_compatible_op_overload", _overload_by_schema))
    return patches


@contextlib.contextmanager
def torch_fixes() -> Iterator[None]:
    """Inside the block, torch's older pieces listed in `_patches` are replaced by ours (no-op
    on a torch that has none of them); the originals come back on leaving."""
    patches = _patches()
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, replacement in patches:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)
