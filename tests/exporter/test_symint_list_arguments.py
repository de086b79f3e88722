"""A custom op taking an ``int[]`` of sizes that the model computes from its inputs' shapes
(``[y.shape[0], x.shape[1]]``, the torch.library tutorial's ``Sequence[int]``/``SymInt`` style).

With static shapes the sizes are ints under dynamo. Under a dynamic dim, dynamo hands the
translation the traced size as a 0-d int64 graph value: ``g.constant`` of such a list built an
object array that failed deep in torch's passes (a PassError about STRING bit widths); now it is
a SymbolicError naming the op and the Concat fix, and the fix is verified at other batch sizes.
TorchScript's tracer stops at an internal assert for such a list (static shapes too: it traces
every shape read): now an UnsupportedOpError naming dynamo. Files are verified in ONNX Runtime
against the eager model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import onnx_custom
from onnx_custom.errors import OnnxCustomError, SymbolicError, UnsupportedOpError


@torch.library.custom_op("octsymint::expand_to", mutates_args=())
def expand_to(x: torch.Tensor, size: list[int]) -> torch.Tensor:
    return x.expand(*size).clone()


@expand_to.register_fake
def _(x: torch.Tensor, size: list[int]) -> torch.Tensor:
    return x.new_empty(size)


constant_sizes = onnx_custom.default_registry().copy()  # sizes as one constant: static shapes only
graph_sizes = onnx_custom.default_registry().copy()  # sizes built in the graph: any shapes


@onnx_custom.symbolic("octsymint::expand_to", opset=13, registry=constant_sizes)
def expand_to_constant(g: Any, x: Any, *, size: list[Any]) -> Any:
    return g.op("Expand", x, g.constant(list(size)))


@onnx_custom.symbolic("octsymint::expand_to", opset=13, registry=graph_sizes)
def expand_to_graph(g: Any, x: Any, *, size: list[Any]) -> Any:
    parts = [
        g.op("Reshape", v, g.constant([1])) if g.is_value(v) else g.constant([v]) for v in size
    ]
    return g.op("Expand", x, g.op("Concat", *parts, axis=0))


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return expand_to(x, [y.shape[0], x.shape[1]]) + y


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    exporter: str
    registry: onnx_custom.Registry
    dynamic: bool
    error: type[OnnxCustomError] | None = None
    match: str = ""


CASES = [
    # TorchScript's tracer traces every shape read, so even static shapes hit its assert
    Case(
        "static-ts",
        "torchscript",
        constant_sizes,
        dynamic=False,
        error=UnsupportedOpError,
        match="exporter='dynamo'",
    ),
    Case("static-constant-dynamo", "dynamo", constant_sizes, dynamic=False),
    Case("dynamic-graph-dynamo", "dynamo", graph_sizes, dynamic=True),
    Case(
        "dynamic-constant-dynamo",
        "dynamo",
        constant_sizes,
        dynamic=True,
        error=SymbolicError,
        match="g.constant got a graph value",
    ),
    Case(
        "dynamic-ts",
        "torchscript",
        graph_sizes,
        dynamic=True,
        error=UnsupportedOpError,
        match="exporter='dynamo'",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sizes_traced_from_shapes(case: Case, tmp_path: Path) -> None:
    args = (torch.randn(1, 4), torch.randn(3, 4))  # x[1, 4] expanded to y's [3, 4]
    torch.testing.assert_close(Model()(*args), args[0].expand(3, 4) + args[1])
    path = tmp_path / "m.onnx"
    dynamic = {"y": {0: "batch"}} if case.dynamic else None
    kwargs: dict[str, Any] = {"exporter": case.exporter, "opset": 18, "registry": case.registry}
    if case.error is not None:
        with pytest.raises(case.error, match=case.match) as caught:
            onnx_custom.export(Model(), args, path, dynamic_shapes=dynamic, **kwargs)
        assert "Fix:" in str(caught.value)
        assert not path.exists()
        return
    onnx_custom.export(Model(), args, path, dynamic_shapes=dynamic, **kwargs)
    onnx_custom.verify(Model(), args, path, trials=2)  # also at other batch sizes when dynamic
