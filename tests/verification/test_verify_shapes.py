"""verify() tries the shapes a file claims: dynamic dims varied by default, explicit ``shapes=``,
declared output types checked against ONNX Runtime, sizes a model cannot take reported."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
import onnx_custom.ops.seed
from onnx_custom.errors import OnnxCustomError, VerificationError
from onnx_custom.verification.runner import bind_inputs
from onnx_custom.verification.trial_shapes import (
    METADATA_KEY,
    ShapeSpecError,
    default_cases,
    plan_dims,
    resize_inputs,
)
from onnx_custom.verification.verifier import DEFAULT_SHAPE_TRIALS, verify

Dim = torch.export.Dim
EXPORTERS = ("torchscript", "dynamo")


def _file(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    metadata: dict[str, Any] | None = None,
) -> onnx.ModelProto:
    """A hand-made file (the export side is not under test here)."""
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    if metadata is not None:
        helper.set_model_props(model, {METADATA_KEY: json.dumps(metadata)})
    onnx.checker.check_model(model)
    return model


def _float(name: str, dims: Sequence[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def _scaled_file(metadata: dict[str, Any] | None = None) -> onnx.ModelProto:
    """y = 2x, z = x + y with x ["batch", 4] and y ["batch", "n"]."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["out"]),
        helper.make_node("ReduceSum", ["y", "axes"], ["total"], keepdims=0),
    ]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    return _file(
        nodes,
        [_float("x", ["batch", 4]), _float("y", ["batch", "n"])],
        [_float("out", ["batch", 4]), _float("total", ["batch"])],
        [two, axes],
        metadata,
    )


