"""Find the pure-PyTorch multi-scale deformable attention in an exported ONNX graph.

The formulation (transformers' ``MultiScaleDeformableAttention``, mmcv's
``multi_scale_deformable_attn_pytorch`` and their copies), as both torch exporters write it at
opsets 16-21, static or symbolic dims::

    value (bs, keys, heads, dim) --Split(axis 1)--> one part per level
        part_l --Reshape/Flatten--> --Transpose[0,2,1]--> --Reshape (bs*heads, dim, H_l, W_l)--> X_l
    sampling_locations (bs, Q, heads, L, P, 2) --Mul 2--> --Sub 1-->
        --Gather(axis 3, l)--> --Transpose[0,2,1,3,4]--> --Reshape (bs*heads, Q, P, 2)--> grid_l
    GridSample(X_l, grid_l; bilinear, zeros, align_corners 0) --Unsqueeze(-2)--> Concat(-2)
        --Reshape--> Mul(weights) --ReduceSum(-1)--> --Reshape--> --Transpose[0,2,1]--> output
    attention_weights (bs, Q, heads, L, P) --Transpose[0,2,1,3,4]--> --Reshape--> weights

One ``GridSample`` per level, so the number of levels varies from file to file: a hand matcher
anchored on the ``GridSample`` nodes (a fixed-size pattern of onnxscript's rewriter would need
one rule per level count, and could not say which step of an almost-matching chain differed).
Every ``GridSample`` that is not part of a match becomes a `NearMiss` naming the first step that
differed. (H, W) per level come from the level's Reshape target: constants, or for symbolic
dims the run-time elements of that target (`LevelShape`).

transformers' v2 form (RT-DETRv2, D-FINE, DEIMv2) concatenates the levels' samples on the points
axis instead (`_match_v2`); the match then carries the points per level (`MsdaMatch.points`).
"""

from __future__ import annotations

import dataclasses

import onnx

from onnx_custom.rewrite.graph_index import GraphIndex

__all__ = ["LevelShape", "MsdaMatch", "NearMiss", "find_msda"]

_STANDARD = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class LevelShape:
    """(H, W) of one level: ``height``/``width`` when constant, else read at run time from
    elements 2 and 3 of ``target`` (the 1-D Reshape target that made the level's image)."""

    target: str
    height: int | None
    width: int | None


@dataclasses.dataclass(frozen=True)
class MsdaMatch:
    """One recognised MSDA subgraph: its boundary values and the nodes that end it."""

    value: str
    sampling_locations: str
    attention_weights: str
    output: str  # produced by `last`; the fused node produces it instead
    last: int  # node index of the final Transpose
    grid_samples: tuple[int, ...]  # node indices, level order
    levels: tuple[LevelShape, ...]
    affine: tuple[int, ...] = ()  # the Mul/Sub nodes of 2 * loc - 1
    # transformers' v2 form: the points per level. Then ``sampling_locations`` is (bs, Q, heads,
    # sum(points), 2) and ``attention_weights`` (bs, Q, heads, sum(points)), the levels' points
    # concatenated; the fused node reads them laid out per level (padded with weight 0).
    points: tuple[int, ...] = ()

    @property
    def static(self) -> bool:
        return all(lv.height is not None and lv.width is not None for lv in self.levels)


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """``GridSample`` nodes that look like MSDA but were not fused, and why."""

    nodes: tuple[str, ...]
    reason: str

    def describe(self) -> str:
        shown = ", ".join(repr(n) for n in self.nodes[:4])
        more = f" (+{len(self.nodes) - 4} more)" if len(self.nodes) > 4 else ""
        return f"GridSample {shown}{more}: {self.reason}"


