"""``@onnxscript.script`` translations in ``translation_table(extra=...)``
(torch.onnx's tutorial style).

torch 2.13 counts a script function's outputs from its return annotation only; without one the
export failed in onnxscript's InlinePass. Checked end to end in ONNX Runtime against torch.
"""

from __future__ import annotations

import typing

import numpy as np
import onnxruntime as ort
import onnxscript
import pytest
import torch
from onnxscript import opset18 as op

import onnx_custom
from onnx_custom.exporter.dynamo import with_output_count

__all__: list[str] = []

_TUTORIAL_DOMAIN = onnxscript.values.Opset(domain="onnx-script", version=1)
_DEFAULT_DOMAIN = onnxscript.values.Opset("", 18)


@onnxscript.script(_TUTORIAL_DOMAIN)
def _add_custom_domain(self, other, alpha: float = 1.0):  # type: ignore[no-untyped-def]  # unannotated on purpose
    alpha = op.CastLike(alpha, other)  # type: ignore[type-var]
    return op.Add(self, op.Mul(other, alpha))


@onnxscript.script(opset=_DEFAULT_DOMAIN)
def _add_default_domain(self, other, alpha: float = 1.0):  # type: ignore[no-untyped-def]
    alpha = op.CastLike(alpha, other)  # type: ignore[type-var]
    return op.Add(self, op.Mul(other, alpha))


@onnxscript.script(_TUTORIAL_DOMAIN)
def _add_and_sub(x, y):  # type: ignore[no-untyped-def]
    return op.Add(x, y), op.Sub(x, y)


class _AddTwice(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(x, y, alpha=2.0) * 3


_FUNCTIONS = {"custom_domain": _add_custom_domain, "default_domain": _add_default_domain}
_TOL = {torch.float32: {"rtol": 1e-6, "atol": 1e-6}, torch.float64: {"rtol": 1e-12, "atol": 1e-12}}


@pytest.mark.parametrize("shape", [(3,), (2, 4)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(_FUNCTIONS))
def test_unannotated_script_function_exports(
    name: str, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2))
    fn = _FUNCTIONS[name]
    table = onnx_custom.translation_table(opset=18, extra={torch.ops.aten.add.Tensor: fn})
    program = torch.onnx.export(
        _AddTwice(),
        (x, y),
        dynamo=True,
        opset_version=18,
        custom_translation_table=table,
        verbose=False,
    )
    assert program is not None
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(
        None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), (x, y), strict=True)}
    )
    expected = (x.double() + 2.0 * y.double()) * 3  # independent reference, float64
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), expected.to(dtype), **_TOL[dtype])
    assert "return" not in fn.__annotations__  # the caller's function is not modified


@pytest.mark.parametrize(
    ("fn", "count"), [(_add_custom_domain, 1), (_add_and_sub, 2)], ids=["1-output", "2-outputs"]
)
def test_copy_declares_every_output(fn: onnxscript.OnnxFunction, count: int) -> None:
    returns = typing.get_type_hints(with_output_count(fn))["return"]
    assert len(typing.get_args(returns) or (returns,)) == count


def test_annotated_and_plain_functions_pass_unchanged() -> None:
    def plain(x: torch.Tensor) -> torch.Tensor:
        return x

    assert with_output_count(plain) is plain


@pytest.mark.parametrize(
    "extra",
    [[(torch.ops.aten.add.Tensor, _add_default_domain)], _add_default_domain],
    ids=["list-of-pairs", "bare-function"],
)
def test_extra_must_be_a_mapping(extra: object) -> None:
    with pytest.raises(
        onnx_custom.errors.InvalidArgumentError,
        match=r"extra must be a mapping.*received (list|OnnxFunction).*Fix: pass e.g. extra=",
    ):
        onnx_custom.translation_table(opset=18, extra=extra)  # type: ignore[arg-type]
