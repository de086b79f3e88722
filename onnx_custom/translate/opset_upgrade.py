"""Attributes that later opsets turned into inputs, moved for the translation.

Symbolic functions written for ``torch.onnx.register_custom_op_symbolic`` (mmcv's, mmdeploy's,
the tutorials') are written for one opset, usually 9 or 11: ``g.op("Unsqueeze", x, axes_i=[0])``,
``g.op("ReduceSum", x, axes_i=[-1])``, ``g.op("Split", x, split_i=[2, 3])``,
``g.op("Clip", x, min_f=0.0)``. From opset 13 (18 for most reductions) those attributes are
inputs, so the same function at a newer opset writes a node ONNX Runtime refuses to load
(torch's exporter writes it anyway), and the dynamo exporter, which always builds at opset 18,
cannot use the function at all. The meaning did not change, only where the value goes: a
constant input in place of the attribute is the same node at the newer opset. The moves are
read off ``onnx.defs`` (an attribute of an older version of the op whose name is an input of the
export's version), not listed by hand, so they cover every op that moved.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import onnx.defs
import torch

from onnx_custom.translate.attributes import AttrKind, AttrValue
from onnx_custom.translate.type_check import input_constant_dtype

__all__ = [
    "MovedAttribute",
    "attributes_moved_to_inputs",
    "split_outputs_attribute",
]

# Renamed on the way from attribute to input.
_RENAMED = {("Pad", "value"): "constant_value", ("TopK", "k"): "K"}
# Inputs that hold one value as a 1-D tensor of one element, not as a scalar.
_ONE_ELEMENT = {("TopK", "K")}


@dataclasses.dataclass(frozen=True)
class MovedAttribute:
    """An attribute that becomes input ``index``: a constant of ``dtype`` (None: the dtype of
    input 0, whose type parameter the input shares)."""

    index: int
    attribute: AttrValue
    dtype: torch.dtype | None
    one_element: bool = False

    @property
    def value(self) -> object:
        value = self.attribute.value
        if self.one_element and self.attribute.kind in (AttrKind.INT, AttrKind.FLOAT):
            return [value]
        return list(value) if isinstance(value, tuple) else value


@dataclasses.dataclass(frozen=True)
class _Layout:
    since: int  # the version in force at the export's opset
    attributes: frozenset[str]
    inputs: tuple[str, ...]


@functools.cache
def _layout(op_type: str, opset: int) -> _Layout | None:
    """The op's schema at ``opset`` with its names read once: pybind builds a new dict on every
    ``schema.attributes`` access, which every node of every export would pay."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    return _Layout(
        schema.since_version, frozenset(schema.attributes), tuple(f.name for f in schema.inputs)
    )


@functools.cache
def _older_attributes(op_type: str, before: int) -> frozenset[str]:
    """Attributes any version of the op older than ``before`` had."""
    names: set[str] = set()
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "" and schema.name == op_type and schema.since_version < before:
            names.update(schema.attributes)
    return frozenset(names)


def attributes_moved_to_inputs(
    op_type: str, opset: int, attrs: Sequence[AttrValue]
) -> tuple[list[AttrValue], list[MovedAttribute]]:
    """Split ``attrs`` of a default-domain ``op_type`` node into those the op still has at
    ``opset`` and those an older version had as attributes and ``opset``'s takes as inputs."""
    layout = _layout(op_type, opset) if attrs else None
    if layout is None or all(attr.name in layout.attributes for attr in attrs):
        return list(attrs), []  # the common case: one set lookup per attribute
    kept: list[AttrValue] = []
    moved: list[MovedAttribute] = []
    for attr in attrs:
        name = _RENAMED.get((op_type, attr.name), attr.name)
        if (
            attr.name in layout.attributes
            or name not in layout.inputs
            or attr.name not in _older_attributes(op_type, layout.since)
        ):
            kept.append(attr)
            continue
        index = layout.inputs.index(name)
        one_element = (op_type, name) in _ONE_ELEMENT
        moved.append(
            MovedAttribute(index, attr, input_constant_dtype(op_type, opset, index), one_element)
        )
    return kept, moved


def split_outputs_attribute(
    op_type: str, opset: int, inputs: int, attrs: Sequence[AttrValue], outputs: int
) -> AttrValue | None:
    """Split from opset 18 wants ``num_outputs`` when no ``split`` input says the sizes; a
    symbolic written for an older opset (``g.op("Split", x, axis_i=1, outputs=2)``) splits
    evenly into ``outputs`` parts, which is what ``num_outputs=outputs`` says."""
    if (
        op_type != "Split"
        or opset < 18
        or inputs >= 2
        or any(a.name == "num_outputs" for a in attrs)
    ):
        return None
    return AttrValue("num_outputs", AttrKind.INT, outputs)
