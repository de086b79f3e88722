"""``onnx_custom::my_add`` (2a + b), a ``torch.library`` custom op: standard ops or one node."""

from __future__ import annotations

import torch

import onnx_custom.ops.seed  # noqa: F401  (defines onnx_custom::my_add)
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "example_inputs"]


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(torch.relu(a), b) - 1.0


def example_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g))


dynamic_shapes = ({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")})

ZOO = (
    ZooCase("torchscript", 13),
    ZooCase("torchscript", 13, variant="custom"),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, variant="custom"),
    ZooCase("dynamo", 18, dynamic=True),
    ZooCase("torchscript", 13, variant="custom", dynamic=True),
    ZooCase("dynamo", 18, variant="custom", dynamic=True),
)
