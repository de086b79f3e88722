"""``fuse=`` for graphs already traced: the ``torch.compile`` backend's form of `fusing`.

Dynamo has inlined every module by the time a backend sees the graph, but each node keeps the
module stack it came from (``meta["nn_module_stack"]``). The nodes of one recognised attention
module instance form a region; the region's tensor inputs are ``value`` (4-D), the sampling
locations (6-D) and the attention weights (5-D), its levels are the maps its ``grid_sample``
calls read. The region is replaced by one call of our op when it has exactly one output and its
level sizes are static, after the same numeric check as `fusing` (on the backend's example
inputs). The function form (mmcv's) leaves no module stack, so it is not fused here, nor is
transformers' v2 attention (its module computes the projections too, not only MSDA).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from onnx_custom.fusion import msda
from onnx_custom.fusion.core import TOLERANCES, FusionReport, FusionSite, check_fuse

__all__ = ["fuse_graph"]

_GRID_SAMPLE = (torch.nn.functional.grid_sample, torch.grid_sampler)


@dataclasses.dataclass
class _Region:
    path: str
    cls: type
    nodes: list[fx.Node]
    site: FusionSite | None = None

    def refuse(self, reason: str, diff: float | None = None) -> None:
        self.site = FusionSite(self.path, _qualname(self.cls), msda.MSDA_OP, False, reason, 1, diff)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _regions(gm: fx.GraphModule, classes: Sequence[type]) -> list[_Region]:
    found: dict[str, _Region] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        for path, cls in (node.meta.get("nn_module_stack") or {}).values():
            if isinstance(cls, type) and issubclass(cls, tuple(classes)):
                name = re.sub(r"^L\['self'\]\.?", "", str(path))  # dynamo's name of the model
                found.setdefault(name, _Region(name, cls, [])).nodes.append(node)
                break
    return list(found.values())


def _example(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else node


def _plan(gm: fx.GraphModule, region: _Region) -> tuple[list[fx.Node], fx.Node, list[Any]] | None:
    """(value, locations, weights), the output node and the level sizes; None (and the reason
    in ``region.site``) when the region is not MSDA-shaped."""
    members = set(region.nodes)
    inputs: list[fx.Node] = []
    for node in region.nodes:
        for arg in node.all_input_nodes:
            if arg not in members and arg not in inputs:
                inputs.append(arg)
    outputs = [n for n in region.nodes if any(u not in members for u in n.users)]
    if len(outputs) != 1:
        region.refuse(f"the traced region has {len(outputs)} outputs; expected 1")
        return None
    by_rank: dict[int, list[fx.Node]] = {}
    for arg in inputs:
        example = _example(arg)
        if isinstance(example, torch.Tensor) and example.is_floating_point():
            by_rank.setdefault(example.dim(), []).append(arg)
        elif not isinstance(example, (torch.Tensor, int, float, bool)) and example is not None:
            region.refuse("its level sizes are symbolic (dynamic shapes): fused only when static")
            return None
    if any(len(by_rank.get(rank, ())) != 1 for rank in (4, 5, 6)):
        region.refuse("its inputs are not one value (4-D), locations (6-D) and weights (5-D)")
        return None
    grids = [n for n in region.nodes if n.target in _GRID_SAMPLE]
    sizes = [tuple(_example(n.args[0]).shape[-2:]) for n in grids]
    if not grids or not all(isinstance(v, int) for pair in sizes for v in pair):
        region.refuse("its level sizes are symbolic (dynamic shapes): fused only when static")
        return None
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    if any(order[a] > order[outputs[0]] for a in inputs):
        region.refuse("an input is computed after the region's output")
        return None
    return [by_rank[4][0], by_rank[6][0], by_rank[5][0]], outputs[0], sizes


class _Capture(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, wanted: set[fx.Node]) -> None:
        super().__init__(gm)
        self.wanted = wanted
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n in self.wanted:
            self.values[n] = result
        return result


def _level_tensors(sizes: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = torch.tensor(sizes, dtype=torch.int64)
    areas = shapes[:, 0] * shapes[:, 1]
    return shapes, torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])


def _int64_node(graph: fx.Graph, values: torch.Tensor) -> fx.Node:
    """Nodes computing the int64 tensor ``values`` (a ``full`` per element, concatenated)."""
    parts = [
        graph.call_function(torch.full, ((1,), int(v)), {"dtype": torch.int64})
        for v in values.flatten().tolist()
    ]
    flat = graph.call_function(torch.cat, (parts,))
    return graph.call_method("view", (flat, *values.shape))


def fuse_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], fuse: Any) -> FusionReport:
    """Replace each recognised attention module's region of ``gm`` by our op (in place)."""
    # the v2 attention classes (``inner`` rules) compute more than MSDA: not a region to replace
    classes = [r.target for r in check_fuse(fuse) if r.is_module and r.inner is None]
    regions = _regions(gm, classes) if classes else []
    plans = {id(r): _plan(gm, r) for r in regions}
    wanted = {n for p in plans.values() if p is not None for n in (*p[0], p[1])}
    values: dict[fx.Node, Any] = {}
    if wanted:
        capture = _Capture(gm, wanted)
        with torch.no_grad():
            capture.run(*example_inputs)
        values = capture.values
    changed = False
    for region in regions:
        plan = plans[id(region)]
        if plan is None:
            continue
        (value, locations, weights), output, sizes = plan
        shapes, starts = _level_tensors(sizes)
        expected = values[output]
        try:
            with torch.no_grad():
                ours = torch.ops.onnx_custom.multi_scale_deformable_attn(
                    values[value], shapes, starts, values[locations], values[weights], 64
                )
        except Exception as exc:
            region.refuse(f"our op refused the region's inputs: {type(exc).__name__}: {exc}"[:300])
            continue
        rtol, atol = TOLERANCES.get(expected.dtype, (1e-4, 1e-5))
        if ours.shape != expected.shape:
            region.refuse(
                f"our op's output is {tuple(ours.shape)}, the region's {tuple(expected.shape)}"
            )
            continue
        diff = float((ours - expected).abs().max()) if expected.numel() else 0.0
        if not torch.allclose(ours, expected, rtol=rtol, atol=atol, equal_nan=True):
            region.refuse(
                f"the numeric check failed on the example input (max |diff| {diff:.3g}): it"
                " computes something else (a changed subclass, other align_corners/padding?)",
                diff,
            )
            continue
        with gm.graph.inserting_before(output):
            # factory calls, not tensor constants: the graph's constants must come from dynamo
            shape_node = _int64_node(gm.graph, shapes)
            start_node = _int64_node(gm.graph, starts)
            fused = gm.graph.call_function(
                torch.ops.onnx_custom.multi_scale_deformable_attn.default,
                (value, shape_node, start_node, locations, weights, 64),
            )
        fused.meta.update(output.meta)
        output.replace_all_uses_with(fused)
        changed = True
        region.site = FusionSite(
            region.path, _qualname(region.cls), msda.MSDA_OP, True, "", 1, diff
        )
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return FusionReport([r.site for r in regions if r.site is not None])
