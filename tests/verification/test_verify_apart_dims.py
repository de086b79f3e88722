"""verify() must fail a file that confuses two dims it names apart but that share an export size.

A square image's height and width (``{2: "h", 3: "w"}``), or two inputs' batches named apart,
exported at one size: every default size trial keeps such dims equal (their candidates depend
only on the export size and range), so a file reading height where it should read width passed.
The apart trial (`trial_shapes.apart_case`) gives them different sizes, never 1 (size 1
broadcasts in eager: another computation, not a refusal), never the export size. Wrong files (a
TorchScript trace of a view reading H twice, a translation whose Reshape reads the wrong Shape
index under both exporters, a hand-written file dividing by the other input's batch) must fail at
that trial; right files (a square-image CNN with independent H and W, a concatenation of two
batches) must pass it; files whose model ties the dims (elementwise ops on inputs named apart)
must pass with the trial skipped and a note.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
from onnx_custom.errors import VerificationError
from onnx_custom.verification.trial_shapes import ApartCase, DimPlan, DynamicDim, apart_case
from onnx_custom.verification.verifier import VerificationReport, verify

Dim = torch.export.Dim

# ---------------------------------------------------------------------------- the sizes chosen


def _plan(*dims: tuple[str, int, int | None, int | None]) -> DimPlan:
    """Dims (key, export size, min, max), each on its own axis of one input ``x``."""
    found = {
        key: DynamicDim(key, size, lo, hi, "test", ((0, axis),), (f"x[{axis}]",))
        for axis, (key, size, lo, hi) in enumerate(dims)
    }
    return DimPlan(found, {}, {"x": tuple(found)})


@dataclasses.dataclass(frozen=True)
class Sizes:
    id: str
    dims: tuple[tuple[str, int, int | None, int | None], ...]
    expected: dict[str, int] | None  # None: no apart trial


SIZES = [
    Sizes("square-h32-w32", (("h", 32, None, None), ("w", 32, None, None)), {"h": 64, "w": 96}),
    Sizes("batches-1-1", (("bx", 1, None, None), ("by", 1, None, None)), {"bx": 2, "by": 3}),
    Sizes("batches-0-0", (("bx", 0, None, None), ("by", 0, None, None)), {"bx": 2, "by": 3}),
    Sizes(
        "three-of-3",
        (("a", 3, None, None), ("b", 3, None, None), ("c", 3, None, None)),
        {"a": 6, "b": 9, "c": 4},
    ),
    Sizes("capped-e4-max5", (("h", 4, None, 5), ("w", 4, None, 5)), {"h": 5, "w": 3}),
    # one size other than e in range: one dim keeps e (still apart)
    Sizes("range-2..3", (("h", 2, 2, 3), ("w", 2, 2, 3)), {"h": 3, "w": 2}),
    # export size 1 within [1, 2]: only one dim could move (to 2), the other would stay at 1,
    # which broadcasts: no trial
    Sizes("range-1..2-e1", (("h", 1, 1, 2), ("w", 1, 1, 2)), None),
    Sizes("range-fixed", (("h", 4, 4, 4), ("w", 4, 4, 4)), None),
    Sizes("sizes-differ", (("h", 4, None, None), ("w", 5, None, None)), None),
    Sizes("ranges-differ", (("h", 4, None, None), ("w", 4, None, 16)), None),
    # the lone dim keeps its export size; only the pair moves
    Sizes(
        "pair-and-lone",
        (("n", 2, None, None), ("h", 8, None, None), ("w", 8, None, None)),
        {"h": 16, "w": 24},
    ),
]


@pytest.mark.parametrize("case", SIZES, ids=lambda c: c.id)
def test_apart_sizes(case: Sizes) -> None:
    plan = _plan(*case.dims)
    found = apart_case(plan)
    if case.expected is None:
        assert found is None
        return
    assert found is not None and found.sizes == case.expected
    for key, size in found.sizes.items():
        dim = plan.dims[key]
        assert dim.admits(size)
        assert size >= 2 or size == dim.export_size  # a moved dim never goes to 1
    for group in found.groups:
        assert len({found.sizes[k] for k in group}) > 1


# ---------------------------------------------------------------------------- wrong files fail


class Transposed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(2, 3).reshape(x.shape[0], x.shape[1], x.shape[3], x.shape[2]) * 2.0


class TransposedWrongView(torch.nn.Module):
    """The bug: the view keeps the input's [h, w] order after swapping them (a square example
    cannot tell; at h != w the element count still fits, so ONNX Runtime runs it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(2, 3).view(x.shape[0], x.shape[1], x.shape[2], x.shape[3]) * 2.0


