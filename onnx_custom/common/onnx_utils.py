"""Small ONNX helpers shared by export, verification, inspection and the kernel host."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import onnx

__all__ = ["HALF_ELEM_TYPES", "ModelCensus", "function_nodes", "iter_nodes", "model_census"]

HALF_ELEM_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def _nodes_within(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and every node of the subgraphs they hold, recursively."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes_within(attr.g.node)
            for sub in attr.graphs:
                yield from _nodes_within(sub.node)


def iter_nodes(model: onnx.ModelProto, *, functions: bool = True) -> Iterator[onnx.NodeProto]:
    """Every node of ``model``: the main graph, nested subgraphs and
    (optionally) local functions."""
    yield from _nodes_within(model.graph.node)
    if functions:
        yield from function_nodes(model)


def function_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``model``'s local functions, nested subgraphs included."""
    for function in model.functions:
        yield from _nodes_within(function.node)


@dataclasses.dataclass(frozen=True)
class ModelCensus:
    """What the export's passes over a fresh model need to know, read in one walk (`model_census`).

    Reading a node's names and attributes through protobuf costs microseconds (upb makes a Python
    object per field access); half a dozen passes each walking every node was most of a small
    export's own overhead. The facts stay true while passes only rename values, drop attributes
    or add nodes without subgraphs, as the export's passes do; `names` only until a pass renames
    values or adds nodes.
    """

    #: the main graph, then every graph nested in a node attribute
    graphs: tuple[onnx.GraphProto, ...]
    #: every node input and output name of those graphs
    names: frozenset[str]
    #: the nodes of those graphs with a non-empty domain
    domain_nodes: tuple[onnx.NodeProto, ...]
    #: the nodes of those graphs reading or writing a main-graph output
    output_users: tuple[onnx.NodeProto, ...]
    #: a main-graph node attribute ``to`` or tensor attribute is float16/bfloat16
    half_attributes: bool

    def nodes(self) -> Iterator[onnx.NodeProto]:
        """Every node of `graphs` (local functions not included)."""
        for graph in self.graphs:
            yield from graph.node


def model_census(model: onnx.ModelProto) -> ModelCensus:
    """One walk over ``model``'s main graph and its subgraphs (not its local functions)."""
    graphs: list[onnx.GraphProto] = []
    names: set[str] = set()
    domain_nodes: list[onnx.NodeProto] = []
    users: list[onnx.NodeProto] = []
    outputs = {o.name for o in model.graph.output}
    half = False
    pending = [model.graph]
    while pending:
        graph = pending.pop()
        main = not graphs
        graphs.append(graph)
        for node in graph.node:
            inputs, produced = list(node.input), list(node.output)
            names.update(inputs)
            names.update(produced)
            if not (outputs.isdisjoint(inputs) and outputs.isdisjoint(produced)):
                users.append(node)
            if node.domain:
                domain_nodes.append(node)
            for attr in node.attribute:
                kind = attr.type
                if kind == onnx.AttributeProto.GRAPH:
                    pending.append(attr.g)
                elif kind == onnx.AttributeProto.GRAPHS:
                    pending.extend(attr.graphs)
                elif main and not half:
                    half = (attr.name == "to" and attr.i in HALF_ELEM_TYPES) or (
                        kind == onnx.AttributeProto.TENSOR and attr.t.data_type in HALF_ELEM_TYPES
                    )
    return ModelCensus(tuple(graphs), frozenset(names), tuple(domain_nodes), tuple(users), half)
