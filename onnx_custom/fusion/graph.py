"""``fuse=`` for graphs already traced: the ``torch.compile`` backend's form of `fusing`.

Dynamo has inlined every module and function by the time a backend sees the graph, but each node
keeps the module stack it came from (``meta["nn_module_stack"]``) and the Python frames that made
it (``meta["stack_trace"]``). The nodes of one recognised attention module instance form a
region; so do the nodes of one call of a recognised function (mmcv's, Mask2Former's, yours: the
consecutive nodes made while that function's code ran). The region's tensor inputs are ``value``
(4-D), the sampling locations (6-D) and the attention weights (5-D), its levels are the maps its
``grid_sample`` calls read. The region is replaced by one call of our op when it has exactly one
output, after the same numeric check as `fusing` (on the backend's example inputs). Level sizes
that are symbolic (``dynamic=True``, sizes that follow the input) are read from those maps in the
graph, so the fused graph stays dynamic. transformers' v2 attention is not
fused here (its module computes the projections too, not only MSDA).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from onnx_custom.fusion import msda
from onnx_custom.fusion.core import TOLERANCES, FusionReport, FusionSite, check_fuse

__all__ = ["fuse_graph"]

_GRID_SAMPLE = (torch.nn.functional.grid_sample, torch.grid_sampler)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@dataclasses.dataclass
class _Region:
    path: str
    cls: Any  # the module class, or the function
    nodes: list[fx.Node]
    site: FusionSite | None = None

    def refuse(self, reason: str, diff: float | None = None) -> None:
        self.site = FusionSite(self.path, _qualname(self.cls), msda.MSDA_OP, False, reason, 1, diff)


def _qualname(cls: Any) -> str:
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


def _code_span(fn: Callable[..., Any]) -> tuple[str, str, int, int] | None:
    """(file, name, first line, last line) of ``fn``'s code; None for non-Python callables."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    lines = [line for _, _, line in code.co_lines() if line is not None]
    return code.co_filename, code.co_name, code.co_firstlineno, max(lines, default=0)


def _call_key(node: fx.Node, span: tuple[str, str, int, int]) -> tuple[Any, ...] | None:
    """The frames down to (and including) the call of ``span``'s function that made ``node``;
    None when that function was not running."""
    filename, name, first, last = span
    frames = _FRAME.findall(str(node.meta.get("stack_trace") or ""))
    for i, (file, line, function) in enumerate(frames):
        if function == name and file == filename and first <= int(line) <= last:
            return tuple(frames[:i])
    return None


def _function_regions(
    gm: fx.GraphModule, functions: Sequence[Callable[..., Any]], taken: set[fx.Node]
) -> list[_Region]:
    """One region per call of each function: the consecutive nodes made by that call (from the
    same caller frames); nodes of a module region are left to it."""
    regions: list[_Region] = []
    for fn in functions:
        span = _code_span(fn)
        if span is None:
            continue
        runs: list[list[fx.Node]] = []
        previous: tuple[Any, ...] | None = None
        for node in gm.graph.nodes:
            if node.op not in ("call_function", "call_method", "call_module") or node in taken:
                continue
            key = _call_key(node, span)
            if key is not None and key == previous:
                runs[-1].append(node)
            elif key is not None:
                runs.append([node])
            previous = key
        name = _qualname(fn)
        for i, nodes in enumerate(runs):
            path = name if len(runs) == 1 else f"{name} (call {i + 1})"
            regions.append(_Region(path, fn, nodes))
    return regions


def _concrete(value: Any) -> Any:
    """An example input as a plain value: a SymInt (``dynamic=True``) becomes its hint."""
    if isinstance(value, _SYMBOLIC):
        hint = getattr(value.node, "hint", None)
        if hint is None:
            raise ValueError(f"the example input {value} has no concrete value")
        return hint
    return value


