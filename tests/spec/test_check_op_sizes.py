"""`check_op` runs ONNX Runtime at other sizes along the dims the op leaves free, lists the shapes
it tried in each case (``CheckCase.shapes`` and the detail line), and says which dims could not
vary and why. A planted op whose ORT kernel is right only at the sample's shape FAILS (before,
check_op verified the sample's shape only and passed it).

Real exporters (both), real ONNX Runtime; each op's eager math and kernel are written apart.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from onnx_custom.errors import VerificationError
from onnx_custom.spec import Attribute, Input, OpSpec, Output
from onnx_custom.testing import CheckCase, CheckReport, check_op
from onnx_custom.verification.trial_shapes import DEFAULT_SHAPE_TRIALS

# -- ops ---------------------------------------------------------------------------------------


def row_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=-1, keepdim=True)


def row_mean_np(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64).sum(axis=-1, keepdims=True) / x.shape[-1]).astype(x.dtype)


def row_mean_planted_np(x: np.ndarray) -> np.ndarray:
    # the bug: the divisor is the sample's row length, hard-coded
    return (x.astype(np.float64).sum(axis=-1, keepdims=True) / 4).astype(x.dtype)


def row_mean_spec(name: str, kernel: Callable[..., Any]) -> OpSpec:
    return OpSpec(
        f"sizes::{name}",
        op_type=name.title().replace("_", ""),
        inputs=[Input("x", ("float32", "float64"))],
        outputs=[Output("y", shape="x[:-1] + [1]")],
        impl=row_mean,
        kernel=kernel,
    )


def to_gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] != 3:
        raise ValueError(f"sizes::to_gray expects 3 channels (dim 1); received {x.shape[1]}")
    return (x * torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1)).sum(
        dim=1, keepdim=True
    )


def to_gray_np(x: np.ndarray) -> np.ndarray:
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]).astype(x.dtype)


TO_GRAY = OpSpec(
    "sizes::to_gray",
    op_type="ToGray",
    inputs=[Input("x", ("float32",))],
    outputs=[Output("y", shape="[x[0], 1, x[2], x[3]]")],
    impl=to_gray,
    kernel=to_gray_np,
)


def _shape_sizes(shape: str) -> list[list[int]]:
    """``"x[3, 4]"`` -> [[3, 4]] (passed shapes only)."""
    if "(" in shape:
        return []
    return [
        [int(v) for v in dims.split(",") if v.strip()]
        for dims in re.findall(r"\[([^\]]*)\]", shape)
    ]


def _ran(report: CheckReport) -> list[CheckCase]:
    """The cases that ran a file in ONNX Runtime."""
    return [c for c in report.cases if c.passed and c.detail.startswith("verified in ONNX Runtime")]


@dataclasses.dataclass(frozen=True)
class Free:
    id: str
    spec: Callable[[], OpSpec]
    sample: tuple[Any, ...]


FREE = [
    Free("row_mean-x[3,4]", lambda: row_mean_spec("row_mean", row_mean_np), (torch.randn(3, 4),)),
    Free(
        "row_mean-x[2,3,5]-permuted",
        lambda: row_mean_spec("row_mean3", row_mean_np),
        (torch.randn(5, 2, 3).permute(1, 2, 0),),
    ),
]


@pytest.mark.parametrize("case", FREE, ids=lambda c: c.id)
def test_free_dims_are_tried_smaller_and_larger(case: Free) -> None:
    report = check_op(case.spec(), case.sample, dtypes=False)
    ran = _ran(report)
    assert {"torchscript", "dynamo"} <= {
        x for c in ran for x in ("torchscript", "dynamo") if x in c.name
    }
    sample = list(case.sample[0].shape)
    for c in ran:
        sizes = [s for shape in c.shapes for s in _shape_sizes(shape)]
        assert sample in sizes, (c.name, c.shapes)  # the sample's own shape, then others
        for d, n in enumerate(sample):
            assert any(s[d] < n for s in sizes) and any(s[d] > n for s in sizes), (
                c.name,
                d,
                c.shapes,
            )
        assert any(all(v == 1 for v in s) for s in sizes), (c.name, c.shapes)  # size 1 where legal
        assert (
            f"at {len(c.shapes)} shape(s)" in c.detail
            and "static in the exported file" not in c.detail
        )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_fixed_dim_is_named_with_the_reason(exporter: str) -> None:
    """Channels must be 3 (the eager op refuses others; its shape rule does not say so, so the
    file's channel dim is dynamic): moving every dim at once is refused, so each dim moves alone;
    batch, height and width still run at smaller and larger sizes, and the detail names the
    channel dim with eager's reason."""
    report = check_op(TO_GRAY, (torch.randn(2, 3, 5, 6),), exporters=(exporter,), dtypes=False)
    (case,) = _ran(report)
    sizes = [s for shape in case.shapes for s in _shape_sizes(shape)]
    assert {s[1] for s in sizes} == {3}, case.shapes
    for d, n in [(0, 2), (2, 5), (3, 6)]:
        assert any(s[d] < n for s in sizes) and any(s[d] > n for s in sizes), (d, case.shapes)
    assert re.search(
        r"dynamic dim \S+ \(x\[1\]\) ran at its export size 3 only: .*expects 3 channels",
        case.detail,
    ), case.detail


def test_trials_1_says_no_other_sizes_were_drawn() -> None:
    """trials=1 (index inputs): only the samples' sizes run, and the detail says why."""
    spec = row_mean_spec("row_mean_t1", row_mean_np)
    report = check_op(spec, [(torch.randn(3, 4),), (torch.randn(5, 6),)], dtypes=False, trials=1)
    for c in _ran(report):
        assert c.shapes == ("x[5, 6]", "x[3, 4]"), c.shapes  # the larger sample is the export's
        assert "trials=1" in c.detail and "only the samples' sizes ran" in c.detail


def test_dynamic_false_says_so() -> None:
    report = check_op(
        row_mean_spec("row_mean_static", row_mean_np),
        (torch.randn(3, 4),),
        dtypes=False,
        dynamic=False,
    )
    for c in _ran(report):
        assert c.shapes == ("x[3, 4]",) and "dynamic=False" in c.detail


@pytest.mark.parametrize("exporters", [("torchscript",), ("dynamo",)], ids=lambda e: e[0])
def test_kernel_right_only_at_the_sample_shape_fails(exporters: tuple[str, ...]) -> None:
    spec = row_mean_spec(f"planted_{exporters[0]}", row_mean_planted_np)
    with pytest.raises(VerificationError) as info:
        check_op(spec, (torch.randn(3, 4),), exporters=exporters, dtypes=False)
    report = info.value.report
    assert isinstance(report, CheckReport)
    (failed,) = [c for c in report.cases if c.passed is False]
    assert "custom node sizes::" in failed.name and exporters[0] in failed.name
    assert "x[1, 1]" in failed.detail or "x_dim1" in failed.detail  # names the size it failed at
    # at the sample's shape alone the planted kernel is right: what check_op used to settle for
    passed = check_op(spec, (torch.randn(3, 4),), exporters=exporters, dtypes=False, dynamic=False)
    assert passed.passed


# -- dims the file names apart (the shape rule leaves an input free) -------------------------------


def scale_add(x: torch.Tensor, y: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return alpha * x + y


def scale_add_equal_shapes_np(x: np.ndarray, y: np.ndarray, *, alpha: float) -> np.ndarray:
    # written for equal shapes, as a native kernel indexing y with x's offsets is
    if x.shape != y.shape:
        raise AssertionError(f"scale_add kernel: x{list(x.shape)} and y{list(y.shape)} differ")
    return (x.dtype.type(alpha) * x + y).astype(x.dtype)


def scale_add_spec(name: str) -> OpSpec:
    return OpSpec(
        f"sizes::{name}",
        op_type="ScaleAdd",
        inputs=[Input("x", ("float32",)), Input("y", ("float32",))],
        outputs=[Output("out", shape="like:x")],
        attributes=[Attribute("alpha", "float", 2.0)],
        impl=scale_add,
        kernel=scale_add_equal_shapes_np,
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5)], ids=lambda s: "x".join(map(str, s)))
def test_dims_named_apart_but_tied_by_eager_are_noted_without_moving_dims_alone(
    exporter: str, shape: tuple[int, ...]
) -> None:
    """``like:x`` leaves y's dims free, so the file names them apart from x's. The apart trial
    gives them other sizes (never 1): eager refuses, which is noted, not failed, and does not send
    check_op into moving each dim alone (y's batch alone at 1 broadcasts in eager, and this
    kernel, written for equal shapes, would be fed x[4, 3] and y[1, 3])."""
    g = torch.Generator().manual_seed(11)
    sample = (torch.randn(*shape, generator=g), torch.randn(*shape, generator=g), 0.5)
    report = check_op(
        scale_add_spec(f"scale_add_{exporter}_{len(shape)}"),
        sample,
        exporters=(exporter,),
        dtypes=False,
    )
    (case,) = _ran(report)
    skipped = [s for s in case.shapes if "skipped" in s]
    assert len(skipped) == 1 and "cannot take" in skipped[0], case.shapes
    apart = [
        [int(v) for v in dims.split(",")]
        for dims in re.findall(r"\[([^\]]*)\]", skipped[0].split(" (")[0])
    ]
    assert apart[0] != apart[1] and min(min(s) for s in apart) >= 2, (
        skipped
    )  # sizes of their own, none 1
    for shape_text in case.shapes:
        if shape_text not in skipped:
            x_shape, y_shape = _shape_sizes(shape_text)
            assert x_shape == y_shape, case.shapes  # the kernel only ever ran at equal shapes
    assert len(case.shapes) == 1 + DEFAULT_SHAPE_TRIALS + 1, (
        case.shapes
    )  # sample, default trials, apart: no dim alone
    assert "names apart were tried at different sizes, which eager refused" in case.detail
