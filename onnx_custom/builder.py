"""The exporter-neutral graph builder ``g`` that translations receive.

Subclasses adapt it to the TorchScript exporter (`_torchscript.py`) and to the torch.export-based
exporter (`_dynamo.py`). Everything a translation can observe (node types, attribute kinds,
output counts) is decided here, so both exporters emit the same ONNX nodes.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
import numbers
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.attributes import AttrValue, convert_attribute
from onnx_custom.errors import SymbolicError
from onnx_custom.names import parse_node_type

__all__ = ["GraphBuilder", "NodeRecord", "record_nodes"]


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """What a translation emitted: enough to compare the two exporters node for node."""

    target: str
    domain: str
    op_type: str
    attributes: tuple[tuple[str, str, Any], ...]
    inputs: int
    outputs: int


_recorder: contextvars.ContextVar[list[NodeRecord] | None] = contextvars.ContextVar("onnx_custom_recorder", default=None)


@contextlib.contextmanager
def record_nodes() -> Iterator[list[NodeRecord]]:
    """Collect a `NodeRecord` for every node any translation adds inside the block."""
    log: list[NodeRecord] = []
    token = _recorder.set(log)
    try:
        yield log
    finally:
        _recorder.reset(token)


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    return value


class GraphBuilder(abc.ABC):
    """``g.op(...)``, ``g.constant(...)``, ``g.opset``, ``g.exporter``, ``g.dtype(x)``."""

    exporter: str = ""

    def __init__(self, opset: int, target: str) -> None:
        self.opset = opset
        self.target = target  # the torch op being translated, for error messages
        self.custom_domains: set[str] = set()

    def op(self, node_type: str, *inputs: Any, outputs: int = 1, **attributes: Any) -> Any:
        """Add one ONNX node. ``node_type`` is ``"OpType"`` or ``"domain::OpType"``.

        Returns one value, or a tuple of ``outputs`` values when ``outputs > 1``.
        """
        domain, op_type = parse_node_type(node_type)
        if not isinstance(outputs, int) or isinstance(outputs, bool) or outputs < 1:
            raise SymbolicError(f"{self.target}: outputs= must be a positive int, got {outputs!r}.")
        attrs = [convert_attribute(name, value) for name, value in attributes.items() if value is not None]
        converted = [self._input(domain, op_type, i, value) for i, value in enumerate(inputs)]
        while converted and converted[-1] is None:  # trailing absent optional inputs are dropped
            converted.pop()
        if domain:
            self.custom_domains.add(domain)
        log = _recorder.get()
        if log is not None:
            frozen = tuple((a.name, a.kind.value, _freeze(a.value)) for a in attrs)
            log.append(NodeRecord(self.target, domain, op_type, frozen, len(converted), outputs))
        result = self._add_node(domain, op_type, converted, attrs, outputs)
        return result[0] if outputs == 1 else tuple(result)

    def _input(self, domain: str, op_type: str, index: int, value: Any) -> Any:
        if value is None or self.is_value(value):
            return value
        if isinstance(value, (np.ndarray, torch.Tensor, np.generic)):
            return self.constant(value)
        kind = type(value).__name__
        hint = " Use g.constant(value, like=x) so the dtype is explicit." if isinstance(value, numbers.Number) else ""
        raise SymbolicError(
            f"{self.target}: input {index} of {domain + '::' if domain else ''}{op_type} is a {kind} "
            f"({value!r}); expected a graph value, a numpy array or a torch tensor.{hint}"
        )

    def constant(self, value: Any, *, dtype: Any = None, like: Any = None) -> Any:
        """A Constant node. ``dtype`` (torch/numpy dtype) or ``like`` (a graph value) sets its type."""
        if like is not None:
            dtype = self.dtype(like)
            if dtype is None:
                raise SymbolicError(f"{self.target}: g.constant(like=...) got a value with unknown dtype; pass dtype= explicitly.")
        if isinstance(value, torch.Tensor):
            array = value.detach().cpu().numpy()
        else:
            array = np.asarray(value)
        if dtype is not None:
            array = array.astype(_numpy_dtype(dtype))
        elif array.dtype == np.float64 and not isinstance(value, (np.ndarray, torch.Tensor, np.generic)):
            array = array.astype(np.float32)  # a bare Python float means float32, as in torch
        self._record_constant(array)
        return self._constant(array)

    @abc.abstractmethod
    def is_value(self, value: Any) -> bool: ...

    @abc.abstractmethod
    def dtype(self, value: Any) -> torch.dtype | None:
        """The torch dtype of a graph value, or None when the exporter does not know it."""

    @abc.abstractmethod
    def shape(self, value: Any) -> tuple[int | None, ...] | None:
        """The shape of a graph value (None for a dynamic dim), or None when the rank is unknown."""

    @abc.abstractmethod
    def _add_node(self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int) -> list[Any]: ...

    @abc.abstractmethod
    def _constant(self, array: np.ndarray) -> Any: ...

    def _record_constant(self, array: np.ndarray) -> None:
        log = _recorder.get()
        if log is not None:
            log.append(NodeRecord(self.target, "", "Constant", (("value", "tensor", _freeze(array)),), 0, 1))


def _numpy_dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype == torch.bfloat16:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return torch.empty((), dtype=dtype).numpy().dtype
    return np.dtype(dtype)
