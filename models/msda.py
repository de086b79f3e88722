"""A small Deformable-DETR encoder layer on three feature levels, built on
``onnx_custom.ops.MultiScaleDeformableAttention`` (the drop-in for mmcv's module).

Like Deformable DETR's encoder: the levels' features are flattened and concatenated (plus a learned
level embedding), every position attends from its own pixel centre (the reference points, one
per level) to ``num_points`` sampled points per head and level, then residual + LayerNorm, a
feed-forward block, residual + LayerNorm. Spatial shapes and level starts are constants of the
model (buffers). The sampling-offset and attention-weight projections get small random weights
(mmcv's init zeroes them, which would sample exactly at pixel centres with uniform weights).

Zoo rows: every export variant (the custom node, ``mmdeploy``'s node, the ``standard`` ops with
GridSample per level, the ``gather`` form: at opset 11 under TorchScript, which is also what
``standard`` gives below 16) under both exporters, static and with a dynamic batch. (The dynamo
exporter builds at opset 18; this model's LayerNorm/Softmax cannot be lowered to 11.)
"""

from __future__ import annotations

import torch
from torch import nn

import onnx_custom.ort_kernels.msda
import onnx_custom.symbolics.msda  # noqa: F401  (translations, kernels)
from onnx_custom.ops import MultiScaleDeformableAttention
from onnx_custom.testing import ZooCase

__all__ = [
    "LEVELS",
    "ZOO",
    "EncoderLayer",
    "Model",
    "dynamic_shapes",
    "example_inputs",
    "reference_points",
]

LEVELS = ((16, 16), (8, 8), (4, 4))  # (H, W): a 128x128 image at strides 8, 16, 32
EMBED, HEADS, POINTS = 32, 4, 4


def reference_points(levels: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """(1, num_keys, num_levels, 2): each key's pixel centre, normalized, repeated per level
    (Deformable DETR's encoder reference points without padding: valid ratios 1)."""
    points = []
    for h, w in levels:
        ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
        points.append(torch.stack([xs.reshape(-1) / w, ys.reshape(-1) / h], -1))
    ref = torch.cat(points, 0)
    return ref[None, :, None, :].repeat(1, 1, len(levels), 1)


class EncoderLayer(nn.Module):
    """MSDA self-attention + FFN with post-norm, as in Deformable DETR's encoder."""

    def __init__(
        self,
        embed: int = EMBED,
        heads: int = HEADS,
        levels: int = len(LEVELS),
        points: int = POINTS,
    ) -> None:
        super().__init__()
        self.attn = MultiScaleDeformableAttention(
            embed, heads, levels, points, dropout=0.0, batch_first=True
        )
        self.norm1 = nn.LayerNorm(embed)
        self.ffn = nn.Sequential(
            nn.Linear(embed, 2 * embed), nn.ReLU(), nn.Linear(2 * embed, embed)
        )
        self.norm2 = nn.LayerNorm(embed)

    def forward(
        self,
        src: torch.Tensor,
        pos: torch.Tensor,
        ref: torch.Tensor,
        shapes: torch.Tensor,
        starts: torch.Tensor,
    ) -> torch.Tensor:
        x = self.norm1(
            self.attn(
                src,
                query_pos=pos,
                reference_points=ref,
                spatial_shapes=shapes,
                level_start_index=starts,
            )
        )
        return self.norm2(x + self.ffn(x))


class Model(nn.Module):
    """Three feature maps (B, 32, H_l, W_l) -> encoded tokens (B, sum H_l*W_l, 32)."""

    spatial_shapes: torch.Tensor
    level_start_index: torch.Tensor
    reference_points: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)  # deterministic init without touching the caller's RNG
        try:
            shapes = torch.tensor(LEVELS, dtype=torch.int64)
            sizes = shapes.prod(1)
            self.register_buffer("spatial_shapes", shapes, persistent=False)
            self.register_buffer(
                "level_start_index",
                torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1])),
                persistent=False,
            )
            self.register_buffer("reference_points", reference_points(LEVELS), persistent=False)
            keys = int(sizes.sum())
            self.level_embed = nn.Parameter(torch.randn(len(LEVELS), EMBED) * 0.1)
            self.pos_embed = nn.Parameter(torch.randn(1, keys, EMBED) * 0.1)
            self.layer = EncoderLayer()
            # Off-centre samples (about +-1 px) with uneven weights: the bilinear path is exercised.
            nn.init.normal_(self.layer.attn.sampling_offsets.weight, std=0.05)
            nn.init.normal_(self.layer.attn.attention_weights.weight, std=0.1)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(
        self, feat0: torch.Tensor, feat1: torch.Tensor, feat2: torch.Tensor
    ) -> torch.Tensor:
        # level_embed[i : i + 1], not [i]: a slice also exports under dynamo at opset 11
        tokens = [
            f.flatten(2).transpose(1, 2) + self.level_embed[i : i + 1]
            for i, f in enumerate((feat0, feat1, feat2))
        ]
        src = torch.cat(tokens, 1)
        ref = self.reference_points.expand(src.shape[0], -1, -1, -1)
        return self.layer(src, self.pos_embed, ref, self.spatial_shapes, self.level_start_index)


def example_inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, EMBED, h, w, generator=gen) for h, w in LEVELS)


_batch = torch.export.Dim("batch", min=1, max=64)
dynamic_shapes = tuple({0: _batch} for _ in LEVELS)

ZOO = tuple(
    row
    for variant, ts_opset, dynamo_opset in (
        (None, 17, 18),
        ("mmdeploy", 17, 18),
        ("standard", 16, 18),
        ("gather", 11, 18),
    )
    for row in (
        ZooCase("torchscript", ts_opset, variant=variant),
        ZooCase("dynamo", dynamo_opset, variant=variant),
        ZooCase("torchscript", ts_opset, variant=variant, dynamic=True),
        ZooCase("dynamo", dynamo_opset, variant=variant, dynamic=True),
    )
)
