"""Half precision that ONNX Runtime's CPU provider runs: a pass over an exported model.

ONNX Runtime's CPU provider has no bfloat16 ``Mul``/``Add``/``MatMul``/``Gemm``, no float16
``ScatterND(reduction='add')``, and ONNX itself has no bfloat16 ``Sin``. A translation cannot
know that (it is a property of the runtime), so the export does it once, for every translation,
after translating and before writing: each standard-domain node with a float16/bfloat16 input
that the CPU provider refuses (asked of ONNX Runtime: `onnx_custom.runtime.cpu_support`) is
computed in float32 with ``Cast`` nodes around it; a node that float32 cannot rescue either is
a `HalfPrecisionError` naming the op, the dtype and the provider.

Modes (``export(..., half_precision=...)``):

- ``"float32-compute"`` (default): widen what the CPU provider refuses, leave the rest as is.
- ``"strict"``: change nothing; raise `HalfPrecisionError` for any node the CPU provider refuses.
- ``"off"``: change nothing, check nothing (for files meant for another provider).

Widening rounds once per node, as the eager half-precision op does, so results stay within the
dtype's tolerance of PyTorch's. Function bodies are widened by `widen_function` for the dtypes
their call sites feed them (see `onnx_custom.function_bodies.embed`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import onnx
from onnx import TensorProto, helper

from onnx_custom.common.external_data import serialized_size
from onnx_custom.common.onnx_utils import ModelCensus
from onnx_custom.errors import HalfPrecisionError, InvalidArgumentError
from onnx_custom.runtime.cpu_support import PROVIDER, TypedInput, cpu_runs

__all__ = [
    "DEFAULT_MODE",
    "HALF_PRECISION_MODES",
    "HALF_TYPES",
    "check_mode",
    "refusal_message",
    "value_types",
    "widen_function",
    "widen_model",
]

HALF_PRECISION_MODES = ("float32-compute", "strict", "off")
DEFAULT_MODE = "float32-compute"
HALF_TYPES: dict[int, str] = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
_DEFAULT_DOMAINS = ("", "ai.onnx")
# Nodes the pass never rewrites: they move or convert values rather than compute on them.
_NEVER_WIDEN = frozenset({"Cast", "CastLike", "Constant", "Identity"})


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A node the CPU provider refuses at a half dtype (and float32 cannot rescue, or may not)."""

    op_type: str
    node: str
    dtype: str
    opset: int
    why: str  # what float32 compute would (or would not) do for it
    rescued_by_float32: bool


def check_mode(mode: Any) -> str:
    if mode not in HALF_PRECISION_MODES:
        raise InvalidArgumentError(
            f"half_precision= expects one of {list(HALF_PRECISION_MODES)}; received {mode!r}. Fix:"
            " half_precision='float32-compute' (default: compute in float32 what ONNX Runtime's"
            " CPU provider lacks at float16/bfloat16), 'strict' (raise instead) or 'off' (no"
            " check)."
        )
    return str(mode)


