"""An ATen op without a TorchScript symbolic at opset 9: ``torch.asinh``."""

from __future__ import annotations

import torch

from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "example_inputs"]


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.asinh(x) * 0.5


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = ({0: torch.export.Dim("batch")},)

ZOO = (
    ZooCase("torchscript", 9),
    ZooCase("torchscript", 17, dynamic=True),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, dynamic=True),
)