class Scaled(torch.nn.Module):
    """The PyTorch side of `_scaled_file`."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, y.sum(1)


def _scaled_args(batch: int = 2, n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, 4, generator=g), torch.randn(batch, n, generator=g)


def _shape_trials(report: Any) -> list[Any]:
    return [r for r in report.shapes_tried if r.kind == "shape"]


# ----------------------------------------------------------------------------- default trials


class SharedBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x.sum(-1, keepdim=True) * y).tanh(), x.mean(-1)


SHARED_DYNAMIC = {"x": {0: Dim("batch"), 1: Dim("feat")}, "y": {0: Dim("batch")}}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_default_trials_vary_every_dynamic_dim_and_keep_shared_dims_equal(exporter: str) -> None:
    args = (torch.randn(2, 5), torch.randn(2, 4))
    proto = onnx_custom.export(
        SharedBatch(), args, exporter=exporter, dynamic_shapes=SHARED_DYNAMIC
    )
    report = verify(SharedBatch(), args, proto, trials=2)
    assert report.passed, str(report)
    assert [r.kind for r in report.shapes_tried] == ["example", "values", "shape", "shape", "shape"]
    shapes = [dict(r.input_shapes) for r in _shape_trials(report)]
    x_name, y_name = (i.name for i in proto.graph.input)
    # batch (export 2): 1, 3, 4 and feat (export 5): 1, 6, 10, one trial each;
    # y's batch follows x's.
    assert [s[x_name] for s in shapes] == [(1, 1), (3, 6), (4, 10)]
    assert [s[y_name] for s in shapes] == [(1, 4), (3, 4), (4, 4)]
    assert report.trials == 2 + DEFAULT_SHAPE_TRIALS
    assert {c.trial for c in report.comparisons} == {0, 1, 2, 3, 4}
    assert "Shapes tried:" in str(report) and "trial 4 (shape)" in str(report)


def test_static_files_run_at_the_export_shape_only() -> None:
    args = (torch.randn(2, 5), torch.randn(2, 4))
    proto = onnx_custom.export(SharedBatch(), args, exporter="torchscript")
    report = verify(SharedBatch(), args, proto, trials=2)
    assert report.passed and [r.kind for r in report.shapes_tried] == ["example", "values"]


def test_metadata_ranges_bound_the_sizes_tried() -> None:
    proto = _scaled_file({"batch": {"min": 2, "max": 5}, "n": {"min": None, "max": None}})
    report = verify(Scaled(), _scaled_args(), proto)
    assert report.passed, str(report)
    sizes = [dict(r.sizes) for r in _shape_trials(report)]
    assert [s["batch"] for s in sizes] == [3, 4, 5]  # 1 is below min=2; 6 is above max=5
    assert [s["n"] for s in sizes] == [1, 6, 10]


def test_unnamed_dynamic_dims_are_varied_too() -> None:
    proto = _scaled_file()
    proto.graph.input[1].type.tensor_type.shape.dim[1].Clear()  # y's second dim: dynamic, no name
    report = verify(Scaled(), _scaled_args(), proto)
    assert report.passed and [dict(r.sizes)["y.shape[1]"] for r in _shape_trials(report)] == [
        1,
        6,
        10,
    ]


# ----------------------------------------------------------------------------- the planted bug


class CustomAdd(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(a, b)  # the custom node's output is the graph output


class CustomAddRelu(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(a, b).relu()  # the custom node's output is intermediate


def _bake_static(proto: onnx.ModelProto, value: str, shape: Sequence[int]) -> onnx.ModelProto:
    """Give ``value`` the static export-time shape, as the TorchScript exporter once did."""
    planted = onnx.ModelProto()
    planted.CopyFrom(proto)
    graph = planted.graph
    infos = [v for v in (*graph.output, *graph.value_info) if v.name == value]
    if not infos:
        graph.value_info.append(_float(value, shape))
        return planted
    for info in infos:
        dims = info.type.tensor_type.shape.dim
        del dims[:]
        for size in shape:
            dims.add().dim_value = size
    return planted


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    "model", [CustomAdd(), CustomAddRelu()], ids=["graph-output", "value-info"]
)
def test_a_baked_static_custom_node_shape_fails_by_default(
    exporter: str, model: torch.nn.Module
) -> None:
    args = (torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    registry = onnx_custom.default_registry().with_variants("custom")
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        registry=registry,
        dynamic_shapes=({0: Dim("batch")}, {0: Dim("batch")}),
    )
    (node,) = [n for n in proto.graph.node if n.domain == "onnx_custom"]
    planted = _bake_static(proto, node.output[0], (2, 3, 8))
    # The old verifier ran the export shape only, where the baked shape is right: PASS.
    assert verify(model, args, planted, shapes=()).passed
    # By default other batch sizes run, and the file's claim [2, 3, 8] is caught.
    with pytest.raises(VerificationError) as info:
        verify(model, args, planted)
    report = info.value.report
    failed = report.failed_trials()
    assert failed and all(r.kind == "shape" for r in failed)
    if report.type_mismatches:  # ORT ran, returned another shape than the file declares
        (mismatch,) = [
            m
            for m in report.type_mismatches
            if m.value == node.output[0] and m.trial == failed[0].trial
        ]
        assert "onnx_custom::my_add" in mismatch.producer
        assert mismatch.declared == "float[2, 3, 8]" and mismatch.actual == "float[1, 3, 8]"
        assert "dim 0 is static 2 in the file but 1 at run time" in str(info.value)
    else:  # our kernel host refused the output ORT inferred from the baked shape
        assert (
            "failed to run the ONNX model on trial 1 at" in failed[0].reason
            and "(2,3,8)" in failed[0].reason
        )


def test_the_correct_dynamic_custom_file_passes_by_default() -> None:
    args = (torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    registry = onnx_custom.default_registry().with_variants("custom")
    proto = onnx_custom.export(
        CustomAddRelu(),
        args,
        exporter="dynamo",
        registry=registry,
        dynamic_shapes=({0: Dim("batch")}, {0: Dim("batch")}),
    )
    report = verify(CustomAddRelu(), args, proto)
    assert (
        report.passed
        and len(_shape_trials(report)) == DEFAULT_SHAPE_TRIALS
        and not report.type_mismatches
    )


# --------------------------------------------------------------------------- skipped / failed sizes


class NeedsBatchTwo(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[0] < 2:
            raise ValueError("needs a batch of at least 2")
        return x * 2, y.sum(1)


def test_a_size_the_model_cannot_take_is_reported_as_skipped() -> None:
    report = verify(NeedsBatchTwo(), _scaled_args(), _scaled_file())
    assert report.passed
    (skipped,) = report.skipped()
    assert dict(skipped.sizes)["batch"] == 1
    assert (
        skipped.reason
        == "the model cannot take batch=1, n=1: ValueError: needs a batch of at least 2"
    )
    assert "SKIPPED: the model cannot take batch=1" in str(report)


class PlusOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class TimesBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.shape[0]


def _batch_file(op: str, constant: np.ndarray) -> onnx.ModelProto:
    c = onnx.numpy_helper.from_array(constant.astype(np.float32), "c")
    return _file(
        [helper.make_node(op, ["x", "c"], ["y"])],
        [_float("x", ["batch", 4])],
        [_float("y", ["batch", 4])],
        [c],
    )


@pytest.mark.parametrize(
    ("model", "onnx_file", "why"),
    [
        # A [2, 1] constant baked where the batch belongs: ORT cannot broadcast it at batch 3.
        (
            PlusOne(),
            _batch_file("Add", np.ones((2, 1))),
            "Backend 'onnxruntime' failed to run the ONNX model on trial 2 at batch=3",
        ),
        # The batch size baked as the constant 2: ORT runs, and disagrees with PyTorch.
        (TimesBatch(), _batch_file("Mul", np.array(2.0)), "outputs mismatch PyTorch: output=y"),
    ],
    ids=["ort-fails", "ort-disagrees"],
)
def test_onnx_runtime_failing_or_disagreeing_at_a_new_size_fails(
    model: torch.nn.Module, onnx_file: onnx.ModelProto, why: str
) -> None:
    x = torch.randn(2, 4)
    assert verify(model, (x,), onnx_file, shapes=()).passed  # fine at the export shape
    with pytest.raises(VerificationError) as info:
        verify(model, (x,), onnx_file)
    report = info.value.report
    assert [dict(r.sizes)["batch"] for r in report.failed_trials()] == [1, 3, 4]
    (at_three,) = [r for r in report.shapes_tried if dict(r.sizes)["batch"] == 3]
    assert why in at_three.reason and at_three.input_shapes == (("x", (3, 4)),)
    assert "trial 2 (shape) batch=3: x[3, 4] -> FAILED" in str(info.value)


# ----------------------------------------------------------------------------- explicit shapes=


def test_explicit_shapes_by_dim_name_or_full_input_shape() -> None:
    report = verify(
        Scaled(), _scaled_args(), _scaled_file(), shapes=[{"batch": 5}, {"x": (7, 4), "n": 2}, {}]
    )
    assert report.passed
    assert [dict(r.input_shapes) for r in _shape_trials(report)] == [
        {"x": (5, 4), "y": (5, 5)},
        {"x": (7, 4), "y": (7, 2)},
        {"x": (2, 4), "y": (2, 5)},
    ]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_dynamic_shapes_ranges_and_dim_names_reach_the_trials(exporter: str) -> None:
    dynamic = {"x": {0: Dim("batch", min=2, max=6)}, "y": {0: Dim("batch", min=2, max=6)}}
    args = (torch.randn(3, 5), torch.randn(3, 4))
    proto = onnx_custom.export(SharedBatch(), args, exporter=exporter, dynamic_shapes=dynamic)
    report = verify(SharedBatch(), args, proto, dynamic_shapes=dynamic)
    batches = [
        s[0]
        for r in _shape_trials(report)
        for n, s in r.input_shapes
        if n == proto.graph.input[0].name
    ]
    assert report.passed and batches == [4, 6, 5]  # e + 1, 2e, e + 2 within [2, 6]
    # The Dim's name works in shapes= whatever the exporter called the dim in the file.
    named = verify(SharedBatch(), args, proto, dynamic_shapes=dynamic, shapes=[{"batch": 2}])
    assert [dict(r.input_shapes)[proto.graph.input[1].name] for r in _shape_trials(named)] == [
        (2, 4)
    ]


BAD_SHAPES = [
    (
        {"nope": 3},
        [
            "shapes[0]: unknown name 'nope'",
            "dynamic dims of the file: batch (x[0], y[0]",
            "inputs: ['x', 'y']",
        ],
    ),
    (
        {"batch": 9},
        [
            "batch",
            "9",
            "outside the range [1, 8] (from metadata onnx_custom.dynamic_dims)",
            "x[0], y[0]",
            "Fix: pick a size inside the range",
        ],
    ),
    ({"x": (3, 5)}, ["input 'x' axis 1 is static (4) in the file, got 5", "Fix: keep 4 there"]),
    ({"x.shape[1]": 5}, ["'x.shape[1]' is static (4) in the file", "Fix: leave it out"]),
    ({"x": (3,)}, ["input 'x' has rank 2 in the file, got shape [3]", "Fix: give 2 sizes"]),
    ({"batch": -1}, ["dim 'batch' must be a non-negative int, got -1"]),
    ({"batch": 2.5}, ["dim 'batch' must be a non-negative int, got 2.5"]),
    (
        {"batch": 3, "x": (4, 4)},
        ["dim 'batch' (x[0], y[0]) gets both 3 and 4", "Fix: give it one size"],
    ),
]


@pytest.mark.parametrize(("case", "expected"), BAD_SHAPES, ids=[str(c) for c, _ in BAD_SHAPES])
def test_bad_shapes_are_typed_errors_naming_input_dim_and_fix(
    case: dict[str, Any], expected: list[str]
) -> None:
    proto = _scaled_file({"batch": {"min": 1, "max": 8}})
    with pytest.raises(ShapeSpecError) as info:
        verify(Scaled(), _scaled_args(), proto, shapes=[case])
    assert isinstance(info.value, VerificationError) and isinstance(info.value, OnnxCustomError)
    for text in expected:
        assert text in str(info.value)


BAD_DYNAMIC = [
    ("not-a-list", None, ["shapes= expects a list of dicts", "Fix: wrap a single case in a list"]),
    (
        "unknown-param",
        {"z": {0: Dim("b")}},
        [
            "dynamic_shapes names ['z'] but forward's parameters are ['x', 'y']",
            "Fix: key dynamic_shapes",
        ],
    ),
    (
        "range-excludes-example",
        {"x": {0: Dim("batch", min=3, max=8)}},
        [
            (
                "'batch' (x[0], y[0]) has the export size 2, outside its range [3, 8] (from"
                " dynamic_shapes)"
            ),
            "Fix",
        ],
    ),
    (
        "bad-axis",
        ({5: Dim("b")}, None),
        ["dynamic_shapes[x]: axis 5 does not exist in a rank-2 tensor", "Fix: use axes 0..1"],
    ),
    ("bad-entry", ({0: 3.5}, None), ["expected a torch.export.Dim", "got 3.5"]),
]


@pytest.mark.parametrize(
    ("case", "dynamic", "expected"), BAD_DYNAMIC, ids=[c for c, _, _ in BAD_DYNAMIC]
)
def test_bad_dynamic_shapes_are_typed_errors(case: str, dynamic: Any, expected: list[str]) -> None:
    options: dict[str, Any] = (
        {"shapes": {"batch": 3}} if case == "not-a-list" else {"dynamic_shapes": dynamic}
    )
    with pytest.raises(ShapeSpecError) as info:
        verify(Scaled(), _scaled_args(), _scaled_file(), **options)
    for text in expected:
        assert text in str(info.value)


# ----------------------------------------------------------------------------- inputs at new shapes


def test_inputs_at_new_shapes_floats_redrawn_ints_kept_or_drawn_in_range() -> None:
    nodes = [
        helper.make_node("Identity", [name], [f"{name}_out"])
        for name in ("x", "idx", "table", "mask")
    ]
    inputs = [
        _float("x", ["n", 3]),
        helper.make_tensor_value_info("idx", TensorProto.INT64, ["n"]),
        helper.make_tensor_value_info("table", TensorProto.INT64, [5]),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, [3]),
    ]
    outputs = [
        helper.make_tensor_value_info(
            f"{i.name}_out",
            i.type.tensor_type.elem_type,
            [None] * len(i.type.tensor_type.shape.dim),
        )
        for i in inputs
    ]
    proto = _file(nodes, inputs, outputs)
    args = (
        torch.randn(4, 3),
        torch.tensor([3, 7, 5, 3]),
        torch.tensor([9, 8, 7, 6, 5]),
        torch.tensor([True, False, True]),
    )
    plan = plan_dims(proto, bind_inputs(proto, args), args)
    assert default_cases(plan) == [{"n": 1}, {"n": 5}, {"n": 8}]
    x, idx, table, mask = resize_inputs(args, {"n": 64}, plan, torch.Generator().manual_seed(0))
    assert (
        x.shape == (64, 3) and abs(float(x.mean())) < 0.5 and 0.6 < float(x.std()) < 1.4
    )  # N(0, 1)
    assert (
        idx.shape == (64,)
        and idx.dtype == torch.int64
        and int(idx.min()) >= 3
        and int(idx.max()) <= 7
    )
    assert len(set(idx.tolist())) > 2  # drawn, not copied
    assert torch.equal(table, args[2]) and torch.equal(mask, args[3])  # shapes unchanged: kept


def test_input_generator_overrides_inputs_at_new_shapes_too() -> None:
    seen: list[tuple[int, tuple[int, ...]]] = []

    def generator(trial: int, example: tuple[Any, ...]) -> tuple[Any, ...]:
        seen.append((trial, tuple(example[0].shape)))
        return tuple(torch.ones_like(t) for t in example)

    report = verify(Scaled(), _scaled_args(), _scaled_file(), trials=2, input_generator=generator)
    assert report.passed and seen == [(1, (2, 4)), (2, (1, 4)), (3, (3, 4)), (4, (4, 4))]
    assert all(c.max_abs_diff == 0 for c in report.comparisons if c.trial > 0)  # all ones: exact


def test_progress_names_the_shape_of_each_trial() -> None:
    lines: list[str] = []
    verify(Scaled(), _scaled_args(), _scaled_file(), progress=lines.append)
    assert lines == [
        "verify: trial 1/4",
        "verify: trial 2/4 (batch=1, n=1)",
        "verify: trial 3/4 (batch=3, n=6)",
        "verify: trial 4/4 (batch=4, n=10)",
    ]


def test_report_lists_shapes_in_dict_and_markdown(tmp_path: Any) -> None:
    from onnx_custom.verification.report import render_markdown, report_to_dict

    report = verify(NeedsBatchTwo(), _scaled_args(), _scaled_file())
    data = report_to_dict(report)
    assert [r["status"] for r in data["shapes_tried"]] == ["passed", "skipped", "passed", "passed"]
    assert data["shapes_tried"][1]["sizes"] == {"batch": 1, "n": 1} and data["shapes_tried"][1][
        "input_shapes"
    ]["x"] == [1, 4]
    assert data["type_mismatches"] == [] and data["pruned_inputs"] == []
    text = render_markdown(report)
    assert "## Shapes tried" in text and "the model cannot take batch=1" in text


def test_cli_verify_lists_the_shapes_tried(tmp_path: Any, capsys: Any) -> None:
    from onnx_custom.cli import main
    from onnx_custom.models import multi_out3

    path = tmp_path / "m3.onnx"
    onnx_custom.export(
        multi_out3.Model().eval(),
        multi_out3.example_inputs(),
        path,
        exporter="dynamo",
        dynamic_shapes=multi_out3.dynamic_shapes,
    )
    assert main(["verify", "multi_out3", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "Verification PASSED" in out
        and "Shapes tried:" in out
        and out.count("(shape)") == DEFAULT_SHAPE_TRIALS
    )
