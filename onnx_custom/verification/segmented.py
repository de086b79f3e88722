"""Running an ONNX graph segment by segment, to read many intermediate values a few at a time.

Localization compares hundreds of intermediates. Making all of them graph outputs of one run
keeps every one alive at once (hundreds of MiB for a mid-size CNN). Instead the node list (in
the file's topological order) is cut into consecutive segments whose wanted values fit a byte
budget; each segment becomes its own small model whose inputs are the values it reads from
earlier segments (carried as ``OrtValue``s) and whose outputs are its wanted values plus what
later segments read. Segments run lazily, as the caller asks for values, so the caller can
consume and drop each value before the next segment runs. Every node still runs exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnx_custom.common.external_data import session_source
from onnx_custom.verification.runner import _from_ort_value, custom_node_types

__all__ = ["SegmentedRun"]

# Peak memory vs sessions (benchmarks/verify_cost.py, DCN net): budgets from 1 to 8 MiB cost the
# same CPU time within noise, while the peak RSS the segments add grows with the budget.
DEFAULT_BUDGET_BYTES = 1 << 20
_UNKNOWN_VALUE_BYTES = 1 << 20  # a value whose shape the file does not state


def _subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names read inside ``node``'s subgraphs (If/Loop/Scan bodies)."""
    found: list[str] = []

    def visit(graph: onnx.GraphProto, bound: set[str]) -> None:
        bound = bound | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        for inner in graph.node:
            found.extend(n for n in inner.input if n and n not in bound)
            for attr in inner.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else []) + list(
                    attr.graphs
                ):
                    visit(sub, bound)
            bound |= set(inner.output)

    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else []) + list(attr.graphs):
            visit(sub, set())
    return found


def _reads(node: onnx.NodeProto) -> list[str]:
    return list(dict.fromkeys([n for n in node.input if n] + _subgraph_reads(node)))


def _value_bytes(info: onnx.ValueInfoProto | None) -> int:
    if info is None or not info.type.HasField("tensor_type"):
        return _UNKNOWN_VALUE_BYTES
    tensor = info.type.tensor_type
    if not tensor.HasField("shape") or any(not d.HasField("dim_value") for d in tensor.shape.dim):
        return _UNKNOWN_VALUE_BYTES
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 4
    return int(np.prod([d.dim_value for d in tensor.shape.dim], dtype=np.int64)) * itemsize


def _session(model: onnx.ModelProto, kernels: Any) -> ort.InferenceSession:
    """A session for one segment, without ORT's memory arena: a segment runs once, and the arena
    (growing by powers of two, kept until the session goes) would hold up to twice its values.
    Plain ORT unless the segment has custom nodes (then our kernel host)."""
    from onnx_custom.runtime.ort_log_level import quiet_session_options

    options = quiet_session_options()  # failures are reported by localize, not ORT's log
    options.enable_cpu_mem_arena = False
    # No spin-waiting between a segment's ops: a spinning pool burns the CPU time of a whole
    # core per thread (about twice the CPU time for one run of the DCN net, at the same wall time).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if not custom_node_types(model):
        with session_source(model) as source:  # a temporary model + data pair past 2 GiB
            return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    from onnx_custom.runtime import InferenceSession

    return InferenceSession(model, options, kernels=kernels)


class _OrtValueArray:
    """Exposes an ``OrtValue``'s CPU buffer to NumPy and owns the value: ``np.asarray`` of it is a
    zero-copy array whose base keeps the OrtValue (and so its buffer) alive, by NumPy's own rules.
    """

    def __init__(self, value: ort.OrtValue) -> None:
        self.value = value
        # The array is held too: ORT's numpy() is a view of the OrtValue's buffer today, and
        # holding it keeps the interface valid even if a later ORT returns a copy.
        self.array = value.numpy()
        self.__array_interface__ = self.array.__array_interface__


def _array_of(value: ort.OrtValue, name: str) -> np.ndarray:
    """``value`` as a NumPy array without copying when it is a plain CPU tensor (a wanted value is
    read once, so a copy would only double the segment's memory); else `_from_ort_value`'s copy."""
    if (
        value.is_tensor()
        and value.element_type() != onnx.TensorProto.BFLOAT16
        and value.tensor_size_in_bytes() > 0
        and value.device_name().lower() == "cpu"
    ):
        return np.asarray(_OrtValueArray(value))
    return _from_ort_value(value, name)


def _input_info(name: str, value: ort.OrtValue) -> onnx.ValueInfoProto:
    """A segment input typed like the value that feeds it (static shape: it runs once)."""
    return onnx.helper.make_tensor_value_info(name, value.element_type(), value.shape())


