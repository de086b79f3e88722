"""verify(localize=True): a passing file costs what a plain verify costs (the whole file runs once
per trial, nothing is localized); a failing trial is judged on the whole file's outputs, localized
once, and later trials still run the file (its session, dropped for the localization, is made
again)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from test_localize_reuse import planted_my_add

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add
import onnx_custom.verification.verifier as verifier_module
from onnx_custom.exporter import program_cache
from onnx_custom.runtime import KernelRegistry

Dim = torch.export.Dim


class ReluAddScale(torch.nn.Module):
    """relu -> my_add -> linear -> tanh: the planted node sits between two correct ones."""

    def __init__(self) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            self.linear = torch.nn.Linear(4, 4)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.ops.onnx_custom.my_add(torch.relu(a), b)
        return torch.tanh(self.linear(y))


def _args(batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return torch.randn(batch, 4, generator=g), torch.randn(batch, 4, generator=g)


def _custom_node(kernel_scale: float) -> tuple[onnx_custom.Registry, KernelRegistry]:
    """my_add as a custom node ``octest_pass::my_add`` whose Python kernel computes
    ``scale * a + b``."""
    kernels = KernelRegistry()
    kernels.kernel("octest_pass::my_add", inputs=["a", "b"], outputs=["y"], shape_fn="broadcast")(
        lambda a, b: kernel_scale * a + b
    )
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(
        lambda g, a, b: g.op("octest_pass::my_add", a, b)
    )
    return registry, kernels


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    program_cache.clear()
    yield
    program_cache.clear()


def _count_whole_file_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = verifier_module.run_onnx

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(verifier_module, "run_onnx", counting)
    return calls


def test_a_failing_trial_is_judged_on_the_whole_file_and_localized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, args = ReluAddScale().eval(), _args()
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(planted_my_add)  # 3a + b
    proto = onnx_custom.export(model, args, exporter="dynamo", registry=registry)
    runs = _count_whole_file_runs(monkeypatch)
    report = onnx_custom.verify(
        model, args, proto, registry=registry, localize=True, raise_on_mismatch=False
    )
    assert len(runs) == len(
        report.shapes_tried
    )  # every trial ran the whole file, after the localization too
    assert not report.passed and report.failed_trials()
    loc = report.localization
    assert (
        loc.method == "names"
        and loc.first is not None
        and loc.first.fx_name == "my_add"
        and loc.first.origin
    )
    # The outputs verify compared are the file's:
    # the same differences a plain ORT run of the whole file gives.
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (whole,) = session.run(None, {"a": args[0].numpy(), "b": args[1].numpy()})
    with torch.no_grad():
        expected = model(*args).numpy()
    compared = report.comparisons[0]
    assert compared.max_abs_diff == pytest.approx(
        float(np.abs(expected.astype(np.float64) - whole).max()), rel=1e-5
    )


def test_a_passing_file_runs_once_per_trial_and_is_not_localized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, args = ReluAddScale().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="dynamo")
    runs = _count_whole_file_runs(monkeypatch)
    report = onnx_custom.verify(model, args, proto, localize=True)
    assert report.passed and report.localization is None
    assert len(runs) == len(report.shapes_tried)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_planted_kernel_is_named_at_every_trial_shape(exporter: str) -> None:
    """A wrong Python kernel (3a + b) for a custom node, dynamic batch: every trial fails, the
    localization names my_add, and the report still says which kernel served the node."""
    model, args = ReluAddScale().eval(), _args(batch=3)
    registry, wrong = _custom_node(kernel_scale=3.0)
    _, right = _custom_node(kernel_scale=2.0)
    dynamic = ({0: Dim("batch")}, {0: Dim("batch")})
    proto = onnx_custom.export(
        model, args, exporter=exporter, registry=registry, dynamic_shapes=dynamic, kernels=right
    )
    assert onnx_custom.verify(model, args, proto, kernels=right, localize=True).passed
    report = onnx_custom.verify(
        model, args, proto, registry=registry, kernels=wrong, localize=True, raise_on_mismatch=False
    )
    assert len(report.shapes_tried) > 1 and {r.kind for r in report.shapes_tried} >= {
        "example",
        "shape",
    }
    assert all(r.status == "failed" for r in report.shapes_tried)
    loc = report.localization
    assert (
        loc.trial == 0
        and loc.first is not None
        and loc.first.fx_name == "my_add"
        and loc.first.origin
    )
    assert not any(n.diverges for n in loc.nodes if n.index < loc.first.index)
    served = {i.node_type: i.kind for i in report.implementations["onnxruntime"]}
    assert served == {"octest_pass::my_add": "python"}
