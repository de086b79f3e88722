"""verify() on bad or unusual input: clear messages, typed errors, no crashes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom.cli import main
from onnx_custom.errors import OnnxCustomError, VerificationError
from onnx_custom.verification.verifier import (
    OutputComparison,
    VerificationReport,
    compare_arrays,
    verify,
)


class NonFinite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x) / (x - 1.0)  # NaN for x < 0, -inf/0 at x = 0, nan at x = 1


class IntBool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x > 0, torch.argmax(x, dim=-1), (x * 10).to(torch.int32)


class IntBoolNoCast(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x > 0, torch.argmax(x, dim=-1)


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        return {"sum": x + y, "pair": (x * y, ((x - y).relu(),))}


class TwoOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * 2


class OneOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class Raises(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.broken:
            raise RuntimeError("boom in eager")
        return x.sin()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_nonfinite_outputs_at_same_positions_pass(exporter: str) -> None:
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0, 0.5, -3.0])
    proto = onnx_custom.export(NonFinite(), (x,), exporter=exporter)
    report = verify(NonFinite(), (x,), proto)
    (c,) = report.comparisons
    assert c.passed and c.nonfinite_mismatch == 0 and c.total == 6


def test_nonfinite_positions_must_match() -> None:
    expected = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    moved_nan = np.array([float("nan"), 1.0, np.inf, 2.0], dtype=np.float32)
    c = compare_arrays(expected, moved_nan, name="y", trial=0)
    assert not c.passed and c.nonfinite_mismatch == 2
    flipped_inf = np.array([1.0, np.nan, -np.inf, 2.0], dtype=np.float32)
    assert compare_arrays(expected, flipped_inf, name="y", trial=0).nonfinite_mismatch == 1


def test_empty_tensors() -> None:
    x = torch.zeros(0, 3)
    proto = onnx_custom.export(OneOut(), (x,), exporter="torchscript")
    report = verify(OneOut(), (x,), proto)
    assert (
        report.passed and report.comparisons[0].total == 0 and report.comparisons[0].shape == (0, 3)
    )


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_integer_and_bool_outputs_compare_exactly(exporter: str) -> None:
    # (x * 10).to(int32) only under TorchScript: the dynamo pre-check flags aten::to.dtype today.
    model = IntBool() if exporter == "torchscript" else IntBoolNoCast()
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    proto = onnx_custom.export(model, (x,), exporter=exporter)
    report = verify(model, (x,), proto, trials=2)
    assert report.passed
    dtypes = [c.dtype for c in report.comparisons if c.trial == 0]
    assert dtypes == (
        ["bool", "int64", "int32"] if exporter == "torchscript" else ["bool", "int64"]
    )
    assert all(c.max_abs_diff == 0 for c in report.comparisons)
    off_by_one = compare_arrays(
        torch.tensor([1, 2, 3]), np.array([1, 2, 4]), name="i", trial=0, rtol=1.0, atol=1.0
    )
    assert not off_by_one.passed and off_by_one.mismatched == 1  # tolerances never apply to ints


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_nested_dict_and_tuple_outputs(exporter: str) -> None:
    args = (torch.randn(2, 3), torch.randn(2, 3))
    proto = onnx_custom.export(Nested(), args, exporter=exporter)
    report = verify(Nested(), args, proto, backends=("onnxruntime", "reference"))
    assert report.passed
    names = [c.name.split("=")[0] for c in report.comparisons if c.backend == "onnxruntime"]
    assert names == ["output.sum", "output.pair[0]", "output.pair[1][0]"]
    assert {c.backend for c in report.comparisons} == {"onnxruntime", "reference"}


def test_model_raising_in_eager_mode() -> None:
    model = Raises()
    proto = onnx_custom.export(model, (torch.randn(3),), exporter="torchscript")
    model.broken = True
    with pytest.raises(
        VerificationError, match=r"raised in eager mode on trial 0: RuntimeError: boom in eager"
    ):
        verify(model, (torch.randn(3),), proto)


def test_output_count_mismatch_raises() -> None:
    proto = onnx_custom.export(TwoOut(), (torch.randn(3),), exporter="dynamo")
    with pytest.raises(
        VerificationError,
        match=(
            r"Output structure mismatch: the PyTorch model returns 1 tensor\(s\).*has 2 output\(s\)"
        ),
    ):
        verify(OneOut(), (torch.randn(3),), proto)


def test_output_shape_mismatch_fails_with_reason() -> None:
    proto = onnx_custom.export(OneOut(), (torch.randn(3),), exporter="torchscript")
    # Static ONNX shapes refuse other input shapes at run time: that is a typed error, not a crash.
    with pytest.raises(VerificationError, match="failed to run the ONNX model"):
        verify(OneOut(), (torch.randn(4),), proto)
    c = compare_arrays(torch.zeros(2, 3), np.zeros((3, 2), np.float32), name="y", trial=0)
    assert not c.passed and "ONNX shape [3, 2] vs [2, 3]" in c.tolerance_source


def test_missing_and_corrupt_files(tmp_path: Any, capsys: Any) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        verify(OneOut(), (torch.randn(3),), missing)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage that is not protobuf \xff\xff\xff")
    with pytest.raises(OnnxCustomError, match="not a valid ONNX model|empty ONNX model"):
        verify(OneOut(), (torch.randn(3),), corrupt)
    assert main(["verify", "onnx_custom.models.my_add:Model", str(missing)]) == 2
    assert main(["inspect", str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "error:" in err


def test_tolerance_sources_and_bad_arguments() -> None:
    proto = onnx_custom.export(OneOut(), (torch.randn(3),), exporter="torchscript")
    default = verify(OneOut(), (torch.randn(3),), proto)
    assert default.comparisons[0].tolerance_source == "torch.testing default for float32"
    override = verify(OneOut(), (torch.randn(3),), proto, rtol=1e-3, atol=1e-3)
    assert override.comparisons[0].tolerance_source == "user override"
    with pytest.raises(ValueError, match="backends must be"):
        verify(OneOut(), (torch.randn(3),), proto, backends=("tensorrt",))
    with pytest.raises(TypeError, match="args must be a tuple"):
        verify(OneOut(), [torch.randn(3)], proto)  # type: ignore[arg-type]


def test_backend_disagreement_is_diagnosed() -> None:
    def comparison(backend: str, mismatched: int) -> OutputComparison:
        return OutputComparison(
            0,
            "y",
            (3,),
            "float32",
            1.0 * mismatched,
            1.0,
            mismatched,
            3,
            1e-5,
            1e-5,
            "x",
            backend=backend,
        )

    report = VerificationReport(
        [comparison("onnxruntime", 1), comparison("reference", 0)], 1, ("onnxruntime", "reference")
    )
    assert report.passed_by_backend() == {"onnxruntime": False, "reference": True}
    assert "suspect the runtime or a custom kernel" in report.diagnosis()
    assert "Backends disagree" in str(report)
    agree = VerificationReport(
        [comparison("onnxruntime", 1), comparison("reference", 1)], 1, ("onnxruntime", "reference")
    )
    assert agree.diagnosis() == ""


def test_reference_backend_runs_custom_nodes() -> None:
    pytest.importorskip(
        "onnx_custom.runtime.reference", reason="kernel host without reference adapters"
    )
    from onnx_custom.models import my_add

    model, args = my_add.Model().eval(), my_add.example_inputs()
    registry = onnx_custom.default_registry().with_variants("custom")
    proto = onnx_custom.export(model, args, exporter="dynamo", registry=registry)
    assert any(n.domain == "onnx_custom" for n in proto.graph.node)
    report = verify(model, args, proto, backends=("onnxruntime", "reference"), trials=2)
    assert report.passed and len(report.comparisons) == 4


def test_progress_and_cli_backends(tmp_path: Any, capsys: Any) -> None:
    proto = onnx_custom.export(OneOut(), (torch.randn(3),), exporter="torchscript")
    lines: list[str] = []
    verify(OneOut(), (torch.randn(3),), proto, trials=3, progress=lines.append)
    assert lines == ["verify: trial 1/3", "verify: trial 2/3", "verify: trial 3/3"]
    from onnx_custom.models import multi_out

    path = tmp_path / "multi.onnx"
    onnx_custom.export(
        multi_out.Model().eval(), multi_out.example_inputs(), path, exporter="dynamo"
    )
    rc = main(
        [
            "verify",
            "multi_out",
            str(path),
            "--trials",
            "2",
            "--backend",
            "onnxruntime",
            "--backend",
            "reference",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "reference" in captured.out and "verify: trial 2/2" in captured.err


def test_wrong_inputs_and_non_tensor_outputs() -> None:
    class WithInt(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
            return x + 1, 3

    proto = onnx_custom.export(OneOut(), (torch.randn(3),), exporter="torchscript")
    with pytest.raises(VerificationError, match=r"takes 1 input\(s\).*hold 2 tensor\(s\)"):
        verify(OneOut(), (torch.randn(3), torch.randn(3)), proto)
    with pytest.raises(VerificationError, match=r"outputs \['output\[1\]'\] are not tensors"):
        verify(WithInt(), (torch.randn(3),), proto)


def test_verify_with_a_users_own_kernel_registry() -> None:
    """A kernel that lives only in the user's KernelRegistry (not the default one) is used."""
    from onnx_custom.runtime import KernelRegistry

    kernels = KernelRegistry()
    kernels.kernel(
        "octest_own::my_add", inputs=["a", "b"], outputs=["y"], attrs={"alpha": ("float", 2.0)}
    )(lambda a, b, *, alpha: alpha * a + b)
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(
        lambda g, a, b: g.op("octest_own::my_add", a, b, alpha=2.0)
    )

    class M(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.ops.onnx_custom.my_add(a, b)

    args = (torch.randn(2, 3), torch.randn(2, 3))
    proto = onnx_custom.export(
        M(), args, exporter="dynamo", registry=registry, verify=True, kernels=kernels
    )
    assert verify(M(), args, proto, kernels=kernels, backends=("onnxruntime", "reference")).passed
    with pytest.raises(onnx_custom.KernelError, match="octest_own::my_add"):
        verify(M(), args, proto)
