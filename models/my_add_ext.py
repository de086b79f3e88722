"""``onnx_custom_ext::my_add`` (2a + b) from the C++ extension, called directly: both exporters.

Importing this module builds (once, cached) and loads the extension; without a compiler or ninja
the import raises ExtensionBuildError carrying ``skip_reason`` and the zoo skips the model.
"""

from __future__ import annotations

import torch

import onnx_custom.symbolics.extension  # noqa: F401  (translations of onnx_custom_ext::my_add)
from onnx_custom.errors import ExtensionBuildError
from onnx_custom.ops.extension import load_my_ops
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "dynamic_shapes", "example_inputs"]

try:
    load_my_ops()
except ExtensionBuildError as exc:
    exc.skip_reason = f"C++ extension unavailable: {exc}"  # type: ignore[attr-defined]
    raise


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom_ext.my_add(torch.tanh(a), b) * 0.5


def example_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g))


dynamic_shapes = ({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")})

ZOO = (
    ZooCase("torchscript", 17),
    ZooCase("torchscript", 17, variant="custom"),
    ZooCase("dynamo", 18),
    ZooCase("dynamo", 18, variant="custom"),
    ZooCase("dynamo", 18, dynamic=True),
    ZooCase("torchscript", 17, variant="custom", dynamic=True),
    ZooCase("dynamo", 18, variant="custom", dynamic=True),
)
