"""``torch.onnx.export(model, args, dynamo=True, custom_translation_table=
onnx_custom.translation_table())`` with no opset named anywhere: the table serves the opset the
export records at (torch's default, or the export's ``opset_version``), under every way torch
accepts dynamic shapes; each file runs in ONNX Runtime at other batch sizes against raw torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

import onnx_custom
import onnx_custom.ops.seed  # defines torch.ops.onnx_custom.my_add


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(torch.asinh(x), y)


def _reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 * torch.asinh(x) + y  # my_add(a, b) = 2a + b, written out


def _run(proto: Any, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {names[0]: x.numpy(), names[1]: y.numpy()})[0]


_BATCH = Dim("batch")
DYNAMIC: dict[str, Any] = {
    "names": {"x": {0: "batch"}, "y": {0: "batch"}},
    "Dim": {"x": {0: _BATCH}, "y": {0: _BATCH}},
    "Dim.AUTO": {"x": {0: Dim.AUTO}, "y": {0: Dim.AUTO}},
    "Dim.DYNAMIC": {"x": {0: Dim.DYNAMIC}, "y": {0: Dim.DYNAMIC}},
    "tuple": ({0: _BATCH}, {0: _BATCH}),
}


@pytest.mark.parametrize("how", list(DYNAMIC), ids=[f"x[3,4]-batch-{k}" for k in DYNAMIC])
def test_plain_table_exports_at_torchs_default_opset(how: str) -> None:
    torch.manual_seed(0)
    args = (torch.randn(3, 4), torch.randn(3, 4))
    program = torch.onnx.export(
        Model(),
        args,
        dynamo=True,
        custom_translation_table=onnx_custom.translation_table(),
        dynamic_shapes=DYNAMIC[how],
        verbose=False,
    )
    assert program is not None
    proto = program.model_proto
    recorded = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    assert recorded >= 18
    for batch in (3, 1, 6):
        x, y = torch.randn(batch, 4), torch.randn(batch, 4)
        torch.testing.assert_close(torch.from_numpy(_run(proto, x, y)), _reference(x, y))


def test_plain_table_with_input_and_output_names() -> None:
    torch.manual_seed(1)
    args = (torch.randn(2, 5), torch.randn(2, 5))
    program = torch.onnx.export(
        Model(),
        args,
        dynamo=True,
        custom_translation_table=onnx_custom.translation_table(),
        input_names=["a", "b"],
        output_names=["total"],
        dynamic_axes={"a": {0: "n"}, "b": {0: "n"}, "total": {0: "n"}},
        verbose=False,
    )
    assert program is not None
    proto = program.model_proto
    assert [o.name for o in proto.graph.output] == ["total"]
    x, y = torch.randn(7, 5), torch.randn(7, 5)
    torch.testing.assert_close(torch.from_numpy(_run(proto, x, y)), _reference(x, y))


@pytest.mark.parametrize("opset", [18, 19, 21], ids=lambda o: f"opset_version={o}")
def test_plain_table_follows_the_exports_opset_version(opset: int) -> None:
    args = (torch.randn(2, 3), torch.randn(2, 3))
    program = torch.onnx.export(
        Model(),
        args,
        dynamo=True,
        opset_version=opset,
        custom_translation_table=onnx_custom.translation_table(),
        verbose=False,
    )
    assert program is not None
    torch.testing.assert_close(
        torch.from_numpy(_run(program.model_proto, *args)), _reference(*args)
    )


def test_an_explicit_opset_still_refuses_another_recording_opset() -> None:
    with pytest.raises(
        Exception, match=r"translation_table\(opset=18\) is used by a dynamo export"
    ):
        torch.onnx.export(
            Model(),
            (torch.randn(2, 3), torch.randn(2, 3)),
            dynamo=True,
            opset_version=20,
            custom_translation_table=onnx_custom.translation_table(opset=18),
            verbose=False,
        )


@torch.library.custom_op("plaintable::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.plaintable.twice(x)


@pytest.mark.parametrize(
    ("opset", "op_type"),
    [(18, "Add"), (19, "Add"), (20, "Mul"), (21, "Mul")],
    ids=lambda v: f"opset_version={v}" if isinstance(v, int) else v,
)
def test_plain_table_picks_the_translation_of_the_recording_opset(opset: int, op_type: str) -> None:
    """Two translations of one op (from opset 1: x + x; from opset 20: x * 2): the table made
    without an opset serves the one valid at the opset each export records at."""
    reg = onnx_custom.Registry()
    reg.symbolic("plaintable::twice", opset=1)(lambda g, x: g.op("Add", x, x))
    reg.symbolic("plaintable::twice", opset=20)(
        lambda g, x: g.op("Mul", x, g.constant(2.0, like=x))
    )
    x = torch.randn(2, 3)
    program = torch.onnx.export(
        Twice(),
        (x,),
        dynamo=True,
        opset_version=opset,
        custom_translation_table=onnx_custom.translation_table(registry=reg),
        verbose=False,
    )
    assert program is not None
    proto = program.model_proto
    assert [n.op_type for n in proto.graph.node] == [op_type]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), x * 2)
