"""Nodes whose mix of float input types ONNX Runtime's CPU provider refuses, repaired with Casts.

Exporters write files the CPU provider cannot load: TorchScript traces ``torch.linspace`` in
float64, so a Deformable DETR-style encoder feeds ``GridSample`` a float32 image and a float64
grid ("Could not find an implementation for GridSample"); a Python float folded into a float64
constant meets a float32 tensor in an ``Add``/``Mul`` ("bound to different types"). PyTorch
computed those in the tensor's dtype. So after translating (and after the half-precision pass)
every standard-domain node with two or more float element types among its inputs is asked of
ONNX Runtime (`onnx_custom.runtime.cpu_support`); a refused one gets ``Cast`` nodes that bring
its odd inputs to the node's compute type (its output's type when known, else its first float
input's), if the CPU provider runs it that way; otherwise the export raises
`MixedFloatTypesError` naming the node, its types and the fix.

The pass follows ``export(..., half_precision=...)``: ``"float32-compute"`` (default) repairs,
``"strict"`` raises for every refused node, ``"off"`` checks nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from onnx_custom.errors import MixedFloatTypesError
from onnx_custom.runtime.cpu_support import PROVIDER, TypedInput, cpu_runs
from onnx_custom.runtime.half_precision import check_mode, value_types

__all__ = ["FLOAT_TYPES", "repair_mixed_floats"]

FLOAT_TYPES: dict[int, str] = {
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
}
_DEFAULT_DOMAINS = ("", "ai.onnx")
# Nodes that convert or move values (a Cast of float64 to float32 is the repair, not the fault).
_LEAVE = frozenset({"Cast", "CastLike", "Constant", "Identity", "If", "Loop", "Scan"})
_MAX_ROUNDS = 4  # a repaired node's output may make the next one's types known


@dataclasses.dataclass(frozen=True)
class _Refusal:
    op_type: str
    node: str
    types: tuple[str, ...]
    why: str


def _float_types_mentioned(graph: onnx.GraphProto) -> set[int]:
    """Every float element type the graph declares, stores or casts to (a cheap pre-check)."""
    found = {t.data_type for t in graph.initializer}
    for info in (*graph.input, *graph.output, *graph.value_info):
        found.add(info.type.tensor_type.elem_type)
    for node in graph.node:
        for attr in node.attribute:
            if attr.name == "to" and node.op_type == "Cast":
                found.add(attr.i)
            elif attr.type == onnx.AttributeProto.TENSOR:
                found.add(attr.t.data_type)
    return found & set(FLOAT_TYPES)


def _target(node: onnx.NodeProto, floats: list[int], types: dict[str, TypedInput]) -> int:
    """The float type the node computes in: its output's when known, else its first float input's
    (PyTorch keeps a tensor's dtype against a float64 Python scalar)."""
    for name in node.output:
        known = types.get(name)
        if known is not None and known[0] in floats:
            return known[0]
    return floats[0]


def _repair_round(
    model: onnx.ModelProto, mode: str
) -> tuple[list[onnx.NodeProto] | None, list[_Refusal]]:
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 1)
    types = value_types(model)
    used = {n for node in graph.node for n in (*node.input, *node.output, node.name)}
    used |= {t.name for t in graph.initializer} | {i.name for i in graph.input}
    out: list[onnx.NodeProto] = []
    refusals: list[_Refusal] = []
    casts: dict[tuple[str, int], str] = {}
    changed = False

    def fresh(base: str) -> str:
        name, index = base, 1
        while name in used:
            index += 1
            name = f"{base}_{index}"
        used.add(name)
        return name

    for node in graph.node:
        if node.domain not in _DEFAULT_DOMAINS or node.op_type in _LEAVE:
            out.append(node)
            continue
        inputs: list[TypedInput] = [types.get(n, (0, None)) if n else (0, None) for n in node.input]
        floats = [t for t, _ in inputs if t in FLOAT_TYPES]
        if len(set(floats)) < 2 or any(n and n not in types for n in node.input):
            out.append(node)
            continue
        if cpu_runs(node, opset, inputs):
            out.append(node)
            continue
        target = _target(node, floats, types)
        shown = tuple(FLOAT_TYPES[t] if t in FLOAT_TYPES else str(t) for t, _ in inputs)
        repaired = [(target if t in FLOAT_TYPES else t, s) for t, s in inputs]
        if mode == "strict" or not cpu_runs(node, opset, repaired):
            why = (
                f"it runs with its float inputs cast to {FLOAT_TYPES[target]}"
                if mode == "strict" and cpu_runs(node, opset, repaired)
                else "no kernel for these types, nor with every float input as"
                f" {FLOAT_TYPES[target]}"
            )
            refusals.append(_Refusal(node.op_type, node.name, shown, why))
            out.append(node)
            continue
        fixed = onnx.NodeProto()
        fixed.CopyFrom(node)
        label = node.name or node.op_type
        for index, (name, (elem, _)) in enumerate(zip(node.input, inputs, strict=True)):
            if elem not in FLOAT_TYPES or elem == target:
                continue
            key = (name, target)
            if key not in casts:
                casts[key] = fresh(f"{name}_as_{FLOAT_TYPES[target]}")
                out.append(
                    helper.make_node(
                        "Cast", [name], [casts[key]], name=fresh(f"{label}_cast{index}"), to=target
                    )
                )
            fixed.input[index] = casts[key]
        out.append(fixed)
        changed = True
    return (out if changed else None), refusals


def _message(refusals: Sequence[_Refusal], where: str, mode: str) -> str:
    lines = [
        f"ONNX Runtime's {PROVIDER} cannot run these nodes of {where} for their mix of float"
        " input types:",
        *(
            f"  - {r.op_type} (node {r.node!r}) on ({', '.join(r.types)}); {r.why}"
            for r in refusals
        ),
    ]
    if mode == "strict":
        lines.append(
            "Fix: export with half_precision='float32-compute' (the default) to cast the odd"
            " inputs, or make the model compute in one dtype (e.g. torch.linspace(...,"
            " dtype=x.dtype) traced by TorchScript yields float64: export with exporter='dynamo')."
        )
    else:
        lines.append(
            "Fix: make the model compute these in one dtype (cast the odd input with .to(x.dtype)"
            " before the op), or export with exporter='dynamo', which keeps PyTorch's dtypes."
        )
    return "\n".join(lines)


def repair_mixed_floats(
    model: onnx.ModelProto, mode: str = "float32-compute", *, where: str = "the exported model"
) -> onnx.ModelProto:
    """Apply the pass to ``model``'s main graph in place (see the module doc); returns ``model``.

    Raises `MixedFloatTypesError` listing every refused node ``mode`` does not repair.
    """
    mode = check_mode(mode)
    if mode == "off" or len(_float_types_mentioned(model.graph)) < 2:
        return model
    for _ in range(_MAX_ROUNDS):
        nodes, refusals = _repair_round(model, mode)
        if refusals:
            raise MixedFloatTypesError(_message(refusals, where, mode))
        if nodes is None:
            break
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return model
