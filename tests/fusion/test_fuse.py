"""``export(..., fuse=...)`` on functions with mmcv's signature: fused when the numeric check
passes, reported (and left alone) when it fails, everything restored after the export."""

from __future__ import annotations

import sys
import threading

import fusion_cases
import onnx
import pytest
import torch
from fusion_cases import FunctionModel, inputs, my_msda, op_counts, shifted_msda

import onnx_custom
from onnx_custom.fusion import fusing, fusion_report, register_fusion, unregister_fusion

EXPORTERS = ["dynamo", "torchscript"]
CUSTOM = onnx_custom.default_registry().with_variants("custom")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_function_copy_is_fused_into_one_node(exporter: str) -> None:
    model = FunctionModel().eval()
    args = inputs()
    proto = onnx_custom.export(model, args, exporter=exporter, registry=CUSTOM, fuse=[my_msda])
    counts = op_counts(proto)
    assert counts.get("MultiScaleDeformableAttn") == 1
    assert "GridSample" not in counts
    report = fusion_report(proto)
    assert report is not None and [s.name for s in report.fused] == ["fusion_cases.my_msda"], report
    assert not hasattr(fusion_cases.my_msda, "__wrapped__")  # the module global is back
    onnx_custom.verify(model, args, proto)  # against the unfused model


@pytest.mark.parametrize(
    ("variant", "expected"),
    [(None, "MultiScaleDeformableAttn"), ("standard", "GridSample")],
    ids=["default-registry", "standard-variant"],
)
def test_other_variants_use_our_translation(variant: str | None, expected: str) -> None:
    """The default registry writes our node too; the standard variant our GridSample form."""
    model = FunctionModel().eval()
    args = inputs()
    registry = onnx_custom.default_registry().with_variants(variant) if variant else None
    proto = onnx_custom.export(model, args, exporter="dynamo", registry=registry, fuse=[my_msda])
    counts = op_counts(proto)
    if expected == "GridSample":
        assert "MultiScaleDeformableAttn" not in counts
        assert counts.get("GridSample") == len(fusion_cases.LEVELS)  # ours: one per level
    else:
        assert counts.get(expected) == 1 and "GridSample" not in counts
    assert len(fusion_report(proto).fused) == 1  # type: ignore[union-attr]
    onnx_custom.verify(model, args, proto)


def test_fused_file_verifies_at_other_sizes() -> None:
    model = FunctionModel().eval()
    args = inputs(batch=2, queries=5)
    proto = onnx_custom.export(
        model,
        args,
        exporter="dynamo",
        registry=CUSTOM,
        fuse=[my_msda],
        dynamic_shapes=({0: "batch"}, {0: "batch", 1: "queries"}, {0: "batch", 1: "queries"}),
    )
    assert op_counts(proto).get("MultiScaleDeformableAttn") == 1
    report = onnx_custom.verify(
        model, args, proto, fuse=[my_msda], shapes=[{"batch": 1, "queries": 9}, {"batch": 3}]
    )
    assert report.passed and report.fusion is not None and len(report.fusion.fused) == 1
    assert len(report.shapes_tried) == 3


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_failing_numeric_check_is_not_fused_and_reported(exporter: str) -> None:
    model = FunctionModel(shifted=True).eval()
    args = inputs()
    proto = onnx_custom.export(
        model, args, exporter=exporter, registry=CUSTOM, fuse=[shifted_msda], verify=True
    )
    counts = op_counts(proto)
    assert "MultiScaleDeformableAttn" not in counts and counts.get("GridSample") == 2
    report = fusion_report(proto)
    assert report is not None and not report.fused
    (site,) = report.not_fused
    assert site.name == "fusion_cases.shifted_msda" and "numeric check failed" in site.reason
    assert site.max_abs_diff is not None and site.max_abs_diff > 1e-3
    assert "not fused: fusion_cases.shifted_msda" in str(report)


def test_without_fuse_nothing_changes() -> None:
    model = FunctionModel().eval()
    proto = onnx_custom.export(model, inputs(), exporter="dynamo", registry=CUSTOM)
    assert "MultiScaleDeformableAttn" not in op_counts(proto)
    assert fusion_report(proto) is None


def test_registered_function_is_fused_with_fuse_true() -> None:
    register_fusion(my_msda)
    try:
        proto = onnx_custom.export(
            FunctionModel().eval(), inputs(), exporter="torchscript", registry=CUSTOM, fuse=True
        )
    finally:
        unregister_fusion(my_msda)
    assert op_counts(proto).get("MultiScaleDeformableAttn") == 1


def test_own_replacement_pair() -> None:
    calls = []

    def replacement(*args: object) -> torch.Tensor:
        calls.append(1)
        return fusion_cases.my_msda(*args)  # type: ignore[arg-type]  # patched: runs the original

    with fusing(FunctionModel().eval(), inputs(), [(my_msda, replacement)]) as report:
        assert report is not None and len(report.fused) == 1
        assert hasattr(fusion_cases.my_msda, "__wrapped__")  # rebound for the block
    assert not hasattr(fusion_cases.my_msda, "__wrapped__") and calls