class MeanHW(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum((2, 3)) / (x.shape[2] * x.shape[3])


class MeanHH(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum((2, 3)) / (x.shape[2] * x.shape[2])


@torch.library.custom_op("octapart::flat_hw", mutates_args=())
def flat_hw(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).clone()


@flat_hw.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1], x.shape[2] * x.shape[3])


def _flat_translation(width_axis: int) -> onnx_custom.Registry:
    """A Reshape to [n, c, h * w] built from Shape slices; width read at ``width_axis``."""
    registry = onnx_custom.default_registry().copy()

    @onnx_custom.symbolic("octapart::flat_hw", opset=13, registry=registry)
    def _(g: Any, x: Any) -> Any:
        shape = g.op("Shape", x)

        def dims(start: int, end: int) -> Any:
            return g.op("Slice", shape, g.constant([start]), g.constant([end]))

        hw = g.op("Mul", dims(2, 3), dims(width_axis, width_axis + 1))
        return g.op("Reshape", x, g.op("Concat", dims(0, 2), hw, axis=0))

    return registry


class FlatOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return flat_hw(x) + 1.0


@torch.library.custom_op("octapart::mean_hw", mutates_args=())
def mean_hw(x: torch.Tensor) -> torch.Tensor:
    return x.mean((2, 3))


@mean_hw.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1])


def _mean_translation(width_axis: int) -> onnx_custom.Registry:
    """ReduceSum over [2, 3] divided by h * w read off Shape; width read at ``width_axis``."""
    registry = onnx_custom.default_registry().copy()

    @onnx_custom.symbolic("octapart::mean_hw", opset=18, registry=registry)
    def _(g: Any, x: Any) -> Any:
        shape = g.op("Shape", x)
        h = g.op("Slice", shape, g.constant([2]), g.constant([3]))
        w = g.op("Slice", shape, g.constant([width_axis]), g.constant([width_axis + 1]))
        count = g.op("Cast", g.op("Mul", h, w), to=TensorProto.FLOAT)
        return g.op("Div", g.op("ReduceSum", x, g.constant([2, 3]), keepdims=0), count)

    return registry


class MeanOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mean_hw(x) * 2.0


def _two_batch_file(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [d, 3])
        for n, d in (("x", "bx"), ("y", "by"))
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, [3])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _mean_by_the_other_batch() -> onnx.ModelProto:
    """sum(x) / len(y) + mean(y): a translation dividing by the other input's batch."""
    zero = helper.make_tensor("zero", TensorProto.INT64, [1], [0])
    nodes = [
        helper.make_node("ReduceSum", ["x", "zero"], ["sx"], keepdims=0),
        helper.make_node("Shape", ["y"], ["batch_y"], start=0, end=1),
        helper.make_node("Cast", ["batch_y"], ["count"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["sx", "count"], ["mx"]),
        helper.make_node("ReduceMean", ["y", "zero"], ["my"], keepdims=0),
        helper.make_node("Add", ["mx", "my"], ["output_0"]),
    ]
    return _two_batch_file(nodes, [zero])


class MeanOfBoth(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.mean(0) + y.mean(0)


def _image(seed: int, n: int = 2, size: int = 6) -> tuple[torch.Tensor]:
    return (torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed)),)


def _traced(wrong: torch.nn.Module, args: tuple[Any, ...]) -> onnx.ModelProto:
    return onnx_custom.export(
        wrong, args, exporter="torchscript", dynamic_shapes={"x": {2: "h", 3: "w"}}
    )


def _raw_traced(wrong: torch.nn.Module, args: tuple[Any, ...]) -> onnx.ModelProto:
    """torch.onnx's own TorchScript export: onnx_custom.export refuses a model that ties dims
    named apart (its torch.export check), a file from elsewhere does not."""
    buffer = io.BytesIO()
    torch.onnx.export(
        wrong,
        args,
        buffer,
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {2: "h", 3: "w"}},
        opset_version=17,
    )
    return onnx.load_from_string(buffer.getvalue())


