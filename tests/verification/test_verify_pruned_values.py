"""A traced file that dropped an input whose values the trace fixed: verify permutes the inputs
the file does not take, and PyTorch's outputs changing with them fails the file.

A Python-side cache keyed on token values (transformers' OmDet-Turbo caches its text embeddings
this way) or a branch on an input's value leaves the TorchScript graph without that input: the
trace recorded the example's result as a constant. Every other trial feeds the example's ints,
so the file matched PyTorch at all of them.
"""

from __future__ import annotations

import warnings

import onnx
import pytest
import torch

import onnx_custom


class ValueCache(torch.nn.Module):
    """Embeds ``ids`` once per distinct sequence: a dict keyed by the ids' values."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        key = tuple(ids.tolist())
        if key not in self.cache:
            self.cache[key] = self.embed(ids)
        return x + self.cache[key]


class ValueBranch(torch.nn.Module):
    """Doubles or triples ``x`` on the value of ``ids[0]``."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if int(ids[0]) > 4:
            return x * 2
        return x * 3


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return (ValueCache() if name == "cache" else ValueBranch()).eval()


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([7, 1, 2])


def _traced(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return onnx_custom.export(model, args, exporter="torchscript")


@pytest.mark.parametrize("name", ["cache", "branch"])
def test_a_pruned_input_the_outputs_depend_on_fails_verification(name: str) -> None:
    model, args = _model(name), _args()
    with torch.no_grad():
        model(*args)  # a first call fills the cache: the trace then reads it
    proto = _traced(model, args)
    assert [i.name for i in proto.graph.input] == ["x"]  # ids: pruned, its value baked in
    # an independent reference: PyTorch at other ids disagrees with the file at the example
    other = (args[0], torch.tensor([2, 1, 7]))
    with torch.no_grad():
        assert not torch.allclose(model(*args), model(*other))
    report = onnx_custom.verify(model, args, proto, raise_on_mismatch=False)
    assert not report.passed, str(report)
    (pruned,) = [r for r in report.shapes_tried if r.kind == "pruned"]
    assert pruned.status == "failed"
    assert "changed with the values of ids" in pruned.reason
    assert "TracerWarning" in str(report)
    with pytest.raises(onnx_custom.VerificationError, match="which the file does not take"):
        onnx_custom.verify(model, args, proto)


def test_a_traced_file_that_takes_the_input_has_no_pruned_trial() -> None:
    model, args = _model("cache"), _args()  # first call inside the trace: the file embeds ids
    proto = _traced(model, args)
    assert [i.name for i in proto.graph.input] == ["x", "ids"]
    report = onnx_custom.verify(_model("cache"), args, proto)
    assert report.passed and not [r for r in report.shapes_tried if r.kind == "pruned"]


class Unused(torch.nn.Module):
    """A TracerWarning (a size turned into an int) and an input the outputs do not depend on."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if int(x.shape[0]) > 1:
            return torch.tanh(x)
        return x


@pytest.mark.parametrize(
    ("name", "ids"),
    [("unused", [7, 1, 2]), ("branch", [7, 1, 9])],
    ids=["unused-ids", "branch-permutation-keeps-the-branch"],
)
def test_a_pruned_input_the_outputs_ignore_passes(name: str, ids: list[int]) -> None:
    model = Unused() if name == "unused" else ValueBranch()
    args = (_args()[0], torch.tensor(ids))
    proto = _traced(model, args)
    assert [i.name for i in proto.graph.input] == ["x"]
    report = onnx_custom.verify(model, args, proto)
    assert report.passed, str(report)
    (pruned,) = [r for r in report.shapes_tried if r.kind == "pruned"]
    assert pruned.status == "passed" and report.pruned_inputs == ("ids",)
