"""``export(..., fuse=...)`` on pure-PyTorch BEV pooling with BEVDet's ``bev_pool_v2``
signature: one ``onnx_custom::BEVPoolV2`` node when the numeric check passes, the code as
written (reported) when it fails; the file verified against the unfused model."""

from __future__ import annotations

import sys
import types

import bev_cases
import pytest
import torch
from bev_cases import BEVModel, rig
from fusion_cases import my_msda, op_counts

import onnx_custom
from onnx_custom.fusion import fusion_report, register_fusion, unregister_fusion
from onnx_custom.fusion.bev_pool import BEV_POOL_OP, has_bev_pool_signature

EXPORTERS = ["dynamo", "torchscript"]
CUSTOM = onnx_custom.default_registry().with_variants("custom")
NODE = "BEVPoolV2"
IMPLEMENTATIONS = {"scatter": bev_cases.scatter_bev_pool, "cumsum": bev_cases.cumsum_bev_pool}
# the ranks and intervals vary with the camera rig: their lengths are the file's dynamic dims
DYNAMIC = (None, None, {0: "points"}, {0: "points"}, {0: "points"}, {0: "cells"}, {0: "cells"})


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_user_function_is_fused_into_one_node(exporter: str, impl: str) -> None:
    model = BEVModel(impl).eval()
    args = rig()
    fn = IMPLEMENTATIONS[impl]
    proto = onnx_custom.export(model, args, exporter=exporter, registry=CUSTOM, fuse=[fn])
    counts = op_counts(proto)
    assert counts.get(NODE) == 1, counts
    assert not {"ScatterElements", "ScatterND", "CumSum"} & set(counts), counts
    report = fusion_report(proto)
    assert report is not None and [s.name for s in report.fused] == [f"bev_cases.{fn.__name__}"]
    (site,) = report.fused
    assert site.op == BEV_POOL_OP and site.calls == 1 and site.max_abs_diff is not None
    assert getattr(bev_cases, fn.__name__) is fn  # the module global is back
    onnx_custom.verify(model, args, proto)  # against the unfused model


def test_default_registry_writes_the_standard_form() -> None:
    """The default translation of the fused op: standard ops (one ScatterND), no custom node."""
    model = BEVModel().eval()
    args = rig()
    proto = onnx_custom.export(model, args, exporter="dynamo", fuse=[bev_cases.scatter_bev_pool])
    counts = op_counts(proto)
    assert NODE not in counts and counts.get("ScatterND") == 1, counts
    assert len(fusion_report(proto).fused) == 1  # type: ignore[union-attr]
    onnx_custom.verify(model, args, proto)


def test_unfused_export_keeps_the_users_code() -> None:
    model = BEVModel().eval()
    proto = onnx_custom.export(model, rig(), exporter="dynamo", registry=CUSTOM)
    assert NODE not in op_counts(proto) and fusion_report(proto) is None


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_fused_file_verifies_at_another_number_of_points(exporter: str) -> None:
    model = BEVModel().eval()
    args = rig()
    other = rig(depth_range=(3.0, 25.0), seed=1)
    assert other[2].shape != args[2].shape and other[5].shape != args[5].shape
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        registry=CUSTOM,
        fuse=[bev_cases.scatter_bev_pool],
        dynamic_shapes=DYNAMIC,
    )
    assert op_counts(proto).get(NODE) == 1
    ranks = proto.graph.input[2].type.tensor_type.shape.dim[0]
    assert ranks.dim_param and not ranks.dim_value, ranks  # the points stay dynamic
    for inputs in (args, other):
        report = onnx_custom.verify(model, inputs, proto, shapes=())
        assert report.passed


@pytest.mark.parametrize(
    ("impl", "reason"),
    [("mean", "numeric check failed"), ("channels_last", "the original's (1, 1, 10, 12, 5)")],
    ids=["mean-per-cell", "channels-last-output"],
)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_mismatching_implementation_is_reported_not_fused(
    exporter: str, impl: str, reason: str
) -> None:
    fn = getattr(bev_cases, f"{impl}_bev_pool")
    model = BEVModel(impl).eval()
    args = rig()
    proto = onnx_custom.export(model, args, exporter=exporter, registry=CUSTOM, fuse=[fn])
    assert NODE not in op_counts(proto)
    report = fusion_report(proto)
    assert report is not None and not report.fused
    (site,) = report.not_fused
    assert site.name == f"bev_cases.{fn.__name__}" and reason in site.reason, site.reason
    onnx_custom.verify(model, args, proto)  # the file computes the code as written


def test_registered_function_is_fused_with_fuse_true() -> None:
    model = BEVModel().eval()
    args = rig()
    register_fusion(bev_cases.scatter_bev_pool)
    try:
        proto = onnx_custom.export(model, args, exporter="dynamo", registry=CUSTOM, fuse=True)
    finally:
        unregister_fusion(bev_cases.scatter_bev_pool)
    assert op_counts(proto).get(NODE) == 1
    assert len(fusion_report(proto).fused) == 1  # type: ignore[union-attr]
    proto = onnx_custom.export(model, args, exporter="dynamo", registry=CUSTOM, fuse=True)
    assert NODE not in op_counts(proto)  # unregistered: not recognised any more


def test_bevdet_function_is_recognised_by_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """BEVDet's ``mmdet3d.ops.bev_pool_v2.bev_pool.bev_pool_v2`` (a stand-in module under its
    name; BEVDet is not installed here) is fused with ``fuse=True``; a same-named function
    defined elsewhere is not recognised."""
    module = types.ModuleType("mmdet3d.ops.bev_pool_v2.bev_pool")
    scatter = bev_cases.scatter_bev_pool

    def bev_pool_v2(*args: torch.Tensor) -> torch.Tensor:
        return scatter(*args)  # type: ignore[arg-type]

    bev_pool_v2.__module__ = module.__name__
    bev_pool_v2.__qualname__ = "bev_pool_v2"
    module.bev_pool_v2 = bev_pool_v2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(bev_cases, "scatter_bev_pool", bev_pool_v2)
    args = rig()
    model = BEVModel().eval()
    proto = onnx_custom.export(model, args, exporter="torchscript", registry=CUSTOM, fuse=True)
    assert op_counts(proto).get(NODE) == 1
    (site,) = fusion_report(proto).fused  # type: ignore[union-attr]
    assert site.implementation == "mmdet3d.ops.bev_pool_v2.bev_pool.bev_pool_v2"
    onnx_custom.verify(model, args, proto)

    monkeypatch.delitem(sys.modules, module.__name__)  # same name, not BEVDet's object
    proto = onnx_custom.export(model, args, exporter="torchscript", registry=CUSTOM, fuse=True)
    assert NODE not in op_counts(proto)


def test_signature_picks_the_replacement() -> None:
    def renamed(d, f, rd, rf, rb, shape, starts, lengths):  # type: ignore[no-untyped-def]
        return d

    assert has_bev_pool_signature(bev_cases.scatter_bev_pool) and has_bev_pool_signature(renamed)
    assert not has_bev_pool_signature(my_msda)
