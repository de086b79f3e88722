"""``onnx_custom::custom_linear`` (the NPU article): MatMul(+Add), Gemm or one CustomLinear node."""

from __future__ import annotations

import torch

import onnx_custom.ort_kernels.custom_linear
import onnx_custom.symbolics.custom_linear  # noqa: F401  (translations)
from onnx_custom.ops.custom_linear import custom_linear
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "dynamic_shapes", "example_inputs"]


class Model(torch.nn.Module):
    def __init__(self, in_features: int = 16, hidden: int = 32, out_features: int = 8) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(hidden, in_features, generator=g) * 0.2)
        self.b1 = torch.nn.Parameter(torch.randn(hidden, generator=g) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(out_features, hidden, generator=g) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(custom_linear(x, self.w1, self.b1))
        return custom_linear(hidden, self.w2)  # no bias: the optional input stays absent


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(0)),)


dynamic_shapes = ({0: torch.export.Dim("batch")},)

ZOO = (
    ZooCase("torchscript", 17),
    ZooCase("torchscript", 17, variant="gemm"),
    ZooCase("torchscript", 17, variant="custom"),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, variant="gemm"),
    ZooCase("dynamo", 18, variant="custom"),
    ZooCase("dynamo", 18, dynamic=True),
    ZooCase("torchscript", 17, variant="custom", dynamic=True),
    ZooCase("dynamo", 18, variant="custom", dynamic=True),
)
