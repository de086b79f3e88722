"""``g.op`` remembers the signatures of standard nodes whose checks passed with nothing to change
(`GraphBuilder._checked_standard`). Each case first exports a node that passes (the verdict is
remembered), then one that differs in a single part of the signature and must still be refused,
promoted or widened: input dtypes, attribute names, the half-precision deferral, an int
attribute the schema widens to float. The reference for a passing file is ONNX Runtime's output
against the eager op (an independent computation)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_custom
from onnx_custom import SymbolicError
from onnx_custom.translate.builder import onnx_dtype


@torch.library.custom_op("octverdict::ident", mutates_args=())
def ident(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@ident.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class One(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ident(x)


Body = Callable[[Any, Any], Any]


def _export(body: Body, x: torch.Tensor, **options: Any) -> onnx.ModelProto:
    reg = onnx_custom.Registry()
    reg.symbolic("octverdict::ident")(lambda g, x: body(g, x))
    buffer = io.BytesIO()
    onnx_custom.export(
        One(), (x,), buffer, exporter="torchscript", opset=13, registry=reg, **options
    )
    return onnx.load_from_string(buffer.getvalue())


def _run(model: onnx.ModelProto, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def _same(g: Any, x: Any) -> Any:  # Concat(x, x) then the first half: x again
    both = g.op("Concat", x, x, axis=0)
    return g.op("Slice", both, g.constant([0]), g.constant([x_rows(g)]), g.constant([0]))


def x_rows(g: Any) -> int:
    return g.outputs[0].shape[0]


def _mixed(g: Any, x: Any) -> Any:  # Concat(float, double): refused
    return g.op("Concat", x, g.op("Cast", x, to=onnx.TensorProto.DOUBLE), axis=0)


def _cast_without_to(g: Any, x: Any) -> Any:
    return g.op("Cast", x)


def _cast_to_own_dtype(g: Any, x: Any) -> Any:
    return g.op("Cast", x, to=onnx_dtype(g.dtype(x)))


def _leaky_int_alpha(g: Any, x: Any) -> Any:  # alpha=0 is an int: the schema widens it to float
    return g.op("LeakyRelu", x, alpha=0)


def _sin(g: Any, x: Any) -> Any:  # Sin's schema takes bfloat16 from opset 22 on
    return g.op("Sin", x)


CASES: dict[str, list[tuple[Body, torch.dtype, dict[str, Any], str | None]]] = {
    "dtypes: Concat(f32,f32) then Concat(f32,f64)": [
        (_same, torch.float32, {}, None),
        (_mixed, torch.float32, {}, "same element type"),
    ],
    "attributes: Cast(to=) then Cast()": [
        (_cast_to_own_dtype, torch.float32, {}, None),
        (_cast_without_to, torch.float32, {}, "requires the attribute"),
    ],
    "half deferral: Sin(bf16) deferred then half_precision=off": [
        (_sin, torch.bfloat16, {}, None),
        (_sin, torch.bfloat16, {"half_precision": "off"}, "bfloat16"),
    ],
    "widened int attribute, twice": [
        (_leaky_int_alpha, torch.float32, {}, None),
        (_leaky_int_alpha, torch.float32, {}, None),
    ],
}


@pytest.mark.parametrize("steps", list(CASES.values()), ids=list(CASES))
def test_remembered_verdicts_never_pass_another_signature(
    steps: list[tuple[Body, torch.dtype, dict[str, Any], str | None]],
) -> None:
    torch.manual_seed(0)
    x32 = torch.randn(3, 4)
    for body, dtype, options, error in steps:
        x = x32.to(dtype)
        if error is not None:
            with pytest.raises(SymbolicError, match=error):
                _export(body, x, **options)
            continue
        model = _export(body, x, **options)
        onnx.checker.check_model(model, full_check=True)
        if dtype == torch.bfloat16:
            continue  # numpy has no bfloat16 to feed ONNX Runtime; the file is checked above
        expected = {
            _leaky_int_alpha: torch.nn.functional.leaky_relu(x32, 0.0),
            _sin: torch.sin(x32),
        }.get(body, x32)
        torch.testing.assert_close(
            torch.from_numpy(_run(model, x)).float(),
            expected,
            **({"atol": 1e-3, "rtol": 1e-3} if dtype == torch.float16 else {}),
        )