def _example(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else node


def _plan(
    gm: fx.GraphModule, region: _Region
) -> tuple[list[fx.Node], fx.Node, list[Any], list[fx.Node]] | None:
    """(value, locations, weights), the output node, the level sizes (ints or SymInts) and the
    level maps; None (and the reason in ``region.site``) when the region is not MSDA-shaped."""
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
    if any(len(by_rank.get(rank, ())) != 1 for rank in (4, 5, 6)):
        region.refuse("its inputs are not one value (4-D), locations (6-D) and weights (5-D)")
        return None
    grids = [n for n in region.nodes if n.target in _GRID_SAMPLE]
    maps = [m for n in grids if isinstance(m := n.args[0], fx.Node)]
    traced = all(isinstance(_example(m), torch.Tensor) for m in maps)
    if not grids or len(maps) != len(grids) or not traced:
        region.refuse("no grid_sample reads a level map of the region")
        return None
    sizes = [tuple(_example(m).shape[-2:]) for m in maps]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    if any(order[a] > order[outputs[0]] for a in inputs):
        region.refuse("an input is computed after the region's output")
        return None
    return [by_rank[4][0], by_rank[6][0], by_rank[5][0]], outputs[0], sizes, maps


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


def _level_nodes(graph: fx.Graph, sizes: list[Any], maps: list[fx.Node]) -> tuple[fx.Node, fx.Node]:
    """Nodes computing the level shapes and start index, symbolic sizes read off the maps."""
    parts = []
    for (h, w), level_map in zip(sizes, maps, strict=True):
        for dim, size in ((-2, h), (-1, w)):
            fill = size if isinstance(size, int) else graph.call_method("size", (level_map, dim))
            parts.append(graph.call_function(torch.full, ((1,), fill), {"dtype": torch.int64}))
    flat = graph.call_function(torch.cat, (parts,))
    shapes = graph.call_method("view", (flat, len(sizes), 2))
    areas = graph.call_function(torch.prod, (shapes, 1))
    ends = graph.call_function(torch.cumsum, (areas, 0))
    return shapes, graph.call_function(torch.sub, (ends, areas))


def fuse_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], fuse: Any) -> FusionReport:
    """Replace each recognised attention module's region, and each call of a recognised
    function, of ``gm`` by our op (in place)."""
    # the v2 attention classes (``inner`` rules) compute more than MSDA: not a region to replace
    classes = [r.target for r in check_fuse(fuse) if r.is_module and r.inner is None]
    regions = _regions(gm, classes) if classes else []
    functions = [  # the function form of MSDA (not a user's replacement pair, not bev_pool_v2)
        r.target
        for r in check_fuse(fuse)
        if not r.is_module and r.replacement is msda.msda_from_function_args
    ]
    if functions:
        taken = {n for r in regions for n in r.nodes}
        regions += _function_regions(gm, functions, taken)
    plans = {id(r): _plan(gm, r) for r in regions}
    wanted = {n for p in plans.values() if p is not None for n in (*p[0], p[1], *p[3])}
    values: dict[fx.Node, Any] = {}
    if wanted:
        try:
            concrete = [_concrete(v) for v in example_inputs]
        except ValueError as exc:
            for region in regions:
                if plans[id(region)] is not None:
                    region.refuse(f"no numeric check possible: {exc}")
            return FusionReport([r.site for r in regions if r.site is not None])
        capture = _Capture(gm, wanted)
        with torch.no_grad():
            capture.run(*concrete)
        values = capture.values
    changed = False
    for region in regions:
        plan = plans[id(region)]
        if plan is None:
            continue
        (value, locations, weights), output, sizes, maps = plan
        static = all(isinstance(v, int) for pair in sizes for v in pair)
        concrete_sizes = [tuple(values[m].shape[-2:]) for m in maps]
        shapes, starts = _level_tensors(concrete_sizes)
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
            if static:
                shape_node = _int64_node(gm.graph, shapes)
                start_node = _int64_node(gm.graph, starts)
            else:
                shape_node, start_node = _level_nodes(gm.graph, sizes, maps)
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
