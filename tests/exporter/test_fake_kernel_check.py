"""A torch.library custom op whose fake (meta) kernel declares another rank or dtype than its real
kernel returns is refused at dynamo export (`FakeKernelError`), not at the first eager run in
verify; ops without a real CPU kernel, and kernels that refuse placeholder inputs, raise nothing.
Each distinct call runs its real kernel once."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx_custom
from onnx_custom import FakeKernelError, Registry
from onnx_custom.exporter.fake_kernels import check_fake_kernels

RUNS = {"good": 0}


@torch.library.custom_op("fkcheck::add_dim", mutates_args=())
def add_dim(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).unsqueeze(0)


@add_dim.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # wrong: the real kernel adds a leading dimension


@torch.library.custom_op("fkcheck::sign_long", mutates_args=())
def sign_long(x: torch.Tensor) -> torch.Tensor:
    return (x > 0).long()


@sign_long.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # wrong: the real kernel returns int64


@torch.library.custom_op("fkcheck::good", mutates_args=())
def good(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    RUNS["good"] += 1
    return (x * w).unsqueeze(0)


@good.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((1, *x.shape))


@torch.library.custom_op("fkcheck::cuda_only", mutates_args=(), device_types="cuda")
def cuda_only(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(0)  # pragma: no cover (no CUDA here)


@cuda_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # would be wrong, but there is no CPU kernel to compare with


@torch.library.custom_op("fkcheck::picky", mutates_args=())
def picky(x: torch.Tensor) -> torch.Tensor:
    if not bool((x != 0).all()):
        raise ValueError("picky needs nonzero input")
    return x.unsqueeze(0).clone()


@picky.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((1, *x.shape))


def _registry() -> Registry:
    reg = Registry()
    for name in ("fkcheck::add_dim", "fkcheck::sign_long", "fkcheck::cuda_only"):
        reg.symbolic(name, opset=1)(lambda g, x: g.op("Identity", x))  # as the fakes declare
    reg.symbolic("fkcheck::picky", opset=1)(
        lambda g, x: g.op("Unsqueeze", x, g.constant(np.array([0])))
    )
    reg.symbolic("fkcheck::good", opset=1)(
        lambda g, x, w: g.op("Unsqueeze", g.op("Mul", x, w), g.constant(np.array([0])))
    )
    return reg


class Calls(torch.nn.Module):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.fkcheck, self.op)(x + 1)


DYNAMIC = {"x": {0: torch.export.Dim("batch")}}


@pytest.mark.parametrize(
    ("op", "match"),
    [
        ("add_dim", r"rank-2 float32 tensor.*rank-3 float32 tensor.*different rank"),
        ("sign_long", r"rank-2 float32 tensor.*rank-2 int64 tensor.*different dtype"),
    ],
    ids=["wrong-rank", "wrong-dtype"],
)
def test_a_wrong_fake_kernel_is_refused_at_dynamo_export(op: str, match: str) -> None:
    with pytest.raises(FakeKernelError, match=match) as info:
        onnx_custom.export(
            Calls(op),
            (torch.randn(4, 3),),
            exporter="dynamo",
            dynamic_shapes=DYNAMIC,
            registry=_registry(),
        )
    text = str(info.value)
    assert f"fkcheck::{op}" in text
    assert f"@torch.library.register_fake('fkcheck::{op}')" in text and "Fix:" in text


class Twice(torch.nn.Module):
    """The op three times: twice with one signature, once with another; and on a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.ops.fkcheck.good(x, self.w)
        b = torch.ops.fkcheck.good(x + 1, self.w)
        c = torch.ops.fkcheck.good(x[:1, :2], self.w[:2])
        return a + b + c.sum()


def test_a_right_fake_exports_and_each_distinct_call_runs_once() -> None:
    model, x = Twice().eval(), torch.randn(5, 3)
    RUNS["good"] = 0
    proto = onnx_custom.export(model, (x,), exporter="dynamo", registry=_registry())
    assert RUNS["good"] == 2  # two distinct signatures; no other part of the model ran
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1.3e-6, atol=1e-5)


def test_the_check_costs_one_run_per_signature_on_the_program() -> None:
    program = torch.export.export(Twice(), (torch.randn(5, 3),), strict=False)
    RUNS["good"] = 0
    assert check_fake_kernels(program, (torch.randn(5, 3),)) == 2
    assert RUNS["good"] == 2


def test_an_op_without_a_cpu_kernel_is_skipped() -> None:
    """A CUDA-only op cannot be run here: its fake is trusted, no false alarm."""
    proto = onnx_custom.export(
        Calls("cuda_only"), (torch.randn(4, 3),), exporter="dynamo", registry=_registry()
    )
    assert any(node.op_type == "Identity" for node in proto.graph.node)


def test_a_kernel_refusing_placeholder_inputs_is_skipped() -> None:
    """The kernel raises on zeros (the placeholder for a computed input): skipped, no error."""
    onnx_custom.export(
        Calls("picky"), (torch.randn(4, 3),), exporter="dynamo", registry=_registry()
    )


class OnInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fkcheck.picky(x)


def test_an_op_reading_the_input_directly_runs_on_the_example_value() -> None:
    """On the real example input the picky kernel runs: the check is done, not skipped."""
    program = torch.export.export(OnInput(), (torch.rand(4, 3) + 1,), strict=False)
    assert check_fake_kernels(program, (torch.rand(4, 3) + 1,)) == 1


def test_calls_with_inputs_over_the_limit_are_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnx_custom.exporter import fake_kernels

    program = torch.export.export(Twice(), (torch.randn(5, 3),), strict=False)
    monkeypatch.setattr(fake_kernels, "MAX_INPUT_BYTES", 32)  # x[5,3] float32 is 60 bytes
    RUNS["good"] = 0
    assert check_fake_kernels(program, (torch.randn(5, 3),)) == 1  # only the x[1,2] call runs
    assert RUNS["good"] == 1
