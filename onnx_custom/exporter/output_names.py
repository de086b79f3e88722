"""Predictable output names when ``output_names`` is absent (both exporters).

Left alone, TorchScript names outputs after its value numbering (``'3'``) and dynamo after the
op that made them (``'add_3'``): names that change when the model changes, so code that reads
``session.run(["3"], ...)`` breaks silently. `default_output_names` takes the fields of a
``NamedTuple`` return annotation of ``forward`` when they match the outputs' count, else
``output_0 .. output_{n-1}``; `rename_outputs` applies them to the graph.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
import weakref
from collections.abc import Sequence
from typing import Any

import onnx

from onnx_custom.common.onnx_utils import ModelCensus, iter_nodes

__all__ = ["default_output_names", "rename_outputs"]


# forward's function -> (its return annotation as written, the NamedTuple fields it names):
# resolving string annotations (``from __future__ import annotations``) costs a tenth of a
# millisecond per export; an annotation replaced since is resolved again.
_FIELDS: weakref.WeakKeyDictionary[Any, tuple[Any, tuple[str, ...] | None]] = (
    weakref.WeakKeyDictionary()
)


def _annotated_fields(model: Any) -> tuple[str, ...] | None:
    forward = getattr(model, "forward", None)
    if forward is None:
        return None
    function = getattr(forward, "__func__", forward)
    annotations = getattr(function, "__annotations__", None)
    written = annotations.get("return") if isinstance(annotations, dict) else None
    try:
        cached = _FIELDS.get(function)
    except TypeError:  # not weak-referenceable: resolve every time
        cached = None
    if cached is not None and cached[0] is written:
        return cached[1]
    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # unresolvable annotations (not cached: a later export may resolve them)
        return None
    fields = _named_tuple_fields(hints.get("return"))
    with contextlib.suppress(TypeError):
        _FIELDS[function] = (written, fields)
    return fields


def _named_tuple_fields(returned: Any) -> tuple[str, ...] | None:
    fields = getattr(returned, "_fields", None)  # a NamedTuple class
    if (
        inspect.isclass(returned)
        and isinstance(fields, tuple)
        and all(isinstance(f, str) for f in fields)
    ):
        return fields
    return None


def default_output_names(model: Any, count: int) -> list[str]:
    """``forward``'s NamedTuple return fields when there are ``count`` of them,
    else ``output_<i>``."""
    fields = _annotated_fields(model)
    if fields is not None and len(fields) == count:
        return list(fields)
    return [f"output_{i}" for i in range(count)]


def rename_outputs(
    proto: onnx.ModelProto,
    names: Sequence[str],
    *,
    keep_values: bool = False,
    census: ModelCensus | None = None,
) -> None:
    """Give the main graph's outputs ``names`` in place, renaming every use. An output that is
    also a graph input or an initializer, or repeats an earlier output, gets an ``Identity`` to
    its new name instead (dynamo names a returned input after the input itself, which ONNX
    Runtime refuses as a duplicate definition). A new name already used elsewhere is skipped.
    ``keep_values``: every output gets an ``Identity`` and inner values keep their names (the
    dynamo exporter names values after FX nodes, which localize matches by name). ``census``:
    the model's, read after its last change (its names and the nodes using the outputs: no
    second walk over every node's names)."""
    graph = proto.graph
    # dynamo writes a returned input as Identity(x) -> x: a second definition of x (invalid)
    selfish = [n for n in graph.node if n.op_type == "Identity" and list(n.input) == list(n.output)]
    for node in selfish:
        graph.node.remove(node)
    if selfish:
        census = None  # its names include the removed nodes'
    fixed = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    taken = set(fixed)
    if census is not None:
        taken |= census.names
    else:
        for node in iter_nodes(proto, functions=False):
            taken.update(node.input)
            taken.update(node.output)
    mapping: dict[str, str] = {}
    copies: list[onnx.NodeProto] = []
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    for output, new in zip(graph.output, names, strict=False):
        old = output.name
        if old == new or new in taken:
            continue
        taken.add(new)
        # Identity takes bfloat16 only from opset 13: below, rename the value itself (a bf16
        # file below 13 holds only custom nodes on that path, which localize does not split)
        no_identity = output.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16 and opset < 13
        if (keep_values and not no_identity) or old in fixed or old in mapping:
            copies.append(
                onnx.helper.make_node(
                    "Identity", [mapping.get(old, old)], [new], name=f"{new}_identity"
                )
            )
            output.name = new
        else:
            mapping[old] = new
    # subgraphs may read outer-scope values; the census lists every node touching an output
    users = iter_nodes(proto, functions=False) if census is None else census.output_users
    for node in users if mapping else ():
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]
    for info in (*graph.output, *graph.value_info):
        if info.name in mapping:
            info.name = mapping[info.name]
    graph.node.extend(copies)
