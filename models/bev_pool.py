"""BEVDet's ``bev_pool_v2`` on a synthetic 6-camera rig: 59 depth bins, 16x44 features, 128x128 BEV.

The ranks/intervals depend only on the camera geometry, so (as in BEVDet's TensorRT deployment)
they are precomputed once with ``prepare_bev_ranks`` and stored as buffers.
"""

from __future__ import annotations

import torch

import onnx_custom.ort_kernels.bev_pool
import onnx_custom.symbolics.bev_pool  # noqa: F401  (translations)
from onnx_custom.ops.bev_pool import bev_pool_v2, prepare_bev_ranks, synthetic_frustum
from onnx_custom.testing import ZooCase

__all__ = ["BEV_SHAPE", "ZOO", "Model", "example_inputs"]

CAMERAS, DEPTH_BINS, FEAT_HW, CHANNELS = 6, 59, (16, 44), 32
GRID_LOWER, GRID_STEP, GRID_SIZE = (-51.2, -51.2, -5.0), (0.8, 0.8, 8.0), (128, 128, 1)
BEV_SHAPE = [1, GRID_SIZE[2], GRID_SIZE[1], GRID_SIZE[0], CHANNELS]  # B, Z, Y, X, C


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        coor = synthetic_frustum(1, CAMERAS, DEPTH_BINS, FEAT_HW)
        ranks = prepare_bev_ranks(coor, GRID_LOWER, GRID_STEP, GRID_SIZE)
        for name, value in zip(
            ("ranks_bev", "ranks_depth", "ranks_feat", "starts", "lengths"), ranks, strict=True
        ):
            self.register_buffer(name, value)

    def forward(self, depth_logits: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        depth = depth_logits.softmax(dim=2)
        return bev_pool_v2(
            depth,
            feat,
            self.ranks_depth,
            self.ranks_feat,
            self.ranks_bev,
            BEV_SHAPE,
            self.starts,
            self.lengths,
        )


def example_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    fh, fw = FEAT_HW
    return (
        torch.randn(1, CAMERAS, DEPTH_BINS, fh, fw, generator=g),
        torch.randn(1, CAMERAS, fh, fw, CHANNELS, generator=g),
    )


_FIXED_BATCH = (
    "no dynamic batch: the batch is fixed by BEV_SHAPE (bev_pool_v2's bev_feat_shape) and by the "
    "ranks precomputed for one camera rig, and no other dim can vary without new ranks"
)

ZOO = (
    ZooCase("torchscript", 17),
    ZooCase("torchscript", 17, variant="custom"),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, variant="custom"),
    ZooCase("torchscript", 17, variant="custom", dynamic=True, skip=_FIXED_BATCH),
    ZooCase("dynamo", 18, variant="custom", dynamic=True, skip=_FIXED_BATCH),
)
