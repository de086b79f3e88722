"""Tensors made from Python data inside ``forward`` (``torch.as_tensor(list)``, ``torch.tensor``).

Deformable-attention models build their level shapes this way (``torch.as_tensor(spatial_shapes)``
from the feature maps' sizes): aot_autograd makes such a tensor a graph constant, which the
backend must keep as a constant in the ONNX graph (inference, training, next to an eager node).
The reference is the uncompiled model.
"""

from __future__ import annotations

import pytest
import torch

import onnx_custom
from onnx_custom.compile import torch_adapter


class LevelShapes(torch.nn.Module):
    """Two feature levels whose (h, w) become a tensor, as multi-scale attention models do."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels = [self.proj(x), torch.nn.functional.avg_pool2d(self.proj(x), 2)]
        shapes = [(f.shape[2], f.shape[3]) for f in levels]
        spatial = torch.as_tensor(shapes, dtype=torch.long, device=x.device)
        starts = torch.cat((spatial.new_zeros((1,)), spatial.prod(1).cumsum(0)[:-1]))
        weights = torch.tensor([0.25, 0.75], dtype=x.dtype)
        flat = torch.cat([f.flatten(2) for f in levels], dim=2)
        scale = (starts.to(x.dtype) + 1).sum() * weights.sum()
        return flat * scale


@torch.library.custom_op("compile_const_test::eager_only", mutates_args=())
def eager_only(x: torch.Tensor) -> torch.Tensor:
    return x.sin()


@eager_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class ConstantBesideEager(torch.nn.Module):
    """A constant in an ORT partition next to an op without a translation (runs in PyTorch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = torch.as_tensor([[1.0, 2.0, 3.0]], dtype=x.dtype)
        return eager_only(x + offsets) * torch.tensor(2.0, dtype=x.dtype)


@pytest.mark.parametrize("shape", [(1, 3, 8, 8), (2, 3, 6, 10)], ids=["1x3x8x8", "2x3x6x10"])
def test_tensor_from_python_data_runs_in_ort(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = LevelShapes().eval()
    x = torch.randn(shape)
    backend = onnx_custom.compile_backend(fallback="error")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert backend.records and all(not r.fallbacks for r in backend.records)
    assert backend.records[0].partitions


def test_tensor_from_python_data_training_step() -> None:
    torch.manual_seed(0)
    model = LevelShapes()
    reference = LevelShapes()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 8, 8)
    compiled = torch.compile(model, backend="onnx_custom")
    compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert got.grad is not None, name
        torch.testing.assert_close(got.grad, want.grad)


def test_tensor_constant_next_to_an_eager_op() -> None:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    model = ConstantBesideEager()
    backend = onnx_custom.compile_backend()
    compiled = torch.compile(model, backend=backend)
    torch.testing.assert_close(compiled(x), model(x))
    assert [f.target for r in backend.records for f in r.fallbacks] == [
        "compile_const_test::eager_only"
    ]
    assert backend.records[0].partitions  # the constants' side runs in ORT


def test_lifting_ops_are_never_decomposed() -> None:
    registry = torch_adapter.torchlib_registry(18)
    table = torch_adapter.decompositions(registry)
    lifted = [op for op in table if str(op.name()).split(".")[0] in torch_adapter.LIFTS]
    assert lifted == []
