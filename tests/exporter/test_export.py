"""onnx_custom.export with both exporters: real exports, real onnxruntime."""

from __future__ import annotations

import io

import onnx
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed
from onnx_custom.api import MAX_IR_VERSION

EXPORTERS = [("torchscript", 13), ("dynamo", 18)]


class AsinhModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.asinh(x)


class SeedModel(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        s = torch.ops.onnx_custom.my_add(torch.relu(x), y)
        p, q = torch.ops.onnx_custom.multi_out(s)
        return p, {"q": q, "s": s}


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)


def test_asinh_torchscript_opset9_fails_without_us_and_works_with_us(tmp_path) -> None:
    with pytest.raises(torch.onnx.errors.UnsupportedOperatorError):
        torch.onnx.export(
            AsinhModel(), (torch.randn(3),), io.BytesIO(), dynamo=False, opset_version=9
        )
    path = tmp_path / "asinh.onnx"
    proto = onnx_custom.export(
        AsinhModel(), (torch.randn(3),), path, exporter="torchscript", opset=9, verify=True
    )
    assert [n.op_type for n in proto.graph.node] == ["Asinh"]
    assert onnx.load(str(path)).graph.node[0].op_type == "Asinh"


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
@pytest.mark.parametrize("variant", [None, "custom"])
def test_seed_ops_export(exporter: str, opset: int, variant: str | None, tmp_path) -> None:
    reg = onnx_custom.default_registry()
    if variant:
        reg = reg.with_variants(variant)
    path = tmp_path / "seed.onnx"
    proto = onnx_custom.export(
        SeedModel(), _args(), path, exporter=exporter, opset=opset, registry=reg
    )
    types = {(n.domain, n.op_type) for n in proto.graph.node}
    if variant == "custom":
        assert {("onnx_custom", "my_add"), ("onnx_custom", "multi_out")} <= types
        assert {o.domain: o.version for o in proto.opset_import}["onnx_custom"] == 1
        multi = next(n for n in proto.graph.node if n.op_type == "multi_out")
        assert len(multi.output) == 2
        assert {a.name: a.f for a in multi.attribute} == {"scale": 2.0, "shift": 3.0}
    else:
        assert all(d == "" for d, _ in types)
    assert proto.ir_version <= MAX_IR_VERSION
    # One self-contained file, no external data next to it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed.onnx"]
    assert len(proto.graph.output) == 3
    onnx.checker.check_model(onnx.load(str(path)))


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_verify_flag_and_file_object(exporter: str, opset: int) -> None:
    buffer = io.BytesIO()
    onnx_custom.export(SeedModel(), _args(), buffer, exporter=exporter, opset=opset, verify=True)
    report = onnx_custom.verify(SeedModel(), _args(), buffer.getvalue(), trials=3)
    assert report.passed and len(report.comparisons) == 9


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_dynamic_batch(exporter: str, opset: int) -> None:
    batch = torch.export.Dim("batch")
    proto = onnx_custom.export(
        SeedModel(),
        _args(),
        exporter=exporter,
        opset=opset,
        dynamic_shapes=({0: batch}, {0: batch}),
    )
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param and not dim0.dim_value
    bigger = (torch.randn(5, 3), torch.randn(5, 3))
    onnx_custom.verify(SeedModel(), bigger, proto)


def test_translation_scoped_to_the_call() -> None:
    from torch.onnx._internal.torchscript_exporter import registration

    onnx_custom.export(AsinhModel(), (torch.randn(3),), exporter="torchscript", opset=9)
    assert registration.registry.get_function_group(
        "aten::asinh"
    ) is None or not registration.registry.is_registered_op("aten::asinh", 9)


class ReluMyAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(torch.relu(x), y) * 2


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_dynamo_below_18_is_really_lowered(opset: int) -> None:
    # torch alone keeps opset 18 here (onnx has no Relu 14->13 adapter) while claiming success.
    proto = onnx_custom.export(ReluMyAdd(), _args(), exporter="dynamo", opset=opset)
    assert {o.domain: o.version for o in proto.opset_import}[""] == opset
    onnx_custom.verify(ReluMyAdd(), _args(), proto)


def test_dynamo_lowering_refuses_ops_that_changed_meaning() -> None:
    class Softmax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x, dim=0)

    with pytest.raises(
        onnx_custom.OnnxCustomError, match=r"Softmax \(changed at opset 13\).*torchscript"
    ):
        onnx_custom.export(Softmax(), (torch.randn(3, 4),), exporter="dynamo", opset=11)


@torch.library.custom_op("octest_same::scale1", mutates_args=())
def _scale1(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@_scale1.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_custom_node_named_like_its_torch_op(exporter: str, opset: int) -> None:
    # The TorchScript exporter looks such nodes up again at their domain version (1) after export.
    from onnx_custom.runtime import KernelRegistry, kernel

    reg = onnx_custom.Registry()
    reg.symbolic("octest_same::scale1", opset=1)(lambda g, x: g.op("octest_same::scale1", x))
    if KernelRegistry().lookup("octest_same", "scale1") is None:
        kernel("octest_same::scale1", inputs=["x"], outputs=["y"], replace=True)(
            lambda x: x * 2 + 1
        )

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _scale1(x)

    proto = onnx_custom.export(
        M(), (torch.randn(3),), exporter=exporter, opset=opset, registry=reg, verify=True
    )
    # (dynamo's outputs get an Identity to their predictable name, output_0)
    assert [(n.domain, n.op_type) for n in proto.graph.node if n.op_type != "Identity"] == [
        ("octest_same", "scale1")
    ]


def test_dynamo_precheck_accepts_ops_the_exporter_lowers() -> None:
    # aten::to.dtype (CompositeImplicit) and aten::_assert_tensor_metadata appear only before
    # the exporter's own decompositions; the pre-flight must not call them missing.
    class Cast(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 10).to(torch.int32)

    proto = onnx_custom.export(Cast(), (torch.randn(3, 4),), exporter="dynamo", verify=True)
    assert "Cast" in {n.op_type for n in proto.graph.node}
