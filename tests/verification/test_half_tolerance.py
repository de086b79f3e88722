"""verify must not PASS a float16/bfloat16 file that is wrong in a few elements
(nor FAIL a right one).

The default atol for half outputs used to be one ulp of max|expected|: with large outputs
elsewhere (max ~1000: 0.98 at float16, 7.8 at bfloat16) an element expected 0.0005 could come
back with the wrong sign, from the neighbouring row, or unclamped, and verify said PASS. Each
element now has its own budget from the model run in float32 (`half_reference`). The wrong files
are real exports (both exporters, ONNX Runtime) of a model that differs from the verified one in
a few small elements; the right files are exports of the verified model itself, with long
reductions, convolutions, softmax and layer norm.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom.verification.compare import (
    HALF_BUDGET,
    ReferencePoint,
    compare_arrays,
    flatten_outputs,
    to_numpy,
)
from onnx_custom.verification.half_reference import HalfReference
from onnx_custom.verification.report import summary_text
from onnx_custom.verification.verifier import verify

HALVES = {"fp16": torch.float16, "bf16": torch.bfloat16}
EXPORTERS = ["torchscript", "dynamo"]


class BigAndSmall(torch.nn.Module):
    """Four outputs per row up to ~1000 and twelve of ~0.001 clamped to +-0.0005.

    ``wrong``: the file's mistake, in the small columns only: ``"sign"`` (column 4 negated),
    ``"row"`` (column 4 read from column 5: an off-by-one index) or ``"clamp"`` (no clamp).
    """

    def __init__(self, wrong: str | None = None) -> None:
        super().__init__()
        self.wrong = wrong
        self.w = torch.nn.Parameter(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.w.t()
        big, small = y[:, :4] * 300.0, y[:, 4:] * 0.001
        if self.wrong == "sign":
            small = torch.cat([-small[:, :1], small[:, 1:]], 1)
        if self.wrong == "row":
            small = torch.cat([small[:, 1:2], small[:, 1:]], 1)
        if self.wrong != "clamp":
            small = small.clamp(-0.0005, 0.0005)
        return torch.cat([big, small], 1)


def _x(dtype: torch.dtype, *shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("wrong", ["sign", "row", "clamp"])
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("half", HALVES, ids=[f"{k}-x4x8" for k in HALVES])
def test_a_file_wrong_in_a_few_small_elements_fails(half: str, exporter: str, wrong: str) -> None:
    dtype = HALVES[half]
    x = _x(dtype, 4, 8)
    proto = onnx_custom.export(BigAndSmall(wrong).to(dtype).eval(), (x,), exporter=exporter)
    report = verify(BigAndSmall().to(dtype).eval(), (x,), proto, raise_on_mismatch=False, shapes=())
    assert not report.passed
    (comparison,) = report.comparisons
    assert 0 < comparison.mismatched <= 4 * 12  # only small elements are wrong
    column = int(comparison.worst.split("]")[0].split(",")[-1])
    assert column >= 4  # the worst is a small element, not a large one rounded differently
    # the message names the element, both values and the tolerance used there
    assert (
        comparison.worst.startswith("element [")
        and "expected" in comparison.worst
        and "received" in comparison.worst
    )
    assert "tolerance" in comparison.worst and "budget" in comparison.worst
    assert "float32 reference" in comparison.tolerance_source
    assert comparison.worst in summary_text(report) and comparison.worst in str(report)


class Reduce(torch.nn.Module):
    """Right files with long reductions, convolution, softmax and layer norm in half precision."""

    def __init__(self, kind: str, k: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.kind = kind
        self.w = torch.nn.Parameter(torch.randn(8, k, generator=g) / k**0.5)
        self.conv = torch.nn.Conv2d(k, 8, 3, padding=1)
        self.norm = torch.nn.LayerNorm(k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "matmul":
            return (x @ self.w.t()) * 100.0 + x.sum(-1, keepdim=True)
        if self.kind == "conv":
            return self.conv(x)
        if self.kind == "softmax":
            return torch.softmax(x * 4.0, -1) + self.norm(x)
        return self.norm(x) * 50.0


RIGHT = [
    ("matmul", (4, 64)),
    ("matmul", (4, 1024)),
    ("matmul", (2, 4096)),
    ("conv", (1, 16, 12, 12)),
    ("conv", (1, 64, 6, 6)),
    ("softmax", (3, 512)),
    ("layernorm", (5, 256)),
]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    ("kind", "shape"), RIGHT, ids=[f"{k}-{'x'.join(map(str, s))}" for k, s in RIGHT]
)
@pytest.mark.parametrize("half", HALVES)
def test_right_half_files_pass(half: str, kind: str, shape: tuple[int, ...], exporter: str) -> None:
    dtype = HALVES[half]
    k = shape[1] if kind == "conv" else shape[-1]
    model = Reduce(kind, k).to(dtype).eval()
    x = _x(dtype, *shape, seed=4)
    proto = onnx_custom.export(model, (x,), exporter=exporter)
    report = verify(model, (x,), proto, raise_on_mismatch=False, shapes=())
    assert report.passed, str(report)
    assert not any("1 ulp" in c.tolerance_source for c in report.comparisons)  # never the old bound


class HalfOnly(torch.nn.Module):
    """Casts to float16 itself: the float32 copy of it fails (float16 @ float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(
            torch.randn(4, 8, generator=torch.Generator().manual_seed(5)).half()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float16) @ self.w.t()


def test_a_model_that_cannot_run_in_float32_keeps_the_old_bound_and_says_so() -> None:
    model = HalfOnly().eval()
    x = _x(torch.float16, 64, 8)
    report = verify(model, (x,), onnx_custom.export(model, (x,)), shapes=())
    assert report.passed
    widened = [c for c in report.comparisons if "1 ulp of max|expected|" in c.tolerance_source]
    noted = [
        n
        for n in report.notes
        if "without a float32 reference" in n and "cannot run in float32" in n
    ]
    assert bool(widened) == bool(noted)  # the old bound only where it was needed, and said so
    notes: list[str] = []
    points = HalfReference(model, flatten_outputs).for_trial((x,), [("output", model(x))], notes)
    assert points is not None and points[0] is not None and points[0]() is None
    assert len(notes) == 1 and "cannot run in float32 (RuntimeError" in notes[0]


@pytest.mark.parametrize("half", HALVES)
def test_compare_budget_is_per_element(half: str) -> None:
    """max|expected| = 1000 no longer buys 0.4 at an element expected 0.001 whose budget is tiny;
    the same difference passes where the budget (cancellation of large terms) allows it."""
    dtype = HALVES[half]
    expected = torch.tensor([1000.0, 0.001, 0.001], dtype=dtype)
    actual = to_numpy(torch.tensor([1000.0, 0.4, 0.4], dtype=dtype))
    value = expected.float()
    spread = torch.tensor([0.5, 1e-6, 0.4 / HALF_BUDGET], dtype=torch.float32)
    c = compare_arrays(expected, actual, name="y", trial=0, reference=ReferencePoint(value, spread))
    assert c.mismatched == 1 and c.worst.startswith("element [1]: expected ")
    legacy = compare_arrays(
        expected, actual, name="y", trial=0
    )  # no reference: the one-ulp-of-max bound
    assert legacy.passed == (
        float(torch.finfo(dtype).eps) * 1000.0 >= float(np.float32(0.4) - np.float32(0.001))
    )
    explicit = compare_arrays(
        expected,
        actual,
        name="y",
        trial=0,
        rtol=1e-3,
        atol=1e-5,
        reference=ReferencePoint(value, spread),
    )
    assert (
        explicit.mismatched == 2 and "user override" in explicit.tolerance_source
    )  # a user's tolerances stay as given


@pytest.mark.parametrize("half", HALVES)
def test_the_reference_is_made_only_when_an_element_needs_it(half: str) -> None:
    dtype = HALVES[half]
    expected = torch.tensor([1000.0, 0.001], dtype=dtype)
    calls: list[int] = []

    def make() -> ReferencePoint | None:
        calls.append(1)
        return None  # a model that cannot run in float32: the old bound

    within = compare_arrays(expected, to_numpy(expected), name="y", trial=0, reference=make)
    assert (
        within.passed and not calls and within.tolerance_source.startswith("torch.testing default")
    )
    off = to_numpy(torch.tensor([1000.0, 0.002], dtype=dtype))
    legacy = compare_arrays(expected, off, name="y", trial=0, reference=make)
    assert calls == [1] and legacy.passed and "1 ulp of max|expected|" in legacy.tolerance_source
