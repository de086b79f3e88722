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
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import torch

from onnx_custom.errors import OnnxCustomError

__all__ = ["dynamo_exporter", "optional_torchscript_exporter", "torchscript_exporter"]

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
