"""Localization reuses what it can: the dynamo exporter's own torch.export program (when still
valid for the model) and verify's outputs of the file; and it is still right when it cannot."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add
import onnx_custom.verification.localize as localize_module
from onnx_custom.exporter import program_cache
from onnx_custom.verification.localize import localize


class Scaled(torch.nn.Module):
    """relu -> mul by a plain Python attribute -> linear -> my_add -> sum: ``scale`` is no
    parameter, so changing it after export changes the model but not its state."""

    def __init__(self) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            self.linear = torch.nn.Linear(4, 4)
        finally:
            torch.random.set_rng_state(generator_state)
        self.scale = 2.0

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = torch.relu(a) * self.scale
        y = torch.ops.onnx_custom.my_add(self.linear(x), b)
        return y.sum(dim=-1)


def _args(batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randn(batch, 4, generator=g), torch.randn(batch, 4, generator=g)


def planted_my_add(g: Any, a: Any, b: Any) -> Any:
    """Wrong on purpose: 3a + b instead of 2a + b."""
    return g.op("Add", g.op("Mul", a, g.constant(3.0, like=a)), b)


@pytest.fixture
def broken_add() -> onnx_custom.Registry:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(planted_my_add)
    return registry


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    program_cache.clear()
    yield
    program_cache.clear()


def _count_traces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = torch.export.export

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(torch.export, "export", counting)
    return calls


def test_verify_reuses_the_exporters_program(
    broken_add: onnx_custom.Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, args = Scaled().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="dynamo", registry=broken_add)
    assert program_cache.recall(model, args) is not None
    calls = _count_traces(monkeypatch)
    report = onnx_custom.verify(
        model, args, proto, registry=broken_add, localize=True, raise_on_mismatch=False
    )
    loc = report.localization
    assert calls == []  # no second torch.export
    assert loc.method == "names" and loc.first is not None and loc.first.fx_name == "my_add"
    assert [n.fx_name for n in loc.origins] == ["my_add"]
    assert not any(n.diverges for n in loc.nodes if n.index < loc.first.index)


def test_a_program_is_not_reused_for_a_changed_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file was right for scale=2; scale=3 makes eager disagree at the mul. The remembered
    program still multiplies by 2 (and would agree with the file everywhere): localize must see
    that its outputs are not eager's and trace the model as it is now."""
    model, args = Scaled().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="dynamo")
    model.scale = 3.0
    calls = _count_traces(monkeypatch)
    report = onnx_custom.verify(model, args, proto, localize=True, raise_on_mismatch=False)
    assert not report.passed
    loc = report.localization
    assert len(calls) == 1  # traced afresh after the reused program's outputs disagreed
    assert loc.first is not None and loc.first.fx_name == "mul" and loc.first.origin
    # Direct calls check against eager themselves.
    calls.clear()
    direct = localize(model, args, proto)
    assert len(calls) == 1 and direct.first is not None and direct.first.fx_name == "mul"


@pytest.mark.parametrize(
    "change",
    [
        "weights-in-place",
        "weights-replaced",
        "train-mode",
        "other-batch",
        "other-dtype",
        "other-model",
    ],
)
def test_recall_misses_when_what_the_program_depends_on_changed(change: str) -> None:
    model, args = Scaled().eval(), _args()
    onnx_custom.export(model, args, exporter="dynamo")
    assert program_cache.recall(model, args) is not None
    if change == "weights-in-place":
        with torch.no_grad():
            model.linear.weight.mul_(2)
    elif change == "weights-replaced":
        model.linear.weight = torch.nn.Parameter(model.linear.weight.detach().clone())
    elif change == "train-mode":
        model.train()
    elif change == "other-batch":
        args = _args(batch=5)
    elif change == "other-dtype":
        args = tuple(a.double() for a in args)  # type: ignore[assignment]
    else:
        model = Scaled().eval()
    assert program_cache.recall(model, args) is None


def test_the_cache_holds_models_weakly() -> None:
    model, args = Scaled().eval(), _args()
    onnx_custom.export(model, args, exporter="dynamo")
    ref = __import__("weakref").ref(model)
    del model
    gc.collect()
    assert ref() is None
    program_cache.remember("not a module", args, None)  # type: ignore[arg-type]
    assert program_cache.recall("not a module", args) is None


def test_torchscript_probe_uses_verifys_outputs_of_the_file(
    broken_add: onnx_custom.Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, args = Scaled().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="torchscript", registry=broken_add)

    def no_second_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("the file was run again")

    monkeypatch.setattr(localize_module, "_run", no_second_run)
    report = onnx_custom.verify(
        model, args, proto, registry=broken_add, localize=True, raise_on_mismatch=False
    )
    loc = report.localization
    assert loc.method == "probe" and loc.first is not None and loc.first.fx_name == "my_add"
    assert "the given file's outputs equal the re-export's" in loc.note
    # Told other outputs, the probe says the file is not the re-export.
    other = localize(model, args, proto, registry=broken_add, file_outputs=[torch.zeros(3).numpy()])
    assert "WARNING: the given file's output for sum_1 differs" in other.note


class LastAndTyped(torch.nn.Module):
    """int64 (argmax) and bool (comparison) intermediates feed the output; the planted my_add is
    the last op of the graph, so nothing downstream can point at it."""

    def forward(self, x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = x.argmax(dim=-1)
        positive = x > 0
        kept = torch.where(positive, x, torch.zeros_like(x))
        return index, torch.ops.onnx_custom.my_add(kept, b)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_divergence_in_the_last_node_next_to_int_and_bool_values(
    exporter: str, broken_add: onnx_custom.Registry
) -> None:
    model, args = LastAndTyped().eval(), _args(batch=5)
    proto = onnx_custom.export(model, args, exporter=exporter, registry=broken_add)
    report = onnx_custom.verify(
        model, args, proto, registry=broken_add, localize=True, raise_on_mismatch=False
    )
    loc = report.localization
    assert loc.first is not None and loc.first.fx_name == "my_add" and loc.first.origin
    assert loc.nodes[-1].fx_name == "my_add"  # the last node, named exactly
    assert [n.fx_name for n in loc.diverging] == ["my_add"]
    typed = {v.dtype: v for n in loc.nodes for v in n.outputs if v.observed}
    assert {"int64", "bool"} <= set(typed)  # compared exactly, and equal
    assert typed["int64"].passed and typed["int64"].total == 5
    assert typed["bool"].passed and typed["bool"].total == 20
