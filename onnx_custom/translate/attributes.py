"""Attribute typing shared by both exporters: one Python value -> one ONNX attribute kind.

Keeping the mapping here (instead of in each builder) is what makes a translation produce the
same attributes under the TorchScript and the dynamo exporter.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.errors import SymbolicError

__all__ = [
    "AttrKind",
    "AttrValue",
    "TypedList",
    "c_contiguous",
    "convert_attribute",
    "floats",
    "ints",
    "strings",
]


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
    """An INTS attribute, also when empty:
    ``g.op("custom::X", x, pads=onnx_custom.attr.ints([]))``."""
    return _typed_list(AttrKind.INTS, values, _is_int, int, "[1, 2]")


def floats(values: Sequence[float]) -> TypedList:
    """A FLOATS attribute, also when empty."""
    return _typed_list(
        AttrKind.FLOATS, values, lambda v: _is_int(v) or _is_float(v), float, "[0.5, 1.0]"
    )


def strings(values: Sequence[str]) -> TypedList:
    """A STRINGS attribute, also when empty."""
    return _typed_list(AttrKind.STRINGS, values, lambda v: isinstance(v, str), str, "['a', 'b']")


def _typed_list(
    kind: AttrKind,
    values: Any,
    ok: Callable[[Any], bool],
    convert: Callable[[Any], Any],
    example: str,
) -> TypedList:
    # A bare string is a sequence too: attr.ints("12") would silently become [1, 2].
    items = (
        None
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray))
        else list(values)
    )
    bad = (
        [v for v in items if not ok(v.item() if isinstance(v, np.generic) else v)]
        if items is not None
        else [values]
    )
    if bad:
        raise SymbolicError(
            f"attr.{kind.value}() expects a list of {kind.value[:-1]}s; received {values!r:.80}"
            f" ({bad[0]!r:.40} is a {type(bad[0]).__name__}). Fix: pass e.g."
            f" attr.{kind.value}({example})."
        )
    return TypedList(kind, tuple(convert(v) for v in items))  # type: ignore[union-attr]


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


_INT64 = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_int(name: str, value: int, where: str) -> int:
    if not _INT64[0] <= value <= _INT64[1]:
        raise SymbolicError(
            f"{where}Attribute {name!r} is {value}, outside the int64 range ONNX integer "
            f"attributes hold [{_INT64[0]}, {_INT64[1]}]. Fix: pass a value in that range (a "
            "larger number can travel as a float attribute or a string)."
        )
    return value


def _check_float(name: str, value: float, where: str) -> float:
    if np.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise SymbolicError(
            f"{where}Attribute {name!r} is {value!r}, beyond the float32 range ONNX float"
            f" attributes hold (|x| <= {_FLOAT32_MAX:.4g}); it would silently become inf. Fix: pass"
            " a smaller value, float('inf') if infinity is meant, or a float64 tensor attribute."
        )
    return value


def _check_string(name: str, value: str, where: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SymbolicError(
            f"{where}Attribute {name!r} holds {value!r}, which is not valid Unicode text (a lone "
            f"surrogate at position {exc.start}); ONNX string attributes are UTF-8. Fix: pass "
            "valid text (e.g. decode bytes with errors='replace' first)."
        ) from None
    return value


def c_contiguous(array: np.ndarray) -> np.ndarray:
    """``array`` in C order with its shape kept: ``np.ascontiguousarray`` turns a 0-d array (a
    scalar constant) into shape (1,), which would make a translation's scalar output [1]."""
    return array if array.flags.c_contiguous else np.array(array, order="C")


def _check_tensor(name: str, array: np.ndarray, where: str) -> np.ndarray:
    if array.dtype.kind not in "biufc" and array.dtype.name != "bfloat16":
        raise SymbolicError(
            f"{where}Attribute {name!r} is a tensor of dtype {array.dtype}; expected a numeric or "
            "bool tensor (the exporters cannot carry string or object tensors). Fix: pass a list "
            "of strings (a STRINGS attribute) or a numeric array."
        )
    return c_contiguous(array)


def convert_attribute(name: str, value: Any, *, where: str = "") -> AttrValue:
    """Infer the ONNX attribute kind from a Python value, or raise `SymbolicError`.

    Values ONNX cannot hold are refused here rather than changed on the way: ints beyond int64,
    finite floats beyond float32 (they would become inf), strings that are not valid UTF-8,
    tensors that are not numeric. ``where`` prefixes messages (e.g. the op being translated).
    """
    if isinstance(value, TypedList):
        return AttrValue(name, value.kind, _checked_items(name, value.kind, value.values, where))
    if isinstance(value, torch.Tensor):
        return AttrValue(
            name, AttrKind.TENSOR, _check_tensor(name, value.detach().cpu().numpy(), where)
        )
    if isinstance(value, np.ndarray):
        return AttrValue(name, AttrKind.TENSOR, _check_tensor(name, value, where))
    if _is_int(value):
        return AttrValue(name, AttrKind.INT, _check_int(name, int(value), where))
    if _is_float(value):
        return AttrValue(name, AttrKind.FLOAT, _check_float(name, float(value), where))
    if isinstance(value, str):
        return AttrValue(name, AttrKind.STRING, _check_string(name, value, where))
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            raise SymbolicError(
                f"{where}Attribute {name!r} is an empty list, whose ONNX type cannot be inferred. "
                "Wrap it: onnx_custom.attr.ints([]), floats([]) or strings([])."
            )
        if all(_is_int(v) for v in items):
            return AttrValue(
                name,
                AttrKind.INTS,
                _checked_items(name, AttrKind.INTS, [int(v) for v in items], where),
            )
        if all(_is_int(v) or _is_float(v) for v in items):
            return AttrValue(
                name,
                AttrKind.FLOATS,
                _checked_items(name, AttrKind.FLOATS, [float(v) for v in items], where),
            )
        if all(isinstance(v, str) for v in items):
            return AttrValue(
                name, AttrKind.STRINGS, _checked_items(name, AttrKind.STRINGS, items, where)
            )
        kinds = sorted({type(v).__name__ for v in items})
        raise SymbolicError(
            f"{where}Attribute {name!r} is a list mixing {kinds}: expected a list of ints, floats "
            "or strings. Fix: make every element the same kind (e.g. all floats)."
        )
    raise SymbolicError(
        f"{where}Attribute {name!r} has unsupported type {type(value).__name__} ({value!r}):"
        " expected int/bool, float, str, numpy array / torch tensor, or a list of ints, floats or"
        " strings. Fix: convert it to one of those."
    )


def _checked_items(name: str, kind: AttrKind, items: Sequence[Any], where: str) -> tuple[Any, ...]:
    check: Callable[[str, Any, str], Any] = {
        AttrKind.INTS: _check_int,
        AttrKind.FLOATS: _check_float,
        AttrKind.STRINGS: _check_string,
    }[kind]  # type: ignore[assignment]
    return tuple(check(f"{name}[{i}]", v, where) for i, v in enumerate(items))
