"""Eager fallback, ``fallback="error"``, ``save_dir``, ``explain_compile`` and the options' errors.

The op below has no translation (or one that raises): the backend must run it in PyTorch, ORT the
rest, and the result must equal eager (the reference is the uncompiled model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

import onnx_custom
from onnx_custom import CompileError, InvalidArgumentError, OpsetError, Registry


@torch.library.custom_op("compile_test::shifted_tanh", mutates_args=())
def shifted_tanh(x: torch.Tensor, shift: float) -> torch.Tensor:
    return torch.tanh(x) + shift


@shifted_tanh.register_fake
def _(x: torch.Tensor, shift: float) -> torch.Tensor:
    return torch.empty_like(x)


def _shifted_tanh_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (x,) = ctx.saved_tensors
    return grad * (1 - torch.tanh(x) ** 2), None


shifted_tanh.register_autograd(
    _shifted_tanh_backward,
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]),
)


class UsesUntranslated(torch.nn.Module):
    """ORT part, the untranslated op, ORT part again: two ORT partitions around one eager node."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.linear(x))
        return shifted_tanh(y, 0.5).exp() * x


def _raising_registry() -> Registry:
    registry = Registry()

    @registry.symbolic("compile_test::shifted_tanh", opset=13)
    def broken(g: Any, x: Any, shift: float) -> Any:
        raise RuntimeError("planted failure in the translation")

    return registry


X = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))


def test_untranslated_op_runs_eager_rest_in_ort() -> None:
    model = UsesUntranslated()
    backend = onnx_custom.compile_backend()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(X)
        torch.testing.assert_close(got, model(X))
    (record,) = backend.records
    assert [f.target for f in record.fallbacks] == ["compile_test::shifted_tanh"]
    assert "no translation" in record.fallbacks[0].reason
    assert len(record.partitions) == 2 and record.ort_nodes == record.nodes - 1


def test_translation_that_raises_falls_back_with_reason() -> None:
    model = UsesUntranslated()
    explanation = onnx_custom.explain_compile(model, X, registry=_raising_registry())
    torch.testing.assert_close(explanation.output, model(X))
    (fallback,) = explanation.fallbacks
    assert fallback.target == "compile_test::shifted_tanh"
    assert "planted failure" in fallback.reason
    text = str(explanation)
    assert "eager compile_test::shifted_tanh" in text and "ORT" in text


@pytest.mark.parametrize(
    "registry", [None, _raising_registry()], ids=["no-translation", "translation-raises"]
)
def test_fallback_error_raises_compile_error(registry: Registry | None) -> None:
    backend = onnx_custom.compile_backend(fallback="error", registry=registry)
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(UsesUntranslated(), backend=backend)(X)
    # dynamo wraps every backend error in BackendCompilerFailed, keeping ours as inner_exception
    assert "compile_test::shifted_tanh" in str(info.value)
    error = getattr(info.value, "inner_exception", info.value)
    assert isinstance(error, CompileError)
    assert "compile_test::shifted_tanh" in str(error) and "fallback='eager'" in str(error)


def test_every_op_falls_back_warns_once() -> None:
    def only_untranslated(x: torch.Tensor) -> torch.Tensor:
        return shifted_tanh(x, 1.0)

    backend = onnx_custom.compile_backend()
    with pytest.warns(UserWarning, match="nothing in graph0_inference runs in ONNX Runtime"):
        got = torch.compile(only_untranslated, backend=backend)(X)
    torch.testing.assert_close(got, torch.tanh(X) + 1.0)


def test_save_dir_writes_each_partition(tmp_path: Path) -> None:
    folder = tmp_path / "graphs"
    backend = onnx_custom.compile_backend(save_dir=folder)
    with torch.no_grad():
        torch.compile(UsesUntranslated(), backend=backend)(X)
    files = sorted(p.name for p in folder.iterdir())
    assert files == sorted(f"{p.name}.onnx" for r in backend.records for p in r.partitions)
    for path in folder.iterdir():
        onnx.checker.check_model(onnx.load(path), full_check=True)


def test_options_are_validated_before_compiling() -> None:
    good = onnx_custom.compile_backend(
        opset=17, kernels="native", fallback="error", verify=True, cache_size=4
    )
    assert good.options.opset == 17 and good.options.cache_size == 4


BAD_OPTIONS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"opset": "18"}, InvalidArgumentError, "opset must be an int"),
    ({"opset": 7}, OpsetError, "builds opsets 13.."),
    ({"kernels": "cuda"}, InvalidArgumentError, "kernels must be one of"),
    ({"fallback": "ignore"}, InvalidArgumentError, "fallback must be one of"),
    ({"providers": ["NoSuchExecutionProvider"]}, InvalidArgumentError, "not available"),
    ({"providers": []}, InvalidArgumentError, "at least one"),
    ({"session_options": {"threads": 1}}, InvalidArgumentError, "onnxruntime.SessionOptions"),
    ({"verify": "yes"}, InvalidArgumentError, "verify must be True or False"),
    ({"cache_size": 0}, InvalidArgumentError, "cache_size must be an int >= 1"),
    ({"registry": {}}, InvalidArgumentError, "registry must be an onnx_custom.Registry"),
    ({"variants": [1]}, InvalidArgumentError, "variants must be a sequence"),
    ({"variants": ["no-such-variant"]}, onnx_custom.SymbolicError, "no-such-variant"),
    ({"opsett": 18}, InvalidArgumentError, "'opsett' -> 'opset'"),
    ({"save_dir": 3}, InvalidArgumentError, "save_dir must be a folder path"),
]


@pytest.mark.parametrize(
    ("options", "error", "text"),
    BAD_OPTIONS,
    ids=[next(iter(o)) + "=" + repr(next(iter(o.values()))) for o, _, _ in BAD_OPTIONS],
)
def test_bad_option_raises_typed_error(
    options: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=None) as info:
        onnx_custom.compile_backend(**options)
    assert text in str(info.value)


def test_save_dir_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "a_file"
    file.write_text("")
    with pytest.raises(InvalidArgumentError, match="not a folder"):
        onnx_custom.compile_backend(save_dir=file)


def test_explain_rejects_non_callable() -> None:
    with pytest.raises(InvalidArgumentError, match="module or function"):
        onnx_custom.explain_compile(42, X)


@torch.library.custom_op("compile_test::add_into", mutates_args=("out",))
def add_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.add_(x)


def test_mutating_op_runs_eager_and_mutates() -> None:
    def f(x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        add_into(y, acc)
        return acc * 2

    x = torch.randn(3, 4)
    acc, ref_acc = torch.zeros(3, 4), torch.zeros(3, 4)
    backend = onnx_custom.compile_backend()
    got = torch.compile(f, backend=backend)(x, acc)
    want = f(x, ref_acc)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(acc, ref_acc)  # the in-place effect reached the caller's tensor
    reasons = [f.reason for r in backend.records for f in r.fallbacks]
    assert reasons and all("no translation" in r or "mutates" in r for r in reasons), reasons


def test_console_stays_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    """torch's translator logs an nn_module_stack warning per node; none may reach the user."""
    model = UsesUntranslated()
    with torch.no_grad():
        torch.compile(model, backend=onnx_custom.compile_backend())(X)
    captured = capfd.readouterr()
    noise = [
        line
        for line in (captured.err + captured.out).splitlines()
        if "nn_module_stack" in line
        or "torchvision is not installed" in line
        or "onnxruntime" in line.lower()
    ]
    assert not noise, noise[:5]
