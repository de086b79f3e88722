"""Our ``aten::convolution_backward`` translation (torchlib has none) against torch's autograd:
grad_input (ConvTranspose), grad_weight (a Conv over the batch), grad_bias (ReduceSum), in 1-3d,
with strides, paddings and dilations whose output padding is nonzero; grouped convs run eager."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import onnx_custom

CASES = {
    "2d-s1-p1": (torch.nn.Conv2d, dict(stride=1, padding=1), (2, 4, 11, 10)),
    "2d-s2-p1-odd": (torch.nn.Conv2d, dict(stride=2, padding=1), (2, 4, 11, 10)),
    "2d-s2-d2": (torch.nn.Conv2d, dict(stride=2, padding=0, dilation=2), (3, 4, 13, 12)),
    "2d-s3-p2": (torch.nn.Conv2d, dict(stride=(3, 2), padding=(2, 1)), (1, 4, 14, 9)),
    "2d-nobias": (torch.nn.Conv2d, dict(stride=1, padding=0, bias=False), (2, 4, 7, 7)),
    "1d-s2": (torch.nn.Conv1d, dict(stride=2, padding=1), (2, 4, 17)),
    "3d-s2": (torch.nn.Conv3d, dict(stride=2, padding=1), (1, 4, 7, 6, 5)),
}


@pytest.mark.parametrize("input_grad", [True, False], ids=["input-grad", "no-input-grad"])
@pytest.mark.parametrize(("cls", "kwargs", "shape"), CASES.values(), ids=CASES.keys())
def test_convolution_backward_matches_autograd(
    cls: Any, kwargs: dict[str, Any], shape: tuple[int, ...], input_grad: bool
) -> None:
    torch.manual_seed(0)
    conv = cls(4, 6, 3, **kwargs)
    reference = copy.deepcopy(conv)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    xs = [x.clone().requires_grad_(input_grad) for _ in range(2)]
    backend = onnx_custom.compile_backend()
    torch.compile(conv, backend=backend)(xs[0]).square().sum().backward()
    reference(xs[1]).square().sum().backward()
    if input_grad:
        torch.testing.assert_close(xs[0].grad, xs[1].grad)
    for (name, p), (_, q) in zip(
        conv.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(
            p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"grad of {n}: {m}"
        )
    assert not [f for r in backend.records for f in r.fallbacks]
    assert all(len(r.partitions) == 1 for r in backend.records)


def test_grouped_convolution_backward_runs_eager() -> None:
    conv = torch.nn.Conv2d(4, 6, 3, groups=2)
    reference = copy.deepcopy(conv)
    x = torch.randn(2, 4, 8, 8)
    backend = onnx_custom.compile_backend()
    with pytest.warns(UserWarning, match="nothing in graph0_backward runs in ONNX Runtime"):
        torch.compile(conv, backend=backend)(x).sum().backward()
    reference(x).sum().backward()
    torch.testing.assert_close(conv.weight.grad, reference.weight.grad)
    (fallback,) = [f for r in backend.records for f in r.fallbacks]
    assert fallback.target == "aten::convolution_backward" and "groups=1" in fallback.reason
