"""The seed article's pattern: ``MyAddFunction`` (an autograd.Function calling the C++ op).

The TorchScript exporter uses the Function's translation from our registry. The dynamo exporter
inlines Functions and would silently ignore that translation, so onnx-custom refuses; the dynamo
route is to call ``onnx_custom_ext::my_add`` directly (see ``models/my_add_ext.py``).
"""

from __future__ import annotations

import torch

import onnx_custom.symbolics.extension  # noqa: F401  (translation of MyAddFunction)
from onnx_custom.errors import ExtensionBuildError
from onnx_custom.ops.extension import MyAddFunction, load_my_ops
from onnx_custom.testing import ZooCase

__all__ = ["ZOO", "Model", "dynamic_shapes", "example_inputs"]

try:
    load_my_ops()
except ExtensionBuildError as exc:
    exc.skip_reason = f"C++ extension unavailable: {exc}"  # type: ignore[attr-defined]
    raise


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return MyAddFunction.apply(a, torch.sigmoid(b)) + 1.0


def example_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g))


dynamic_shapes = ({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")})

ZOO = (
    ZooCase("torchscript", 17),
    ZooCase("torchscript", 17, variant="custom"),
    ZooCase(
        "torchscript",
        17,
        variant="custom",
        dynamic=True,
        note="dynamo: see my_add_ext's dynamic rows",
    ),
    ZooCase(
        "dynamo",
        18,
        expect_error="dynamo exporter ignores Function translations",
        note=(
            "autograd.Function is TorchScript-only; export onnx_custom_ext::my_add directly"
            " (my_add_ext)"
        ),
    ),
)
