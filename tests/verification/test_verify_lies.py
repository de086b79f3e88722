"""verify() must not say PASS on a file that fails where users run it (nor FAIL a right one).

Each table row is a way verify was made to lie, found by an audit:
- a model that writes into its inputs (``x.abs_()``) ran eager first, and ONNX Runtime was fed the
  written values: a file missing the ``abs`` passed, a right file of ``x.mul_(2)`` failed;
- example inputs of one sign (``torch.rand``) with the default ``trials=1`` and no dynamic dims
  hid sign bugs: a file computing ``log(x + 1)`` for ``log(|x| + 1)`` passed.
The references are hand-written ONNX graphs (the wrong files) and the real exporters (the right
ones).
"""

from __future__ import annotations

from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
from onnx_custom.errors import VerificationError
from onnx_custom.verification.verifier import verify


def _unary_file(ops: list[tuple[str, float | None]], shape: tuple[int, ...]) -> onnx.ModelProto:
    """``x -> op1 -> op2 ...`` (``("Add", 1.0)`` adds a constant, ``("Log", None)`` is unary)."""
    nodes, inits, last = [], [], "x"
    for i, (op, constant) in enumerate(ops):
        out = "output_0" if i == len(ops) - 1 else f"t{i}"
        inputs = [last]
        if constant is not None:
            inits.append(helper.make_tensor(f"c{i}", TensorProto.FLOAT, [], [constant]))
            inputs.append(f"c{i}")
        nodes.append(helper.make_node(op, inputs, [out]))
        last = out
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, list(shape))],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class AbsInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.abs_()
        return x + 1.0


class DoubleInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x * 1.0


class LogAbs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.abs(x) + 1.0)


class PositiveOnly(torch.nn.Module):
    """Refuses negative values, as models with a domain check do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise ValueError("x must be non-negative")
        return torch.sqrt(x) * 2.0


# -------------------------------------------------------------------------- inputs written in place


def test_a_file_missing_what_the_model_did_in_place_fails() -> None:
    """Fed the written x (= |x|), the file without abs used to match: it must fail."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    wrong = _unary_file([("Add", 1.0)], (3, 4))
    report = verify(AbsInPlace(), (x,), wrong, raise_on_mismatch=False)
    assert not report.passed
    assert any("writes into its input(s) x" in n for n in report.notes)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5)], ids=lambda s: "x".join(map(str, s)))
def test_a_right_file_of_an_in_place_model_passes_and_leaves_the_inputs(
    exporter: str, shape: tuple[int, ...]
) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    proto = onnx_custom.export(DoubleInPlace(), (x.clone(),), exporter=exporter)
    before = x.clone()
    report = verify(DoubleInPlace(), (x,), proto)
    assert report.passed
    torch.testing.assert_close(x, before, rtol=0, atol=0)  # the caller's tensor is not written
    assert any("writes into its input(s) x" in n for n in report.notes)


def test_no_in_place_note_for_a_model_that_writes_nothing() -> None:
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    proto = onnx_custom.export(LogAbs(), (x,))
    assert not any("writes into" in n for n in verify(LogAbs(), (x,), proto).notes)


# ----------------------------------------------------------------------- example values of one sign


def _one_signed(shape: tuple[int, ...], sign: float) -> torch.Tensor:
    return sign * torch.rand(*shape, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["rand", "minus-rand"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 8)], ids=lambda s: "x".join(map(str, s)))
def test_a_sign_bug_fails_on_one_signed_examples(sign: float, shape: tuple[int, ...]) -> None:
    """log(x + 1) matches log(|x| + 1) on torch.rand (on -rand the example already differs)."""
    wrong = _unary_file([("Add", 1.0), ("Log", None)], shape)
    with pytest.raises(VerificationError, match="all have one sign") as caught:
        verify(LogAbs(), (_one_signed(shape, sign),), wrong)
    report = caught.value.report
    assert report is not None and [r.status for r in report.shapes_tried] == [
        "passed" if sign > 0 else "failed",
        "failed",
    ]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_right_file_passes_the_sign_trial(exporter: str) -> None:
    x = _one_signed((3, 4), 1.0)
    proto = onnx_custom.export(LogAbs(), (x,), exporter=exporter)
    report = verify(LogAbs(), (x,), proto)
    assert report.passed and [(r.kind, r.status) for r in report.shapes_tried] == [
        ("example", "passed"),
        ("values", "passed"),
    ]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_the_sign_trial_is_skipped_when_eager_refuses_its_values() -> None:
    x = _one_signed((3, 4), 1.0)
    proto = onnx_custom.export(PositiveOnly(), (x,), exporter="torchscript")
    report = verify(PositiveOnly(), (x,), proto)
    assert report.passed
    skipped = report.skipped()
    assert (
        len(skipped) == 1
        and "cannot take N(0, 1) values" in skipped[0].reason
        and "non-negative" in skipped[0].reason
    )


