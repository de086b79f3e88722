"""Standard (default-domain) nodes checked against ``onnx.defs`` when a translation adds them.

Without this a misspelt op type (``g.op("Asinh2", x)``), an op newer than the export's opset, a
misspelt attribute or a missing required one exports fine and fails only when ONNX Runtime
loads the file, far from the translation that caused it. Here it fails in ``g.op`` with the
closest valid names (difflib) and the fix.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import onnx.defs

from onnx_custom.errors import SymbolicError
from onnx_custom.translate.attributes import AttrKind, AttrValue

__all__ = ["check_standard_node"]

_AttrType = onnx.defs.OpSchema.AttrType
_KIND_TO_ONNX = {
    AttrKind.INT: _AttrType.INT,
    AttrKind.FLOAT: _AttrType.FLOAT,
    AttrKind.STRING: _AttrType.STRING,
    AttrKind.TENSOR: _AttrType.TENSOR,
    AttrKind.INTS: _AttrType.INTS,
    AttrKind.FLOATS: _AttrType.FLOATS,
    AttrKind.STRINGS: _AttrType.STRINGS,
}
# Lossless widenings done for the user: ``alpha=1`` for a float attribute means 1.0.
_WIDEN = {
    (AttrKind.INT, _AttrType.FLOAT): AttrKind.FLOAT,
    (AttrKind.INTS, _AttrType.FLOATS): AttrKind.FLOATS,
}


@functools.cache
def _schema(op_type: str, opset: int) -> Any:
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


@functools.cache
def _first_version(op_type: str) -> int | None:
    versions = [
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op_type and s.domain == ""
    ]
    return min(versions) if versions else None


def _close(word: str, candidates: Iterable[str]) -> list[str]:
    """Close matches, case-insensitive (``"relu"`` finds ``"Relu"``)."""
    by_lower = {c.lower(): c for c in candidates}
    return [
        by_lower[m]
        for m in difflib.get_close_matches(word.lower(), list(by_lower), n=3, cutoff=0.6)
    ]


@functools.lru_cache(maxsize=1)
def _all_names() -> tuple[str, ...]:
    return tuple(
        sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""})
    )


def _suggest(found: list[str], opset: int | None = None) -> str:
    """'did you mean ...? ' (an op newer than ``opset`` says from which opset it exists)."""
    if not found:
        return ""
    shown = []
    for name in found:
        first = _first_version(name) if opset is not None else None
        shown.append(
            f"{name!r} (opset {first}+)" if first is not None and first > opset else repr(name)  # type: ignore[operator]
        )
    return f"did you mean {' or '.join(shown)}? "


def check_standard_node(
    where: str,
    op_type: str,
    opset: int,
    inputs: int,
    outputs: int,
    attrs: Sequence[AttrValue],
    referenced: Iterable[str] = (),
) -> list[AttrValue]:
    """Check a default-domain node against its schema at ``opset``; returns ``attrs`` with ints
    widened to floats where the schema wants floats. ``referenced``: attributes a function body
    takes from its caller (present at run time)."""
    schema = _schema(op_type, opset)
    if schema is None:
        first = _first_version(op_type)
        if first is None:
            raise SymbolicError(
                f"{where}expected an ONNX operator type (default domain, opset {opset}); received"
                f" {op_type!r}, which ONNX does not define. Fix:"
                f" {_suggest(_close(op_type, _all_names()), opset)}Use the ONNX op type"
                f" (https://onnx.ai/onnx/operators/), or a custom node 'mydomain::{op_type}'."
            )
        raise SymbolicError(
            f"{where}{op_type} exists from opset {first} on; this export targets opset {opset}. "
            f"Fix: export with opset>={first}, or register this translation with opset={first} "
            "and another one, without it, for older opsets."
        )
    if schema.deprecated:
        raise SymbolicError(
            f"{where}{op_type} is deprecated at opset {opset} (since opset {schema.since_version});"
            f" ONNX Runtime refuses it. Fix: use its replacement ({_replacement(op_type)}) or"
            " export at an older opset."
        )
    _check_count(where, op_type, opset, "input", inputs, schema.min_input, schema.max_input)
    _check_count(where, op_type, opset, "output", outputs, schema.min_output, schema.max_output)
    checked = []
    for attr in attrs:
        spec = schema.attributes.get(attr.name)
        if spec is None:
            known = sorted(schema.attributes)
            raise SymbolicError(
                f"{where}{op_type} (opset {opset}) has no attribute {attr.name!r}; its attributes"
                f" are {known or 'none'}. Fix: {_suggest(_close(attr.name, known))}Remove or"
                " rename it."
            )
        checked.append(_check_kind(where, op_type, attr, spec.type))
    given = {a.name for a in attrs} | set(referenced)
    missing = sorted(
        name for name, spec in schema.attributes.items() if spec.required and name not in given
    )
    if missing:
        raise SymbolicError(
            f"{where}{op_type} (opset {opset}) requires the attribute(s) {missing}; received"
            f" {sorted(given) or 'none'}. Fix: pass {', '.join(f'{m}=...' for m in missing)} to"
            " g.op."
        )
    return checked


def _check_count(
    where: str, op_type: str, opset: int, what: str, count: int, low: int, high: int
) -> None:
    if low <= count <= high:
        return
    wanted = str(low) if low == high else f"{low}..{high}" if high < 2**30 else f"at least {low}"
    hint = (
        "pass outputs=N to g.op"
        if what == "output"
        else f"pass {wanted} {what}s (None for an absent optional one)"
    )
    raise SymbolicError(
        f"{where}{op_type} (opset {opset}) takes {wanted} {what}(s); received {count}. Fix: {hint}."
    )


def _check_kind(where: str, op_type: str, attr: AttrValue, wanted: Any) -> AttrValue:
    ours = _KIND_TO_ONNX.get(attr.kind)
    if ours == wanted:
        return attr
    widened = _WIDEN.get((attr.kind, wanted))
    if widened is not None:
        value = (
            tuple(float(v) for v in attr.value) if attr.kind is AttrKind.INTS else float(attr.value)
        )
        return AttrValue(attr.name, widened, value)
    expected = str(wanted).rsplit(".", 1)[-1].lower()
    raise SymbolicError(
        f"{where}{op_type} expects attribute {attr.name!r} as {expected}; received"
        f" {attr.kind.value} ({attr.value!r:.60}). Fix: pass a value of that kind"
        " (onnx_custom.attr.ints/floats/strings for lists)."
    )


def _replacement(op_type: str) -> str:
    return {"Upsample": "Resize", "Scatter": "ScatterElements"}.get(
        op_type, "see https://onnx.ai/onnx/operators/"
    )
