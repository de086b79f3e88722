"""Which nodes ONNX Runtime runs, and fusing them into as few partitions as possible.

A node goes to ORT when torchlib or our registry translates its op, it mutates nothing, and its
values are plain dense tensors or scalars. Everything else stays in PyTorch (eager), each with
the reason (`Fallback`) that ``explain_compile`` prints. torch's ``CapabilityBasedPartitioner``
fuses the supported nodes into ``fused_N`` submodules; their placeholders get the ``meta["val"]``
of the values the parent graph passes in (fusing leaves them without one).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from onnx_custom.compile import torch_adapter

__all__ = ["Fallback", "OrtSupport", "fill_placeholder_meta", "fuse"]


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A node left to PyTorch: its FX name, its op and why."""

    node: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"{self.target} ({self.node}): {self.reason}"


def _plain(value: Any) -> str | None:
    """Why ``value`` (a node's meta val) cannot cross into ORT, or None."""
    if isinstance(value, (list, tuple)):
        return next((r for r in map(_plain, value) if r), None)
    if value is None or isinstance(
        value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)
    ):
        return None
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            return f"{value.layout} tensors have no ONNX form"
        if value.dtype.is_complex or value.dtype in (torch.bfloat16,) or value.dtype.itemsize < 1:
            return f"dtype {value.dtype} is not handed to ONNX Runtime"
        if value.device.type != "cpu":
            return f"a {value.device.type} tensor; the backend's providers run on CPU"
        return None
    return f"a {type(value).__name__} value"


class OrtSupport(OperatorSupportBase):
    """The ORT/eager decision for each node, remembering why a node stays eager."""

    def __init__(
        self, registry: Any, ours: Mapping[Any, Any], refused: Mapping[str, str] | None = None
    ) -> None:
        self.registry = registry
        self.ours = ours
        self.refused = dict(refused or {})

    def reason(self, node: torch.fx.Node) -> str | None:
        """Why ``node`` runs eager, or None when ORT can take it."""
        if node.op != "call_function":
            return "not a call"
        if node.name in self.refused:
            return self.refused[node.name]
        target = node.target
        if target is operator.getitem:
            source = node.args[0]
            return self.reason(source) if isinstance(source, torch.fx.Node) else None
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable:
                return (
                    "mutates an input in place (ONNX has no in-place ops; aot_autograd keeps it"
                    " outside)"
                )
            if torch_adapter.is_training_batch_norm(target):
                return (
                    "training batch norm: torchlib's translation computes inference statistics only"
                )
            if target not in self.ours and not torch_adapter.is_registered(self.registry, target):
                return "no translation: neither torchlib nor the onnx-custom registry has one"
        elif not torch_adapter.is_registered(self.registry, target):
            return f"{getattr(target, '__name__', target)} is not an ATen op and has no translation"
        why = _plain(node.meta.get("val"))
        if why is None and "val" not in node.meta:
            why = "no metadata (meta['val']) to type its outputs"
        return why

    def is_node_supported(
        self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node
    ) -> bool:
        return self.reason(node) is None

    def fallbacks(self, graph: torch.fx.Graph) -> list[Fallback]:
        found = []
        for node in graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            why = self.reason(node)
            if why is not None:
                found.append(Fallback(node.name, _op_name(node.target), why))
        return found


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target.name())
    return str(getattr(target, "__name__", target))


def fill_placeholder_meta(
    parent: torch.fx.GraphModule,
) -> list[tuple[torch.fx.Node, torch.fx.GraphModule]]:
    """Each ``call_module`` node with its submodule, the submodule's placeholders given the
    ``meta["val"]`` of the parent's arguments."""
    found = []
    for node in parent.graph.nodes:
        if node.op != "call_module":
            continue
        sub = parent.get_submodule(str(node.target))
        assert isinstance(sub, torch.fx.GraphModule)
        holders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for holder, arg in zip(holders, node.args, strict=True):
            if isinstance(arg, torch.fx.Node) and "val" in arg.meta:
                holder.meta["val"] = arg.meta["val"]
            elif not isinstance(arg, torch.fx.Node):
                holder.meta["val"] = arg
        found.append((node, sub))
    return found


def fuse(gm: torch.fx.GraphModule, support: OrtSupport) -> torch.fx.GraphModule:
    """``gm`` with the supported nodes fused into ``fused_N`` submodules (``gm`` is modified)."""
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    return partitioner.partition_and_fuse()  # type: ignore[no-any-return]
