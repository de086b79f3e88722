"""``forward``'s signature is read once per function and reused by later exports (inspect.signature
was a third of resolving a small model's inputs); whatever it is read from changing in between
must be seen by the next export. The reference is the ONNX file's input names and ONNX Runtime's
result against PyTorch eager."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom.runtime import InferenceSession

X = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
Y = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))


def _forward_ab(self: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 2 + b


def _replace_function(cls: type) -> list[str]:
    cls.forward = _forward_ab  # type: ignore[attr-defined]
    return ["a", "b"]


def _rename_in_code(cls: type) -> list[str]:
    def forward(self: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return left * 2 + right

    cls.forward.__code__ = forward.__code__  # type: ignore[attr-defined]
    return ["left", "right"]


def _declared_signature(cls: type) -> list[str]:
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("p", "q")
    ]
    cls.forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return ["p", "q"]


CHANGES: dict[str, Callable[[type], list[str]]] = {
    "function-replaced": _replace_function,
    "code-replaced": _rename_in_code,
    "__signature__-set": _declared_signature,
}


def _export(model: torch.nn.Module, exporter: str) -> list[str]:
    proto = onnx_custom.export(model, (X, Y), exporter=exporter, opset=17)
    names = [i.name for i in proto.graph.input]
    got = InferenceSession(proto).run(None, dict(zip(names, (X.numpy(), Y.numpy()), strict=True)))[
        0
    ]
    np.testing.assert_allclose(got, (X * 2 + Y).numpy(), rtol=1.3e-6, atol=1e-5)
    return names


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_input_names_follow_a_changed_forward(
    change: Callable[[type], list[str]], exporter: str
) -> None:
    def forward(self: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    cls = type("Pair", (torch.nn.Module,), {"forward": forward})  # a class of its own per case
    assert _export(cls(), exporter) == ["x", "y"]
    assert _export(cls(), exporter) == ["x", "y"]  # the cached signature
    expected = change(cls)
    assert _export(cls(), exporter) == expected
