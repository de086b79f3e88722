"""The compile backend's door to torch's private translator: feature detection, not versions.

Every supported torch (2.11 to 2.15) has every piece; a torch that lacks one (simulated here by
the probe's answer) raises `CompileError` naming the torch version and the piece under
``fallback="error"``, and runs the graph in PyTorch with one warning under ``fallback="eager"``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import onnx_custom
from onnx_custom import CompileError
from onnx_custom.compile import torch_adapter

MISSING = ("_core._translate_fx_graph(lower=...)",)


class Small(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1


def test_this_torch_has_every_piece() -> None:
    assert torch_adapter.missing_features() == ()
    torch_adapter.check_torch()


@pytest.fixture
def lacking(monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = torch_adapter._probe()
    monkeypatch.setattr(torch_adapter, "_probe", lambda: (found, MISSING))


@pytest.mark.usefixtures("lacking")
def test_missing_piece_raises_naming_version_and_piece() -> None:
    with pytest.raises(CompileError) as info:
        torch_adapter.check_torch()
    assert torch.__version__ in str(info.value) and MISSING[0] in str(info.value)
    compiled = torch.compile(Small(), backend=onnx_custom.compile_backend(fallback="error"))
    with pytest.raises(Exception) as raised:
        compiled(torch.randn(2, 3))
    # dynamo wraps every backend error in BackendCompilerFailed, keeping ours as inner_exception
    error = getattr(raised.value, "inner_exception", raised.value)
    assert isinstance(error, CompileError) and MISSING[0] in str(error)


@pytest.mark.usefixtures("lacking")
def test_missing_piece_with_eager_fallback_runs_in_pytorch() -> None:
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    backend = onnx_custom.compile_backend(fallback="eager")
    compiled = torch.compile(Small(), backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(x), Small()(x))
        torch.testing.assert_close(compiled(x + 1), Small()(x + 1))
    messages = [str(w.message) for w in caught if "onnx_custom backend" in str(w.message)]
    assert len(messages) == 1 and MISSING[0] in messages[0]
    assert backend.records == []  # nothing was translated
