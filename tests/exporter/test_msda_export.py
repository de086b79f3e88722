"""multi_scale_deformable_attn through both exporters, every variant: the custom node (Python and
native kernels, function body in plain ORT), the standard ops (GridSample per level from opset 16,
gathers below), mmdeploy's node with its exact signature. Dynamic batch and queries, level tensors
as graph inputs or constants, results at sizes other than the export's against the independent
grid_sample reference; bad shapes fail at export with eager's message."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _msda_reference import grid_sample_msda, make_inputs
from onnx import helper

import onnx_custom
from onnx_custom.errors import MultiScaleDeformableAttnDtypeError, MultiScaleDeformableAttnError
from onnx_custom.ops import multi_scale_deformable_attn
from onnx_custom.ops.msda import load_extension


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


class LevelsAsInputs(torch.nn.Module):
    """mmcv's call, every tensor a graph input (as mmdeploy's rewritten models have it)."""

    def forward(
        self,
        value: torch.Tensor,
        spatial_shapes: torch.Tensor,
        level_start_index: torch.Tensor,
        sampling_locations: torch.Tensor,
        attention_weights: torch.Tensor,
    ) -> torch.Tensor:
        return multi_scale_deformable_attn(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights, 32
        )


class ConstantLevels(torch.nn.Module):
    """Level tensors fixed in the model (buffers): constants in the file."""

    spatial_shapes: torch.Tensor
    level_start_index: torch.Tensor

    def __init__(self, shapes: torch.Tensor, starts: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("spatial_shapes", shapes, persistent=False)
        self.register_buffer("level_start_index", starts, persistent=False)

    def forward(
        self, value: torch.Tensor, sampling_locations: torch.Tensor, attention_weights: torch.Tensor
    ) -> torch.Tensor:
        return multi_scale_deformable_attn(
            value,
            self.spatial_shapes,
            self.level_start_index,
            sampling_locations,
            attention_weights,
        )


BATCH_QUERIES = {
    "value": {0: "batch"},
    "sampling_locations": {0: "batch", 1: "queries"},
    "attention_weights": {0: "batch", 1: "queries"},
}


def _dynamic(levels_as_inputs: bool) -> dict[str, Any]:
    return (
        {**BATCH_QUERIES, "spatial_shapes": None, "level_start_index": None}
        if levels_as_inputs
        else BATCH_QUERIES
    )


def _model_and_args(
    levels_as_inputs: bool, bs: int = 2, queries: int = 5, seed: int = 0
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    inputs = make_inputs(bs, queries, 2, 4, 2, seed=seed)
    value, shapes, starts, loc, attn = inputs
    if levels_as_inputs:
        return LevelsAsInputs(), inputs, inputs
    return ConstantLevels(shapes, starts), (value, loc, attn), inputs


def _run(proto: onnx.ModelProto, args: tuple[torch.Tensor, ...], **kwargs: Any) -> np.ndarray:
    sess = (
        onnx_custom.InferenceSession(proto, **kwargs) if kwargs.get("kernels") != "none" else None
    )
    if sess is None:  # plain ONNX Runtime: nothing registered
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    feeds = {n: a.numpy() for n, a in zip(names, args, strict=True)}
    return sess.run(None, feeds)[0]


def _node_types(proto: onnx.ModelProto) -> set[tuple[str, str]]:
    return {(n.domain, n.op_type) for n in proto.graph.node}


VARIANTS = [  # (variant, opset for torchscript, opset for dynamo, the node that must appear)
    (None, 17, 18, ("onnx_custom", "MultiScaleDeformableAttn")),
    ("mmdeploy", 17, 18, ("mmdeploy", "MMCVMultiScaleDeformableAttention")),
    ("standard", 11, 11, ("", "Gather")),
    ("standard", 16, 18, ("", "GridSample")),
    ("gather", 17, 18, ("", "Gather")),
]


@pytest.mark.parametrize(
    "levels_as_inputs", [True, False], ids=["levels-inputs", "levels-constant"]
)
@pytest.mark.parametrize(
    ("variant", "ts_opset", "dynamo_opset", "node"),
    VARIANTS,
    ids=[f"{v or 'custom'}-{o}" for v, o, _, _ in VARIANTS],
)
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_export_verify_and_run_at_other_sizes(
    exporter: str,
    variant: str | None,
    ts_opset: int,
    dynamo_opset: int,
    node: tuple[str, str],
    levels_as_inputs: bool,
) -> None:
    model, args, _ = _model_and_args(levels_as_inputs)
    registry = onnx_custom.default_registry().with_variants(variant) if variant else None
    opset = ts_opset if exporter == "torchscript" else dynamo_opset
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        opset=opset,
        registry=registry,
        dynamic_shapes=_dynamic(levels_as_inputs),
    )
    types = _node_types(proto)
    assert node in types
    if variant in ("standard", "gather"):
        assert all(domain == "" for domain, _ in types), types
        assert (("", "GridSample") in types) == (variant == "standard" and opset >= 16)
    # verify: the export size plus other batch/query sizes the file claims
    assert onnx_custom.verify(model, args, proto, trials=2).passed
    # and at a size chosen here, against the independent reference
    _, other_args, (value, shapes, _, loc, attn) = _model_and_args(
        levels_as_inputs, bs=3, queries=9, seed=5
    )
    expected = grid_sample_msda(value, shapes, loc, attn).numpy()
    runs = (
        {"python": {}}
        if variant in ("standard", "gather")
        else {"python": {}, "native": {"kernels": "native"}}
    )
    for name, kwargs in runs.items():
        np.testing.assert_allclose(
            _run(proto, other_args, **kwargs), expected, rtol=1e-5, atol=1e-5, err_msg=name
        )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_function_body_runs_in_plain_onnxruntime(exporter: str) -> None:
    model, args, _ = _model_and_args(True)
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        dynamic_shapes=_dynamic(True),
        functions=True,
    )
    assert ("onnx_custom", "MultiScaleDeformableAttn") in _node_types(proto)
    assert any(f.name == "MultiScaleDeformableAttn" for f in proto.functions)
    _, other_args, (value, shapes, _, loc, attn) = _model_and_args(True, bs=1, queries=11, seed=6)
    got = _run(proto, other_args, kernels="none")
    np.testing.assert_allclose(
        got, grid_sample_msda(value, shapes, loc, attn).numpy(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_mmdeploy_node_has_mmdeploys_exact_signature(exporter: str) -> None:
    """mmdeploy's symbolic: g.op('mmdeploy::MMCVMultiScaleDeformableAttention', value,
    value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
    im2col_step_i=im2col_step): five inputs in that order, one INT attribute, one output."""
    model, args, _ = _model_and_args(True)
    registry = onnx_custom.default_registry().with_variants("mmdeploy")
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        registry=registry,
    )
    (node,) = [n for n in proto.graph.node if n.domain == "mmdeploy"]
    assert node.op_type == "MMCVMultiScaleDeformableAttention"
    assert list(node.input) == [i.name for i in proto.graph.input]  # the op's inputs, mmcv's order
    assert [i.name for i in proto.graph.input] == [
        "value",
        "spatial_shapes",
        "level_start_index",
        "sampling_locations",
        "attention_weights",
    ]
    assert [(a.name, a.type) for a in node.attribute] == [("im2col_step", onnx.AttributeProto.INT)]
    assert helper.get_attribute_value(node.attribute[0]) == 32
    # one output, the graph's (dynamo files name outputs through an Identity: exporter.output_names)
    producers = {o: n for n in proto.graph.node for o in n.output}
    final = producers.get(proto.graph.output[0].name)
    reaches = final is node or (
        final is not None and final.op_type == "Identity" and list(final.input) == list(node.output)
    )
    assert len(node.output) == 1 and reaches
    assert {o.domain: o.version for o in proto.opset_import}.get("mmdeploy") == 1


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_bad_shapes_fail_at_export_with_eagers_message(exporter: str) -> None:
    value, shapes, starts, loc, attn = make_inputs()

    class WrongHeads(torch.nn.Module):
        def forward(
            self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor
        ) -> torch.Tensor:
            return torch.ops.onnx_custom.multi_scale_deformable_attn(
                value, shapes, starts, loc[:, :, :1], attn[:, :, :1], 64
            )

    with pytest.raises(MultiScaleDeformableAttnError, match="num_heads=2"):
        onnx_custom.export(
            WrongHeads(),
            (value, loc, attn),
            exporter=exporter,
            opset=17 if exporter == "torchscript" else 18,
        )


@pytest.mark.parametrize("name", ["spatial_shapes", "level_start_index"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_int32_level_tensors_fail_at_export_with_the_fix(exporter: str, name: str) -> None:
    """int32 level tensors (as TensorRT-minded code makes them) are refused at export with the
    op's typed error naming the fix, before a file ONNX Runtime would reject exists."""
    inputs = list(make_inputs())
    index = 1 if name == "spatial_shapes" else 2
    inputs[index] = inputs[index].int()
    with pytest.raises(
        MultiScaleDeformableAttnDtypeError,
        match=rf"{name} has dtype torch.int32; expected int64. Fix: {name}.long\(\)",
    ):
        onnx_custom.export(
            LevelsAsInputs(),
            tuple(inputs),
            exporter=exporter,
            opset=17 if exporter == "torchscript" else 18,
        )


def test_half_types_through_the_standard_variant() -> None:
    """float16 files: the standard ops compute in float32 inside and cast back."""
    model, args, _ = _model_and_args(True)
    half = tuple(a.half() if a.is_floating_point() else a for a in args)
    for opset in (11, 16):
        proto = onnx_custom.export(
            model,
            half,
            exporter="torchscript",
            opset=opset,
            registry=onnx_custom.default_registry().with_variants("standard"),
        )
        assert onnx_custom.verify(model, half, proto, shapes=()).passed
