"""Attribute typing shared by both exporters: one Python value -> one ONNX attribute kind.

Keeping the mapping here (instead of in each builder) is what makes a translation produce the
same attributes under the TorchScript and the dynamo exporter.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.errors import SymbolicError

__all__ = ["AttrKind", "AttrValue", "TypedList", "convert_attribute", "floats", "ints", "strings"]


class AttrKind(enum.Enum):
    INT = "int"
    FLOAT = "float"
    STRING = "string"
    TENSOR = "tensor"
    INTS = "ints"
    FLOATS = "floats"
    STRINGS = "strings"


@dataclasses.dataclass(frozen=True)
class TypedList:
    """A list attribute whose element kind is explicit (required for empty lists)."""

    kind: AttrKind
    values: tuple[Any, ...]


def ints(values: Sequence[int]) -> TypedList:
    """An INTS attribute, also when empty: ``g.op("custom::X", x, pads=onnx_custom.attr.ints([]))``."""
    return TypedList(AttrKind.INTS, tuple(int(v) for v in values))


def floats(values: Sequence[float]) -> TypedList:
    """A FLOATS attribute, also when empty."""
    return TypedList(AttrKind.FLOATS, tuple(float(v) for v in values))


def strings(values: Sequence[str]) -> TypedList:
    """A STRINGS attribute, also when empty."""
    return TypedList(AttrKind.STRINGS, tuple(str(v) for v in values))


@dataclasses.dataclass(frozen=True)
class AttrValue:
    """A typed attribute: kind + normalized value (tensor attributes are numpy arrays)."""

    name: str
    kind: AttrKind
    value: Any


def _is_int(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_, numbers.Integral))


def _is_float(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not _is_int(v)


def convert_attribute(name: str, value: Any) -> AttrValue:
    """Infer the ONNX attribute kind from a Python value, or raise `SymbolicError`."""
    if isinstance(value, TypedList):
        return AttrValue(name, value.kind, value.values)
    if isinstance(value, torch.Tensor):
        return AttrValue(name, AttrKind.TENSOR, value.detach().cpu().numpy())
    if isinstance(value, np.ndarray):
        return AttrValue(name, AttrKind.TENSOR, value)
    if _is_int(value):
        return AttrValue(name, AttrKind.INT, int(value))
    if _is_float(value):
        return AttrValue(name, AttrKind.FLOAT, float(value))
    if isinstance(value, str):
        return AttrValue(name, AttrKind.STRING, value)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            raise SymbolicError(
                f"Attribute {name!r} is an empty list, whose ONNX type cannot be inferred. "
                "Wrap it: onnx_custom.attr.ints([]), floats([]) or strings([])."
            )
        if all(_is_int(v) for v in items):
            return AttrValue(name, AttrKind.INTS, tuple(int(v) for v in items))
        if all(_is_int(v) or _is_float(v) for v in items):
            return AttrValue(name, AttrKind.FLOATS, tuple(float(v) for v in items))
        if all(isinstance(v, str) for v in items):
            return AttrValue(name, AttrKind.STRINGS, tuple(items))
        kinds = sorted({type(v).__name__ for v in items})
        raise SymbolicError(
            f"Attribute {name!r} is a list mixing {kinds}: expected a list of ints, floats or strings."
        )
    raise SymbolicError(
        f"Attribute {name!r} has unsupported type {type(value).__name__} ({value!r}): expected "
        "int/bool, float, str, numpy array / torch tensor, or a list of ints, floats or strings."
    )