def _translated(
    model: torch.nn.Module, registry: onnx_custom.Registry, exporter: str, args: tuple[Any, ...]
) -> onnx.ModelProto:
    dims = {"x": {2: Dim("h"), 3: Dim("w")}}
    return onnx_custom.export(
        model, args, exporter=exporter, registry=registry, dynamic_shapes=dims
    )


@dataclasses.dataclass(frozen=True)
class Wrong:
    id: str
    model: Callable[[], torch.nn.Module]  # what the file should compute
    args: Callable[[], tuple[Any, ...]]
    file: Callable[[tuple[Any, ...]], onnx.ModelProto]
    apart: tuple[str, str]  # the input dims the trial must move apart ("x[2]")


WRONG = [
    Wrong(
        "ts-view-h-w-swapped-x2x3x6x6",
        Transposed,
        lambda: _image(0),
        lambda a: _raw_traced(TransposedWrongView(), a),
        ("x[2]", "x[3]"),
    ),
    Wrong(
        "ts-mean-by-h-h-x2x3x6x6",
        MeanHW,
        lambda: _image(1),
        lambda a: _traced(MeanHH(), a),
        ("x[2]", "x[3]"),
    ),
    Wrong(
        "ts-reshape-from-shape-2-x2x3x6x6",
        FlatOp,
        lambda: _image(3),
        lambda a: _translated(FlatOp(), _flat_translation(2), "torchscript", a),
        ("x[2]", "x[3]"),
    ),
    *(
        Wrong(
            f"{exporter}-count-from-shape-2-x2x3x6x6",
            MeanOp,
            lambda: _image(2),
            lambda a, exporter=exporter: _translated(MeanOp(), _mean_translation(2), exporter, a),
            ("x[2]", "x[3]"),
        )
        for exporter in ("dynamo", "torchscript")
    ),
    Wrong(
        "batches-confused-x4x3-y4x3",
        MeanOfBoth,
        lambda: tuple(
            torch.randn(4, 3, generator=torch.Generator().manual_seed(4 + i)) for i in range(2)
        ),
        lambda a: _mean_by_the_other_batch(),
        ("x[0]", "y[0]"),
    ),
]


def _apart_sizes(report: VerificationReport, slots: tuple[str, str]) -> list[int]:
    """The sizes the apart trial gave ``slots`` (e.g. ``("x[2]", "x[3]")``)."""
    (record,) = [r for r in report.shapes_tried if r.kind == "apart"]
    shapes = dict(record.input_shapes)
    return [shapes[slot.split("[")[0]][int(slot.split("[")[1].rstrip("]"))] for slot in slots]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("case", WRONG, ids=lambda c: c.id)
def test_a_file_confusing_dims_named_apart_fails_at_the_apart_trial(case: Wrong) -> None:
    args = case.args()
    proto = case.file(args)
    report = verify(case.model(), args, proto, raise_on_mismatch=False)
    assert not report.passed
    (failed,) = report.failed_trials()
    assert failed.kind == "apart"
    assert all(
        r.status == "passed" for r in report.shapes_tried if r is not failed
    )  # equal sizes hid it
    sizes = _apart_sizes(report, case.apart)
    assert sizes[0] != sizes[1] and min(sizes) >= 2, sizes
    with pytest.raises(VerificationError, match=r"trial \d+ \(apart\)"):
        verify(case.model(), args, proto)


# ---------------------------------------------------------------------------- right files pass


