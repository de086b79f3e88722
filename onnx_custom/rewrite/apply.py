"""Replace each matched MSDA subgraph with one fused node; nothing else changes.

The fused node takes the place of the subgraph's last node and produces the same value name, so
every reader downstream is untouched. The subgraph's nodes are then removed only where nothing
else reads what they produce (a value the rest of the graph also reads keeps its producers), and
so are the initializers only they read. Every other node keeps its position, name and
attributes; every other initializer stays as it was. (H, W) per level and the level start
indices become int64 initializers when the file fixes them, else a few shape nodes read them
from the levels' Reshape targets at run time. transformers' v2 form (the levels' points
concatenated, a count per level) gets a Reshape per input to the per-level layout, after a
zero Pad of each level with fewer points than the largest (weight 0: the same sum).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_custom.rewrite.graph_index import GraphIndex
from onnx_custom.rewrite.msda_pattern import MsdaMatch

__all__ = ["VARIANTS", "FusedNode", "apply_matches"]

#: variant -> (domain, op_type) of the fused node. Both run with onnx-custom's MSDA kernels.
VARIANTS: dict[str, tuple[str, str]] = {
    "custom": ("onnx_custom", "MultiScaleDeformableAttn"),
    "mmdeploy": ("mmdeploy", "MMCVMultiScaleDeformableAttention"),
}
IM2COL_STEP = 64  # mmcv's CUDA batching hint; the result does not depend on it


@dataclasses.dataclass(frozen=True)
class FusedNode:
    """One fused node: its name, the value it produces, levels, and how many nodes it replaced."""

    name: str
    output: str
    levels: int
    removed: int
    static_shapes: bool

    def describe(self) -> str:
        shapes = "constant" if self.static_shapes else "read at run time"
        return (
            f"{self.name!r} -> {self.output!r}: {self.levels} levels, {self.removed} nodes"
            f" replaced, level shapes {shapes}"
        )


class _Names:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.taken = {n.name for n in graph.node} | {t.name for t in graph.initializer}
        for node in graph.node:
            self.taken.update(node.output)
        self.taken.update(i.name for i in graph.input)

    def fresh(self, wanted: str) -> str:
        name, k = wanted, 1
        while name in self.taken:
            name, k = f"{wanted}_{k}", k + 1
        self.taken.add(name)
        return name


def _scope(index: GraphIndex, match: MsdaMatch) -> str:
    """The common name prefix of the matched nodes (TorchScript names nodes by module path)."""
    names = [index.nodes[i].name for i in (*match.grid_samples, match.last)]
    if not all(names):
        return ""
    common: list[str] = []
    for parts in zip(*(n.split("/")[:-1] for n in names), strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return "/".join(common) + "/" if common else ""


def _i64(names: _Names, new_init: list[onnx.TensorProto], wanted: str, values: object) -> str:
    name = names.fresh(wanted)
    new_init.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
    return name


def _shape_inputs(
    match: MsdaMatch, base: str, names: _Names, new_init: list[onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], str, str]:
    """(nodes to add, spatial_shapes, level_start_index)."""
    if match.static:
        hw = np.asarray([[lv.height, lv.width] for lv in match.levels], dtype=np.int64)
        start = np.concatenate(([0], np.cumsum(hw.prod(1))[:-1])).astype(np.int64)
        return (
            [],
            _i64(names, new_init, f"{base}_spatial_shapes", hw),
            _i64(names, new_init, f"{base}_level_start_index", start),
        )
    nodes: list[onnx.NodeProto] = []
    two, four, zero = (
        _i64(names, new_init, f"{base}_{label}", [v])
        for label, v in (("two", 2), ("four", 4), ("zero", 0))
    )
    parts = []
    for k, lv in enumerate(match.levels):
        if lv.height is not None and lv.width is not None:
            parts.append(_i64(names, new_init, f"{base}_level{k}_hw", [lv.height, lv.width]))
            continue
        out = names.fresh(f"{base}_level{k}_hw")
        nodes.append(
            helper.make_node(
                "Slice", [lv.target, two, four, zero], [out], name=names.fresh(f"{base}_Slice{k}")
            )
        )
        parts.append(out)
    flat = names.fresh(f"{base}_hw")
    nodes.append(helper.make_node("Concat", parts, [flat], axis=0, name=names.fresh(f"{base}_Cat")))
    shapes = names.fresh(f"{base}_spatial_shapes")
    pairs = _i64(names, new_init, f"{base}_pairs", [-1, 2])
    nodes.append(
        helper.make_node("Reshape", [flat, pairs], [shapes], name=names.fresh(f"{base}_Pairs"))
    )
    col0 = _i64(names, new_init, f"{base}_col0", 0)
    col1 = _i64(names, new_init, f"{base}_col1", 1)
    h, w, area, starts = (
        names.fresh(f"{base}_{x}") for x in ("h", "w", "area", "level_start_index")
    )
    nodes += [
        helper.make_node("Gather", [shapes, col0], [h], axis=1, name=names.fresh(f"{base}_H")),
        helper.make_node("Gather", [shapes, col1], [w], axis=1, name=names.fresh(f"{base}_W")),
        helper.make_node("Mul", [h, w], [area], name=names.fresh(f"{base}_Area")),
        helper.make_node(
            "CumSum", [area, col0], [starts], exclusive=1, name=names.fresh(f"{base}_Start")
        ),
    ]
    return nodes, shapes, starts


def _per_level_inputs(
    match: MsdaMatch, base: str, names: _Names, new_init: list[onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], str, str]:
    """(nodes to add, sampling locations, attention weights) in the fused node's layout: as
    matched, or for the v2 form the concatenated points reshaped per level, a level with fewer
    points than the largest padded with zeros (weight 0: the same sum)."""
    if not match.points:
        return [], match.sampling_locations, match.attention_weights
    counts = list(match.points)
    levels, points = len(counts), max(counts)
    nodes: list[onnx.NodeProto] = []
    outputs = []
    for source, label, tail in (
        (match.sampling_locations, "locations", [2]),
        (match.attention_weights, "weights", []),
    ):
        laid_out = source
        if len(set(counts)) > 1:
            rank = 4 + len(tail)
            sizes = _i64(names, new_init, f"{base}_{label}_points", counts)
            parts = [names.fresh(f"{base}_{label}_level{k}") for k in range(levels)]
            nodes.append(
                helper.make_node(
                    "Split", [source, sizes], parts, axis=3, name=names.fresh(f"{base}_Split")
                )
            )
            padded = []
            for k, (part, n) in enumerate(zip(parts, counts, strict=True)):
                if n == points:
                    padded.append(part)
                    continue
                pads = [0] * (2 * rank)
                pads[rank + 3] = points - n  # the end of axis 3
                pad_name = _i64(names, new_init, f"{base}_{label}_pads{k}", pads)
                out = names.fresh(f"{base}_{label}_padded{k}")
                nodes.append(
                    helper.make_node(
                        "Pad", [part, pad_name], [out], name=names.fresh(f"{base}_Pad")
                    )
                )
                padded.append(out)
            laid_out = names.fresh(f"{base}_{label}_padded")
            nodes.append(
                helper.make_node(
                    "Concat", padded, [laid_out], axis=3, name=names.fresh(f"{base}_Concat")
                )
            )
        target = _i64(names, new_init, f"{base}_{label}_shape", [0, 0, 0, levels, points, *tail])
        out = names.fresh(f"{base}_{label}_per_level")
        nodes.append(
            helper.make_node(
                "Reshape", [laid_out, target], [out], name=names.fresh(f"{base}_PerLevel")
            )
        )
        outputs.append(out)
    return nodes, outputs[0], outputs[1]


def _candidates(index: GraphIndex, match: MsdaMatch) -> set[int]:
    """Nodes the subgraph's output depends on, up to its boundary values."""
    stop = {match.value, match.sampling_locations, match.attention_weights}
    found: set[int] = set()
    todo = [match.last]
    while todo:
        i = todo.pop()
        if i in found:
            continue
        found.add(i)
        for name in index.reads[i]:
            j = index.producer.get(name)
            if j is not None and name not in stop:
                todo.append(j)
    return found