class SegmentedRun:
    """Lazily runs ``proto`` on ``feeds`` segment by segment;
    ``take(name)`` hands out wanted values.

    ``feeds``: the graph inputs as ``OrtValue``s. ``wanted``: names of values the caller will ask
    for, once per occurrence (node outputs of the main graph; graph inputs and initializers are
    handed out as they are). Values come back as NumPy arrays (bfloat16 as ml_dtypes).
    """

    def __init__(
        self,
        proto: onnx.ModelProto,
        feeds: Mapping[str, ort.OrtValue],
        wanted: Iterable[str],
        *,
        kernels: Any = None,
        budget_bytes: int | None = None,
    ) -> None:
        self._proto = proto
        self._kernels = kernels
        graph = proto.graph
        self._nodes = list(graph.node)
        self._initializers = {i.name: i for i in graph.initializer}
        self._reads = [_reads(n) for n in self._nodes]
        self._producer = {
            out: i for i, node in enumerate(self._nodes) for out in node.output if out
        }
        wanted = list(wanted)
        self._wanted = Counter(w for w in wanted if w in self._producer)
        self._direct = {
            w: _from_ort_value(feeds[w], w)
            for w in wanted
            if w in feeds and w not in self._producer
        }
        self._direct |= {
            w: onnx.numpy_helper.to_array(self._initializers[w])
            for w in wanted
            if w in self._initializers and w not in self._direct
        }
        self._segments = self._cut(
            graph, DEFAULT_BUDGET_BYTES if budget_bytes is None else budget_bytes
        )
        self._segment_of_node = [0] * len(self._nodes)
        for s, (start, end) in enumerate(self._segments):
            for i in range(start, end):
                self._segment_of_node[i] = s
        # The last segment reading each value decides how long it is carried.
        self._last_read: dict[str, int] = {}
        for i, names in enumerate(self._reads):
            for name in names:
                self._last_read[name] = self._segment_of_node[i]
        self._carried: dict[str, ort.OrtValue] = dict(feeds)
        self._ready: dict[str, np.ndarray] = {}
        self._next = 0

    @property
    def segments(self) -> int:
        return len(self._segments)

    def _cut(self, graph: onnx.GraphProto, budget: int) -> list[tuple[int, int]]:
        infos = {v.name: v for v in (*graph.value_info, *graph.output)}
        segments: list[tuple[int, int]] = []
        start, used = 0, 0
        for i, node in enumerate(self._nodes):
            used += sum(_value_bytes(infos.get(o)) for o in node.output if o in self._wanted)
            if used >= budget:
                segments.append((start, i + 1))
                start, used = i + 1, 0
        if start < len(self._nodes):
            segments.append((start, len(self._nodes)))
        return segments

    def take(self, name: str) -> np.ndarray | None:
        """The value ``name`` (running segments up to its producer); None if it is not wanted.

        Once handed out as often as it was wanted, the run keeps no reference to it.
        """
        if name in self._direct:
            return self._direct[name]
        if self._wanted[name] <= 0:
            return None
        segment = self._segment_of_node[self._producer[name]]
        while self._next <= segment:
            self._run_segment(self._next)
            self._next += 1
        self._wanted[name] -= 1
        return self._ready[name] if self._wanted[name] else self._ready.pop(name, None)

    def _run_segment(self, s: int) -> None:
        start, end = self._segments[s]
        nodes = self._nodes[start:end]
        made = {out for node in nodes for out in node.output if out}
        reads = list(dict.fromkeys(name for i in range(start, end) for name in self._reads[i]))
        inputs = [
            n for n in reads if n not in made and n not in self._initializers and n in self._carried
        ]
        initializers = [
            self._initializers[n] for n in reads if n not in made and n in self._initializers
        ]
        outputs = [o for o in made if o in self._wanted or self._last_read.get(o, -1) > s]
        if outputs:
            graph = onnx.helper.make_graph(
                nodes,
                f"{self._proto.graph.name or 'graph'}_segment{s}",
                [_input_info(n, self._carried[n]) for n in inputs],
                [onnx.ValueInfoProto(name=o) for o in outputs],  # ORT types untyped outputs itself
                initializer=initializers,
            )
            model = onnx.helper.make_model(
                graph, opset_imports=self._proto.opset_import, ir_version=self._proto.ir_version
            )
            model.functions.extend(self._proto.functions)
            session = _session(model, self._kernels)
            values = session.run_with_ort_values(outputs, {n: self._carried[n] for n in inputs})
            del session  # its arena goes before the next segment's
            for name in outputs:
                value = values.pop(0)  # each ORT buffer goes once its array is dropped
                if self._last_read.get(name, -1) > s:
                    self._carried[name] = value
                if name in self._wanted:
                    self._ready[name] = _array_of(
                        value, name
                    )  # the OrtValue's own buffer; bfloat16-safe
        for name in [n for n in self._carried if self._last_read.get(n, -1) <= s]:
            del self._carried[name]  # no later segment reads it