def _generator(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a + trial for a in args)


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("mixed-signs", {}),
        ("trials-2", {"trials": 2}),
        ("input-generator", {"input_generator": _generator}),
        ("shapes-given", {"shapes": ()}),
        ("single-value", {}),
    ],
)
def test_no_sign_trial_when_other_values_are_drawn_or_signs_are_mixed(
    case: str, kwargs: dict[str, Any]
) -> None:
    shape = (1,) if case == "single-value" else (3, 4)
    x = (
        torch.randn(*shape, generator=torch.Generator().manual_seed(4))
        if case == "mixed-signs"
        else _one_signed(shape, 1.0)
    )
    proto = onnx_custom.export(LogAbs(), (x,))
    report = verify(LogAbs(), (x,), proto, **kwargs)
    assert report.passed and not any("one sign" in n for n in report.notes)
    assert report.trials == kwargs.get("trials", 1)


def test_no_sign_trial_when_shape_trials_draw_values() -> None:
    x = _one_signed((3, 4), 1.0)
    batch = torch.export.Dim("batch", min=1, max=16)
    proto = onnx_custom.export(LogAbs(), (x,), dynamic_shapes={"x": {0: batch}})
    report = verify(LogAbs(), (x,), proto)
    assert report.passed and not any("one sign" in n for n in report.notes)
    assert all(r.kind in ("example", "shape") for r in report.shapes_tried)


# ---------------------------------------------------------------------------- the native library


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_native_backend_runs_the_library_a_cpp_deployment_loads(exporter: str) -> None:
    """backend "onnxruntime" verifies our Python kernels only; "onnxruntime-native" the library."""
    from onnx_custom.models import custom_linear
    from onnx_custom.translate.registry import default_registry

    args = custom_linear.example_inputs()
    model = custom_linear.Model()
    proto = onnx_custom.export(
        model, args, exporter=exporter, registry=default_registry().with_variants("custom")
    )
    assert any(n.op_type == "CustomLinear" for n in proto.graph.node)
    report = verify(model, args, proto, backends=("onnxruntime", "onnxruntime-native"))
    assert report.passed and {c.backend for c in report.comparisons} == {
        "onnxruntime",
        "onnxruntime-native",
    }
    assert [i.describe() for i in report.implementations["onnxruntime-native"]] == [
        "onnx_custom::CustomLinear (2 nodes): native kernel in libonnx_custom_ops.so"
    ]
    assert "Python kernel" in report.implementations["onnxruntime"][0].describe()


def test_the_cli_verifies_with_the_native_library(tmp_path: Any, capsys: Any) -> None:
    from onnx_custom.cli import main

    path = tmp_path / "cl.onnx"
    assert main(["export", "custom_linear", "--variant", "custom", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["verify", "custom_linear", str(path), "--backend", "onnxruntime-native"]) == 0
    out = capsys.readouterr().out
    assert "backends: onnxruntime-native" in out and "native kernel in libonnx_custom_ops.so" in out


# ---------------------------------------------------------------------------- training mode


class Regularized(torch.nn.Module):
    def __init__(self, layer: str) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.Dropout(0.5) if layer == "dropout" else torch.nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


@pytest.mark.parametrize("layer", ["dropout", "batchnorm"])
def test_a_model_left_in_training_mode_fails_naming_the_cause(layer: str) -> None:
    """The file is exported in eval mode;
    eager in training mode draws dropout / batch statistics."""
    torch.manual_seed(0)
    model = Regularized(layer).eval()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))
    proto = onnx_custom.export(model, (x,))
    assert verify(model, (x,), proto).passed and not verify(model, (x,), proto).notes
    model.train()
    with pytest.raises(VerificationError, match=r"training mode: norm .*Fix: call model.eval\(\)"):
        verify(model, (x,), proto)


@pytest.fixture
def _python_only_triple() -> Any:
    """acme::Triple: a Python kernel in the default registry that no native library serves."""
    from onnx_custom.runtime.registry import user_kernel_registry

    registry = user_kernel_registry()

    @registry.kernel("acme::Triple", inputs=["x"], outputs=["y"], shape_fn="like0")
    def triple(x: Any) -> Any:
        return x * 3

    try:
        yield
    finally:
        registry.remove("acme::Triple")


def _triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@pytest.mark.usefixtures("_python_only_triple")
@pytest.mark.filterwarnings("ignore::onnx_custom.runtime.native.NativeFallbackWarning")
@pytest.mark.parametrize(
    "backends", [("onnxruntime-native",), ("onnxruntime", "onnxruntime-native")], ids="+".join
)
def test_the_native_backend_names_nodes_no_native_kernel_serves(backends: tuple[str, ...]) -> None:
    node = helper.make_node("Triple", ["x"], ["output_0"], domain="acme")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, [2, 3])],
    )
    proto = helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)],
    )
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(6))
    report = verify(_triple, (x,), proto, backends=backends)
    assert report.passed  # it runs here, with Python
    (note,) = [n for n in report.notes if "onnxruntime-native ran" in n]
    assert "acme::Triple" in note and "cannot run this file" in note


class GradAware(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.is_leaf and x.requires_grad  # what the caller passed
        return x * 2


def test_eagers_copies_are_leaves_like_the_inputs() -> None:
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10))
    proto = onnx_custom.export(GradAware(), (x.clone().requires_grad_(),))
    assert verify(GradAware(), (x.requires_grad_(),), proto).passed
