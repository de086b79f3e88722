"""Shared cases of the fusion tests: our own grid_sample formulation of multi-scale deformable
attention (mmcv's function signature), small models calling it, and input builders."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

LEVELS = ((6, 5), (3, 3))  # (H, W) per level
HEADS, DIM, QUERIES, POINTS = 2, 4, 7, 3


def grid_msda(
    value: Tensor,
    value_spatial_shapes: Any,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    align_corners: bool = False,
) -> Tensor:
    """Multi-scale deformable attention with ``F.grid_sample``, written independently of any
    library: per level, sample every head's map at ``2 * loc - 1``, weight and sum."""
    bs, _, heads, dim = value.shape
    queries, points = sampling_locations.shape[1], sampling_locations.shape[4]
    out = value.new_zeros(bs, heads, dim, queries)
    start = 0
    for level, (h, w) in enumerate(value_spatial_shapes):
        keys = value[:, start : start + h * w]  # (bs, h*w, heads, dim)
        start = start + h * w
        maps = keys.permute(0, 2, 3, 1).reshape(bs * heads, dim, h, w)
        grid = sampling_locations[:, :, :, level].permute(0, 2, 1, 3, 4)  # (bs, heads, q, p, 2)
        grid = grid.reshape(bs * heads, queries, points, 2) * 2 - 1
        samples = nn.functional.grid_sample(
            maps, grid, mode="bilinear", padding_mode="zeros", align_corners=align_corners
        ).reshape(bs, heads, dim, queries, points)
        weights = attention_weights[:, :, :, level].permute(0, 2, 1, 3)  # (bs, heads, q, p)
        out = out + (samples * weights[:, :, None]).sum(-1)
    return out.permute(0, 3, 1, 2).reshape(bs, queries, heads * dim)


def my_msda(
    value: Tensor, value_spatial_shapes: Any, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """A user's copy with mmcv's signature (module-level, called by name)."""
    return grid_msda(value, value_spatial_shapes, sampling_locations, attention_weights)


def shifted_msda(
    value: Tensor, value_spatial_shapes: Any, sampling_locations: Tensor, attention_weights: Tensor
) -> Tensor:
    """Same signature, other math (align_corners=True): must fail the numeric check."""
    return grid_msda(value, value_spatial_shapes, sampling_locations, attention_weights, True)


class FunctionModel(nn.Module):
    """Projections around a call of ``my_msda`` (or ``shifted_msda``) by its module-level name."""

    def __init__(self, shifted: bool = False) -> None:
        super().__init__()
        self.shifted = shifted
        self.value_proj = nn.Linear(HEADS * DIM, HEADS * DIM)
        self.output_proj = nn.Linear(HEADS * DIM, HEADS * DIM)

    def forward(
        self, value: Tensor, sampling_locations: Tensor, attention_weights: Tensor
    ) -> Tensor:
        bs, keys, _ = value.shape
        value = self.value_proj(value).view(bs, keys, HEADS, DIM)
        fn = shifted_msda if self.shifted else my_msda
        return self.output_proj(fn(value, list(LEVELS), sampling_locations, attention_weights))


def inputs(batch: int = 1, queries: int = QUERIES, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """``(value (bs, keys, heads*dim), locations, softmaxed weights)``; some locations outside
    [0, 1] so the zero padding counts."""
    g = torch.Generator().manual_seed(seed)
    keys = sum(h * w for h, w in LEVELS)
    value = torch.randn(batch, keys, HEADS * DIM, generator=g)
    locations = torch.rand(batch, queries, HEADS, len(LEVELS), POINTS, 2, generator=g) * 1.2 - 0.1
    weights = torch.rand(batch, queries, HEADS, len(LEVELS) * POINTS, generator=g).softmax(-1)
    return value, locations, weights.view(batch, queries, HEADS, len(LEVELS), POINTS)


def op_counts(proto: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


class MyAttention(nn.Module):
    """A module with transformers' ``MultiScaleDeformableAttention.forward`` signature."""

    def __init__(self, align_corners: bool = False) -> None:
        super().__init__()
        self.align_corners = align_corners

    def forward(
        self,
        value: Tensor,
        value_spatial_shapes: Tensor,
        value_spatial_shapes_list: list[tuple[int, int]],
        level_start_index: Tensor,
        sampling_locations: Tensor,
        attention_weights: Tensor,
        im2col_step: int,
    ) -> Tensor:
        return grid_msda(
            value,
            value_spatial_shapes_list,
            sampling_locations,
            attention_weights,
            self.align_corners,
        )


class AttentionModel(nn.Module):
    """A projection, then an attention module called as transformers' encoder layers call it."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.value_proj = nn.Linear(HEADS * DIM, HEADS * DIM)
        self.attn = attention
        shapes = torch.tensor(LEVELS, dtype=torch.int64)
        self.register_buffer("shapes", shapes)
        starts = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
        self.register_buffer("starts", starts)

    def forward(self, value: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
        bs, keys, _ = value.shape
        value = self.value_proj(value).view(bs, keys, HEADS, DIM)
        return self.attn(value, self.shapes, list(LEVELS), self.starts, locations, weights, 64)  # type: ignore[no-any-return]
