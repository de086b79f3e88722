"""Example inputs bound to ``forward``'s parameters without ``Signature.bind`` when every parameter
is positional and only positional arguments are given (a cold ``bind`` cost ~40 us per export):
the pairs must be what ``inspect.signature(forward).bind`` gives, and a call that does not fit
must still be refused with the signature in the message."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from onnx_custom.errors import DynamicShapesError
from onnx_custom.exporter.dynamic_shapes import _bound_inputs


class _Two(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class _Default(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, scale: float = 2.0, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return x * scale if bias is None else x * scale + bias


class _PositionalOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor, /, y: torch.Tensor) -> torch.Tensor:
        return x - y


class _Varargs(torch.nn.Module):
    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return x + sum(rest)


class _KeywordOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, y: torch.Tensor) -> torch.Tensor:
        return x + y


X = torch.zeros(2, 3)
CASES: dict[str, tuple[type[torch.nn.Module], tuple[Any, ...], dict[str, Any]]] = {
    "two-of-two": (_Two, (X, X), {}),
    "one-of-three-defaults": (_Default, (X,), {}),
    "two-of-three-defaults": (_Default, (X, 3.0), {}),
    "three-of-three": (_Default, (X, 3.0, X), {}),
    "positional-only": (_PositionalOnly, (X, X), {}),
    "varargs-three": (_Varargs, (X, X, X), {}),
    "keyword-only": (_KeywordOnly, (X,), {"y": X}),
    "positional-and-keyword": (_Default, (X,), {"bias": X}),
}


def _reference(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[str, Any]]:
    signature = inspect.signature(model.forward)
    result: list[tuple[str, Any]] = []
    for name, value in signature.bind(*args, **kwargs).arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            result.extend((f"{name}_{i}", v) for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            result.extend(value.items())
        else:
            result.append((name, value))
    return result


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_pairs_as_bind_gives_them(case: str) -> None:
    cls, args, kwargs = CASES[case]
    model = cls()
    for _ in range(2):  # the second call reads the cached signature
        got = _bound_inputs(model, args, kwargs)
        want = _reference(model, args, kwargs)
        assert [n for n, _ in got] == [n for n, _ in want]
        assert all(a is b for (_, a), (_, b) in zip(got, want, strict=True))


@pytest.mark.parametrize(
    ("cls", "args"),
    [(_Two, (X,)), (_Two, (X, X, X)), (_Default, ()), (_KeywordOnly, (X, X))],
    ids=[
        "two-given-one",
        "two-given-three",
        "defaults-given-none",
        "keyword-only-given-positional",
    ],
)
def test_calls_that_do_not_fit_are_refused(
    cls: type[torch.nn.Module], args: tuple[Any, ...]
) -> None:
    model = cls()
    _bound_inputs(
        model, (X,) * 2 if cls is _Two else (X,), {"y": X} if cls is _KeywordOnly else {}
    )  # cache it
    with pytest.raises(DynamicShapesError, match=r"do not fit forward\("):
        _bound_inputs(model, args, {})
