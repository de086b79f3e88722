"""A small DCNv2 network: a strided conv backbone whose last stage's 3x3 convs are deformable.

``DeformConv2d`` has the constructor and forward of ``torchvision.ops.DeformConv2d`` (same
parameter init), backed by ``onnx_custom::deform_conv2d``. Offsets (and modulation masks) are
predicted by plain 3x3 convs initialized with small random weights, so the sampling really is
off-grid (zero init would reduce every block to a plain conv at export-test time).
"""

from __future__ import annotations

import math

import torch
from torch import nn

import onnx_custom.ort_kernels.vision
import onnx_custom.symbolics.vision  # noqa: F401  (translations, kernels)
from onnx_custom.ops.deform_conv import deform_conv2d
from onnx_custom.zoo import ZooCase

__all__ = ["ZOO", "DeformBlock", "DeformConv2d", "Model", "dynamic_shapes", "example_inputs"]


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class DeformConv2d(nn.Module):
    """Same constructor and ``forward(input, offset, mask=None)`` as torchvision's."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if in_channels % groups != 0 or out_channels % groups != 0:
            raise ValueError(
                f"DeformConv2d: in_channels={in_channels} and out_channels={out_channels} must "
                f"both be divisible by groups={groups}."
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = groups
        self.weight = nn.Parameter(
            torch.empty(out_channels, in_channels // groups, *self.kernel_size)
        )
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(
        self, input: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return deform_conv2d(input, offset, self.weight, self.bias, self.stride, self.padding,
                             self.dilation, mask)  # fmt: skip

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}")  # fmt: skip


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
                nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            )  # fmt: skip
            self.dcn1 = DeformBlock(32)
            self.dcn2 = DeformBlock(32, offset_groups=2, groups=2, modulated=False)
            for block in (self.dcn1, self.dcn2):
                # Offsets of about +-1 px: off-grid sampling that exercises the bilinear path.
                nn.init.normal_(block.predict.weight, std=0.05)
                nn.init.zeros_(block.predict.bias)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dcn2(self.dcn1(self.stem(x)))


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = (
    {0: torch.export.Dim("batch", min=1, max=64), 2: torch.export.Dim("height", min=8, max=1024),
     3: torch.export.Dim("width", min=8, max=1024)},
)  # fmt: skip

ZOO = (
    ZooCase("torchscript", 11),
    ZooCase("dynamo", 11),
    ZooCase("torchscript", 19),
    ZooCase("dynamo", 19),
)
