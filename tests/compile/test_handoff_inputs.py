"""The partition hand-off (`OrtPartition.run`, one pass over the inputs now) takes
every input kind it did before: contiguous tensors as they are, non-contiguous views (copied),
``nn.Parameter``s, and refuses a dtype ONNX Runtime cannot wrap with a typed error naming it.
The reference is PyTorch eager on the same inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import onnx_custom
from onnx_custom.errors import OnnxCustomError


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + y)


def _partition() -> Any:
    backend = onnx_custom.compile_backend()
    compiled = torch.compile(Affine(), backend=backend)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), Affine()(x, y))
    (runner,) = [p.runner for r in backend.records for p in r.partitions]
    return runner


_G = torch.Generator().manual_seed(0)
CASES = {
    "contiguous": (torch.randn(4, 6, generator=_G), torch.randn(4, 6, generator=_G)),
    "transposed-view": (torch.randn(6, 4, generator=_G).t(), torch.randn(4, 6, generator=_G)),
    "sliced-view": (torch.randn(4, 12, generator=_G)[:, ::2], torch.randn(4, 6, generator=_G)),
    "parameter": (
        torch.nn.Parameter(torch.randn(4, 6, generator=_G), requires_grad=False),
        torch.randn(4, 6, generator=_G),
    ),
}


@pytest.mark.parametrize("name", list(CASES), ids=[f"{n}-4x6" for n in CASES])
def test_partition_inputs_match_eager(name: str) -> None:
    runner = _partition()
    x, y = CASES[name]
    (got,) = runner.run([x, y])
    torch.testing.assert_close(got, Affine()(x, y), rtol=1.3e-6, atol=1e-5)


def test_partition_refuses_a_dtype_it_cannot_wrap() -> None:
    runner = _partition()
    x = torch.randn(4, 6).to(torch.bfloat16)
    with pytest.raises(
        OnnxCustomError, match=r"input dtype torch.bfloat16 cannot be handed to ONNX Runtime"
    ):
        runner.run([x, torch.randn(4, 6)])
