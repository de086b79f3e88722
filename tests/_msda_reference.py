"""Independent references for multi-scale deformable attention, used by the msda tests
(tests/*/test_msda*.py).

`grid_sample_msda` is the pure-PyTorch formulation (one ``F.grid_sample`` per level with
``align_corners=False`` and zero padding on grid ``2 * loc - 1``), written here from the op's
definition, not from the code under test. `make_inputs` draws a sample with locations inside and
outside [0, 1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["LEVELS", "grid_sample_msda", "level_start", "make_inputs"]

LEVELS = ((4, 5), (2, 3), (1, 1))  # (H, W) per level: odd sizes, a 1x1 level


def level_start(shapes: torch.Tensor) -> torch.Tensor:
    sizes = shapes.prod(1)
    return torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1]))


def grid_sample_msda(
    value: torch.Tensor, shapes: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor
) -> torch.Tensor:
    """(bs, Q, M*D): per level, sample every head's (D, H, W) image at the queries' points."""
    bs, _, heads, dim = value.shape
    _, queries, _, levels, points, _ = loc.shape
    per_level = []
    start = 0
    for level, (h, w) in enumerate(shapes.tolist()):
        image = value[:, start : start + h * w].permute(0, 2, 3, 1).reshape(bs * heads, dim, h, w)
        start += h * w
        grid = (2 * loc[:, :, :, level] - 1).transpose(1, 2).reshape(bs * heads, queries, points, 2)
        if h * w == 0:  # grid_sample refuses empty images; nothing to sample there
            per_level.append(grid.new_zeros(bs * heads, dim, queries, points))
            continue
        per_level.append(
            F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    sampled = torch.stack(per_level, dim=-2)  # (bs*M, D, Q, L, P)
    weights = attn.transpose(1, 2).reshape(bs * heads, 1, queries, levels, points)
    out = (sampled * weights).sum((-1, -2))  # (bs*M, D, Q)
    return out.view(bs, heads, dim, queries).permute(0, 3, 1, 2).reshape(bs, queries, heads * dim)


def make_inputs(
    bs: int = 2,
    queries: int = 5,
    heads: int = 2,
    dim: int = 3,
    points: int = 2,
    levels: tuple[tuple[int, int], ...] = LEVELS,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spread: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
    locations uniform in [-spread, 1 + spread] (some outside every level)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(levels, dtype=torch.int64).reshape(-1, 2)
    keys = int(shapes.prod(1).sum())
    value = torch.randn(bs, keys, heads, dim, generator=gen, dtype=torch.float64)
    loc = torch.rand(bs, queries, heads, len(levels), points, 2, generator=gen, dtype=torch.float64)
    loc = loc * (1 + 2 * spread) - spread
    attn = torch.rand(bs, queries, heads, len(levels), points, generator=gen, dtype=torch.float64)
    return value.to(dtype), shapes, level_start(shapes), loc.to(dtype), attn.to(dtype)
