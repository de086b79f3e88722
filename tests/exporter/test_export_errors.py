"""Every bad input gets a clear, typed error (real exporters, no mocks)."""

from __future__ import annotations

import contextlib
import inspect
import io
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

import onnx_custom
import onnx_custom.ops.seed
from onnx_custom import (
    OnnxCustomError,
    Registry,
    SymbolicError,
    UnsupportedOpError,
    VerificationError,
)
from onnx_custom.hf_zoo import raw_torch_export

EXPORTERS = [("torchscript", 13), ("dynamo", 18)]


@torch.library.custom_op("octest::no_translation_a", mutates_args=())
def no_translation_a(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@no_translation_a.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("octest::no_translation_b", mutates_args=())
def no_translation_b(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@no_translation_b.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("octest::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x - 1


class TwoMissing(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.octest.no_translation_b(torch.ops.octest.no_translation_a(x))


class NoFake(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.octest.no_fake(x)


class MyAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x, y)


ARGS2 = (torch.randn(2, 3), torch.randn(2, 3))


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_every_missing_op_listed_at_once(exporter: str, opset: int) -> None:
    with pytest.raises(UnsupportedOpError) as info:
        onnx_custom.export(TwoMissing(), (torch.randn(3),), exporter=exporter, opset=opset)
    assert set(info.value.missing) >= {
        "octest::no_translation_a",
        "octest::no_translation_b",
    } or set(info.value.missing) >= {
        "octest::no_translation_a.default",
        "octest::no_translation_b.default",
    }
    assert exporter in str(info.value) and f"opset {opset}" in str(info.value)
    # the fix is written out for the first op, and a user op also learns the custom-node route
    assert f"@onnx_custom.symbolic('octest::no_translation_a', opset={opset})" in str(info.value)
    assert "g.op('octest::no_translation_a', ...)" in str(
        info.value
    ) and "pick an opset" not in str(info.value)


def test_missing_fake_under_dynamo() -> None:
    with pytest.raises(SymbolicError, match=r"octest::no_fake has no fake.*register_fake"):
        onnx_custom.export(NoFake(), (torch.randn(3),), exporter="dynamo")


def test_export_opset_below_every_translation() -> None:
    class Asinh(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.asinh(x)

    with pytest.raises(UnsupportedOpError, match=r"aten::asinh.*from opset \[9\]") as info:
        onnx_custom.export(Asinh(), (torch.randn(3),), exporter="torchscript", opset=8)
    assert "symbolic('aten::asinh', opset=8), or pick an opset listed above." in str(info.value)
    assert "custom node" not in str(
        info.value
    )  # an ATen op is translated, not shipped as a custom node


def _broken_registry(fn) -> Registry:  # type: ignore[no-untyped-def]
    reg = onnx_custom.default_registry().copy()
    reg.symbolic("onnx_custom::my_add", opset=1, replace=True)(fn)
    return reg


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_wrong_number_of_outputs(exporter: str, opset: int) -> None:
    def two_outputs(g, a, b):  # type: ignore[no-untyped-def]
        return g.op("Add", a, b), g.op("Sub", a, b)

    with pytest.raises(SymbolicError, match=r"returned 2 output\(s\) but the torch op has 1"):
        onnx_custom.export(
            MyAdd(), ARGS2, exporter=exporter, opset=opset, registry=_broken_registry(two_outputs)
        )


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_unsupported_attribute_value(exporter: str, opset: int) -> None:
    def bad_attr(g, a, b):  # type: ignore[no-untyped-def]
        return g.op("onnx_custom::my_add", a, b, alpha={"no": "dicts"})

    with pytest.raises(SymbolicError, match="Attribute 'alpha' has unsupported type dict"):
        onnx_custom.export(
            MyAdd(), ARGS2, exporter=exporter, opset=opset, registry=_broken_registry(bad_attr)
        )


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_python_scalar_input_needs_constant(exporter: str, opset: int) -> None:
    def scalar_input(g, a, b):  # type: ignore[no-untyped-def]
        return g.op("Add", a, 2.0)

    with pytest.raises(SymbolicError, match=r"g\.constant\(value, like=x\)"):
        onnx_custom.export(
            MyAdd(), ARGS2, exporter=exporter, opset=opset, registry=_broken_registry(scalar_input)
        )


def test_autograd_function_under_dynamo_is_refused() -> None:
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            return grad * 2

    class UsesFunction(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Double.apply(x)

    reg = Registry()
    reg.symbolic(Double, opset=1)(lambda g, x: g.op("Mul", x, g.constant(2.0, like=x)))
    with pytest.raises(SymbolicError, match=r"autograd.Function.*torch.library.custom_op"):
        onnx_custom.export(UsesFunction(), (torch.randn(3),), exporter="dynamo", registry=reg)
    # The same declaration works with the TorchScript exporter, and forward is restored.
    proto = onnx_custom.export(
        UsesFunction(),
        (torch.randn(3),),
        exporter="torchscript",
        opset=13,
        registry=reg,
        verify=True,
    )
    assert [n.op_type for n in proto.graph.node if n.op_type != "Constant"] == ["Mul"]
    assert torch.equal(Double.apply(torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"exporter": "onnxscript"}, OnnxCustomError, "exporter must be one of"),
        ({"exporter": "torchscript", "opset": 25}, OnnxCustomError, "supports opsets 7..20"),
        ({"opset": "18"}, TypeError, "opset must be an int"),
        ({"registry": {}}, TypeError, "registry must be an onnx_custom.Registry"),
    ],
    ids=["exporter", "ts-opset", "opset-type", "registry-type"],
)
def test_bad_export_arguments(kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        onnx_custom.export(MyAdd(), ARGS2, **kwargs)


def test_bad_model_and_args() -> None:
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        onnx_custom.export(lambda x: x, ARGS2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="args must be a tuple"):
        onnx_custom.export(MyAdd(), [torch.randn(2)])  # type: ignore[arg-type]


def test_verify_flag_raises_on_planted_mismatch() -> None:
    def three_a_plus_b(g, a, b):  # type: ignore[no-untyped-def]
        return g.op("Add", g.op("Mul", a, g.constant(3.0, like=a)), b)

    with pytest.raises(VerificationError, match="FAILED"):
        onnx_custom.export(
            MyAdd(),
            ARGS2,
            exporter="dynamo",
            registry=_broken_registry(three_a_plus_b),
            verify=True,
        )


def test_verify_structure_mismatch_and_bad_files(tmp_path) -> None:
    proto = onnx_custom.export(MyAdd(), ARGS2, exporter="dynamo")

    class TwoOutputs(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, y

    with pytest.raises(VerificationError, match=r"returns 2 tensor\(s\).*1 output"):
        onnx_custom.verify(TwoOutputs(), ARGS2, proto)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        onnx_custom.verify(MyAdd(), ARGS2, tmp_path / "missing.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(OnnxCustomError, match="corrupt"):
        onnx_custom.verify(MyAdd(), ARGS2, corrupt)
    with pytest.raises(VerificationError, match="takes 2 input"):
        onnx_custom.verify(MyAdd(), (torch.randn(2, 3),), proto)
    buffer = io.BytesIO()
    onnx_custom.export(MyAdd(), ARGS2, buffer)
    assert buffer.getvalue()


@torch.library.custom_op("octest::add_into", mutates_args=("out",))
def add_into(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x + y)


@add_into.register_fake
def _(x, y, out):  # type: ignore[no-untyped-def]
    return None


MUTATING = (
    onnx_custom.default_registry().copy()
)  # not the default registry: other tests list its targets


@onnx_custom.symbolic("octest::add_into", opset=13, registry=MUTATING)
def _add_into_onnx(g, x, y, out):  # type: ignore[no-untyped-def]
    return g.op("Add", x, y)


class WritesIntoABuffer(torch.nn.Module):
    """The out-argument style of mmcv's C++ ops, as a torch.library op writing into ``out``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.octest.add_into(x, y, out)
        return out * 2


def test_a_custom_op_writing_into_its_argument_is_refused_under_dynamo(tmp_path: Path) -> None:
    with pytest.raises(
        SymbolicError,
        match=(
            r"octest::add_into writes into its argument\(s\) \['out'\].*Fix: export a functional"
            r" version"
        ),
    ):
        onnx_custom.export(
            WritesIntoABuffer(),
            (torch.randn(2, 3), torch.randn(2, 3)),
            tmp_path / "m.onnx",
            exporter="dynamo",
            registry=MUTATING,
        )
    assert not (tmp_path / "m.onnx").exists()


@torch.library.custom_op("octest::scale_into", mutates_args=("out",))
def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:  # no translation anywhere
    out.copy_(x * 3)


class WritesWithoutATranslation(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        torch.ops.octest.scale_into(x, out)
        return out + 1


class WritesInALoop(torch.nn.Module):
    """The op inside a scripted loop: the check walks nested blocks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scripted_loop(x)


@torch.jit.script
def _scripted_loop(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for _ in range(2):
        torch.ops.octest.scale_into(x, out)
    return out


# TorchScript's dead-code pass drops an op that returns nothing before any symbolic runs: the
# file would silently read the buffer as it was before the op, so the export must refuse it.
@pytest.mark.parametrize(
    ("model", "args", "op"),
    [
        (WritesIntoABuffer(), (torch.randn(2, 3), torch.randn(2, 3)), "octest::add_into"),
        (WritesWithoutATranslation(), (torch.randn(2, 3),), "octest::scale_into"),
        (WritesInALoop(), (torch.randn(2, 3),), "octest::scale_into"),
    ],
    ids=["translated-2x3", "untranslated-2x3", "scripted-loop-2x3"],
)
def test_a_custom_op_writing_into_its_argument_is_refused_under_torchscript(
    tmp_path: Path, model: torch.nn.Module, args: tuple[torch.Tensor, ...], op: str
) -> None:
    path = tmp_path / "m.onnx"
    with pytest.raises(
        SymbolicError,
        match=rf"{op} writes into its argument\(s\) \['out'\].*Fix: export a functional version",
    ):
        onnx_custom.export(model, args, path, exporter="torchscript", registry=MUTATING)
    assert not path.exists()
    # the user's own TorchScript export inside registered() is refused the same way
    with onnx_custom.registered(MUTATING), pytest.raises(SymbolicError, match=op):
        torch.onnx.export(model, args, io.BytesIO(), dynamo=False, opset_version=13)
    # and torch is left as it was: a functional model exports afterwards
    onnx_custom.export(MyAdd(), ARGS2, path, exporter="torchscript")
    assert path.exists()


class TokenList(torch.nn.Module):
    """Reads the non-zero ids into a Python list: a size torch.export cannot know."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        kept = ids[ids != 0].tolist()  # the data-dependent line
        return x[: len(kept)] * 2


def test_a_data_dependent_line_torch_export_cannot_trace_is_named() -> None:
    """torch's own failure: the raw exporter fails the same way, and ours names the model's line
    (torch's message ends in the traced graph) and what to do."""
    args = (torch.randn(4, 3), torch.tensor([1, 0, 2]))
    assert raw_torch_export(TokenList(), args, "dynamo").startswith("fails")
    lines, start = inspect.getsourcelines(TokenList.forward)
    line = start + next(i for i, text in enumerate(lines) if "the data-dependent line" in text)
    with pytest.raises(GuardOnDataDependentSymNode) as caught:
        with contextlib.redirect_stdout(io.StringIO()):
            onnx_custom.export(TokenList(), args, exporter="dynamo")
    (note,) = caught.value.__notes__
    assert f"test_export_errors.py:{line} in forward: kept = ids[ids != 0].tolist()" in note
    assert "torch's failure" in note and "exporter='torchscript'" in note
    # the traced file runs: the trace fixed the example's count of non-zero ids
    proto = onnx_custom.export(TokenList(), args, exporter="torchscript")
    assert onnx_custom.verify(TokenList(), args, proto).passed


def test_an_op_torchs_own_symbolic_refuses_is_named() -> None:
    """torch's adaptive_avg_pool2d symbolic refuses an output size that does not divide the input
    (UperNet's pyramid pooling): the error names that op, not the constant torch blames."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.AdaptiveAvgPool2d(3)).eval()
    args = (torch.rand(1, 3, 4, 4),)
    assert raw_torch_export(model, args, "torchscript").startswith("fails")
    with pytest.raises(SymbolicError) as caught:
        onnx_custom.export(model, args, exporter="torchscript")
    text = str(caught.value)
    assert "could not translate aten::adaptive_avg_pool2d" in text
    assert "output size that are not factor of input size" in text
    assert "@onnx_custom.symbolic('aten::adaptive_avg_pool2d')" in text
    assert "onnx::Constant" not in text
    # the advice holds: the dynamo exporter takes it
    with contextlib.redirect_stdout(io.StringIO()):
        proto = onnx_custom.export(model, args, exporter="dynamo")
    assert onnx_custom.verify(model, args, proto).passed
