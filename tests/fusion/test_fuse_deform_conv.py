"""A pure-PyTorch deformable convolution (torchvision's ``deform_conv2d`` signature) fused into
``onnx_custom::deform_conv2d`` with a ``(target, replacement)`` pair."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fusion_cases import op_counts
from torch import Tensor, nn

import onnx_custom
from onnx_custom.fusion import fusion_report
from onnx_custom.ops.deform_conv import deform_conv2d


def torch_deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    mask: Tensor | None = None,
) -> Tensor:
    """Deformable convolution (one group, one offset group) with ``F.grid_sample``: every kernel
    tap samples the input at its shifted pixel (align_corners=True maps pixel coordinates, zero
    padding outside), then one contraction with the weight."""
    _, c, h, w = input.shape
    out_channels, _, kh, kw = weight.shape
    oh = (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    ys = (torch.arange(oh) * stride[0] - padding[0]).to(input.dtype)[:, None]
    xs = (torch.arange(ow) * stride[1] - padding[1]).to(input.dtype)[None, :]
    taps = []
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            y = ys + i * dilation[0] + offset[:, 2 * k]
            x = xs + j * dilation[1] + offset[:, 2 * k + 1]
            grid = torch.stack([2 * x / (w - 1) - 1, 2 * y / (h - 1) - 1], dim=-1)
            sample = F.grid_sample(
                input, grid, mode="bilinear", padding_mode="zeros", align_corners=True
            )
            taps.append(sample if mask is None else sample * mask[:, k : k + 1])
    columns = torch.stack(taps, dim=2)  # (n, c, kh*kw, oh, ow)
    out = torch.einsum("nckhw,ock->nohw", columns, weight.reshape(out_channels, c, kh * kw))
    return out if bias is None else out + bias[None, :, None, None]


class DeformBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.offsets = nn.Conv2d(4, 2 * 9, 3, padding=1)
        self.masks = nn.Conv2d(4, 9, 3, padding=1)
        self.weight = nn.Parameter(torch.randn(6, 4, 3, 3) * 0.2)
        self.bias = nn.Parameter(torch.randn(6))

    def forward(self, x: Tensor) -> Tensor:
        offset = self.offsets(x) * 2
        mask = self.masks(x).sigmoid()
        return torch_deform_conv2d(x, offset, self.weight, self.bias, (1, 1), (1, 1), (1, 1), mask)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_pure_torch_deform_conv2d_is_fused(exporter: str) -> None:
    model = DeformBlock().eval()
    args = (torch.randn(2, 4, 7, 6, generator=torch.Generator().manual_seed(3)),)
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        registry=onnx_custom.default_registry().with_variants("custom"),
        fuse=[(torch_deform_conv2d, deform_conv2d)],
    )
    counts = op_counts(proto)
    assert counts.get("DeformConv2d") == 1 and "GridSample" not in counts, counts
    (site,) = fusion_report(proto).fused  # type: ignore[union-attr]
    assert site.op.endswith("deform_conv.deform_conv2d")
    onnx_custom.verify(model, args, proto)  # against the pure-PyTorch (unfused) model
