"""One pass over a graph: who produces and who reads each value, and which values are constants.

The matcher (`onnx_custom.rewrite.msda_pattern`) walks from node to node through these maps, so
a file of tens of thousands of nodes is indexed once and every step is a dict lookup. Values read
inside subgraphs (``If``/``Loop`` bodies) count as read by their holding node, so no rewrite
removes a value a subgraph still needs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["GraphIndex"]

_STANDARD = ("", "ai.onnx")


def _subgraph_inputs(node: onnx.NodeProto) -> Iterator[str]:
    """Every value name read by the subgraphs of ``node`` (their own values included: harmless)."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                yield from inner.input
                yield from _subgraph_inputs(inner)


class GraphIndex:
    """Producers, readers and constants of one ``onnx.GraphProto`` (its top level)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes = list(graph.node)
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        #: per node, every value it reads (its inputs, and what its subgraphs read), once each
        self.reads: list[tuple[str, ...]] = []
        for i, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = i
            reads = [name for name in node.input if name]
            if node.attribute:
                reads.extend(_subgraph_inputs(node))
            unique = tuple(dict.fromkeys(reads))
            self.reads.append(unique)
            for name in unique:
                self.readers.setdefault(name, []).append(i)
        self.outputs = {o.name for o in graph.output}
        self.initializers = {t.name: t for t in graph.initializer}
        self._constants: dict[str, np.ndarray | None] = {}

    def node_of(self, name: str) -> onnx.NodeProto | None:
        """The node producing ``name`` (None for graph inputs, initializers and unknown names)."""
        i = self.producer.get(name)
        return None if i is None else self.nodes[i]

    def readers_of(self, name: str) -> list[onnx.NodeProto]:
        return [self.nodes[i] for i in self.readers.get(name, ())]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is an initializer or a ``Constant`` node's output."""
        if name in self._constants:
            return self._constants[name]
        value: np.ndarray | None = None
        if name in self.initializers:
            tensor = self.initializers[name]
            if tensor.data_location != onnx.TensorProto.EXTERNAL and _small(tensor):
                value = numpy_helper.to_array(tensor)
        else:
            node = self.node_of(name)
            if node is not None and node.op_type == "Constant" and node.domain in _STANDARD:
                value = _constant_node_value(node)
        self._constants[name] = value
        return value

    def scalar(self, name: str) -> float | None:
        """A constant holding one number (any rank), as a Python float; else None."""
        value = self.constant(name)
        if value is None or value.size != 1:
            return None
        return float(value.reshape(()))

    def int_list(self, name: str) -> list[int] | None:
        value = self.constant(name)
        if value is None or value.dtype.kind not in "iu":
            return None
        return [int(v) for v in value.reshape(-1)]

    def vector_pieces(self, name: str) -> list[tuple[int, list[int] | None]] | None:
        """A 1-D int64 vector (a Reshape target) as its pieces: (length, values or None when
        computed at run time). Follows ``Concat`` of constants and of ``Unsqueeze``\\ d scalars
        (inside a 1-D ``Concat`` an ``Unsqueeze`` output has one element). None when the length
        of a piece cannot be told."""
        const = self.int_list(name)
        if const is not None:
            return [(len(const), const)]
        node = self.node_of(name)
        if node is None or node.domain not in _STANDARD:
            return None
        if node.op_type == "Concat":
            pieces: list[tuple[int, list[int] | None]] = []
            for part in node.input:
                sub = self.vector_pieces(part)
                if sub is None:
                    return None
                pieces.extend(sub)
            return pieces
        if node.op_type == "Unsqueeze":
            return [(1, None)]
        return None

    def vector_elements(self, name: str) -> list[int | None] | None:
        """The elements of a 1-D int vector, None where computed at run time; None when its
        length is unknown."""
        pieces = self.vector_pieces(name)
        if pieces is None:
            return None
        out: list[int | None] = []
        for length, values in pieces:
            out.extend(values if values is not None else [None] * length)
        return out


def _small(tensor: onnx.TensorProto) -> bool:
    """Few enough elements to read as a constant (shape vectors, scalars), not weights."""
    return int(np.prod(tensor.dims, dtype=np.int64)) <= 64


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(attr.t) if _small(attr.t) else None
        if attr.name == "value_int":
            return np.asarray(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.asarray(list(attr.ints), dtype=np.int64)
        if attr.name == "value_float":
            return np.asarray(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.asarray(list(attr.floats), dtype=np.float32)
    return None
