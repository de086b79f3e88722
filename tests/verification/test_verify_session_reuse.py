"""verify reuses ONNX Runtime's session across calls on the same file (runtime.session_cache), and
never for a file that changed: the same proto edited in place, a path rewritten, a localized
failure (whose session is given back before localize's segments run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from test_localize_reuse import planted_my_add

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add
from onnx_custom.errors import VerificationError
from onnx_custom.exporter import program_cache
from onnx_custom.runtime.session_cache import clear_session_cache, shared_sessions
from onnx_custom.verification.initializers import InitializerMismatchWarning


class Affine(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.weight)


class AddThenTanh(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.ops.onnx_custom.my_add(a, b))


def _x(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 4, generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    clear_session_cache()
    yield
    clear_session_cache()


def _count_ort_sessions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every ONNX Runtime session created (ours subclass onnxruntime's)."""
    made: list[int] = []
    real = ort.InferenceSession._create_inference_session

    def counting(self: Any, *a: Any, **k: Any) -> Any:
        made.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(ort.InferenceSession, "_create_inference_session", counting)
    return made


@pytest.mark.parametrize("trials", [1, 3], ids=lambda t: f"trials{t}")
def test_verifying_one_file_again_makes_no_new_session(
    monkeypatch: pytest.MonkeyPatch, trials: int
) -> None:
    model, x = Affine().eval(), _x()
    proto = onnx_custom.export(model, (x,), exporter="torchscript")
    made = _count_ort_sessions(monkeypatch)
    first = onnx_custom.verify(model, (x,), proto, trials=trials)
    second = onnx_custom.verify(model, (x,), proto, trials=trials)
    assert first.passed and second.passed and len(made) == 1
    assert [c.max_abs_diff for c in first.comparisons] == [
        c.max_abs_diff for c in second.comparisons
    ]


def test_a_proto_edited_in_place_is_verified_afresh() -> None:
    model, x = Affine().eval(), _x()
    proto = onnx_custom.export(model, (x,), exporter="torchscript")
    assert onnx_custom.verify(model, (x,), proto).passed
    (weight,) = proto.graph.initializer
    right = numpy_helper.to_array(weight).copy()
    weight.CopyFrom(numpy_helper.from_array(right * 1.5, weight.name))
    with (
        pytest.raises(VerificationError, match="mismatch"),
        pytest.warns(InitializerMismatchWarning),
    ):
        onnx_custom.verify(model, (x,), proto)
    weight.CopyFrom(numpy_helper.from_array(right, weight.name))
    assert onnx_custom.verify(model, (x,), proto).passed


def test_a_rewritten_file_is_verified_afresh(tmp_path: Path) -> None:
    x = _x()
    path = tmp_path / "m.onnx"
    model = Affine(seed=0).eval()
    onnx_custom.export(model, (x,), str(path), exporter="torchscript")
    assert onnx_custom.verify(model, (x,), path).passed
    onnx_custom.export(
        Affine(seed=1).eval(), (x,), str(path), exporter="torchscript"
    )  # another model's weights
    with pytest.warns(InitializerMismatchWarning):
        report = onnx_custom.verify(model, (x,), path, raise_on_mismatch=False)
    assert not report.passed
    expected = model(x).detach().numpy()
    (actual,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()}
    )
    assert report.comparisons[0].max_abs_diff == pytest.approx(
        float(np.abs(expected - actual).max()), rel=1e-6
    )


def test_a_localized_failure_gives_its_session_back() -> None:
    program_cache.clear()
    args = (_x(3), _x(3) * 2)
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(planted_my_add)  # 3a + b
    proto = onnx_custom.export(AddThenTanh(), args, exporter="dynamo", registry=registry)
    report = onnx_custom.verify(
        AddThenTanh(),
        args,
        proto,
        registry=registry,
        localize=True,
        raise_on_mismatch=False,
        shapes=(),
    )
    assert not report.passed and report.localization.first is not None
    assert len(shared_sessions) == 0  # the only trial failed: nothing ran after the localization
    program_cache.clear()


def test_a_bigger_file_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = Affine().eval(), _x()
    proto = onnx_custom.export(model, (x,), exporter="torchscript")
    monkeypatch.setattr(shared_sessions, "max_file_bytes", onnx.ModelProto.ByteSize(proto) - 1)
    made = _count_ort_sessions(monkeypatch)
    onnx_custom.verify(model, (x,), proto)
    onnx_custom.verify(model, (x,), proto)
    assert len(made) == 2 and len(shared_sessions) == 0
