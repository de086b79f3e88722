"""Check custom nodes against their kernel declarations before ONNX Runtime sees the model.

ORT's own messages for these mistakes name neither the declaration nor the fix ("has input size
2 not in range"), and some are silent (a misspelt attribute name just gets the default).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import onnx
from onnx import AttributeProto

from onnx_custom.common.onnx_utils import ModelCensus, function_nodes
from onnx_custom.errors import NodeDeclarationError
from onnx_custom.runtime import abi
from onnx_custom.runtime.host import note_exact_strings
from onnx_custom.runtime.kernel_spec import RESERVED_DOMAINS, AttrSpec, KernelSpec, ParamSpec

if TYPE_CHECKING:
    from onnx_custom.runtime.registry import KernelRegistry

__all__ = [
    "NodeDeclarationError",
    "graph_value_types",
    "node_problems",
    "validate_model",
    "validate_nodes",
    "validate_registered",
]

_MAX_LISTED = 10
_EXAMPLE = {
    "int": "1",
    "float": "1.0",
    "string": "'text'",
    "ints": "[1, 2]",
    "floats": "[1.0, 2.0]",
    "strings": "['a', 'b']",
    "tensor": "numpy.array([1.0, 2.0])",
}


def _label(node: onnx.NodeProto) -> str:
    return (
        f"node {node.name!r}"
        if node.name
        else f"unnamed {node.op_type} node (outputs {list(node.output)})"
    )


def _declared(params: Sequence[ParamSpec]) -> str:
    marks = {"required": "", "optional": "?", "variadic": "*"}
    return "[" + ", ".join(f"{p.name}{marks[p.kind]}" for p in params) + "]"


def _arity_problems(what: str, names: Sequence[str], params: Sequence[ParamSpec]) -> list[str]:
    """Problems of one node's input (or output) list against the declared parameters."""
    variadic = bool(params) and params[-1].kind == "variadic"
    # ONNX marks an omitted optional value with '' and may drop trailing ones
    needed = max((i + 1 for i, p in enumerate(params) if p.kind != "optional"), default=0)
    most = None if variadic else len(params)
    count = len(names)
    while count > needed and names[count - 1] == "":
        count -= 1
    problems = []
    if count < needed or (most is not None and count > most):
        want = (
            f"{needed}"
            if most == needed
            else f"{needed} to {most}"
            if most is not None
            else f"{needed} or more"
        )
        problems.append(
            f"has {len(names)} {what}(s) {list(names)} but the kernel declares {want}: "
            f"{_declared(params)}"
        )
        return problems
    for i, p in enumerate(params[:count]):
        if p.kind != "optional" and names[i] == "":
            problems.append(f"leaves required {what} {i} ({p.name!r}) empty")
    return problems


def _attr_value_problem(attr: AttributeProto, decl: AttrSpec) -> str | None:
    expected = abi.ATTR_PROTO_TYPES[decl.type]
    if attr.ref_attr_name:  # inside a function body: resolved when the function is inlined
        return None
    if attr.type != expected:
        got = AttributeProto.AttributeType.Name(attr.type).lower()
        return (
            f"sets attribute {attr.name!r} as {got} but the kernel declares {decl.type}; "
            f"fix: set it as a {decl.type}, e.g. {attr.name}={_EXAMPLE[decl.type]}"
        )
    raw = (
        [attr.s] if decl.type == "string" else list(attr.strings) if decl.type == "strings" else []
    )
    try:
        texts = [b.decode() for b in raw]
    except UnicodeDecodeError:
        return (
            f"sets {decl.type} attribute {attr.name!r} to bytes that are not valid UTF-8; "
            "fix: store UTF-8 text (Python kernels receive str)"
        )
    if decl.type == "strings":
        note_exact_strings(texts)
    return None


def _attr_problems(node: onnx.NodeProto, spec: KernelSpec) -> list[str]:
    declared = {a.name: a for a in spec.attrs}
    problems = []
    present = set()
    for attr in node.attribute:
        present.add(attr.name)
        decl = declared.get(attr.name)
        if decl is None:
            names = ", ".join(f"{a.name} ({a.type})" for a in spec.attrs) or "none"
            problems.append(
                f"sets attribute {attr.name!r}, which the kernel does not declare (declared:"
                f" {names}); fix: rename it to a declared attribute, or declare it at registration"
            )
            continue
        problem = _attr_value_problem(attr, decl)
        if problem:
            problems.append(problem)
    for a in spec.attrs:
        if a.required and a.name not in present:
            problems.append(
                f"lacks required attribute {a.name!r} ({a.type}); fix: set it on the node "
                f"({a.name}={_EXAMPLE[a.type]}) or declare a default at registration "
                f"(attrs={{{a.name!r}: ({a.type!r}, {_EXAMPLE[a.type]})}})"
            )
    return problems


def _dtype_problems(node: onnx.NodeProto, spec: KernelSpec, known: Mapping[str, int]) -> list[str]:
    """Inputs whose dtype the model states and the declaration excludes."""
    problems = []
    for i, name in enumerate(node.input):
        elem = known.get(name)
        if not name or not elem or not spec.inputs:
            continue
        param = spec.inputs[min(i, len(spec.inputs) - 1)]
        got = abi.ELEM_TO_NAME.get(elem, onnx.TensorProto.DataType.Name(elem).lower())
        if got not in param.dtypes:
            problems.append(
                f"gives input {i} ({param.name!r}) {name!r} of dtype {got}; expected one of "
                f"{', '.join(param.dtypes)}; fix: cast the input (a Cast node) or widen dtypes= at "
                "registration"
            )
    return problems


