"""Ops with several overloads, declared the legacy way (``torch.library.Library("ns", "DEF")`` +
``lib.define`` + ``lib.impl`` + ``register_fake`` by name), one translation per overload or one
for all, under BOTH exporters.

TorchScript keys symbolics by ``ns::op`` without the overload, and by its ONNX pass a scalar
argument is a tensor constant, so the node has no schema: on main the last overload's translation
served every call and the arguments all arrived positionally (a SymbolicError, or the wrong
translation). Now the call's overload is read off the node (overloads of different arity), and
overloads it cannot tell apart are a SymbolicError naming dynamo as the fix. Files are verified
in ONNX Runtime against the eager ops (written independently below).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import onnx_custom
from onnx_custom.errors import SymbolicError

lib = torch.library.Library("octovl", "DEF")
lib.define("arity(Tensor x, Tensor y, *, float alpha=1.0) -> Tensor")
lib.define("arity.scaled(Tensor x, Tensor y, float s, float t) -> Tensor")
lib.define("same(Tensor x, Tensor y, *, float alpha=1.0) -> Tensor")
lib.define("same.scaled(Tensor x, Tensor y, float s) -> Tensor")
lib.impl("arity", lambda x, y, *, alpha=1.0: x * y + alpha, "CompositeExplicitAutograd")
lib.impl("arity.scaled", lambda x, y, s, t: x * y * s - t, "CompositeExplicitAutograd")
lib.impl("same", lambda x, y, *, alpha=1.0: x * y + alpha, "CompositeExplicitAutograd")
lib.impl("same.scaled", lambda x, y, s: x * y * s, "CompositeExplicitAutograd")
for _name in ("octovl::arity", "octovl::arity.scaled", "octovl::same", "octovl::same.scaled"):
    torch.library.register_fake(_name, lambda x, y, *args, **kwargs: torch.empty_like(x), lib=lib)

per_overload = onnx_custom.default_registry().copy()  # one translation per overload
one_for_all = onnx_custom.default_registry().copy()  # one translation for every overload


def _mul(g: Any, x: Any, y: Any, value: float) -> Any:
    return g.op("Mul", g.op("Mul", x, y), g.constant(value, like=x))


def _add(g: Any, x: Any, value: float) -> Any:
    return g.op("Add", x, g.constant(value, like=x))


@onnx_custom.symbolic("octovl::arity", opset=13, registry=per_overload)
@onnx_custom.symbolic("octovl::same", opset=13, registry=per_overload)
def plus_alpha(g: Any, x: Any, y: Any, *, alpha: float) -> Any:
    return _add(g, g.op("Mul", x, y), alpha)


@onnx_custom.symbolic("octovl::arity.scaled", opset=13, registry=per_overload)
def scaled_minus(g: Any, x: Any, y: Any, *, s: float, t: float) -> Any:
    return _add(g, _mul(g, x, y, s), -t)


@onnx_custom.symbolic("octovl::same.scaled", opset=13, registry=per_overload)
def scaled(g: Any, x: Any, y: Any, *, s: float) -> Any:
    return _mul(g, x, y, s)


@onnx_custom.symbolic("octovl::arity", opset=13, registry=one_for_all)
def any_overload(g: Any, x: Any, y: Any, **kwargs: Any) -> Any:
    if "alpha" in kwargs:
        return _add(g, g.op("Mul", x, y), kwargs["alpha"])
    return _add(g, _mul(g, x, y, kwargs["s"]), -kwargs["t"])


class Arity(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.ops.octovl.arity(x, y, alpha=0.5), torch.ops.octovl.arity.scaled(
            x, y, 3.0, 0.25
        )


class Same(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.ops.octovl.same(x, y, alpha=0.5), torch.ops.octovl.same.scaled(x, y, 3.0)


def reference(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The ops' math written out, independent of the registered kernels."""
    if isinstance(model, Arity):
        return x * y + 0.5, x * y * 3.0 - 0.25
    return x * y + 0.5, x * y * 3.0


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: type[torch.nn.Module]
    registry: onnx_custom.Registry
    torchscript_error: str | None = None  # what TorchScript refuses, matched in the message


CASES = [
    Case("per-overload-different-arity", Arity, per_overload),
    Case("one-translation-for-all-overloads", Arity, one_for_all),
    Case("per-overload-same-arity", Same, per_overload, torchscript_error="exporter='dynamo'"),
]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_overloads_export_to_their_own_translation(
    case: Case, exporter: str, tmp_path: Path
) -> None:
    args = (torch.randn(3, 4), torch.randn(3, 4))
    model = case.model()
    for got, want in zip(model(*args), reference(model, *args), strict=True):
        torch.testing.assert_close(got, want)  # the eager ops are what the reference says
    path = tmp_path / "m.onnx"
    export = lambda: onnx_custom.export(  # noqa: E731
        model,
        args,
        path,
        exporter=exporter,
        opset=18,
        registry=case.registry,
        dynamic_shapes={"x": {0: "batch"}, "y": {0: "batch"}},
    )
    if exporter == "torchscript" and case.torchscript_error is not None:
        with pytest.raises(SymbolicError, match=case.torchscript_error) as caught:
            export()
        assert "octovl::same.scaled" in str(caught.value)
        return
    export()
    onnx_custom.verify(model, args, path, trials=2)  # ORT vs eager at batch 3 and other sizes