def apply_matches(
    model: onnx.ModelProto, index: GraphIndex, matches: list[MsdaMatch], variant: str
) -> tuple[onnx.ModelProto, list[FusedNode]]:
    """A copy of ``model`` with every match fused (``model`` itself is not changed)."""
    domain, op_type = VARIANTS[variant]
    graph = model.graph
    names = _Names(graph)
    new_init: list[onnx.TensorProto] = []
    inserted: dict[int, list[onnx.NodeProto]] = {}
    readers = {name: len(ids) for name, ids in index.readers.items()}
    for name in index.outputs:
        readers[name] = readers.get(name, 0) + 1
    candidates: list[set[int]] = []
    bases = []
    for match in matches:
        base = names.fresh(f"{_scope(index, match)}{op_type}")
        bases.append(base)
        extra, shapes, start = _shape_inputs(match, base, names, new_init)
        layout, locations, weights = _per_level_inputs(match, base, names, new_init)
        extra += layout
        fused = helper.make_node(
            op_type,
            [match.value, shapes, start, locations, weights],
            [match.output],
            name=base,
            domain=domain,
            im2col_step=IM2COL_STEP,
        )
        inserted[match.last] = [*extra, fused]
        for node in inserted[match.last]:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        candidates.append(_candidates(index, match))

    removed: set[int] = set()
    fused_nodes = []
    for match, cands, base in zip(matches, candidates, bases, strict=True):
        before = len(removed)
        # the last node's output now comes from the fused node: it goes whatever reads it
        order = sorted(cands, reverse=True)  # readers before producers (topological order)
        removed.add(match.last)
        for name in index.reads[match.last]:
            readers[name] -= 1
        for i in order:
            if i in removed:
                continue
            node = index.nodes[i]
            if any(readers.get(o, 0) for o in node.output if o):
                continue
            removed.add(i)
            for name in index.reads[i]:
                readers[name] -= 1
        fused_nodes.append(
            FusedNode(
                name=base,
                output=match.output,
                levels=len(match.levels),
                removed=len(removed) - before,
                static_shapes=match.static,
            )
        )

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for i, node in enumerate(index.nodes):
        if i in inserted:
            out.graph.node.extend(inserted[i])
        if i not in removed:
            out.graph.node.append(node)
    gone = {o for i in removed for o in index.nodes[i].output} - {m.output for m in matches}
    unused = {n for n in index.initializers if readers.get(n, 0) == 0 and index.readers.get(n)}
    graph_inputs = {i.name for i in graph.input}
    kept_init = [t for t in out.graph.initializer if t.name not in unused or t.name in graph_inputs]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_init)
    out.graph.initializer.extend(new_init)
    kept_info = [v for v in out.graph.value_info if v.name not in gone]
    del out.graph.value_info[:]
    out.graph.value_info.extend(kept_info)
    if matches and not any(o.domain == domain for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(domain, 1))
    return out, fused_nodes
