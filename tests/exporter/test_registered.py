"""Plugging our translations into the user's own torch.onnx.export calls."""

from __future__ import annotations

import io

import onnx
import pytest
import torch
from torch.onnx._internal.torchscript_exporter import registration

import onnx_custom
import onnx_custom.ops.seed


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(torch.asinh(x), y)


ARGS = (torch.randn(2, 3), torch.randn(2, 3))


def _snapshot() -> dict[str, object]:
    table = registration.registry._registry
    # Custom overrides only: torch registers its base symbolics lazily during any export.
    return {
        name: dict(g._functions._overrides) for name, g in table.items() if g._functions._overrides
    }


def test_registered_with_plain_torchscript_export() -> None:
    before = _snapshot()
    buffer = io.BytesIO()
    with onnx_custom.registered():
        torch.onnx.export(Model(), ARGS, buffer, dynamo=False, opset_version=9)
    proto = onnx.load_from_string(buffer.getvalue())
    assert [n.op_type for n in proto.graph.node if n.op_type != "Constant"] == [
        "Asinh",
        "Mul",
        "Add",
    ]
    onnx_custom.verify(Model(), ARGS, proto)
    assert _snapshot() == before


def test_state_restored_after_exception_and_no_min_quirk() -> None:
    before = _snapshot()
    with pytest.raises(RuntimeError, match="boom"), onnx_custom.registered():
        raise RuntimeError("boom")
    assert _snapshot() == before
    # torch's unregister_custom_op_symbolic would leave an empty group and the next export would
    # fail with "min() arg is an empty sequence"; we get torch's ordinary, accurate error instead.
    with pytest.raises(torch.onnx.errors.UnsupportedOperatorError, match="asinh"):
        torch.onnx.export(Model(), ARGS, io.BytesIO(), dynamo=False, opset_version=9)


def test_users_own_symbolic_is_restored() -> None:
    def users_asinh(g, x):  # type: ignore[no-untyped-def]
        return g.op("Asinh", x)

    torch.onnx.register_custom_op_symbolic("aten::asinh", users_asinh, 9)
    try:
        with onnx_custom.registered():
            assert registration.registry.get_function_group("aten::asinh").get(9) is not users_asinh  # type: ignore[union-attr]
        assert registration.registry.get_function_group("aten::asinh").get(9) is users_asinh  # type: ignore[union-attr]
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::asinh", 9)
        # torch leaves an empty group behind; an onnx_custom.registered() block heals it.
        with onnx_custom.registered():
            pass
        assert registration.registry.get_function_group("aten::asinh") is None


def test_translation_table_with_plain_dynamo_export() -> None:
    table = onnx_custom.translation_table(opset=18)
    assert torch.ops.onnx_custom.my_add.default in table
    assert all(isinstance(k, torch._ops.OpOverload) for k in table)
    program = torch.onnx.export(
        Model(), ARGS, dynamo=True, opset_version=18, custom_translation_table=table, verbose=False
    )
    assert program is not None
    onnx_custom.verify(Model(), ARGS, program.model_proto)


def test_translation_table_custom_variant() -> None:
    table = onnx_custom.translation_table(
        opset=18, registry=onnx_custom.default_registry().with_variants("custom")
    )
    program = torch.onnx.export(
        Model(), ARGS, dynamo=True, opset_version=18, custom_translation_table=table, verbose=False
    )
    assert program is not None
    assert "onnx_custom" in {n.domain for n in program.model_proto.graph.node}


def test_translation_table_bad_opset() -> None:
    with pytest.raises(onnx_custom.SymbolicError, match="opset must be a positive int"):
        onnx_custom.translation_table(opset=0)


@pytest.mark.parametrize("bad", [{}, "default", 3])
def test_bad_registry_argument(bad: object) -> None:
    with pytest.raises(TypeError, match="registry must be an onnx_custom.Registry"):
        with onnx_custom.registered(bad):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="registry must be an onnx_custom.Registry"):
        onnx_custom.translation_table(18, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="registry must be an onnx_custom.Registry"):
        onnx_custom.symbolic("mylib::x", registry=bad)  # type: ignore[arg-type]
