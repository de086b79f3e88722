"""Example models of the seed-article ops: every ZOO row exports and verifies in ONNX Runtime, and
custom nodes keep their outputs and attributes under both exporters."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.errors import ExtensionBuildError
from onnx_custom.ops.bev_pool import bev_pool_v2, prepare_bev_ranks, synthetic_frustum
from onnx_custom.ort_kernels.bev_pool import bev_pool_v2 as bev_kernel
from onnx_custom.zoo import ZooCase, run_case

MODELS = ("my_add_ext", "autograd_fn", "numpy_sin", "multi_out3", "custom_linear", "bev_pool")


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"onnx_custom.models.{name}")
    except ExtensionBuildError as exc:
        pytest.skip(f"C++ extension unavailable: {exc}")


def _zoo_rows() -> list[Any]:
    rows = []
    for name in MODELS:
        try:  # the extension models build (once, cached) and load onnx_custom_ext on import
            cases = importlib.import_module(f"onnx_custom.models.{name}").ZOO
        except ExtensionBuildError as exc:
            rows.append(pytest.param(name, None, id=name, marks=pytest.mark.skip(reason=str(exc))))
            continue
        rows += [
            pytest.param(
                name,
                case,
                id=f"{name}-{case.label}",
                marks=pytest.mark.skip(reason=case.skip) if case.skip else (),
            )
            for case in cases
        ]
    return rows


@pytest.mark.parametrize(("name", "case"), _zoo_rows())
def test_zoo_row_exports_and_verifies(name: str, case: ZooCase) -> None:
    result = run_case(name, _import(name), case)
    assert result.status == "pass", result.detail


def _export(
    name: str, exporter: str, opset: int, variant: str | None = None
) -> tuple[ModuleType, onnx.ModelProto]:
    module = _import(name)
    registry = onnx_custom.default_registry()
    if variant:
        registry = registry.with_variants(variant)
    proto = onnx_custom.export(
        module.Model().eval(),
        module.example_inputs(),
        exporter=exporter,
        opset=opset,
        registry=registry,
    )
    return module, proto


def _node(proto: onnx.ModelProto, domain: str, op_type: str) -> onnx.NodeProto:
    nodes = [n for n in proto.graph.node if n.domain == domain and n.op_type == op_type]
    assert len(nodes) == 1, [f"{n.domain}::{n.op_type}" for n in proto.graph.node]
    return nodes[0]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize(
    "exporter,opset", [("torchscript", 17), ("dynamo", 18)], ids=["torchscript-17", "dynamo-18"]
)
def test_multi_out3_custom_node_keeps_outputs_and_attributes(exporter: str, opset: int) -> None:
    module, proto = _export("multi_out3", exporter, opset, "custom")
    node = _node(proto, "onnx_custom", "MultiOut3")
    assert len(node.output) == 3
    attrs = _attrs(node)
    assert list(attrs["repeats"]) == list(module.REPEATS)
    assert attrs["scale"] == pytest.approx(module.SCALE)
    assert {d.domain for d in proto.opset_import} >= {"", "onnx_custom"}
    x = module.example_inputs()[0]
    shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in proto.graph.output]
    assert shapes == [list(x.shape), [4, 3, 12], list(x.shape[:-1])]


@pytest.mark.parametrize(
    "exporter,opset", [("torchscript", 17), ("dynamo", 18)], ids=["torchscript-17", "dynamo-18"]
)
def test_custom_linear_npu_node_with_and_without_bias(exporter: str, opset: int) -> None:
    _, proto = _export("custom_linear", exporter, opset, "custom")
    nodes = [n for n in proto.graph.node if n.domain == "onnx_custom"]
    assert [n.op_type for n in nodes] == ["CustomLinear", "CustomLinear"]
    assert [len([i for i in n.input if i]) for n in nodes] == [3, 2]  # the second has no bias


@pytest.mark.parametrize(
    "exporter,opset", [("torchscript", 17), ("dynamo", 18)], ids=["torchscript-17", "dynamo-18"]
)
def test_bev_pool_both_translations_match_eager_on_a_realistic_rig(
    exporter: str, opset: int
) -> None:
    """6 cameras x 59 depth bins x 16x44 features -> 128x128 BEV, against the eager op."""
    module = _import("bev_pool")
    model = module.Model().eval()
    args = module.example_inputs()
    expected = model(*args)
    assert expected.shape == (1, module.CHANNELS, 1, 128, 128)
    assert int(model.ranks_bev.numel()) > 200_000
    for variant, marker in ((None, "ScatterND"), ("custom", "BEVPoolV2")):
        registry = onnx_custom.default_registry()
        if variant:
            registry = registry.with_variants(variant)
        proto = onnx_custom.export(model, args, exporter=exporter, opset=opset, registry=registry)
        assert marker in {n.op_type for n in proto.graph.node}
        if variant:
            assert (
                list(_attrs(_node(proto, "onnx_custom", "BEVPoolV2"))["bev_feat_shape"])
                == module.BEV_SHAPE
            )
        session = onnx_custom.InferenceSession(proto)
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
        (actual,) = session.run(None, feeds)
        torch.testing.assert_close(torch.from_numpy(np.asarray(actual)), expected)


def test_bev_pool_decomposition_needs_opset_16() -> None:
    module = _import("bev_pool")
    with pytest.raises(onnx_custom.UnsupportedOpError, match="opset"):
        onnx_custom.export(module.Model(), module.example_inputs(), exporter="dynamo", opset=15)


def test_bev_kernel_honours_intervals_like_the_eager_op() -> None:
    """The NumPy kernel (prefix sums per interval) and the eager op (index_add_) are different
    algorithms; they must agree, also when some points lie outside every interval."""
    coor = synthetic_frustum(cameras=2, depth_bins=6, feat_hw=(4, 8), depth_range=(1.0, 20.0))
    rb, rd, rf, st, ln = prepare_bev_ranks(coor, (-25.6, -25.6, -5.0), (1.6, 1.6, 8.0), (32, 32, 1))
    g = torch.Generator().manual_seed(0)
    depth, feat = torch.rand(1, 2, 6, 4, 8, generator=g), torch.randn(1, 2, 4, 8, 3, generator=g)
    shape = [1, 1, 32, 32, 3]
    for keep in (torch.arange(st.numel()), torch.arange(0, st.numel(), 3)):
        expected = bev_pool_v2(depth, feat, rd, rf, rb, shape, st[keep], ln[keep])
        actual = bev_kernel(
            depth.numpy(),
            feat.numpy(),
            rd.numpy(),
            rf.numpy(),
            rb.numpy(),
            st[keep].numpy(),
            ln[keep].numpy(),
            bev_feat_shape=shape,
        )
        torch.testing.assert_close(torch.from_numpy(actual), expected)
