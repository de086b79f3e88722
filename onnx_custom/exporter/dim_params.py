"""The symbolic dims of an exported file: find them, rename them, record their ranges.

Both exporters' files go through here after export: torch's symbols become the user's dim names
(``s77`` -> ``batch``, ``2*s77`` -> ``2*batch``) and ``metadata_props["onnx_custom.dynamic_dims"]``
records each named dim's declared range for the verifier.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

import onnx

from onnx_custom.exporter.dynamic_shapes import DynamicSpec

__all__ = [
    "METADATA_KEY",
    "dim_params",
    "rename_dims",
    "rename_in_text",
    "tensor_dims",
    "value_infos",
    "write_metadata",
]

METADATA_KEY = "onnx_custom.dynamic_dims"

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def rename_in_text(text: str, mapping: Mapping[str, str]) -> str:
    """Replace whole identifiers of ``text`` (a dim_param,
    possibly an expression) per ``mapping``."""
    return _TOKEN.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)


def value_infos(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    """Every typed value of ``graph`` and its subgraphs (inputs, outputs, value_info)."""
    yield from graph.input
    yield from graph.output
    yield from graph.value_info
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from value_infos(attr.g)
            for sub in attr.graphs:
                yield from value_infos(sub)


def _infos(
    model: onnx.ModelProto, graphs: Sequence[onnx.GraphProto] | None
) -> Iterator[onnx.ValueInfoProto]:
    """`value_infos` of the main graph, or of ``graphs`` when a census already found them all."""
    if graphs is None:
        yield from value_infos(model.graph)
        return
    for graph in graphs:
        yield from graph.input
        yield from graph.output
        yield from graph.value_info


def tensor_dims(info: onnx.ValueInfoProto) -> Iterator[onnx.TensorShapeProto.Dimension]:
    typ = info.type
    while typ.HasField("sequence_type") or typ.HasField("optional_type"):
        typ = (
            typ.sequence_type.elem_type
            if typ.HasField("sequence_type")
            else typ.optional_type.elem_type
        )
    if typ.HasField("tensor_type") and typ.tensor_type.HasField("shape"):
        yield from typ.tensor_type.shape.dim


def dim_params(
    model: onnx.ModelProto, *, graphs: Sequence[onnx.GraphProto] | None = None
) -> set[str]:
    """Every dim_param of ``model`` (``graphs``: the main graph and all its subgraphs,
    when known)."""
    return {d.dim_param for info in _infos(model, graphs) for d in tensor_dims(info) if d.dim_param}


def rename_dims(
    model: onnx.ModelProto,
    mapping: Mapping[str, str],
    *,
    exact: bool = False,
    graphs: Sequence[onnx.GraphProto] | None = None,
) -> None:
    """Rename symbolic dims everywhere in ``model``: identifiers inside each dim_param (``s77`` ->
    ``batch``, so ``2*s77`` -> ``2*batch``), or whole dim_params with ``exact``.

    A dim_param that is a plain number (torch writes a Dim.AUTO it made static as ``"2"``)
    becomes that static size: as a name it would let any size through. ``graphs``: the main
    graph and all its subgraphs, when a `ModelCensus` already found them."""
    for info in _infos(model, graphs):
        for dim in tensor_dims(info):
            if not dim.dim_param:
                continue
            if mapping:
                dim.dim_param = (
                    mapping.get(dim.dim_param, dim.dim_param)
                    if exact
                    else rename_in_text(dim.dim_param, mapping)
                )
            if dim.dim_param.isdecimal():
                dim.dim_value = int(dim.dim_param)


def write_metadata(
    model: onnx.ModelProto, spec: DynamicSpec, *, graphs: Sequence[onnx.GraphProto] | None = None
) -> None:
    """Record every named dynamic dim the file uses (the verifier draws trial sizes from it).
    ``graphs`` as for `rename_dims`."""
    payload = spec.metadata()
    if (
        payload is not None
    ):  # only then does it matter which dims the file uses (a walk of every value)
        used = {
            tok
            for text in dim_params(model, graphs=graphs)
            for tok in [text, *_TOKEN.findall(text)]
        }
        payload = spec.metadata(used)
    for i, entry in enumerate(model.metadata_props):
        if entry.key == METADATA_KEY:
            del model.metadata_props[i]
            break
    if payload is not None:
        model.metadata_props.add(key=METADATA_KEY, value=payload)