class SquareCNN(torch.nn.Module):
    """Independent height and width all the way to a flattened feature vector."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.relu(self.conv(x)))
        return torch.cat([y.flatten(1), y.mean((2, 3))], dim=1)


class CatBatches(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x * 2.0, y], dim=0)


def _cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return SquareCNN().eval()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize(
    ("model", "args", "dims", "slots"),
    [
        pytest.param(
            _cnn,
            lambda: _image(5, size=8),
            {"x": {2: Dim("h", min=4), 3: Dim("w", min=4)}},
            ("x[2]", "x[3]"),
            id="square-cnn-x2x3x8x8",
        ),
        pytest.param(
            CatBatches,
            lambda: tuple(
                torch.randn(4, 3, generator=torch.Generator().manual_seed(6 + i)) for i in range(2)
            ),
            {"x": {0: Dim("bx")}, "y": {0: Dim("by")}},
            ("x[0]", "y[0]"),
            id="cat-batches-x4x3-y4x3",
        ),
    ],
)
def test_a_right_file_passes_the_apart_trial(
    exporter: str,
    model: Callable[[], torch.nn.Module],
    args: Callable[[], tuple[Any, ...]],
    dims: dict[str, Any],
    slots: tuple[str, str],
) -> None:
    inputs = args()
    module = model()
    proto = onnx_custom.export(module, inputs, exporter=exporter, dynamic_shapes=dims)
    report = verify(module, inputs, proto)
    assert report.passed, str(report)
    sizes = _apart_sizes(report, slots)
    assert sizes[0] != sizes[1] and min(sizes) >= 2
    assert [r.status for r in report.shapes_tried if r.kind == "apart"] == ["passed"]


class AddScaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + 0.5 * y


def _add_scaled_file(x_dims: list[int | str], y_dims: list[int | str]) -> onnx.ModelProto:
    """x + 0.5 * y with the dims named as given (our exporters refuse to name tied dims apart;
    a custom op whose shape rule leaves an input free gets them, see tests/spec)."""
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    nodes = [
        helper.make_node("Mul", ["y", "half"], ["scaled"]),
        helper.make_node("Add", ["x", "scaled"], ["output_0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, d)
            for n, d in (("x", x_dims), ("y", y_dims))
        ],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, x_dims)],
        initializer=[half],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize(
    ("x_dims", "y_dims", "sizes"),
    [
        (["bx", 3], ["by", 3], {"bx": 4, "by": 4}),
        ([2, "c"], ["k"], {"c": 4, "k": 4}),
        (["a", "b"], ["c", "d"], {"a": 4, "b": 4, "c": 4, "d": 4}),
    ],
    ids=["x4x3-y4x3-batches", "x2x4-y4-broadcast", "x4x4-y4x4-all-apart"],
)
def test_a_model_tying_dims_the_file_names_apart_skips_the_trial_with_a_note(
    x_dims: list[int | str], y_dims: list[int | str], sizes: dict[str, int]
) -> None:
    """Eager broadcasting ties the dims the file names apart: the trial is skipped (its sizes are
    at least 2, so eager refuses rather than broadcasting) and said in a note, not failed."""
    g = torch.Generator().manual_seed(7)
    args = tuple(
        torch.randn(*[sizes.get(d, d) for d in dims], generator=g) for dims in (x_dims, y_dims)
    )  # type: ignore[misc]
    proto = _add_scaled_file(x_dims, y_dims)
    report = verify(AddScaled(), args, proto)
    assert report.passed, str(report)
    (skipped,) = report.skipped()
    assert skipped.kind == "apart" and "cannot take" in skipped.reason
    shapes = dict(skipped.input_shapes)
    assert min(min(s) for s in shapes.values()) >= 2, shapes  # no size 1: it would broadcast
    (note,) = [n for n in report.notes if "apart" in n]
    assert "the model refused different sizes" in note and "one name" in note


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_explicit_shapes_replace_the_apart_trial() -> None:
    args = _image(8)
    proto = _raw_traced(TransposedWrongView(), args)
    report = verify(Transposed(), args, proto, shapes=[{"h": 5, "w": 5}])
    assert report.passed and not [r for r in report.shapes_tried if r.kind == "apart"]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_apart_case_reads_the_files_dims() -> None:
    """Through plan_dims: a traced file's h and w (x[2], x[3]) form one group."""
    from onnx_custom.verification.runner import bind_inputs
    from onnx_custom.verification.trial_shapes import plan_dims

    args = _image(9)
    proto = _raw_traced(TransposedWrongView(), args)
    plan = plan_dims(proto, bind_inputs(proto, args, Transposed()), args, model=Transposed())
    found = apart_case(plan)
    assert (
        isinstance(found, ApartCase)
        and found.groups == (("h", "w"),)
        and found.sizes == {"h": 12, "w": 18}
    )
    assert found.describe_groups(plan) == "h (x[2]) and w (x[3])"
