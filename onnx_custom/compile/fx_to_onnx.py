"""One FX graph (aot_autograd's, or a partition of it) -> an ONNX model, with torch's translator.

ATen ops go through torchlib (torch's ``ONNXRegistry``), the user's ops through *our*
translations (`onnx_custom.exporter.dynamo.translation_table`, the same functions
``onnx_custom.export`` uses, so they see the same ``g.outputs``), scoped to the ops the graph
contains; an ATen op gets our translation only where torchlib has none (our ATen entries exist for
the TorchScript exporter, and must not replace torchlib's in every compiled graph). The result is
lowered to the requested opset and finalized exactly as ``export`` does.

Graph outputs are planned here (`OutputPlan`): ONNX returns only the distinct computed values;
``None`` outputs, inputs returned as they are, repeated values and Python constants are put back
in place by the hand-off (`onnx_custom.compile.session`), and SymInt outputs become Python ints.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import torch

from onnx_custom.common.torch_chatter import quiet_torch
from onnx_custom.compile import torch_adapter
from onnx_custom.errors import OnnxCustomError

__all__ = [
    "OutputPlan",
    "TranslatedGraph",
    "TranslationFailure",
    "graph_targets",
    "scoped_translations",
    "translate",
]


class TranslationFailure(Exception):
    """Translating ``node`` raised; the partitioner leaves that node to eager (or reports it)."""

    def __init__(self, node: str, target: str, reason: str) -> None:
        super().__init__(f"{node} ({target}): {reason}")
        self.node, self.target, self.reason = node, target, reason


@dataclasses.dataclass(frozen=True)
class OutputPlan:
    """How to rebuild the graph's outputs from ORT's distinct outputs.

    ``slots``: per graph output, ``("ort", j)`` / ``("int", j)`` (a SymInt: ``.item()``) /
    ``("float", j)`` / ``("input", i)`` / ``("const", value)``. ``bool_outputs``: ORT outputs that
    are bool (DLPack hands them over as uint8). ``single``: the graph returns one value,
    not a tuple.
    """

    slots: tuple[tuple[str, Any], ...]
    bool_outputs: tuple[int, ...]
    single: bool

    def assemble(self, ort: Sequence[torch.Tensor], inputs: Sequence[Any]) -> Any:
        if self.bool_outputs:
            ort = list(ort)
            for j in self.bool_outputs:
                if ort[j].dtype is not torch.bool:
                    ort[j] = ort[j].view(torch.bool)
        out = []
        for kind, where in self.slots:
            if kind == "ort":
                out.append(ort[where])
            elif kind == "int":
                out.append(int(ort[where].item()))
            elif kind == "float":
                out.append(float(ort[where].item()))
            elif kind == "input":
                out.append(inputs[where])
            else:
                out.append(where)
        return out[0] if self.single else tuple(out)


@dataclasses.dataclass(frozen=True)
class TranslatedGraph:
    proto: onnx.ModelProto
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    plan: OutputPlan
    custom_ops: tuple[str, ...]  # our translations used (qualified names)


def graph_targets(graph: torch.fx.Graph) -> set[Any]:
    return {n.target for n in graph.nodes if n.op == "call_function"}


def scoped_translations(
    targets: set[Any], ours: Mapping[Any, Any], registry: Any
) -> dict[Any, Any]:
    """Our translations for the ops in ``targets``: every non-ATen op we translate, and ATen ops
    only where torchlib has nothing."""
    scoped = {}
    for target in targets:
        function = ours.get(target)
        if function is None:
            continue
        namespace = target.namespace if isinstance(target, torch._ops.OpOverload) else ""
        if namespace in ("aten", "prims") and torch_adapter.is_registered(registry, target):
            continue
        scoped[target] = function
    return scoped


def _plan(graph: torch.fx.Graph) -> tuple[OutputPlan, list[torch.fx.Node], torch.fx.Node]:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    raw = output.args[0]
    single = not isinstance(raw, (tuple, list))
    values = [raw] if single else list(raw)
    placeholders = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    distinct: dict[torch.fx.Node, int] = {}
    slots: list[tuple[str, Any]] = []
    bools: list[int] = []
    for value in values:
        if value is None or not isinstance(value, torch.fx.Node):
            slots.append(("const", value))
        elif value in placeholders:
            slots.append(("input", placeholders[value]))
        else:
            if value not in distinct:
                distinct[value] = len(distinct)
                meta = value.meta.get("val")
                if isinstance(meta, torch.Tensor) and meta.dtype is torch.bool:
                    bools.append(distinct[value])
            meta = value.meta.get("val")
            kind = (
                "int"
                if isinstance(meta, (int, torch.SymInt)) and not isinstance(meta, bool)
                else "float"
                if isinstance(meta, (float, torch.SymFloat))
                else "ort"
            )
            slots.append((kind, distinct[value]))
    return OutputPlan(tuple(slots), tuple(bools), single), list(distinct), output


_FAILED_NODE = re.compile(r"Error when translating node (.*?)\. See the stack trace")


def _failed_node(exc: BaseException, graph: torch.fx.Graph) -> tuple[str, str, str]:
    text = str(exc)
    match = _FAILED_NODE.search(text)
    node = None
    if match:
        node = next((n for n in graph.nodes if n.format_node() == match.group(1)), None)
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
        if isinstance(cause, OnnxCustomError):
            break
    reason = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    if node is None:
        return "?", "?", reason
    return node.name, str(node.target), reason


GRAPH_NAME = "onnx_custom_compiled"


def translate(
    graph: torch.fx.Graph, *, registry: Any, ours: Mapping[Any, Any], opset: int
) -> TranslatedGraph:
    """Translate ``graph`` (every placeholder and node carrying ``meta["val"]``); raises
    `TranslationFailure` naming the node whose translation raised. The same graph always gives
    the same bytes (one fixed graph name), so a recompiled graph finds its cached session."""
    from onnx_ir import serde

    from onnx_custom.exporter.opset_compat import lower_default_opset
    from onnx_custom.exporter.pipeline import finalize_model

    plan, distinct, output = _plan(graph)
    scoped = scoped_translations(graph_targets(graph), ours, registry)
    onnx_registry = torch_adapter.scoped_registry(registry, scoped) if scoped else registry
    original = output.args
    output.args = (tuple(distinct),)
    try:
        with quiet_torch():
            model = torch_adapter.translate_graph(graph, onnx_registry, GRAPH_NAME)
    except Exception as exc:
        raise TranslationFailure(*_failed_node(exc, graph)) from exc
    finally:
        output.args = original
    proto = serde.serialize_model(model)
    built = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
    if opset < built:
        proto = lower_default_opset(proto, opset)
    proto = finalize_model(proto)
    return TranslatedGraph(
        proto,
        tuple(i.name for i in proto.graph.input),
        tuple(o.name for o in proto.graph.output),
        plan,
        tuple(sorted(str(t) for t in scoped)),
    )
