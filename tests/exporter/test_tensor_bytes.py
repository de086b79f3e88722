"""Which TorchScript exports go through a temporary folder (past `_IN_MEMORY_LIMIT` bytes of
weights): `_tensor_bytes` counts what the file holds, each parameter and buffer once with its own
elements, against a reference that sums the exported initializers' bytes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

import onnx_custom
from onnx_custom.exporter import pipeline


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)
        self.b.weight = self.a.weight  # one tensor, two modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _View(torch.nn.Module):
    """A parameter viewing 6 rows of a 4096-row storage: the file holds the 6 rows."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4096, 6)[:6])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


class _Buffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6).double()
        self.register_buffer("scale", torch.full((6,), 2.0, dtype=torch.float64))
        self.register_buffer("absent", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "linear-6x6": lambda: torch.nn.Linear(6, 6),
    "tied-6x6": _Tied,
    "view-6x6-of-4096x6": _View,
    "float64-buffers": _Buffers,
}


def _initializer_bytes(proto: onnx.ModelProto) -> int:
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)


@pytest.mark.parametrize("name", list(MODELS), ids=list(MODELS))
def test_counts_what_the_file_holds(name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    dtype = next(model.parameters()).dtype
    proto = onnx_custom.export(
        model,
        (torch.randn(2, 6, dtype=dtype),),
        exporter="torchscript",
        opset=17,
        do_constant_folding=False,
    )
    assert pipeline._tensor_bytes(model) == _initializer_bytes(proto)


def test_not_a_module_counts_nothing() -> None:
    assert pipeline._tensor_bytes(lambda x: x) == 0


def _folders(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    made: list[Any] = []
    real = tempfile.TemporaryDirectory

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs.get("prefix"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline.tempfile, "TemporaryDirectory", spy)
    return made


@pytest.mark.parametrize(
    ("name", "through_folder"),
    [("view-6x6-of-4096x6", False), ("tied-6x6", True)],
    ids=["view-in-memory", "tied-through-folder"],
)
def test_folder_only_past_the_limit(
    monkeypatch: pytest.MonkeyPatch, name: str, through_folder: bool
) -> None:
    """With the limit at 150 bytes: the view (144 bytes written, a 98 KB storage) stays in
    memory; the tied model (192 bytes) goes through the folder, and both files match eager."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    monkeypatch.setattr(pipeline, "_IN_MEMORY_LIMIT", 150)
    made = _folders(monkeypatch)
    x = torch.randn(2, 6)
    proto = onnx_custom.export(model, (x,), exporter="torchscript", opset=17)
    assert (made == ["onnx_custom_export_"]) is through_folder
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), model(x).detach())
