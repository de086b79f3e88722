"""``torch.compile(backend="onnx_custom", options={"fuse": ...})`` with ``dynamic=True`` (level
sizes that follow the input) and on the function form (mmcv's signature, Mask2Former's function):
the fused graphs compared with eager PyTorch at several sizes."""

from __future__ import annotations

from typing import Any

import fusion_cases
import pytest
import torch
from fusion_cases import DIM, HEADS, POINTS, QUERIES, FunctionModel, MyAttention, inputs, my_msda
from torch import Tensor, nn

import onnx_custom

# (H, W) of the two levels per call: every call of a dynamic graph meets new level sizes
LEVEL_SETS = (((6, 5), (3, 3)), ((8, 4), (4, 2)), ((5, 7), (3, 4)))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class MapsModel(nn.Module):
    """Feature maps projected, flattened into ``value``; the level sizes read from the maps (so
    they are symbolic under ``dynamic=True``); then the attention module, or ``my_msda``."""

    def __init__(self, attention: nn.Module | None = None) -> None:
        super().__init__()
        self.proj = nn.Conv2d(HEADS * DIM, HEADS * DIM, 1)
        self.attn = attention

    def forward(self, map0: Tensor, map1: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
        maps = [self.proj(map0), self.proj(map1)]
        sizes = [(m.shape[2], m.shape[3]) for m in maps]
        value = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)
        value = value.reshape(map0.shape[0], value.shape[1], HEADS, DIM)
        if self.attn is None:
            return my_msda(value, sizes, locations, weights)
        # the level tensors built from the sizes without specialising them
        one = map0.new_ones((), dtype=torch.long)
        shapes = torch.stack([torch.stack([one * h, one * w]) for h, w in sizes])
        starts = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
        return self.attn(value, shapes, sizes, starts, locations, weights, 64)  # type: ignore[no-any-return]


def maps_inputs(levels: Any, batch: int = 2, seed: int = 0) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    maps = [torch.randn(batch, HEADS * DIM, h, w, generator=g) for h, w in levels]
    locations = torch.rand(batch, QUERIES, HEADS, 2, POINTS, 2, generator=g) * 1.2 - 0.1
    weights = torch.rand(batch, QUERIES, HEADS, 2 * POINTS, generator=g).softmax(-1)
    return (*maps, locations, weights.view(batch, QUERIES, HEADS, 2, POINTS))


def _custom_ops(backend: Any) -> list[str]:
    return [op for r in backend.records for p in r.partitions for op in p.custom_ops]


@pytest.mark.parametrize(
    ("form", "fuse", "name"),
    [("module", [MyAttention], "attn"), ("function", [my_msda], "fusion_cases.my_msda")],
    ids=["module", "function"],
)
def test_dynamic_compile_fuses_symbolic_level_sizes(form: str, fuse: Any, name: str) -> None:
    model = MapsModel(MyAttention() if form == "module" else None).eval()
    backend = onnx_custom.compile_backend(fuse=fuse)
    compiled = torch.compile(model, backend=backend, dynamic=True)  # type: ignore[call-overload]
    with torch.no_grad():
        for levels in LEVEL_SETS:
            args = maps_inputs(levels)
            torch.testing.assert_close(compiled(*args), model(*args))
    # the last sizes ran a graph compiled for others: its level sizes are symbolic
    assert len(backend.records) < len(LEVEL_SETS)
    assert backend.fusion_reports and all(
        [s.name for s in r.fused] == [name] and not r.not_fused for r in backend.fusion_reports
    ), [str(r) for r in backend.fusion_reports]
    assert _custom_ops(backend) == ["onnx_custom.multi_scale_deformable_attn.default"] * len(
        backend.records
    )


