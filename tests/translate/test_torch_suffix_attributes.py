"""A custom node's attributes written with torch's type suffixes (``keep_topk_i=8``, mmdeploy's
``g.op("mmdeploy::TRTBatchedNMS", ...)`` lines pasted into an onnx-custom translation).

Our ``g`` types attributes from their values, so without the check the node carried an
attribute literally named ``keep_topk_i`` that no kernel or TensorRT plugin reads: the export
succeeded and nothing failed until a runtime ran the node. Now: a `SymbolicError` naming the
attribute and the fixes, under both exporters. The same line in a torch-style function (which
reads suffixes as torch does) exports ``keep_topk``; a registered schema declaring the suffixed
name allows it; a suffix whose kind does not match the value is an ordinary name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from torch.onnx import symbolic_helper

import onnx_custom
from onnx_custom.runtime import KernelRegistry, register_schemas


@torch.library.custom_op("sfxtest::pick", mutates_args=())
def pick(x: torch.Tensor, k: int) -> torch.Tensor:
    return x[:, :k].clone()


@pick.register_fake
def _(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], k))


class Pick(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.sfxtest.pick(x, 2)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    node: str  # the custom node's type (a schema is registered for "Declared" only)
    attrs: dict[str, Any]
    error: str | None  # the attribute the error names, None: exports
    written: tuple[str, ...] = ()  # attribute names the node carries


CASES = [
    Case("int-_i", "Plugin", {"keep_topk_i": 2}, "keep_topk_i"),
    Case("float-_f", "Plugin", {"iou_threshold_f": 0.5}, "iou_threshold_f"),
    Case("string-_s", "Plugin", {"mode_s": "avg"}, "mode_s"),
    Case("ints-_is", "Plugin", {"pads_is": [0, 1]}, "pads_is"),
    Case(
        "kind-mismatch-is-a-name",
        "Plugin",
        {"device_i": "cpu", "keep_topk": 2},
        None,
        ("device_i", "keep_topk"),
    ),
    Case("declared-by-schema", "Declared", {"keep_topk_i": 2}, None, ("keep_topk_i",)),
]

kernels = KernelRegistry()


@kernels.kernel("sfxtest::Declared", inputs=["x"], outputs=["y"], attrs={"keep_topk_i": "int"})
def declared(x: Any, *, keep_topk_i: int) -> Any:
    return x[:, :keep_topk_i].copy()


register_schemas(kernels)  # the escape the error names: a schema that declares the suffixed name


def _registry(case: Case) -> onnx_custom.Registry:
    registry = onnx_custom.Registry()

    @registry.symbolic("sfxtest::pick", opset=1)
    def translation(g: Any, x: Any, *, k: int) -> Any:
        return g.op(f"sfxtest::{case.node}", x, **case.attrs)

    return registry


def _custom_node(path: Path) -> onnx.NodeProto:
    (node,) = [n for n in onnx.load(path).graph.node if n.domain == "sfxtest"]
    return node


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_suffixed_custom_attributes_in_our_g(
    case: Case, exporter: str, tmp_path: Path
) -> None:
    path = tmp_path / "m.onnx"
    export = lambda: onnx_custom.export(  # noqa: E731
        Pick(), (torch.randn(2, 5),), path, exporter=exporter, registry=_registry(case)
    )
    if case.error is None:
        export()
        assert sorted(a.name for a in _custom_node(path).attribute) == sorted(case.written)
        return
    with pytest.raises(onnx_custom.SymbolicError) as info:
        export()
    base = case.error.rpartition("_")[0]
    for phrase in (
        f"attribute {case.error!r}",
        f"writes {base!r}",
        f"Fix: write {base}=...",
        "parse_args",
        "register_schemas",
    ):
        assert phrase in str(info.value), (phrase, str(info.value))
    assert not path.exists()


@symbolic_helper.parse_args("v", "i")
def torch_style_pick(g: Any, x: Any, k: int) -> Any:
    return g.op("sfxtest::Plugin", x, keep_topk_i=k, mode_s="avg")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_same_line_in_a_torch_style_function_writes_torchs_names(
    exporter: str, tmp_path: Path
) -> None:
    registry = onnx_custom.Registry()
    onnx_custom.register_custom_op_symbolic(
        "sfxtest::pick", torch_style_pick, 11, registry=registry
    )
    path = tmp_path / "m.onnx"
    onnx_custom.export(Pick(), (torch.randn(2, 5),), path, exporter=exporter, registry=registry)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in _custom_node(path).attribute}
    assert attrs == {"keep_topk": 2, "mode": b"avg"}
