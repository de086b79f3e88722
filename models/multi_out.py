"""``onnx_custom::multi_out(x) -> (x * 2, x + 3)``: one 2-output custom node, or standard ops."""

from __future__ import annotations

import torch

import onnx_custom.ops.seed  # noqa: F401  (defines onnx_custom::multi_out)
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "dynamic_shapes", "example_inputs"]


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        doubled, shifted = torch.ops.onnx_custom.multi_out(x)
        return doubled.sum(dim=-1), shifted * doubled


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(4, 5, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = ({0: torch.export.Dim("batch")},)

ZOO = (
    ZooCase("torchscript", 13),
    ZooCase("torchscript", 13, variant="custom"),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, variant="custom"),
    ZooCase("torchscript", 13, variant="custom", dynamic=True),
    ZooCase("dynamo", 18, variant="custom", dynamic=True),
)