def test_dynamic_compile_with_static_levels() -> None:
    """``dynamic=True`` with the batch and query count symbolic, the levels fixed."""
    model = fusion_cases.AttentionModel(MyAttention()).eval()
    backend = onnx_custom.compile_backend(fuse=[MyAttention])
    compiled = torch.compile(model, backend=backend, dynamic=True)  # type: ignore[call-overload]
    with torch.no_grad():
        for batch, queries in ((1, 7), (2, 5), (3, 9)):
            args = inputs(batch=batch, queries=queries)
            torch.testing.assert_close(compiled(*args), model(*args))
    assert all(len(r.fused) == 1 for r in backend.fusion_reports)
    assert len(_custom_ops(backend)) == len(backend.records) < 3


def test_compile_fuses_the_function_form() -> None:
    model = FunctionModel().eval()
    backend = onnx_custom.compile_backend(fuse=[my_msda])
    args = inputs()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(*args)  # type: ignore[call-overload]
        torch.testing.assert_close(got, model(*args))
    (report,) = backend.fusion_reports
    (site,) = report.fused
    assert site.name == "fusion_cases.my_msda" and site.implementation == site.name
    assert _custom_ops(backend) == ["onnx_custom.multi_scale_deformable_attn.default"]


def test_compile_leaves_a_different_function_alone() -> None:
    model = FunctionModel(shifted=True).eval()
    backend = onnx_custom.compile_backend(fuse=[fusion_cases.shifted_msda])
    args = inputs()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(*args)  # type: ignore[call-overload]
        torch.testing.assert_close(got, model(*args))
    (report,) = backend.fusion_reports
    (site,) = report.not_fused
    assert site.name == "fusion_cases.shifted_msda" and "numeric check failed" in site.reason
    assert not _custom_ops(backend)


class TwoCalls(nn.Module):
    """``my_msda`` called twice, a projection between the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.first = FunctionModel()
        self.mix = nn.Linear(HEADS * DIM, HEADS * DIM)

    def forward(self, value: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
        out = self.mix(self.first(value, locations, weights))
        keys = value.shape[1]
        again = out[:, :1].expand(-1, keys, -1).reshape(value.shape[0], keys, HEADS, DIM)
        return my_msda(again, list(fusion_cases.LEVELS), locations, weights)


def test_compile_fuses_each_call_of_a_function() -> None:
    model = TwoCalls().eval()
    backend = onnx_custom.compile_backend(fuse=[my_msda])
    args = inputs()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(*args)  # type: ignore[call-overload]
        torch.testing.assert_close(got, model(*args))
    (report,) = backend.fusion_reports
    assert [s.name for s in report.fused] == [
        "fusion_cases.my_msda (call 1)",
        "fusion_cases.my_msda (call 2)",
    ], str(report)
    assert set(_custom_ops(backend)) == {"onnx_custom.multi_scale_deformable_attn.default"}


def test_compile_fuses_mask2formers_function() -> None:
    """``fuse=True``: transformers' Mask2Former function, found by its code, no registration."""
    modeling = pytest.importorskip("transformers.models.mask2former.modeling_mask2former")

    class Mask2FormerStyle(FunctionModel):
        def forward(self, value: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
            bs, keys, _ = value.shape
            value = self.value_proj(value).view(bs, keys, HEADS, DIM)
            out = modeling.multi_scale_deformable_attention(
                value, list(fusion_cases.LEVELS), locations, weights
            )
            return self.output_proj(out)  # type: ignore[no-any-return]

    model = Mask2FormerStyle().eval()
    backend = onnx_custom.compile_backend(fuse=True)
    compiled = torch.compile(model, backend=backend, dynamic=True)  # type: ignore[call-overload]
    with torch.no_grad():
        for batch, queries in ((2, 7), (3, 5)):
            args = inputs(batch=batch, queries=queries)
            torch.testing.assert_close(compiled(*args), model(*args))
    assert all(len(r.fused) == 1 for r in backend.fusion_reports), [
        str(r) for r in backend.fusion_reports
    ]
    (site,) = backend.fusion_reports[0].fused
    assert site.implementation.endswith("modeling_mask2former.multi_scale_deformable_attention")
    assert _custom_ops(backend)
