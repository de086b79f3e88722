"""deform_conv2d under ``torch.compile(fullgraph=True)``: aot_eager and inductor, static and
``dynamic=True``, forward and backward, against eager (a second input size checks the dynamic
graph and the recompile of the static one)."""

from __future__ import annotations

import pytest
import torch

from onnx_custom.ops import DeformConv2d
from onnx_custom.ops.deform_conv import load_extension


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


SIZES = [(2, 7, 6), (3, 9, 5)]  # (N, H, W): the second one is not the first compile's


def _inputs(n: int, h: int, w: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n * 100 + h)
    x = torch.randn(n, 4, h, w, generator=g)
    offset = torch.randn(n, 18, h, w, generator=g) * 1.5
    mask = torch.rand(n, 9, h, w, generator=g)
    return tuple(t.requires_grad_() for t in (x, offset, mask))


def _check(backend: str, dynamic: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = DeformConv2d(4, 6, 3, padding=1)

    def step(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return module(x, offset, mask).relu().square().sum()

    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=dynamic)
    for size in SIZES:
        inputs = _inputs(*size)
        leaves = (*inputs, module.weight, module.bias)
        expected = step(*inputs)
        expected_grads = torch.autograd.grad(expected, leaves)
        got = compiled(*inputs)
        got_grads = torch.autograd.grad(got, leaves)
        torch.testing.assert_close(got, expected)
        for name, a, b in zip(
            ("x", "offset", "mask", "weight", "bias"), got_grads, expected_grads, strict=True
        ):
            torch.testing.assert_close(a, b, msg=lambda m, n=name, s=size: f"{n} at {s}: {m}")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_aot_eager(dynamic: bool) -> None:
    _check("aot_eager", dynamic)


@pytest.mark.slow  # inductor's first CPU compile takes ~1-2 min on a loaded 2-core machine
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_inductor(dynamic: bool) -> None:
    _check("inductor", dynamic)
