"""``g.outputs``: the output types torch computed, the same under both exporters; custom nodes
typed from it (no guessed input-0 dtype); ``Tensor[]`` returns; ``output_types=``; bfloat16
constants; a translation whose claim the fake kernel contradicts."""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch

import onnx_custom
from onnx_custom import SymbolicError
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.types import TensorInfo
from onnx_custom.translate.builder import OutputMeta

EXPORTERS = [("torchscript", 17), ("dynamo", 18)]
BATCHES = (1, 3, 7)


# -- test ops: a Tensor[] return and a float + int64 pair ---------------------------------


@torch.library.custom_op("octest_meta::chunk3", mutates_args=())
def chunk3(x: torch.Tensor) -> list[torch.Tensor]:
    return [c.clone() for c in x.chunk(3, dim=-1)]


@chunk3.register_fake
def _(x: torch.Tensor) -> list[torch.Tensor]:
    return [x.new_empty(*x.shape[:-1], x.shape[-1] // 3) for _ in range(3)]


@torch.library.custom_op("octest_meta::maxidx", mutates_args=())
def maxidx(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = x.max(dim=-1)
    return values, indices


@maxidx.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1], dtype=torch.int64)


@torch.library.custom_op("octest_meta::halve", mutates_args=())
def halve(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


@halve.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# A translation reports what it saw on stderr: the dynamo exporter swallows stdout.
SEEN: dict[str, list[tuple[OutputMeta, ...]]] = {}


def _registry(*, claim_float_index: bool = False) -> onnx_custom.Registry:
    reg = onnx_custom.Registry()

    @reg.symbolic("octest_meta::chunk3")
    def _chunk3(g: Any, x: Any) -> Any:
        SEEN.setdefault(g.exporter, []).append(g.outputs)
        return g.op("octest_meta::Chunk3", x, outputs=3)

    @reg.symbolic("octest_meta::maxidx")
    def _maxidx(g: Any, x: Any) -> Any:
        SEEN.setdefault(g.exporter, []).append(g.outputs)
        types = [torch.float32, torch.float32] if claim_float_index else None
        values, indices = g.op("octest_meta::MaxIdx", x, outputs=2, output_types=types)
        # An int64 output must get int64 constants (the old provisional input-0 dtype gave float
        # ones, which ONNX Runtime refuses).
        one = g.constant(1, like=indices)
        return values, g.op("Sub", g.op("Add", indices, one), one)

    return reg


def _kernels() -> KernelRegistry:
    kernels = KernelRegistry()

    def chunk_shapes(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None and x.shape is not None
        last = x.shape[-1] // 3 if isinstance(x.shape[-1], int) else None
        return [TensorInfo(x.dtype, (*x.shape[:-1], last))] * 3

    @kernels.kernel(
        "octest_meta::Chunk3", inputs=["x"], outputs=["a", "b", "c"], shape_fn=chunk_shapes
    )
    def _chunk3(x: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(np.ascontiguousarray(c) for c in np.split(x, 3, axis=-1))

    def maxidx_shapes(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None and x.shape is not None
        return [TensorInfo(x.dtype, x.shape[:-1]), TensorInfo(np.int64, x.shape[:-1])]

    @kernels.kernel(
        "octest_meta::MaxIdx",
        inputs=["x"],
        outputs=["values", "indices"],
        dtypes={"x": ["float32"], "values": ["float32"], "indices": ["int64"]},
        shape_fn=maxidx_shapes,
    )
    def _maxidx(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x.max(-1), x.argmax(-1).astype(np.int64)

    return kernels


class Pipeline(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b, c = torch.ops.octest_meta.chunk3(x)
        values, indices = torch.ops.octest_meta.maxidx(a * 2 + c)
        return values + b.sum(-1), indices + 1


class MaxIdx(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.octest_meta.maxidx(x)


DYNAMIC = {"x": {0: "batch", 1: "seq"}}
F32, I64 = torch.float32, torch.int64


def _export(exporter: str, opset: int, dynamic: bool = True, **kwargs: Any) -> onnx.ModelProto:
    SEEN.pop(exporter, None)
    return onnx_custom.export(
        Pipeline(),
        (torch.randn(2, 4, 6),),
        exporter=exporter,
        opset=opset,
        registry=kwargs.pop("registry", None) or _registry(),
        dynamic_shapes=DYNAMIC if dynamic else None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("dynamic", "expected"),
    [
        (
            True,
            [
                (OutputMeta(F32, ("batch", "seq", 2)),) * 3,
                (OutputMeta(F32, ("batch", "seq")), OutputMeta(I64, ("batch", "seq"))),
            ],
        ),
        (
            False,
            [(OutputMeta(F32, (2, 4, 2)),) * 3, (OutputMeta(F32, (2, 4)), OutputMeta(I64, (2, 4)))],
        ),
    ],
    ids=["dynamic-batch-seq", "static"],
)
def test_g_outputs_identical_under_both_exporters(dynamic: bool, expected: list[Any]) -> None:
    for exporter, opset in EXPORTERS:
        _export(exporter, opset, dynamic)
        assert SEEN[exporter] == expected, exporter


def test_g_outputs_spell_derived_dims_alike() -> None:
    from onnx_custom.models import multi_out3 as mo3

    seen: dict[str, tuple[OutputMeta, ...]] = {}
    reg = onnx_custom.default_registry().with_variants("custom").copy()
    original = reg.lookup("onnx_custom::multi_out3", 13).fn

    @reg.symbolic("onnx_custom::multi_out3", opset=7, variant="custom", replace=True)
    def recording(g: Any, x: Any, **attrs: Any) -> Any:
        seen[g.exporter] = g.outputs
        return original(g, x, **attrs)

    for exporter, opset in [("torchscript", 13), ("dynamo", 18)]:
        onnx_custom.export(
            mo3.Model(),
            mo3.example_inputs(),
            exporter=exporter,
            opset=opset,
            registry=reg,
            dynamic_shapes=mo3.dynamic_shapes,
        )
    expected = (
        OutputMeta(F32, ("batch", 3, 4)),
        OutputMeta(F32, ("2*batch", 3, 12)),
        OutputMeta(F32, ("batch", 3)),
    )
    assert seen == {"torchscript": expected, "dynamo": expected}


def _tensor(proto: onnx.ModelProto, name: str) -> onnx.TensorProto:
    for init in proto.graph.initializer:
        if init.name == name:
            return init
    node = next(n for n in proto.graph.node if name in n.output)
    assert node.op_type == "Constant", node
    return node.attribute[0].t


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_tensor_list_return_and_int64_output_run_in_ort(exporter: str, opset: int) -> None:
    proto = _export(exporter, opset)
    custom = [n for n in proto.graph.node if n.domain == "octest_meta"]
    assert sorted((n.op_type, len(n.output)) for n in custom) == [("Chunk3", 3), ("MaxIdx", 2)]
    # The constant added to the int64 indices is int64 (a Constant node or an initializer).
    add = next(n for n in proto.graph.node if n.op_type == "Add" and custom[1].output[1] in n.input)
    one = next(i for i in add.input if i != custom[1].output[1])
    assert _tensor(proto, one).data_type == onnx.TensorProto.INT64
    session = onnx_custom.InferenceSession(proto, kernels=_kernels())
    for batch in BATCHES:
        x = torch.randn(batch, 5, 6, generator=torch.Generator().manual_seed(batch))
        got = session.run(None, {"x": x.numpy()})
        for g, e in zip(got, Pipeline()(x), strict=True):
            torch.testing.assert_close(torch.from_numpy(g), e)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_output_types_declare_what_g_outputs_cannot(exporter: str, opset: int) -> None:
    reg = onnx_custom.Registry()
    seen: dict[str, Any] = {}

    @reg.symbolic("octest_meta::maxidx")
    def _maxidx(g: Any, x: Any) -> Any:
        # Three node outputs for a two-output op: not the op's outputs, so untyped by default...
        *_, extra = g.op("octest_meta::MaxIdx3", x, outputs=3)
        # ...unless declared.
        values, indices, _ = g.op(
            "octest_meta::MaxIdx3",
            x,
            outputs=3,
            output_types=[g.outputs[0], g.outputs[1], OutputMeta(F32, ("batch",))],
        )
        seen.update(untyped=g.dtype(extra), values=g.dtype(values), indices=g.dtype(indices))
        return values, indices

    proto = onnx_custom.export(
        MaxIdx(),
        (torch.randn(2, 4),),
        exporter=exporter,
        opset=opset,
        registry=reg,
        dynamic_shapes={"x": {0: "batch"}},
    )
    assert seen == {"untyped": None, "values": F32, "indices": I64}
    outputs = {o.name: o.type.tensor_type for o in proto.graph.output}
    assert [t.elem_type for t in outputs.values()] == [
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.INT64,
    ]
    assert [[d.dim_param for d in t.shape.dim] for t in outputs.values()] == [["batch"], ["batch"]]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_a_claim_the_fake_kernel_contradicts_is_refused(exporter: str, opset: int) -> None:
    with pytest.raises(SymbolicError) as info:
        _export(exporter, opset, registry=_registry(claim_float_index=True))
    message = str(info.value)
    assert "octest_meta::maxidx" in message and "output 1" in message
    assert "dtype torch.float32, but torch computes torch.int64" in message and "Fix" in message


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_output_count_is_checked_against_tensor_list_elements(exporter: str, opset: int) -> None:
    reg = onnx_custom.Registry()

    @reg.symbolic("octest_meta::chunk3")
    def _two(g: Any, x: Any) -> Any:
        return g.op("octest_meta::Chunk3", x, outputs=2)

    class Chunks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b, c = torch.ops.octest_meta.chunk3(x)
            return a + b + c

    with pytest.raises(
        SymbolicError, match=r"returned 2 output\(s\) but the torch op has 3 .*Tensor\[\] return"
    ):
        onnx_custom.export(
            Chunks(), (torch.randn(2, 6),), exporter=exporter, opset=opset, registry=reg
        )


# -- bfloat16 --------------------------------------------------------------------------------


def _bf16_registry() -> onnx_custom.Registry:
    reg = onnx_custom.Registry()

    @reg.symbolic("octest_meta::halve")
    def _halve(g: Any, x: Any) -> Any:
        # A bf16 Constant and a bf16 tensor attribute, both into a custom node (never folded).
        half = g.constant(np.array([0.5], dtype=ml_dtypes.bfloat16))
        return g.op(
            "octest_meta::Scale", x, half, unused=np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
        )

    return reg


class Halve(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.octest_meta.halve(x)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_bfloat16_constant_and_tensor_attribute_export(exporter: str, opset: int) -> None:
    proto = onnx_custom.export(
        Halve(), (torch.randn(3, 4),), exporter=exporter, opset=opset, registry=_bf16_registry()
    )
    tensors = [
        a.t for n in proto.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
    ]
    tensors += list(proto.graph.initializer)  # the dynamo exporter lifts constants
    bf16 = [t for t in tensors if t.data_type == onnx.TensorProto.BFLOAT16]
    values = sorted(
        float(v) for t in bf16 for v in onnx.numpy_helper.to_array(t).astype(np.float32).ravel()
    )
    assert values == [-2.0, 0.5, 1.5]
    kernels = KernelRegistry()

    @kernels.kernel("octest_meta::Scale", inputs=["x", "scale"], outputs=["y"], shape_fn="like0")
    def _scale(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        assert scale.dtype == ml_dtypes.bfloat16
        return x * scale.astype(np.float32)

    # The kernel host refuses attributes a kernel does not declare (a misspelt one would
    # otherwise fall back to its default silently), and kernels cannot declare TENSOR
    # attributes: the bf16 payload was checked above, so run the node without it.
    for node in proto.graph.node:
        kept = [a for a in node.attribute if a.name != "unused"]
        del node.attribute[:]
        node.attribute.extend(kept)
    x = torch.randn(3, 4)
    (got,) = onnx_custom.InferenceSession(proto, kernels=kernels).run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), x * 0.5)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_bfloat16_model_types_its_custom_outputs_bf16(exporter: str, opset: int) -> None:
    reg = onnx_custom.Registry()

    @reg.symbolic("octest_meta::maxidx")
    def _maxidx(g: Any, x: Any) -> Any:
        return g.op("octest_meta::MaxIdx", x, outputs=2)

    x = torch.randn(2, 4, dtype=torch.bfloat16)
    proto = onnx_custom.export(
        MaxIdx(),
        (x,),
        exporter=exporter,
        opset=opset,
        registry=reg,
        dynamic_shapes={"x": {0: "batch"}},
    )
    types = [
        (
            o.type.tensor_type.elem_type,
            [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim],
        )
        for o in proto.graph.output
    ]
    assert types == [(onnx.TensorProto.BFLOAT16, ["batch"]), (onnx.TensorProto.INT64, ["batch"])]


@torch.library.custom_op("octest_meta::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x - 1


def test_op_without_fake_kernel_gets_no_static_dims_under_torchscript() -> None:
    # No fake kernel: TorchScript still exports (dynamo refuses, see test_export_errors). The
    # trace's dtype and rank are kept; its sizes are the example's, so with a dynamic input every
    # dim is unknown rather than baked in.
    reg = onnx_custom.Registry()
    seen: list[tuple[OutputMeta, ...]] = []

    @reg.symbolic("octest_meta::no_fake")
    def _no_fake(g: Any, x: Any) -> Any:
        seen.append(g.outputs)
        return g.op("octest_meta::NoFake", x)

    class NoFake(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.octest_meta.no_fake(x).relu()

    kernels = KernelRegistry()

    @kernels.kernel("octest_meta::NoFake", inputs=["x"], outputs=["y"], shape_fn="like0")
    def _kernel(x: np.ndarray) -> np.ndarray:
        return x - 1

    proto = onnx_custom.export(
        NoFake(),
        (torch.randn(2, 3),),
        exporter="torchscript",
        opset=17,
        registry=reg,
        dynamic_shapes={"x": {0: "batch"}},
    )
    assert seen == [(OutputMeta(F32, (None, None)),)]
    typed = [*proto.graph.value_info, *proto.graph.output]
    assert typed and all(
        d.dim_param and not d.dim_value for v in typed for d in v.type.tensor_type.shape.dim
    )
    session = onnx_custom.InferenceSession(proto, kernels=kernels)
    for batch in BATCHES:
        x = torch.randn(batch, 3)
        (got,) = session.run(None, {"x": x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), NoFake()(x))


def test_dynamo_without_the_fx_node_runs_the_fake_kernel_on_onnx_types() -> None:
    # The dynamo adapter reads torch's FX node; should that ever be out of reach it falls back
    # to the op's fake kernel on the inputs' ONNX types, and must give the same answer.
    import onnx_ir as ir

    from onnx_custom.exporter.dynamo import DynamoBuilder
    from onnx_custom.exporter.dynamo_output_types import symbol_names, value_outputs
    from onnx_custom.exporter.output_meta import flat_outputs
    from onnx_custom.models import multi_out3  # noqa: F401  (defines onnx_custom::multi_out3)

    x = ir.Value(name="x")
    x.dtype, x.shape = ir.DataType.FLOAT, ir.Shape(["s1", 3, 4])
    with symbol_names({"s1": "batch"}):
        found = value_outputs(
            torch.ops.onnx_custom.multi_out3.default,
            [x, [2, 1, 3], 0.25],
            {},
            DynamoBuilder.dtype_of,
        )
    assert found is not None
    outputs, spelled, names = found
    assert [names.meta(d) for d in flat_outputs(outputs)] == [
        OutputMeta(F32, ("batch", 3, 4)),
        OutputMeta(F32, ("2*batch", 3, 12)),
        OutputMeta(F32, ("batch", 3)),
    ]
    assert spelled == [
        ["s1", 3, 4],
        ["2*s1", 3, 12],
        ["s1", 3],
    ]  # torch's spelling, renamed after export


def test_g_outputs_outside_an_export_is_a_clear_error() -> None:
    from onnx_custom.exporter.dynamo import DynamoBuilder

    with pytest.raises(
        SymbolicError, match=r"g.outputs exists inside a translation.*Fix: add register_fake"
    ):
        _ = DynamoBuilder(None, 18, "octest_meta::halve").outputs


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