class _Miss(Exception):
    def __init__(self, reason: str, grid_samples: tuple[int, ...] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.grid_samples = grid_samples


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for attr in node.attribute:
        if attr.name == name:
            value = onnx.helper.get_attribute_value(attr)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


class _Walker:
    def __init__(self, index: GraphIndex, ranks: dict[str, int]) -> None:
        self.ix = index
        self.ranks = ranks

    def producer(self, name: str, op_types: tuple[str, ...], what: str) -> onnx.NodeProto:
        node = self.ix.node_of(name)
        if node is None or node.op_type not in op_types or node.domain not in _STANDARD:
            found = "a graph input or weight" if node is None else f"a {node.op_type} node"
            raise _Miss(f"{what}: expected {' or '.join(op_types)}, found {found}")
        return node

    def reader(self, name: str, op_type: str, what: str) -> onnx.NodeProto:
        found = [n for n in self.ix.readers_of(name) if n.op_type == op_type]
        if len(found) != 1 or found[0].domain not in _STANDARD:
            others = sorted({n.op_type for n in self.ix.readers_of(name)}) or ["nothing"]
            raise _Miss(f"{what}: expected one {op_type} reading it, found {', '.join(others)}")
        return found[0]

    def axes(self, node: onnx.NodeProto) -> list[int] | None:
        """The ``axes`` of an Unsqueeze/ReduceSum: an attribute (old opsets) or input 1."""
        value = _attr(node, "axes", None)
        if value is not None:
            return list(value)  # type: ignore[call-overload]
        return self.ix.int_list(node.input[1]) if len(node.input) > 1 else None

    def perm(self, node: onnx.NodeProto, expected: list[int], what: str) -> None:
        perm = list(_attr(node, "perm", []))  # type: ignore[call-overload]
        if perm != expected:
            raise _Miss(f"{what}: Transpose perm {perm}, expected {expected}")

    def rank(self, name: str) -> int | None:
        """The rank of ``name``: declared in the file, or the length of its Reshape target."""
        if name in self.ranks:
            return self.ranks[name]
        node = self.ix.node_of(name)
        if node is not None and node.op_type == "Reshape" and len(node.input) > 1:
            elements = self.ix.vector_elements(node.input[1])
            if elements is not None:
                return len(elements)
        return None


def _check_grid_sample(w: _Walker, node: onnx.NodeProto) -> None:
    name = _label(node)
    mode = _attr(node, "mode", "bilinear")
    if mode not in ("bilinear", "linear"):
        raise _Miss(f"{name!r} has mode={mode!r}; the fused op samples bilinearly")
    padding = _attr(node, "padding_mode", "zeros")
    if padding != "zeros":
        raise _Miss(f"{name!r} has padding_mode={padding!r}; the fused op pads with zeros")
    if _attr(node, "align_corners", 0) != 0:
        raise _Miss(f"{name!r} has align_corners=1; the fused op samples with align_corners=0")
    for role, value in (("X", node.input[0]), ("grid", node.input[1])):
        rank = w.rank(value)
        if rank is not None and rank != 4:
            raise _Miss(
                f"{name!r} is a {rank}-D GridSample ({role} has rank {rank}); the fused op"
                " samples 2-D levels (4-D X and grid)"
            )


def _stack(w: _Walker, gs: onnx.NodeProto) -> tuple[onnx.NodeProto, list[onnx.NodeProto]]:
    """The Concat stacking the levels, and the GridSample of each level in stack order."""
    unsqueeze = w.reader(gs.output[0], "Unsqueeze", f"the output of {_label(gs)!r}")
    concat = w.reader(unsqueeze.output[0], "Concat", "the levels' stack (Unsqueeze -> Concat)")
    if _attr(concat, "axis", None) not in (-2, 3):
        raise _Miss(f"the levels are stacked on axis {_attr(concat, 'axis', None)}, expected -2")
    levels = []
    for part in concat.input:
        unsq = w.producer(part, ("Unsqueeze",), "a stacked level")
        if w.axes(unsq) not in ([-2], [3]):
            raise _Miss(f"a level is unsqueezed on axes {w.axes(unsq)}, expected [-2]")
        levels.append(w.producer(unsq.input[0], ("GridSample",), "a stacked level"))
    return concat, levels


def _affine_source(w: _Walker, name: str) -> tuple[str, tuple[int, int]]:
    """``loc`` for ``name = 2 * loc - 1`` (Sub 1 or Add -1 of a Mul by 2, either operand order),
    and the indices of those two nodes."""
    node = w.producer(name, ("Sub", "Add"), "the sampling grid (2 * loc - 1)")
    minus_one = -1.0 if node.op_type == "Sub" else 1.0
    if w.ix.scalar(node.input[1]) != -minus_one:
        raise _Miss(f"the sampling grid is not 2 * loc - 1 ({node.op_type} of another constant)")
    mul = w.producer(node.input[0], ("Mul",), "the sampling grid (2 * loc - 1)")
    nodes = (w.ix.producer[mul.output[0]], w.ix.producer[node.output[0]])
    for ours, other in ((0, 1), (1, 0)):
        if w.ix.scalar(mul.input[ours]) == 2.0:
            return mul.input[other], nodes
    raise _Miss("the sampling grid is not 2 * loc - 1 (Mul by another value than 2)")


def _level(
    w: _Walker, gs: onnx.NodeProto, level: int
) -> tuple[str, str, onnx.NodeProto, str, tuple[int, int]]:
    """(value, sampling_locations, Split or Slice node, Reshape target, the 2 * loc - 1 nodes)
    of one level's GridSample."""
    what = f"level {level} ({_label(gs)!r})"
    image = w.producer(gs.input[0], ("Reshape",), f"{what} X")
    transpose = w.producer(image.input[0], ("Transpose",), f"{what} X")
    w.perm(transpose, [0, 2, 1], f"{what} X")
    flat = w.producer(transpose.input[0], ("Reshape", "Flatten"), f"{what} X")
    split = w.producer(flat.input[0], ("Split", "Slice"), f"{what} value")
    if split.op_type == "Slice":  # TorchScript slices each level when the sizes are traced
        axes = w.ix.int_list(split.input[3]) if len(split.input) > 3 else None
        steps = w.ix.int_list(split.input[4]) if len(split.input) > 4 and split.input[4] else [1]
        if axes not in ([1], [-3]) or steps != [1]:
            raise _Miss(f"{what}: value is sliced on axes {axes} steps {steps}, expected [1], [1]")
    else:
        if _attr(split, "axis", 0) not in (1, -3):
            raise _Miss(f"{what}: value is split on axis {_attr(split, 'axis', 0)}, expected 1")
        part = list(split.output).index(flat.input[0])
        if part != level:
            raise _Miss(f"{what} samples value part {part}: levels out of order")

    grid = w.producer(gs.input[1], ("Reshape",), f"{what} grid")
    grid_t = w.producer(grid.input[0], ("Transpose",), f"{what} grid")
    w.perm(grid_t, [0, 2, 1, 3, 4], f"{what} grid")
    select = w.producer(grid_t.input[0], ("Gather",), f"{what} grid level select")
    if _attr(select, "axis", 0) not in (3, -3):
        raise _Miss(f"{what}: grid level selected on axis {_attr(select, 'axis', 0)}, expected 3")
    index = w.ix.constant(select.input[1])
    if index is None or index.size != 1 or index.ndim != 0 or int(index) != level:
        raise _Miss(f"{what}: grid selects level {index} instead of {level}")
    loc, affine = _affine_source(w, select.input[0])
    return split.input[0], loc, split, image.input[1], affine


def _level_shape(w: _Walker, target: str, level: int) -> LevelShape:
    elements = w.ix.vector_elements(target)
    if elements is None or len(elements) != 4:
        return LevelShape(target, None, None)
    h, wd = elements[2], elements[3]
    for dim, label in ((h, "height"), (wd, "width")):
        if dim is not None and dim <= 0:
            raise _Miss(f"level {level}: the image {label} is {dim} in its Reshape target")
    return LevelShape(target, h, wd)


def _v2_concat(w: _Walker, gs: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Concat on the last axis reading ``gs`` and only GridSamples: transformers' v2 form."""
    readers = w.ix.readers_of(gs.output[0])
    if len(readers) != 1 or readers[0].op_type != "Concat" or readers[0].domain not in _STANDARD:
        return None
    concat = readers[0]
    if _attr(concat, "axis", None) not in (-1, 3) or len(concat.input) < 2:
        return None
    levels = [w.ix.node_of(part) for part in concat.input]
    if not all(n is not None and n.op_type == "GridSample" for n in levels):
        return None
    return concat


def _split_parts(
    w: _Walker, names: list[str], axes: tuple[int, ...], what: str
) -> tuple[onnx.NodeProto, list[int] | None]:
    """The Split producing ``names`` in order (one output each, on one of ``axes``), and its
    sizes when constant."""
    split = w.producer(names[0], ("Split",), what)
    if list(split.output) != names:
        raise _Miss(f"{what}: the levels read {names}, not the outputs of one Split in order")
    if _attr(split, "axis", 0) not in axes:
        raise _Miss(f"{what}: split on axis {_attr(split, 'axis', 0)}, expected {axes[0]}")
    sizes = w.ix.int_list(split.input[1]) if len(split.input) > 1 and split.input[1] else None
    if sizes is None:
        sizes = _attr(split, "split", None)  # type: ignore[assignment]
        sizes = list(sizes) if sizes is not None else None
    return split, sizes


def _value_parts(w: _Walker, names: list[str]) -> tuple[str, list[tuple[int, int] | None]]:
    """The v2 value's levels: one Split on the last axis, or (TorchScript when the sizes are
    traced) one Slice per level of the same tensor. The tensor split, and each level's key range
    when constant."""
    first = w.producer(names[0], ("Split", "Slice"), "value")
    if first.op_type == "Split":
        split, sizes = _split_parts(w, names, (-1, 2), "value")
        if sizes is None or len(sizes) != len(names):
            return split.input[0], [None] * len(names)
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return split.input[0], [(a, a + n) for a, n in zip(starts, sizes, strict=True)]
    ranges: list[tuple[int, int] | None] = []
    for k, name in enumerate(names):
        part = w.producer(name, ("Slice",), f"level {k} value")
        if part.input[0] != first.input[0]:
            raise _Miss("the levels slice different value tensors")
        axes = w.ix.int_list(part.input[3]) if len(part.input) > 3 and part.input[3] else None
        steps = w.ix.int_list(part.input[4]) if len(part.input) > 4 and part.input[4] else [1]
        if axes not in ([-1], [2]) or steps != [1]:
            raise _Miss(
                f"level {k}: value is sliced on axes {axes} steps {steps}, expected [-1], [1]"
            )
        lo, hi = w.ix.int_list(part.input[1]), w.ix.int_list(part.input[2])
        ranges.append((lo[0], hi[0]) if lo and hi and len(lo) == len(hi) == 1 else None)
    return first.input[0], ranges


def _weighted_sum(
    w: _Walker, sampled: str, what: str, weights_perm: list[int]
) -> tuple[str, onnx.NodeProto]:
    """The tail both attention forms share: ``sampled`` times the attention weights, summed over
    the last axis, reshaped and transposed to ``(bs, Q, heads*dim)``. Returns the attention
    weights as the model gives them (before their ``Transpose[weights_perm]`` and ``Reshape``)
    and the output ``Transpose``."""
    mul = w.reader(sampled, "Mul", f"{what} (times attention weights)")
    weights = mul.input[1] if mul.input[0] == sampled else mul.input[0]
    reduce = w.reader(mul.output[0], "ReduceSum", "the weighted samples")
    if w.axes(reduce) not in ([-1], [3]) or _attr(reduce, "keepdims", 1) != 0:
        raise _Miss("the weighted samples are not summed over the last axis (keepdims 0)")
    view = w.reader(reduce.output[0], "Reshape", "the summed samples")
    last = w.reader(view.output[0], "Transpose", "the output (bs, heads*dim, Q)")
    w.perm(last, [0, 2, 1], "the output")
    w_reshape = w.producer(weights, ("Reshape",), "the attention weights")
    w_t = w.producer(w_reshape.input[0], ("Transpose",), "the attention weights")
    w.perm(w_t, weights_perm, "the attention weights")
    return w_t.input[0], last


def _match_v2(w: _Walker, concat: onnx.NodeProto) -> MsdaMatch:
    """transformers' ``multi_scale_deformable_attention_v2`` (RT-DETRv2, D-FINE, DEIMv2)::

    value (bs, keys, heads, dim) --Transpose[0,2,3,1]--> --Reshape (bs*heads, dim, keys)-->
        --Split(-1, H*W per level)--> --Reshape (bs*heads, dim, H_l, W_l)--> X_l
    loc (bs, Q, heads, sum(P), 2) --Mul 2--> --Sub 1--> --Transpose[0,2,1,3,4]-->
        --Reshape (bs*heads, Q, sum(P), 2)--> --Split(-2, P per level)--> grid_l
    GridSample(X_l, grid_l) --Concat(-1)--> Mul(weights) --ReduceSum(-1)--> --Reshape-->
        --Transpose[0,2,1]--> output
    weights (bs, Q, heads, sum(P)) --Transpose[0,2,1,3]--> --Reshape--> weights
    """
    grid_samples = [w.producer(part, ("GridSample",), "a level") for part in concat.input]
    indices = tuple(w.ix.producer[gs.output[0]] for gs in grid_samples)
    try:
        for gs in grid_samples:
            _check_grid_sample(w, gs)
        attn, last = _weighted_sum(w, concat.output[0], "the concatenated levels", [0, 2, 1, 3])

        images = [
            w.producer(gs.input[0], ("Reshape",), f"level {k} X")
            for k, gs in enumerate(grid_samples)
        ]
        source, key_ranges = _value_parts(w, [im.input[0] for im in images])
        flat = w.producer(source, ("Reshape",), "value (bs*heads, dim, keys)")
        value_t = w.producer(flat.input[0], ("Transpose",), "value")
        w.perm(value_t, [0, 2, 3, 1], "value")

        gsplit, points = _split_parts(w, [gs.input[1] for gs in grid_samples], (-2, 2), "the grid")
        if points is None or len(points) != len(grid_samples) or min(points) < 1:
            raise _Miss(f"the points per level are not constant (grid split sizes {points})")
        grid = w.producer(gsplit.input[0], ("Reshape",), "the grid (bs*heads, Q, points, 2)")
        grid_t = w.producer(grid.input[0], ("Transpose",), "the grid")
        w.perm(grid_t, [0, 2, 1, 3, 4], "the grid")
        loc, affine = _affine_source(w, grid_t.input[0])

        levels = tuple(_level_shape(w, im.input[1], k) for k, im in enumerate(images))
        if all(lv.height is not None and lv.width is not None for lv in levels):
            hw = [lv.height * lv.width for lv in levels]  # type: ignore[operator]
            starts = [sum(hw[:k]) for k in range(len(hw))]
            expected = [(a, a + n) for a, n in zip(starts, hw, strict=True)]
            for k, got in enumerate(key_ranges):
                if got is not None and got != expected[k]:
                    raise _Miss(
                        f"level {k} reads value keys {got[0]}:{got[1]}, expected"
                        f" {expected[k][0]}:{expected[k][1]} (H*W of the levels {hw})"
                    )
        for name, rank, role in (
            (value_t.input[0], 4, "value"),
            (loc, 5, "sampling locations"),
            (attn, 4, "attention weights"),
        ):
            found = w.rank(name)
            if found is not None and found != rank:
                raise _Miss(f"{role} has rank {found}, expected {rank}")
    except _Miss as miss:
        miss.grid_samples = indices
        raise
    return MsdaMatch(
        value=value_t.input[0],
        sampling_locations=loc,
        attention_weights=attn,
        output=last.output[0],
        last=w.ix.producer[last.output[0]],
        grid_samples=indices,
        levels=levels,
        affine=affine,
        points=tuple(points),
    )


def _match(w: _Walker, anchor: onnx.NodeProto) -> MsdaMatch:
    v2 = _v2_concat(w, anchor)
    if v2 is not None:
        return _match_v2(w, v2)
    try:
        concat, grid_samples = _stack(w, anchor)
    except _Miss:
        _check_grid_sample(w, anchor)  # its own attributes or rank say more, when they differ
        raise
    indices = tuple(w.ix.producer[gs.output[0]] for gs in grid_samples)
    try:
        for gs in grid_samples:
            _check_grid_sample(w, gs)
        flat = w.reader(concat.output[0], "Reshape", "the stacked levels")
        attn, last = _weighted_sum(w, flat.output[0], "the flattened levels", [0, 2, 1, 3, 4])

        per_level = [_level(w, gs, i) for i, gs in enumerate(grid_samples)]
        values = {p[0] for p in per_level}
        locs = {p[1] for p in per_level}
        splits = {id(p[2]) for p in per_level}
        split = per_level[0][2]
        sliced = split.op_type == "Slice"
        if len(values) != 1 or len(locs) != 1 or (not sliced and len(splits) != 1):
            raise _Miss("the levels sample different value or location tensors")
        if not sliced and len(split.output) != len(grid_samples):
            raise _Miss(
                f"value is split into {len(split.output)} parts but {len(grid_samples)} levels"
                " are sampled"
            )
        levels = tuple(_level_shape(w, p[3], i) for i, p in enumerate(per_level))
        if all(lv.height is not None and lv.width is not None for lv in levels):
            hw = [lv.height * lv.width for lv in levels]  # type: ignore[operator]
            if sliced:
                bounds = [
                    (w.ix.int_list(p[2].input[1]), w.ix.int_list(p[2].input[2])) for p in per_level
                ]
                start = 0
                for k, (lo, hi) in enumerate(bounds):
                    if lo is not None and hi is not None and (lo, hi) != ([start], [start + hw[k]]):
                        raise _Miss(
                            f"level {k} slices value keys {lo}:{hi}, expected"
                            f" [{start}]:[{start + hw[k]}] (H*W of the levels {hw})"
                        )
                    start += hw[k]
            else:
                sizes = w.ix.int_list(split.input[1]) if len(split.input) > 1 else None
                if sizes is not None and hw != sizes:
                    raise _Miss(f"the split sizes {sizes} differ from H*W of the levels {hw}")
        for name, rank, role in ((values.pop(), 4, "value"), (attn, 5, "attention weights")):
            found = w.rank(name)
            if found is not None and found != rank:
                raise _Miss(f"{role} has rank {found}, expected {rank}")
    except _Miss as miss:
        miss.grid_samples = indices
        raise
    return MsdaMatch(
        value=split.input[0],
        affine=tuple(i for p in per_level for i in p[4]),
        sampling_locations=locs.pop(),
        attention_weights=attn,
        output=last.output[0],
        last=w.ix.producer[last.output[0]],
        grid_samples=indices,
        levels=levels,
    )


def _declared_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    ranks = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            ranks[info.name] = len(info.type.tensor_type.shape.dim)
    return ranks


def find_msda(index: GraphIndex) -> tuple[list[MsdaMatch], list[NearMiss]]:
    """Every MSDA subgraph of the indexed graph, and the GridSample nodes that almost are."""
    walker = _Walker(index, _declared_ranks(index.graph))
    matches: list[MsdaMatch] = []
    misses: list[NearMiss] = []
    seen: set[int] = set()
    for i, node in enumerate(index.nodes):
        if node.op_type != "GridSample" or node.domain not in _STANDARD or i in seen:
            continue
        try:
            match = _match(walker, node)
        except _Miss as miss:
            group = miss.grid_samples or (i,)
            seen.update(group)
            misses.append(NearMiss(tuple(_label(index.nodes[g]) for g in group), miss.reason))
            continue
        seen.update(match.grid_samples)
        matches.append(match)
    return matches, misses
