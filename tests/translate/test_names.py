from __future__ import annotations

import pytest
import torch

import onnx_custom.ops.seed  # noqa: F401
from onnx_custom.errors import SymbolicError
from onnx_custom.translate.names import QualifiedName, normalize_target, parse_node_type


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aten::asinh", QualifiedName("aten", "asinh")),
        ("mylib::my_add.default", QualifiedName("mylib", "my_add", "default")),
        ("torchvision::deform_conv2d", QualifiedName("torchvision", "deform_conv2d")),
    ],
)
def test_parse_valid(text: str, expected: QualifiedName) -> None:
    assert QualifiedName.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    ("bad", "hint"),
    [
        ("asinh", "Did you mean 'aten::asinh'"),
        ("aten:asinh", "double colon"),
        ("aten::", "expected"),
        ("a b::c", "expected"),
        ("aten::asinh.", "expected"),
    ],
)
def test_parse_ill_formed(bad: str, hint: str) -> None:
    with pytest.raises(SymbolicError, match="Ill-formed") as info:
        QualifiedName.parse(bad)
    assert hint in str(info.value)


def test_overload_packet_is_rejected_with_fix() -> None:
    with pytest.raises(SymbolicError, match=r"OverloadPacket.*\.default"):
        normalize_target(torch.ops.onnx_custom.my_add)


def test_op_overload_and_function_targets() -> None:
    assert (
        normalize_target(torch.ops.onnx_custom.my_add.default).key == "onnx_custom::my_add.default"
    )

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x

    assert normalize_target(Fn).function is Fn
    with pytest.raises(SymbolicError, match="Unsupported translation target"):
        normalize_target(42)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Asinh", ("", "Asinh")),
        ("custom::my_add", ("custom", "my_add")),
        ("com.acme::Foo", ("com.acme", "Foo")),
        ("ai.onnx::Add", ("", "Add")),
    ],
)
def test_node_types(text: str, expected: tuple[str, str]) -> None:
    assert parse_node_type(text) == expected


@pytest.mark.parametrize("bad", ["", "custom::", "::Add", "a::b::c", "1abc"])
def test_bad_node_types(bad: str) -> None:
    with pytest.raises(SymbolicError, match="Ill-formed ONNX node type"):
        parse_node_type(bad)
