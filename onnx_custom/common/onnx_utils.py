"""Small ONNX helpers shared by export, verification, inspection and the kernel host."""

from __future__ import annotations

from collections.abc import Iterator

import onnx

__all__ = ["iter_nodes"]


def _graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_nodes(attr.g)
            for sub in attr.graphs:
                yield from _graph_nodes(sub)


def iter_nodes(model: onnx.ModelProto, *, functions: bool = True) -> Iterator[onnx.NodeProto]:
    """Every node of ``model``: the main graph, nested subgraphs and (optionally) local functions."""
    yield from _graph_nodes(model.graph)
    if functions:
        for function in model.functions:
            for node in function.node:
                yield node
                for attr in node.attribute:
                    if attr.type == onnx.AttributeProto.GRAPH:
                        yield from _graph_nodes(attr.g)
                    for sub in attr.graphs:
                        yield from _graph_nodes(sub)