def graph_value_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element type of every value ``graph`` states one for (inputs, initializers, value_info)."""
    known = {t.name: t.data_type for t in graph.initializer}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            known.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return known


def node_problems(
    node: onnx.NodeProto, spec: KernelSpec, known: Mapping[str, int] | None = None
) -> list[str]:
    """Every way ``node`` disagrees with ``spec`` (empty when it matches); ``known`` maps value
    names to the element types the model states for them."""
    return (
        _arity_problems("input", list(node.input), spec.inputs)
        + _arity_problems("output", list(node.output), spec.outputs)
        + _attr_problems(node, spec)
        + _dtype_problems(node, spec, known or {})
    )


def _problem_lines(
    nodes: Sequence[onnx.NodeProto], specs: Sequence[KernelSpec], known: Mapping[str, int] | None
) -> list[str]:
    by_key = {(s.domain, s.op_type): s for s in specs}
    lines: list[str] = []
    for node in nodes:
        spec = by_key.get((node.domain, node.op_type))
        if spec is not None:
            lines += [f"{_label(node)} ({spec.name}) {p}" for p in node_problems(node, spec, known)]
    return lines


def _raise_for(lines: list[str]) -> None:
    if not lines:
        return
    shown = "\n".join(f"  - {line}" for line in lines[:_MAX_LISTED])
    more = f"\n  ... and {len(lines) - _MAX_LISTED} more" if len(lines) > _MAX_LISTED else ""
    raise NodeDeclarationError(
        f"{len(lines)} custom node problem(s) against the kernel declarations (checked before "
        f"ONNX Runtime loads the model):\n{shown}{more}\n"
        "fix: make the nodes match the declarations (see each line), or register kernels that "
        "declare what the nodes use.",
        lines,
    )


def validate_nodes(
    nodes: Sequence[onnx.NodeProto],
    specs: Sequence[KernelSpec],
    known: Mapping[str, int] | None = None,
) -> None:
    """Raise :class:`NodeDeclarationError` listing every node that disagrees with its kernel."""
    _raise_for(_problem_lines(nodes, specs, known))


def _subgraph_nodes(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    found: list[onnx.NodeProto] = []
    for node in nodes:
        for attr in node.attribute:
            for graph in ([attr.g] if attr.type == AttributeProto.GRAPH else []) + list(
                attr.graphs
            ):
                found += list(graph.node) + _subgraph_nodes(graph.node)
    return found


def _nested_nodes(model: onnx.ModelProto, *, subgraphs: bool = True) -> list[onnx.NodeProto]:
    """Nodes outside the main graph: its subgraphs (``subgraphs=False``: known to have none) and
    the model's local functions."""
    found = _subgraph_nodes(model.graph.node) if subgraphs else []
    for function in model.functions:
        found += list(function.node) + _subgraph_nodes(function.node)
    return found


def validate_model(
    model: onnx.ModelProto, specs: Sequence[KernelSpec], *, census: ModelCensus | None = None
) -> None:
    """:func:`validate_nodes` for every custom node of ``model``; input dtypes are checked where
    the main graph states them (subgraphs and functions have their own value names). ``census``:
    the model's; without subgraphs its nodes with a domain are the main graph's custom nodes, in
    order, and the graph is not walked twice more (a cold walk costs tens of microseconds)."""
    if census is not None and len(census.graphs) == 1:
        top = [n for n in census.domain_nodes if n.domain not in RESERVED_DOMAINS]
        nested = [
            n for n in _nested_nodes(model, subgraphs=False) if n.domain not in RESERVED_DOMAINS
        ]
    else:
        top = [n for n in model.graph.node if n.domain not in RESERVED_DOMAINS]
        nested = [n for n in _nested_nodes(model) if n.domain not in RESERVED_DOMAINS]
    _raise_for(
        _problem_lines(top, specs, graph_value_types(model.graph))
        + _problem_lines(nested, specs, None)
    )


def validate_registered(
    model: onnx.ModelProto, registry: KernelRegistry, *, census: ModelCensus | None = None
) -> None:
    """:func:`validate_model` against the kernels ``registry`` holds for ``model``'s custom nodes;
    nodes without a registered kernel are left alone (a file may be meant for another runtime).
    The export calls it before writing, so a mismatch never reaches a file. ``census``: the
    model's (its nodes with a domain; a model without custom nodes is then not walked again)."""
    if census is None:
        nodes: Iterable[onnx.NodeProto] = [*model.graph.node, *_nested_nodes(model)]
    else:
        nodes = itertools.chain(census.domain_nodes, function_nodes(model))
    keys = {(n.domain, n.op_type) for n in nodes if n.domain not in RESERVED_DOMAINS}
    specs = [spec for key in sorted(keys) if (spec := registry.lookup(*key)) is not None]
    if specs:
        validate_model(model, specs, census=census)