def test_patch_restored_after_failing_export() -> None:
    class Failing(FunctionModel):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls > 1:  # the probe passes, the export's trace fails
                raise RuntimeError("boom during export")
            return super().forward(*args)

    with pytest.raises(RuntimeError, match="boom"):
        onnx_custom.export(Failing().eval(), inputs(), exporter="torchscript", fuse=[my_msda])
    assert not hasattr(fusion_cases.my_msda, "__wrapped__")


def test_fusion_holds_the_export_lock() -> None:
    """A second thread's export waits until the patched block ends."""
    entered = threading.Event()
    seen: list[bool] = []

    def other() -> None:
        entered.wait()
        from onnx_custom.exporter.pipeline import EXPORT_LOCK

        with EXPORT_LOCK:
            seen.append(hasattr(fusion_cases.my_msda, "__wrapped__"))

    thread = threading.Thread(target=other)
    thread.start()
    with fusing(FunctionModel().eval(), inputs(), [my_msda]):
        entered.set()
        thread.join(timeout=0.5)
        assert thread.is_alive()  # blocked on the lock
    thread.join()
    assert seen == [False]


@pytest.mark.parametrize(
    ("fuse", "match"),
    [("yes", "fuse must be True"), ([42], "expected a Python function"), ([(my_msda,)], "pair")],
    ids=["string", "not-callable", "short-pair"],
)
def test_bad_fuse_argument(fuse: object, match: str) -> None:
    with pytest.raises(onnx_custom.InvalidArgumentError, match=match):
        onnx_custom.export(FunctionModel(), inputs(), fuse=fuse)


def test_exported_program_cannot_be_fused() -> None:
    program = torch.export.export(FunctionModel().eval(), inputs())
    with pytest.raises(onnx_custom.InvalidArgumentError, match="already traced"):
        onnx_custom.export(program, inputs(), fuse=True)


def test_report_survives_save_and_load(tmp_path: object) -> None:
    path = f"{tmp_path}/m.onnx"
    onnx_custom.export(
        FunctionModel().eval(), inputs(), path, exporter="torchscript", fuse=[my_msda]
    )
    report = fusion_report(onnx.load(path))
    assert report is not None and report.fused[0].calls == 1


def test_mmcv_function_is_recognised_by_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmcv's ``multi_scale_deformable_attn_pytorch`` (a stand-in module under mmcv's name; mmcv
    itself is not installed here) is fused with ``fuse=True``; a same-named function defined
    elsewhere is not recognised."""
    import types

    module = types.ModuleType("mmcv.ops.multi_scale_deform_attn")

    def multi_scale_deformable_attn_pytorch(
        value: torch.Tensor,
        value_spatial_shapes: object,
        sampling_locations: torch.Tensor,
        attention_weights: torch.Tensor,
    ) -> torch.Tensor:
        return fusion_cases.grid_msda(
            value, value_spatial_shapes, sampling_locations, attention_weights
        )

    multi_scale_deformable_attn_pytorch.__module__ = module.__name__
    module.multi_scale_deformable_attn_pytorch = multi_scale_deformable_attn_pytorch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(fusion_cases, "my_msda", multi_scale_deformable_attn_pytorch)
    proto = onnx_custom.export(
        FunctionModel().eval(), inputs(), exporter="torchscript", registry=CUSTOM, fuse=True
    )
    assert op_counts(proto).get("MultiScaleDeformableAttn") == 1
    (site,) = fusion_report(proto).fused  # type: ignore[union-attr]
    assert site.implementation.endswith("multi_scale_deformable_attn_pytorch")

    monkeypatch.delitem(sys.modules, module.__name__)  # same name, not mmcv's object
    proto = onnx_custom.export(
        FunctionModel().eval(), inputs(), exporter="torchscript", registry=CUSTOM, fuse=True
    )
    assert "MultiScaleDeformableAttn" not in op_counts(proto)


def test_module_patch_restored_after_failing_export() -> None:
    class Failing(fusion_cases.AttentionModel):
        calls = 0

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            type(self).calls += 1
            if type(self).calls > 1:  # the probe passes, the export's trace fails
                raise RuntimeError("boom during export")
            return super().forward(*args)

    attention = fusion_cases.MyAttention()
    with pytest.raises(RuntimeError, match="boom"):
        onnx_custom.export(
            Failing(attention).eval(),
            inputs(),
            exporter="torchscript",
            fuse=[fusion_cases.MyAttention],
        )
    assert "forward" not in attention.__dict__


def test_fuse_true_with_nothing_recognised_reports_nothing() -> None:
    model = torch.nn.Linear(3, 2).eval()
    proto = onnx_custom.export(model, (torch.randn(1, 3),), exporter="torchscript", fuse=True)
    report = fusion_report(proto)
    assert report is not None and report.sites == []
    assert str(report) == "fusion: 0 fused, 0 recognised but not fused"
