"""Small models computing multi-scale deformable attention the pure-PyTorch way (one
``F.grid_sample`` per level), written here from the op's definition, and their raw
``torch.onnx.export`` files: what users of transformers' and mmcv's code have on disk.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ExtraLevel",
    "Pyramid",
    "Standalone",
    "Volume",
    "export_raw",
    "grid_sample_attention",
    "standalone_inputs",
]

SHAPES = ((6, 5), (3, 3), (1, 2))  # (H, W) per level: non-square, a 1-row level


def grid_sample_attention(
    value: torch.Tensor,
    shapes: Any,
    loc: torch.Tensor,
    attn: torch.Tensor,
    *,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    affine: bool = True,
    reverse: bool = False,
) -> torch.Tensor:
    """(bs, Q, heads*dim) from value (bs, keys, heads, dim), locations (bs, Q, heads, L, P, 2)
    in [0, 1] and weights (bs, Q, heads, L, P): split value per level, sample each level's
    (bs*heads, dim, H, W) image at grid 2*loc-1, weight, sum over levels and points."""
    bs, _, heads, dim = value.shape
    _, queries, _, levels, points, _ = loc.shape
    parts = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * loc - 1 if affine else loc
    sampled = []
    for level, (h, w) in enumerate(shapes):
        image = parts[level].flatten(2).transpose(1, 2).reshape(bs * heads, dim, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(
            F.grid_sample(
                image, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
            )
        )
    if reverse:  # stacked last level first: not the layout the weights assume
        sampled.reverse()
    weights = attn.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
    return out.view(bs, heads * dim, queries).transpose(1, 2).contiguous()


class Standalone(nn.Module):
    """value projection -> grid-sample attention -> output projection."""

    def __init__(self, heads: int = 2, dim: int = 4, **options: Any) -> None:
        super().__init__()
        self.heads, self.dim, self.options = heads, dim, options
        self.value_proj = nn.Linear(heads * dim, heads * dim)
        self.output_proj = nn.Linear(heads * dim, heads * dim)

    def forward(self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        bs, keys, _ = value.shape
        v = self.value_proj(value).view(bs, keys, self.heads, self.dim)
        return self.output_proj(grid_sample_attention(v, SHAPES, loc, attn, **self.options))


def standalone_inputs(
    bs: int = 2, queries: int = 5, heads: int = 2, dim: int = 4, points: int = 3, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Locations in [-0.2, 1.2] (some outside every level), weights in [0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    keys = sum(h * w for h, w in SHAPES)
    levels = len(SHAPES)
    return (
        torch.randn(bs, keys, heads * dim, generator=gen),
        torch.rand(bs, queries, heads, levels, points, 2, generator=gen) * 1.4 - 0.2,
        torch.rand(bs, queries, heads, levels, points, generator=gen),
    )


class ExtraLevel(Standalone):
    """Locations carry one level more than value has (never read): the chain looks like MSDA,
    but the fused node, given all locations, refuses them."""

    def forward(self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        bs, keys, _ = value.shape
        v = self.value_proj(value).view(bs, keys, self.heads, self.dim)
        extra = torch.cat([loc, loc[:, :, :, :1]], dim=3)
        _, queries, heads, levels, points = attn.shape
        parts = v.split([h * w for h, w in SHAPES], dim=1)
        grids = 2 * extra - 1
        sampled = []
        for level, (h, w) in enumerate(SHAPES):
            image = parts[level].flatten(2).transpose(1, 2).reshape(bs * heads, self.dim, h, w)
            grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
            sampled.append(F.grid_sample(image, grid, align_corners=False))
        weights = attn.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
        out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
        out = out.view(bs, heads * self.dim, queries).transpose(1, 2).contiguous()
        return self.output_proj(out)


class Pyramid(nn.Module):
    """Levels pooled from one feature map: (H, W) per level follow the input's size."""

    def __init__(self, heads: int = 2, dim: int = 4, points: int = 2, queries: int = 5) -> None:
        super().__init__()
        self.heads, self.dim, self.points, self.queries = heads, dim, points, queries
        self.loc = nn.Linear(heads * dim, heads * 3 * points * 2)
        self.attn = nn.Linear(heads * dim, heads * 3 * points)
        self.query = nn.Parameter(torch.randn(queries, heads * dim))

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        bs = feat.shape[0]
        levels = [feat, F.avg_pool2d(feat, 2), F.avg_pool2d(feat, 4)]
        shapes = [(x.shape[2], x.shape[3]) for x in levels]
        value = torch.cat([x.flatten(2).transpose(1, 2) for x in levels], 1)
        value = value.view(bs, -1, self.heads, self.dim)
        q = self.query.unsqueeze(0).expand(bs, -1, -1)
        loc = self.loc(q).view(bs, self.queries, self.heads, 3, self.points, 2).sigmoid()
        attn = self.attn(q).view(bs, self.queries, self.heads, 3, self.points).softmax(-1)
        return grid_sample_attention(value, shapes, loc, attn)


class Volume(nn.Module):
    """The same chain over 3-D levels: 5-D GridSample (volumetric), not fusable."""

    def forward(self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        bs, _, heads, dim = value.shape
        _, queries, _, levels, points, _ = loc.shape
        shapes = ((2, 3, 2), (1, 2, 2))
        parts = value.split([d * h * w for d, h, w in shapes], dim=1)
        grids = 2 * loc - 1
        sampled = []
        for level, (d, h, w) in enumerate(shapes):
            image = parts[level].flatten(2).transpose(1, 2).reshape(bs * heads, dim, d, h, w)
            grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1).unsqueeze(1)
            sampled.append(F.grid_sample(image, grid, align_corners=False).squeeze(2))
        weights = attn.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
        out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
        return out.view(bs, heads * dim, queries).transpose(1, 2).contiguous()


def export_raw(
    model: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    *,
    exporter: str,
    opset: int,
    names: tuple[str, ...],
    dynamic: dict[str, dict[int, str]] | None = None,
) -> Path:
    """``torch.onnx.export`` as a user calls it (no onnx-custom), dims named as in ``dynamic``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            shapes = None
            if dynamic:
                made: dict[str, torch.export.Dim] = {}
                shapes = tuple(
                    {
                        axis: made.setdefault(dim, torch.export.Dim(dim))
                        for axis, dim in dynamic.get(name, {}).items()
                    }
                    or None
                    for name in names
                )
            torch.onnx.export(
                model.eval(),
                args,
                str(path),
                dynamo=True,
                opset_version=opset,
                input_names=list(names),
                dynamic_shapes=shapes,
                verbose=False,
            )
        else:
            torch.onnx.export(
                model.eval(),
                args,
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=list(names),
                dynamic_axes=dynamic,
            )
    return path
