"""``onnx_custom::multi_out3(x, repeats, scale)``: 3 outputs of other shapes, INTS + FLOAT attrs."""

from __future__ import annotations

import torch

import onnx_custom.ort_kernels.multi_out3
import onnx_custom.symbolics.multi_out3  # noqa: F401  (translations)
from onnx_custom.ops.multi_out3 import multi_out3
from onnx_custom.testing import ZooCase

__all__ = ["REPEATS", "SCALE", "ZOO", "Model", "dynamic_shapes", "example_inputs"]

REPEATS = (2, 1, 3)
SCALE = 0.25


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scaled, tiled, summed = multi_out3(x, list(REPEATS), SCALE)
        return scaled, tiled.relu(), summed


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = ({0: torch.export.Dim("batch")},)

ZOO = (
    ZooCase("torchscript", 13),
    ZooCase("torchscript", 13, variant="custom"),
    ZooCase("torchscript", 11),  # ReduceSum with the axes attribute
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, variant="custom"),
    ZooCase("dynamo", 18, variant="custom", dynamic=True),  # kernel shape_fn on symbolic dims
    ZooCase("torchscript", 13, variant="custom", dynamic=True),
)
