"""deform_conv2d through both exporters: ONNX ``DeformConv`` at opset 19,
``onnx_custom::DeformConv2d`` (run by our kernel) below; the DCN example network, ONNX's backend
cases, shape function, domain factory and early export errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from test_deform_conv import onnx_backend_cases, op_args_from_onnx

import onnx_custom
from onnx_custom.models import deform_conv as dcn
from onnx_custom.ops.deform_conv import load_extension, torchvision_unavailable_reason
from onnx_custom.ort_kernels import deform_conv as deform_conv_kernels
from onnx_custom.runtime.types import TensorInfo
from onnx_custom.symbolics import deform_conv as deform_conv_symbolics
from onnx_custom.zoo import run_case

EXPORTERS = ["torchscript", "dynamo"]


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


def _nodes(proto: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in proto.graph.node if n.op_type == op_type]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _run(proto: onnx.ModelProto, *inputs: torch.Tensor, **kwargs: Any) -> list[np.ndarray]:
    sess = onnx_custom.InferenceSession(proto, **kwargs)
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})


# -- the DCN example network ------------------------------------------------------------------

NET_CASES = [
    pytest.param(
        exporter, opset, dynamic, id=f"{exporter}-opset{opset}-{'dynamic' if dynamic else 'static'}"
    )
    for exporter, opset, dynamic in [
        ("torchscript", 11, False),
        ("torchscript", 11, True),
        ("torchscript", 19, False),
        ("torchscript", 19, True),
        ("dynamo", 11, False),
        ("dynamo", 18, True),  # custom node with dynamic shapes (see the refusal test below)
        ("dynamo", 19, False),
        ("dynamo", 19, True),
    ]
]


@pytest.mark.parametrize(("exporter", "opset", "dynamic"), NET_CASES)
def test_dcn_network(exporter: str, opset: int, dynamic: bool) -> None:
    model = dcn.Model().eval()
    args = dcn.example_inputs()
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        opset=opset,
        dynamic_shapes=dcn.dynamic_shapes if dynamic else None,
    )
    if opset >= 19:
        assert len(_nodes(proto, "DeformConv")) == 2 and not _nodes(proto, "DeformConv2d")
    else:
        custom = _nodes(proto, "DeformConv2d")
        assert len(custom) == 2 and {n.domain for n in custom} == {"onnx_custom"}
        assert not _nodes(proto, "DeformConv")
    # Dynamic exports run on another batch and spatial size than the one traced.
    x = (
        torch.randn(3, 3, 40, 48, generator=torch.Generator().manual_seed(1))
        if dynamic
        else args[0]
    )
    (got,) = _run(proto, x)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)


def test_dynamo_dynamic_below_opset18_is_refused_with_a_fix() -> None:
    # The dynamo exporter builds at opset 18; with dynamic shapes the graph holds Shape nodes
    # that cannot be lowered to 11, and the core says so instead of emitting a wrong model.
    with pytest.raises(onnx_custom.OnnxCustomError, match="cannot be lowered to opset 11"):
        onnx_custom.export(
            dcn.Model().eval(),
            dcn.example_inputs(),
            exporter="dynamo",
            opset=11,
            dynamic_shapes=dcn.dynamic_shapes,
        )


@pytest.mark.slow
@pytest.mark.parametrize("case", dcn.ZOO, ids=lambda c: c.label)
def test_zoo_rows(case: Any) -> None:
    result = run_case("deform_conv", dcn, case)
    assert result.status == "pass", result.detail


def test_opset19_attributes_are_mapped_exactly() -> None:
    class One(torch.nn.Module):
        def forward(self, x, w, offset, mask, bias):
            return torch.ops.onnx_custom.deform_conv2d(
                x, w, offset, mask, bias, 2, 1, 1, 0, 2, 1, 2, 2, True
            )

    x, w = torch.randn(1, 4, 9, 7), torch.randn(4, 2, 3, 2)
    ho, wo = (9 + 2 - 5) // 2 + 1, (7 - 2) // 1 + 1
    offset, mask = torch.randn(1, 24, ho, wo), torch.rand(1, 12, ho, wo)
    for exporter in EXPORTERS:
        proto = onnx_custom.export(
            One(), (x, w, offset, mask, torch.randn(4)), exporter=exporter, opset=19
        )
        (node,) = _nodes(proto, "DeformConv")
        assert _attrs(node) == {
            "kernel_shape": [3, 2],
            "strides": [2, 1],
            "pads": [1, 0, 1, 0],
            "dilations": [2, 1],
            "group": 2,
            "offset_group": 2,
        }
        assert len(node.input) == 5  # X, W, offset, B, mask


# -- ONNX's backend cases through exported graphs ---------------------------------------------


class _Op(torch.nn.Module):
    def __init__(self, params: tuple[Any, ...]) -> None:
        super().__init__()
        self.params = params

    def forward(self, x, w, offset, mask, bias):
        return torch.ops.onnx_custom.deform_conv2d(x, w, offset, mask, bias, *self.params)


@pytest.mark.parametrize("opset", [11, 19])
@pytest.mark.parametrize(("node", "inputs", "outputs"), onnx_backend_cases())
def test_onnx_backend_case_exported(node, inputs, outputs, opset: int) -> None:
    args = op_args_from_onnx(node, inputs)
    if args is None:
        pytest.skip("asymmetric pads: torchvision's schema has one pad per axis")
    tensors, params = args[:5], args[5:]
    names = ["x", "w", "offset", "mask", "bias"]
    proto = onnx_custom.export(
        _Op(params), tensors, exporter="torchscript", opset=opset, input_names=names
    )
    if opset >= 19:
        (exported,) = _nodes(proto, "DeformConv")
        expected_attrs = _attrs(node)
        got_attrs = _attrs(exported)
        for key, value in expected_attrs.items():
            assert got_attrs[key] == value, key
    else:
        assert len(_nodes(proto, "DeformConv2d")) == 1
    sess = onnx_custom.InferenceSession(proto)
    feeds = dict(zip(names, (t.numpy() for t in tensors), strict=True))
    # An unused mask (use_mask=False) may be pruned from the graph inputs.
    (got,) = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(outputs[0]))


# -- kernel, shape function, domain factory ---------------------------------------------------

SHAPE_CASES = [
    pytest.param(
        (2, 4, 9, 7),
        (6, 2, 3, 2),
        (2, 24, 4, 6),
        dict(stride_h=2, pad_h=1, dilation_h=2, pad_w=0, stride_w=1, dilation_w=1),
        (2, 6, 4, 6),
        id="static_9x7_k3x2_s2_p1_d2",
    ),
    pytest.param(
        ("N", 4, "H", "W"),
        (6, 4, 3, 3),
        ("N", 18, "Ho", "Wo"),
        dict(stride_h=1, pad_h=1, dilation_h=1, pad_w=1, stride_w=1, dilation_w=1),
        ("N", 6, "Ho", "Wo"),
        id="symbolic_NxHxW",
    ),
]


@pytest.mark.parametrize(("x", "w", "offset", "attrs", "expected"), SHAPE_CASES)
def test_shape_function(x, w, offset, attrs, expected) -> None:
    f32 = np.dtype("float32")
    infos = [
        TensorInfo(f32, x),
        TensorInfo(f32, w),
        TensorInfo(f32, offset),
        None,
        TensorInfo(f32, (6,)),
    ]
    out = deform_conv_kernels.deform_conv2d_shape(infos, {**attrs, "groups": 1, "offset_groups": 1})
    assert out.shape == expected and out.dtype == f32


def test_custom_domain_factory() -> None:
    registry = onnx_custom.default_registry().copy()
    registry.update(deform_conv_symbolics.make_registry(domain="acme"), replace=True)
    model = dcn.Model().eval()
    args = dcn.example_inputs()
    proto = onnx_custom.export(model, args, exporter="torchscript", opset=11, registry=registry)
    assert {n.domain for n in _nodes(proto, "DeformConv2d")} == {"acme"}
    (got,) = _run(proto, *args, kernels=deform_conv_kernels.make_kernels("acme"))
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(*args), rtol=1e-4, atol=1e-5)


def test_translation_docstrings_are_the_schema() -> None:
    for entry in deform_conv_symbolics.registry:
        assert entry.fn.__doc__ == deform_conv_symbolics.SCHEMA


@pytest.mark.skipif(
    not deform_conv_symbolics.torchvision_ops_available(),
    reason=torchvision_unavailable_reason() or "torchvision's ops load",
)
def test_torchvision_op_translates_too() -> None:
    targets = {str(t) for t in deform_conv_symbolics.registry.targets()}
    assert any("torchvision" in t for t in targets)


# -- early, identical errors at export time ----------------------------------------------------


class _BadOffset(torch.nn.Module):
    def forward(self, x):
        w = torch.ones(2, 2, 3, 3)
        offset = torch.zeros(x.shape[0], 16, 3, 3)  # should be 18 channels
        return torch.ops.onnx_custom.deform_conv2d(
            x, w, offset, x.new_zeros(1, 1), torch.zeros(2), 1, 1, 0, 0, 1, 1, 1, 1, False
        )


def _chain(exc: BaseException | None) -> str:
    text = []
    while exc is not None:
        text.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(text)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_fails_early_with_eager_message(exporter: str) -> None:
    x = torch.randn(1, 2, 5, 5)
    message = (
        r"offset must have shape \(N, 2\*offset_groups\*kh\*kw, Ho, Wo\) = \(1, 18, 3, 3\), got"
        r" \(1, 16, 3, 3\)"
    )
    with pytest.raises(ValueError, match=message):
        _BadOffset()(x)
    with pytest.raises(Exception) as info:
        onnx_custom.export(_BadOffset(), (x,), exporter=exporter, opset=19)
    assert "got (1, 16, 3, 3)" in _chain(info.value)


def test_checker_and_shape_inference_see_the_output_shape() -> None:
    from onnx_custom.runtime.schemas import register_schemas

    register_schemas(deform_conv_kernels.kernels)
    f = onnx.TensorProto.FLOAT
    node = helper.make_node(
        "DeformConv2d",
        ["x", "w", "offset", "mask", "bias"],
        ["y"],
        domain="onnx_custom",
        stride_h=2,
        pad_h=1,
        pad_w=1,
        use_mask=1,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", f, ["N", 4, 9, "W"]),
            helper.make_tensor_value_info("w", f, [6, 4, 3, 3]),
            helper.make_tensor_value_info("offset", f, ["N", 18, 5, "Wo"]),
            helper.make_tensor_value_info("mask", f, ["N", 9, 5, "Wo"]),
            helper.make_tensor_value_info("bias", f, [6]),
        ],
        [helper.make_tensor_value_info("y", f, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("onnx_custom", 1)]
    )
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    onnx.checker.check_model(inferred, full_check=True)
    (y,) = [v for v in inferred.graph.output if v.name == "y"]
    dims = [d.dim_value or d.dim_param for d in y.type.tensor_type.shape.dim]
    assert dims == ["N", 6, 5, "Wo"]
