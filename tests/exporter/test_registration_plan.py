"""The TorchScript exporter's symbolics are planned once per registry and opset: a
registry changed between exports (a translation replaced, one added) must export with its new
translations, a registry no longer used must not be kept alive by the plan, and torch's
symbolic table is left as it was after each export. The reference is the ONNX file itself
(node types) run in ONNX Runtime against PyTorch eager."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # registers onnx_custom::my_add
from onnx_custom.exporter.torchscript import registered
from onnx_custom.runtime import InferenceSession
from onnx_custom.translate.registry import Registry

ARGS = (
    torch.randn(2, 3, generator=torch.Generator().manual_seed(0)),
    torch.randn(2, 3, generator=torch.Generator().manual_seed(1)),
)


class AddModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x, y)


def _ops(registry: Registry, opset: int = 17) -> list[str]:
    proto = onnx_custom.export(
        AddModel(), ARGS, exporter="torchscript", opset=opset, registry=registry
    )
    got = InferenceSession(proto).run(None, {"x": ARGS[0].numpy(), "y": ARGS[1].numpy()})[0]
    np.testing.assert_allclose(got, AddModel()(*ARGS).numpy(), rtol=1.3e-6, atol=1e-5)
    return [n.op_type for n in proto.graph.node]


def _via_sub(g: Any, a: Any, b: Any) -> Any:
    """my_add (2 * a + b, alpha = 2 in ops/seed.yaml) written as (a + a) - (-b): the same values,
    other node types."""
    return g.op("Sub", g.op("Add", a, a), g.op("Neg", b))


@pytest.mark.parametrize("opset", [13, 17], ids=["opset13", "opset17"])
def test_replaced_translation_is_used_by_the_next_export(opset: int) -> None:
    registry = onnx_custom.default_registry().copy()
    assert "Sub" not in _ops(registry, opset)
    registry.symbolic("onnx_custom::my_add", opset=opset, replace=True)(_via_sub)
    assert {"Sub", "Neg"} <= set(_ops(registry, opset))


def test_plan_does_not_keep_a_registry_alive() -> None:
    registry = onnx_custom.default_registry().copy()
    _ops(registry)
    ref = weakref.ref(registry)
    del registry
    gc.collect()
    assert ref() is None


def test_symbolic_table_restored_after_each_export() -> None:
    from torch.onnx._internal.torchscript_exporter import registration

    table = registration.registry._registry
    before = {
        name: dict(group._functions._overrides)
        for name, group in table.items()
        if name.startswith("onnx_custom::")
    }
    registry = onnx_custom.default_registry().copy()
    for _ in range(2):
        _ops(registry)
        with registered(registry, opset=17):
            assert "onnx_custom::my_add" in table
    after = {
        name: dict(group._functions._overrides)
        for name, group in table.items()
        if name.startswith("onnx_custom::")
    }
    assert after == before


class Doubled(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y


def test_translation_added_after_an_export_is_registered_by_the_next() -> None:
    registry = Registry()
    onnx_custom.export(
        Doubled(), ARGS, exporter="torchscript", opset=17, registry=registry
    )  # planned without my_add
    registry.symbolic("onnx_custom::my_add", opset=1)(_via_sub)
    assert {"Sub", "Neg"} <= set(_ops(registry))
