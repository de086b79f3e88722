"""ATen ops the exporters lack: the TorchScript exporter's gaps (``asinh``) and ops torch's dynamo
exporter has no translation for (``_is_all_true``/``_is_any_true``, which ``torch.export``
leaves in the graph for ``if tensor.all():`` style checks, e.g. RT-DETRv2's sampling-method
check)."""

from __future__ import annotations

import onnx
import torch

from onnx_custom.errors import SymbolicError
from onnx_custom.translate.registry import Registry

__all__ = ["registry"]

registry = Registry()


@registry.symbolic("aten::asinh", opset=9)
def asinh(g, self):  # type: ignore[no-untyped-def]
    """aten::asinh(Tensor self) -> Tensor"""
    return g.op("Asinh", self)


def _all(g, self):  # type: ignore[no-untyped-def]
    """A 0-d bool: every element true, as a ReduceMin over int32 (ONNX Runtime has no bool
    reductions). An empty tensor reduces to int32's max, so to True, as torch's ``all``."""
    as_int = g.op("Cast", self, to=onnx.TensorProto.INT32)
    return g.op("Cast", g.op("ReduceMin", as_int, keepdims=0), to=onnx.TensorProto.BOOL)


@registry.symbolic("aten::_is_all_true", opset=18)
def is_all_true(g, self):  # type: ignore[no-untyped-def]
    """aten::_is_all_true(Tensor self) -> Tensor"""
    return _all(g, self)


@registry.symbolic("aten::_is_any_true", opset=18)
def is_any_true(g, self):  # type: ignore[no-untyped-def]
    """aten::_is_any_true(Tensor self) -> Tensor: not all false (an empty tensor: False)."""
    return g.op("Not", _all(g, g.op("Not", self)))


def _static_int(g, value, target: str) -> int:  # type: ignore[no-untyped-def]
    """An ``int`` argument as a Python int: some torch releases' TorchScript exporters hand it
    over as a graph constant rather than a Python value."""
    if isinstance(value, int):
        return value
    constant = g.constant_value(value)
    if constant is None or constant.size != 1:
        raise SymbolicError(
            f"{target}: dim must be a constant int; received a value computed in the graph."
            " Fix: pass dim as a Python int."
        )
    return int(constant.reshape(()))


def _cumulative(g, self, dim: int, reduce: str):  # type: ignore[no-untyped-def]
    """(values, indices) of a running max/min along ``dim``: every prefix compared at once over a
    lower-triangular mask (the sizes these models scan, a prompt's tokens, are small). ``indices``
    is the last position in the prefix holding the running value, as torch's kernel picks it."""
    shape = g.shape(self)
    if shape is None:
        raise SymbolicError(
            f"aten::cum{reduce[6:].lower()}: the input's rank is unknown; expected a tensor of"
            " known rank. Fix: give the model's input a static rank."
        )
    rank = len(shape)
    if rank == 0:
        return self, g.constant(0, dtype=torch.int64)
    d = _static_int(g, dim, f"aten::cum{reduce[6:].lower()}") % rank
    size = g.op("Squeeze", g.op("Shape", self, start=d, end=d + 1))
    index = g.op("Range", g.constant(0, dtype=torch.int64), size, g.constant(1, dtype=torch.int64))
    trailing = list(range(2, 2 + rank - 1 - d))
    row = g.op("Unsqueeze", index, g.constant([0, *trailing]))  # j: [1, N, 1...]
    column = g.op("Unsqueeze", index, g.constant([1, *trailing]))  # i: [N, 1, 1...]
    prefix = g.op("LessOrEqual", row, column)  # [N(i), N(j), 1...]: j <= i
    current = g.op("Unsqueeze", self, g.constant([d + 1]))  # x_i along axis d
    other = g.op("Unsqueeze", self, g.constant([d]))  # x_j along axis d + 1
    candidates = g.op("Where", prefix, other, current)  # x_i fills j > i: never beyond the prefix
    values = g.op(reduce, candidates, g.constant([d + 1]), keepdims=0)
    holds = g.op(
        "And", prefix, g.op("Equal", other, g.op("Unsqueeze", values, g.constant([d + 1])))
    )
    where = g.op("Where", holds, row, g.constant(-1, dtype=torch.int64))
    return values, g.op("ReduceMax", where, g.constant([d + 1]), keepdims=0)


@registry.symbolic("aten::cummax", opset=18)
def cummax(g, self, dim):  # type: ignore[no-untyped-def]
    """aten::cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)"""
    return _cumulative(g, self, dim, "ReduceMax")


@registry.symbolic("aten::cummin", opset=18)
def cummin(g, self, dim):  # type: ignore[no-untyped-def]
    """aten::cummin(Tensor self, int dim) -> (Tensor values, Tensor indices)"""
    return _cumulative(g, self, dim, "ReduceMin")
