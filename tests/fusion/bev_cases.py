"""Shared cases of the bev_pool_v2 fusion tests: pure-PyTorch BEV pooling written as users write
it (BEVDet's ``bev_pool_v2`` signature), small models calling it by its module-level name, and a
small camera rig."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from onnx_custom.ops.bev_pool import prepare_bev_ranks, synthetic_frustum

CAMERAS, DEPTH_BINS, FEAT_HW, CHANNELS = 2, 6, (4, 6), 5
GRID = (12, 10, 1)  # X, Y, Z cells
GRID_LOWER, GRID_STEP = (-30.0, -25.0, -5.0), (5.0, 5.0, 10.0)


def scatter_bev_pool(
    depth: Tensor,
    feat: Tensor,
    ranks_depth: Tensor,
    ranks_feat: Tensor,
    ranks_bev: Tensor,
    bev_feat_shape: Any,
    interval_starts: Tensor,
    interval_lengths: Tensor,
) -> Tensor:
    """Loop-free: every point's depth x feature product, ``scatter_add``-ed into its BEV cell
    (the intervals are implied by ``ranks_bev``), then the (B, Z, Y, X, C) grid to (B, C, Z, Y,
    X)."""
    b, z, y, x, c = bev_feat_shape
    products = (
        depth.reshape(-1)[ranks_depth.long()].unsqueeze(1) * feat.reshape(-1, c)[ranks_feat.long()]
    )
    cells = ranks_bev.long().unsqueeze(1).expand(-1, c)
    grid = feat.new_zeros(b * z * y * x, c).scatter_add(0, cells, products)
    return grid.view(b, z, y, x, c).permute(0, 4, 1, 2, 3).contiguous()


def cumsum_bev_pool(
    depth: Tensor,
    feat: Tensor,
    ranks_depth: Tensor,
    ranks_feat: Tensor,
    ranks_bev: Tensor,
    bev_feat_shape: Any,
    interval_starts: Tensor,
    interval_lengths: Tensor,
) -> Tensor:
    """The cumsum trick: running sums of the products (in float64), each interval's sum as the
    difference of the running sum at its end and its start, written at the interval's cell."""
    b, z, y, x, c = bev_feat_shape
    products = (
        depth.reshape(-1)[ranks_depth.long()].unsqueeze(1) * feat.reshape(-1, c)[ranks_feat.long()]
    )
    running = torch.cat([products.new_zeros(1, c), products.double().cumsum(0)])
    starts = interval_starts.long()
    sums = running[starts + interval_lengths.long()] - running[starts]
    grid = feat.new_zeros(b * z * y * x, c)
    grid = grid.index_put((ranks_bev.long()[starts],), sums.to(feat.dtype))
    return grid.view(b, z, y, x, c).permute(0, 4, 1, 2, 3).contiguous()


def mean_bev_pool(
    depth: Tensor,
    feat: Tensor,
    ranks_depth: Tensor,
    ranks_feat: Tensor,
    ranks_bev: Tensor,
    bev_feat_shape: Any,
    interval_starts: Tensor,
    interval_lengths: Tensor,
) -> Tensor:
    """Same signature, other math (each cell's mean instead of its sum): fails the numeric
    check."""
    total = scatter_bev_pool(
        depth,
        feat,
        ranks_depth,
        ranks_feat,
        ranks_bev,
        bev_feat_shape,
        interval_starts,
        interval_lengths,
    )
    b, z, y, x, _ = bev_feat_shape
    counts = feat.new_zeros(b * z * y * x).scatter_add(
        0, ranks_bev.long(), feat.new_ones(ranks_bev.shape[0])
    )
    return total / counts.clamp(min=1).view(b, 1, z, y, x)


def channels_last_bev_pool(
    depth: Tensor,
    feat: Tensor,
    ranks_depth: Tensor,
    ranks_feat: Tensor,
    ranks_bev: Tensor,
    bev_feat_shape: Any,
    interval_starts: Tensor,
    interval_lengths: Tensor,
) -> Tensor:
    """Same sums, the (B, Z, Y, X, C) grid returned as it is: another layout than the op's."""
    out = scatter_bev_pool(
        depth,
        feat,
        ranks_depth,
        ranks_feat,
        ranks_bev,
        bev_feat_shape,
        interval_starts,
        interval_lengths,
    )
    return out.permute(0, 2, 3, 4, 1).contiguous()


class BEVModel(nn.Module):
    """A depth softmax, then the pooling (by its module-level name) of ranks given as inputs;
    ``impl`` picks the function."""

    def __init__(self, impl: str = "scatter", channels: int = CHANNELS) -> None:
        super().__init__()
        self.impl = impl
        self.shape = [1, GRID[2], GRID[1], GRID[0], channels]

    def forward(
        self,
        depth_logits: Tensor,
        feat: Tensor,
        ranks_depth: Tensor,
        ranks_feat: Tensor,
        ranks_bev: Tensor,
        interval_starts: Tensor,
        interval_lengths: Tensor,
    ) -> Tensor:
        depth = depth_logits.softmax(dim=2)
        pool = scatter_bev_pool
        if self.impl == "cumsum":
            pool = cumsum_bev_pool
        elif self.impl == "mean":
            pool = mean_bev_pool
        elif self.impl == "channels_last":
            pool = channels_last_bev_pool
        bev = pool(
            depth,
            feat,
            ranks_depth,
            ranks_feat,
            ranks_bev,
            self.shape,
            interval_starts,
            interval_lengths,
        )
        return bev.flatten(1, 2).relu()  # type: ignore[no-any-return]


def rig(
    depth_range: tuple[float, float] = (1.0, 40.0), channels: int = CHANNELS, seed: int = 0
) -> tuple[Tensor, ...]:
    """``(depth_logits, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts,
    interval_lengths)``: another ``depth_range`` keeps another number of points in the grid."""
    coor = synthetic_frustum(1, CAMERAS, DEPTH_BINS, FEAT_HW, depth_range=depth_range)
    ranks_bev, ranks_depth, ranks_feat, starts, lengths = prepare_bev_ranks(
        coor, GRID_LOWER, GRID_STEP, GRID
    )
    g = torch.Generator().manual_seed(seed)
    fh, fw = FEAT_HW
    depth_logits = torch.randn(1, CAMERAS, DEPTH_BINS, fh, fw, generator=g)
    feat = torch.randn(1, CAMERAS, fh, fw, channels, generator=g)
    return depth_logits, feat, ranks_depth, ranks_feat, ranks_bev, starts, lengths