def refusal_message(refusals: Sequence[Refusal], where: str, mode: str) -> str:
    lines = [
        f"ONNX Runtime's {PROVIDER} cannot run these half-precision nodes of {where}:",
        *(
            f"  - {r.op_type} (opset {r.opset}, node {r.node!r}) at {r.dtype}; {r.why}"
            for r in refusals
        ),
    ]
    if any("needs opset 13+" in r.why for r in refusals):
        lines.append(
            "Fix: export at opset 13 or later (ONNX has bfloat16 from opset 13 on), or in"
            " float16/float32."
        )
    elif mode == "strict" and all(r.rescued_by_float32 for r in refusals):
        lines.append(
            "Fix: export with half_precision='float32-compute' (the default) to compute these nodes"
            " in float32 with Casts around them, or export the model in float32 (model.float())."
        )
    else:
        lines.append(
            "Fix: export the model in float32 (model.float()) or in a dtype these ops support, or "
            "change the translation so it uses ops the provider implements at this dtype"
            + (
                "; or embed no function bodies (functions=False) and run the file with"
                " onnx-custom's kernels."
                if where.startswith("the function body")
                else "."
            )
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- types


def _has_half(graph: onnx.GraphProto, attributes: bool | None = None) -> bool:
    """Cheap pre-check: does any declared value, initializer, Cast or constant mention a half type?
    ``attributes``: whether a node attribute does, when a `ModelCensus` already read them."""
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type in HALF_TYPES:
            return True
    if any(t.data_type in HALF_TYPES for t in graph.initializer):
        return True
    if attributes is not None:
        return attributes
    for node in graph.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i in HALF_TYPES:
                return True
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in HALF_TYPES:
                return True
    return False


def _shape(info: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)


def value_types(model: onnx.ModelProto) -> dict[str, TypedInput]:
    """Element type and shape of every value ONNX shape inference (or the file) knows.

    Inference runs on a copy without tensor payloads, so a model past protobuf's 2 GiB limit
    (held in memory) is inferred too.
    """
    light = _without_payloads(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:  # custom nodes it cannot see are fine; anything else: use what the file has
        inferred = light
    graph = inferred.graph
    found: dict[str, TypedInput] = {t.name: (t.data_type, tuple(t.dims)) for t in graph.initializer}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            found.setdefault(info.name, (info.type.tensor_type.elem_type, _shape(info)))
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value":
                    found.setdefault(node.output[0], (attr.t.data_type, tuple(attr.t.dims)))
    return found


def _without_payloads(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers keep their type and dims but no data."""
    light = onnx.ModelProto()
    light.CopyFrom(model) if serialized_size(model) < (1 << 28) else _copy_structure(model, light)
    return light


def _copy_structure(model: onnx.ModelProto, light: onnx.ModelProto) -> None:
    saved = [(t, t.raw_data) for t in model.graph.initializer if t.HasField("raw_data")]
    try:
        for tensor, _ in saved:
            tensor.ClearField("raw_data")
        light.CopyFrom(model)
    finally:
        for tensor, data in saved:
            tensor.raw_data = data


# ---------------------------------------------------------------------------------- the pass


class _Names:
    def __init__(self, used: set[str]) -> None:
        self.used = used

    def fresh(self, base: str) -> str:
        name, index = base, 1
        while name in self.used:
            index += 1
            name = f"{base}_{index}"
        self.used.add(name)
        return name


def _opset_of(imports: Sequence[onnx.OperatorSetIdProto]) -> int:
    return next((o.version for o in imports if o.domain in _DEFAULT_DOMAINS), 1)


def _widen_nodes(
    nodes: Sequence[onnx.NodeProto],
    probes: Sequence[onnx.NodeProto],
    types: dict[str, TypedInput],
    opset: int,
    mode: str,
    names: _Names,
    maybe_absent: frozenset[str] = frozenset(),
) -> tuple[list[onnx.NodeProto], list[Refusal]]:
    """``nodes`` with every refused half-precision node computed in float32 (``probes``: the same
    nodes with attribute references resolved, for asking ONNX Runtime)."""
    out: list[onnx.NodeProto] = []
    refusals: list[Refusal] = []
    widened: dict[str, str] = {}  # half value -> its float32 copy (one Cast per value)
    for node, probe in zip(nodes, probes, strict=True):
        inputs = [types.get(name, (0, None)) if name else (0, None) for name in node.input]
        half = sorted({t for t, _ in inputs if t in HALF_TYPES})
        if (
            node.domain not in _DEFAULT_DOMAINS
            or node.op_type in _NEVER_WIDEN
            or not half
            or _has_subgraph(node)
        ):
            out.append(node)
            continue
        if any(name and name not in types for name in node.input) or cpu_runs(probe, opset, inputs):
            out.append(node)  # an input of unknown type: leave it to the runtime to judge
            continue
        as_float = [(TensorProto.FLOAT if t in HALF_TYPES else t, s) for t, s in inputs]
        why = _why_not_float32(
            probe, opset, as_float, half, [types.get(name) for name in node.output if name]
        )
        absent = [
            name for name in node.input if name in maybe_absent and types[name][0] in HALF_TYPES
        ]
        if absent and not why:
            why = (
                f"its optional input {absent[0]!r} is absent in some calls, and an absent value"
                " cannot be cast to float32"
            )
        if mode == "strict" or why:
            rescued = not why
            refusals.append(
                Refusal(
                    node.op_type,
                    node.name,
                    HALF_TYPES[half[0]],
                    opset,
                    why or "it runs in float32",
                    rescued,
                )
            )
            out.append(node)
            continue
        out.extend(_widened(node, types, widened, names))
    return out, refusals


def _why_not_float32(
    probe: onnx.NodeProto,
    opset: int,
    as_float: list[TypedInput],
    half: list[int],
    outputs: list[Any],
) -> str:
    """Why computing ``probe`` in float32 cannot work ("" when it can)."""
    for t in half:
        if not _casts_run(t, opset):
            return (
                f"Cast cannot convert {HALF_TYPES[t]} at opset {opset} (bfloat16 needs opset 13+)"
            )
    if not cpu_runs(probe, opset, as_float):
        return "no float32 kernel either"
    if any(o is None for o in outputs):
        return "its output types are unknown, so they cannot be cast back"
    return ""


def _casts_run(half: int, opset: int) -> bool:
    """Can the CPU provider cast ``half`` to float32 and back at ``opset`` (bfloat16 Cast: 13+)?"""
    there = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    back = helper.make_node("Cast", ["x"], ["y"], to=half)
    return cpu_runs(there, opset, [(half, (1,))]) and cpu_runs(
        back, opset, [(TensorProto.FLOAT, (1,))]
    )


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    )


def _widened(
    node: onnx.NodeProto, types: dict[str, TypedInput], widened: dict[str, str], names: _Names
) -> Iterator[onnx.NodeProto]:
    """Casts to float32 for the node's half inputs, the node on float32, Casts back."""
    label = node.name or node.op_type
    computed = onnx.NodeProto()
    computed.CopyFrom(node)
    for index, name in enumerate(node.input):
        if not name or types[name][0] not in HALF_TYPES:
            continue
        if name not in widened:
            widened[name] = names.fresh(f"{name}_float32")
            yield helper.make_node(
                "Cast",
                [name],
                [widened[name]],
                name=names.fresh(f"{label}_widen{index}"),
                to=TensorProto.FLOAT,
            )
        computed.input[index] = widened[name]
    narrow = []
    for index, name in enumerate(node.output):
        if name and types[name][0] in HALF_TYPES:
            computed.output[index] = names.fresh(f"{name}_float32")
            narrow.append(
                helper.make_node(
                    "Cast",
                    [computed.output[index]],
                    [name],
                    name=names.fresh(f"{label}_narrow{index}"),
                    to=types[name][0],
                )
            )
    yield computed
    yield from narrow


def _all_names(graph: onnx.GraphProto) -> set[str]:
    used = {v.name for v in (*graph.input, *graph.output, *graph.value_info)} | {
        t.name for t in graph.initializer
    }
    for node in graph.node:
        used.update(node.input)
        used.update(node.output)
        used.add(node.name)
    return used


def widen_model(
    model: onnx.ModelProto,
    mode: str = DEFAULT_MODE,
    *,
    where: str = "the exported model",
    census: ModelCensus | None = None,
) -> onnx.ModelProto:
    """Apply the pass to ``model``'s main graph in place (see the module doc); returns ``model``.

    Raises `HalfPrecisionError` listing every node the CPU provider refuses that ``mode`` does
    not widen. Nodes with subgraphs (If/Loop/Scan) are left as they are. ``census``: the
    model's, whose node attributes then need no second reading.
    """
    mode = check_mode(mode)
    graph = model.graph
    if mode == "off" or not _has_half(graph, None if census is None else census.half_attributes):
        return model
    types = value_types(model)
    nodes, refusals = _widen_nodes(
        list(graph.node),
        list(graph.node),
        types,
        _opset_of(model.opset_import),
        mode,
        _Names(_all_names(graph)),
    )
    if refusals:
        raise HalfPrecisionError(refusal_message(refusals, where, mode))
    if len(nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(nodes)
    return model


def widen_function(
    function: onnx.FunctionProto,
    input_types: Sequence[int],
    call: onnx.NodeProto,
    mode: str = DEFAULT_MODE,
    *,
    maybe_absent: Sequence[str] = (),
) -> onnx.FunctionProto:
    """``function`` specialised for a call with inputs of ``input_types`` (element types; 0 for
    an absent optional input): its refused half-precision nodes computed in float32, in place.

    ``call`` (a node calling the function) supplies the attribute values the body's references
    resolve to, for type inference and for asking ONNX Runtime. ``maybe_absent``: inputs some
    calls leave out (a node needing float32 on one of those is refused: no Cast of nothing).
    """
    mode = check_mode(mode)
    if mode == "off" or not any(t in HALF_TYPES for t in input_types):
        return function
    resolved = [_resolve(node, function, call) for node in function.node]
    types = _function_types(function, resolved, input_types)
    used = (
        set(function.input)
        | set(function.output)
        | {n for node in function.node for n in (*node.input, *node.output, node.name)}
    )
    nodes, refusals = _widen_nodes(
        list(function.node),
        resolved,
        types,
        _opset_of(function.opset_import),
        mode,
        _Names(used),
        frozenset(maybe_absent),
    )
    if refusals:
        raise HalfPrecisionError(
            refusal_message(
                refusals, f"the function body of {function.domain}::{function.name}", mode
            )
        )
    if len(nodes) != len(function.node):
        del function.node[:]
        function.node.extend(nodes)
    return function


def _resolve(
    node: onnx.NodeProto, function: onnx.FunctionProto, call: onnx.NodeProto
) -> onnx.NodeProto:
    """``node`` with attribute references replaced by the call's values (or the body's defaults)."""
    given = {a.name: a for a in (*function.attribute_proto, *call.attribute)}
    out = onnx.NodeProto()
    out.CopyFrom(node)
    del out.attribute[:]
    for attr in node.attribute:
        if not attr.ref_attr_name:
            out.attribute.append(attr)
        elif attr.ref_attr_name in given:
            value = onnx.AttributeProto()
            value.CopyFrom(given[attr.ref_attr_name])
            value.name = attr.name
            out.attribute.append(value)
    return out


def _function_types(
    function: onnx.FunctionProto, resolved: list[onnx.NodeProto], input_types: Sequence[int]
) -> dict[str, TypedInput]:
    inputs = [
        helper.make_tensor_value_info(name, t, None)
        for name, t in zip(function.input, input_types, strict=False)
        if t
    ]
    graph = helper.make_graph(
        resolved, "body", inputs, [helper.make_empty_tensor_value_info(o) for o in function.output]
    )
    model = helper.make_model(graph, opset_imports=list(function.opset_import), ir_version=10)
    return value_types(model)
