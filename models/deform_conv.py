"""A small DCNv2 network: a strided conv backbone whose last stage's 3x3 convs are deformable.

The deformable convs are ``onnx_custom.ops.DeformConv2d`` (the drop-in for
``torchvision.ops.DeformConv2d``). Offsets (and modulation masks) are predicted by plain 3x3 convs
initialized with small random weights, so the sampling really is off-grid (zero init would reduce
every block to a plain conv at export-test time).
"""

from __future__ import annotations

import torch
from torch import nn

import onnx_custom.ort_kernels.deform_conv
import onnx_custom.symbolics.deform_conv  # noqa: F401  (translations, kernels)
from onnx_custom.ops import DeformConv2d
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "DeformBlock", "DeformConv2d", "Model", "dynamic_shapes", "example_inputs"]


class DeformBlock(nn.Module):
    """3x3 deformable conv + ReLU whose offsets (and sigmoid masks, DCNv2) come from a 3x3 conv."""

    def __init__(
        self, channels: int, offset_groups: int = 1, groups: int = 1, modulated: bool = True
    ) -> None:
        super().__init__()
        self.offset_groups, self.modulated = offset_groups, modulated
        taps = offset_groups * 9
        self.predict = nn.Conv2d(channels, taps * (3 if modulated else 2), 3, padding=1)
        self.conv = DeformConv2d(channels, channels, 3, padding=1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pred = self.predict(x)
        taps = self.offset_groups * 9
        offset = pred[:, : 2 * taps]
        mask = pred[:, 2 * taps :].sigmoid() if self.modulated else None
        return torch.relu(self.conv(x, offset, mask))


class Model(nn.Module):
    """Stem (stride 4, 3->32 channels), then two deformable blocks: DCNv2 and grouped DCNv1."""

    def __init__(self) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)  # deterministic init without touching the caller's RNG
        try:
            self.stem = nn.Sequential(
                nn.Conv2d(3, 16, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1),
                nn.ReLU(),
            )
            self.dcn1 = DeformBlock(32)
            self.dcn2 = DeformBlock(32, offset_groups=2, groups=2, modulated=False)
            for block in (self.dcn1, self.dcn2):
                # Offsets of about +-1 px: off-grid sampling that exercises the bilinear path.
                nn.init.normal_(block.predict.weight, std=0.05)
                assert block.predict.bias is not None  # the offset predictor is built with a bias
                nn.init.zeros_(block.predict.bias)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dcn2(self.dcn1(self.stem(x)))


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = (
    {
        0: torch.export.Dim("batch", min=1, max=64),
        2: torch.export.Dim("height", min=8, max=1024),
        3: torch.export.Dim("width", min=8, max=1024),
    },
)

ZOO = (
    ZooCase("torchscript", 11),
    ZooCase("dynamo", 11),
    ZooCase("torchscript", 19),
    ZooCase("dynamo", 19),
    # Dynamic batch, height and width. dynamo: opset 18, the lowest its dynamic Shape nodes allow.
    ZooCase("torchscript", 11, dynamic=True),
    ZooCase("dynamo", 18, dynamic=True),
)
