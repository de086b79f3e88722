"""``onnx_custom::numpy_sin``: a custom_op with a NumPy kernel, exported as ONNX ``Sin``."""

from __future__ import annotations

import torch

import onnx_custom.symbolics.numpy_sin  # noqa: F401  (translation)
from onnx_custom.ops.numpy_sin import numpy_sin
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "dynamic_shapes", "example_inputs"]


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return numpy_sin(x * 2.0) + x


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(3, 16, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = ({0: torch.export.Dim("batch")},)

ZOO = (
    ZooCase("torchscript", 13),
    ZooCase("torchscript", 17),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, dynamic=True),
)
