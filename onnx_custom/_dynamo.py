"""Adapter for the torch.export-based exporter (``torch.onnx.export(..., dynamo=True)``).

Each registry target becomes a plain Python function in ``custom_translation_table``. When the
exporter calls it, an onnxscript tracer (torch's ``OpRecorder``) is the active evaluator; our
builder appends ``onnx_ir`` nodes to it directly, so custom domains need no onnxscript schema and
attribute kinds stay exactly those of `onnx_custom.attributes`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxscript
import torch
from torch.onnx._internal.exporter import _building, _tensors

from onnx_custom.attributes import AttrKind, AttrValue
from onnx_custom.builder import GraphBuilder
from onnx_custom.errors import SymbolicError
from onnx_custom.names import QualifiedName, Target
from onnx_custom.registry import Registry, SymbolicEntry, resolve_registry

__all__ = ["DynamoBuilder", "resolve_overloads", "translation_table"]

_IR_KIND = {
    AttrKind.INT: ir.AttributeType.INT,
    AttrKind.FLOAT: ir.AttributeType.FLOAT,
    AttrKind.STRING: ir.AttributeType.STRING,
    AttrKind.INTS: ir.AttributeType.INTS,
    AttrKind.FLOATS: ir.AttributeType.FLOATS,
    AttrKind.STRINGS: ir.AttributeType.STRINGS,
}


class DynamoBuilder(GraphBuilder):
    exporter = "dynamo"

    def __init__(self, recorder: Any, opset: int, target: str) -> None:
        super().__init__(opset, target)
        self.recorder = recorder

    def is_value(self, value: Any) -> bool:
        return isinstance(value, ir.Value)

    def dtype(self, value: Any) -> torch.dtype | None:
        dtype = getattr(value, "dtype", None)
        if dtype is None:
            return None
        try:
            return _ONNX_TO_TORCH[int(dtype)]
        except KeyError:
            return None

    def shape(self, value: Any) -> tuple[int | None, ...] | None:
        shape = getattr(value, "shape", None)
        if shape is None:
            return None
        return tuple(d if isinstance(d, int) else None for d in shape)

    def _add_node(self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int) -> list[Any]:
        ir_attrs = []
        for attr in attrs:
            if attr.kind is AttrKind.TENSOR:
                ir_attrs.append(ir.AttrTensor(attr.name, ir.tensor(np.ascontiguousarray(attr.value))))
            else:
                value = list(attr.value) if isinstance(attr.value, tuple) else attr.value
                ir_attrs.append(ir.Attr(attr.name, _IR_KIND[attr.kind], value))
        node = ir.Node(
            domain,
            op_type,
            inputs=list(inputs),
            attributes=ir_attrs,
            outputs=[_tensors.SymbolicTensor(self.recorder.opset) for _ in range(outputs)],
        )
        self.recorder.nodes.append(node)
        return list(node.outputs)

    def _constant(self, array: np.ndarray) -> Any:
        (value,) = self._add_node("", "Constant", [], [AttrValue("value", AttrKind.TENSOR, array)], 1)
        value.dtype = ir.DataType(_numpy_to_onnx(array.dtype))
        value.shape = ir.Shape(array.shape)
        return value


def _numpy_to_onnx(dtype: np.dtype) -> int:
    import onnx

    if dtype.name == "bfloat16":
        return onnx.TensorProto.BFLOAT16
    return onnx.helper.np_dtype_to_tensor_dtype(dtype)


def _build_onnx_to_torch() -> dict[int, torch.dtype]:
    import onnx

    table: dict[int, torch.dtype] = {}
    for dt in (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128):
        table[onnx.helper.np_dtype_to_tensor_dtype(torch.empty((), dtype=dt).numpy().dtype)] = dt
    table[onnx.TensorProto.BFLOAT16] = torch.bfloat16
    return table


_ONNX_TO_TORCH = _build_onnx_to_torch()


def _split(schema: torch._C.FunctionSchema, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    inputs: list[Any] = []
    attrs: dict[str, Any] = {}
    for index, param in enumerate(schema.arguments):
        if index < len(args):
            value = args[index]
        elif param.name in kwargs:
            value = kwargs[param.name]
        elif param.has_default_value():
            value = param.default_value
        else:
            value = None
        text = str(param.type)
        if text.startswith("Tensor") or text in ("Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]"):
            inputs.append(list(value) if isinstance(value, (list, tuple)) else value)
        else:
            attrs[param.name] = value
    return inputs, attrs


def _translation(registry: Registry, target: Target, overload: torch._ops.OpOverload, opset: int, entry: SymbolicEntry) -> Any:
    schema = overload._schema
    expected = len(schema.returns)

    def translate(*args: Any, **kwargs: Any) -> Any:
        recorder = onnxscript.evaluator.default()
        if not isinstance(recorder, _building.OpRecorder):
            raise SymbolicError(f"The translation for {target} was called outside the dynamo exporter.")
        inputs, attrs = _split(schema, args, kwargs)
        builder = DynamoBuilder(recorder, opset, str(target))
        result = entry.fn(builder, *inputs, **attrs)
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(values) != expected:
            raise SymbolicError(
                f"The translation for {target} ({entry.source}) returned {len(values)} output(s) "
                f"but the torch op has {expected}. Return one value per torch output (a tuple for several)."
            )
        return values[0] if expected == 1 else tuple(values)

    # Plain parameters without annotations: torch treats every one as an input and dispatches
    # all calls for this overload to us (no signature mismatch warnings).
    translate.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in schema.arguments]
    )
    translate.__name__ = f"onnx_custom_{target.name.name if target.name else 'op'}"
    translate.__qualname__ = f"onnx_custom_translation[{target}]"
    return translate


def resolve_overloads(target: Target) -> list[torch._ops.OpOverload]:
    """The torch OpOverloads a name target covers (all overloads when none is named)."""
    if target.function is not None:
        raise SymbolicError(
            f"{target.function.__qualname__} is a torch.autograd.Function: the dynamo exporter "
            "ignores Function.symbolic and cannot dispatch on it. Wrap the op as a "
            "torch.library.custom_op (with register_fake) and register the translation for that "
            "op's name, or export with exporter='torchscript'."
        )
    name: QualifiedName = target.name  # type: ignore[assignment]
    try:
        packet = getattr(getattr(torch.ops, name.namespace), name.name)
    except (AttributeError, RuntimeError):
        packet = None
    if packet is None:
        return []
    overloads = [name.overload] if name.overload else packet.overloads()
    result = []
    for ovl in overloads:
        try:
            result.append(getattr(packet, ovl))
        except (AttributeError, RuntimeError) as exc:
            raise SymbolicError(f"{name.op} has no overload {ovl!r}; it has {packet.overloads()}.") from exc
    return result


def translation_table(opset: int = 18, registry: Registry | None = None) -> dict[torch._ops.OpOverload, Any]:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)`` at ``opset``.

    Only torch ops that exist in this process (their library is loaded) and have a translation
    valid at ``opset`` are included; autograd.Function targets are skipped (TorchScript only).
    """
    reg = resolve_registry(registry)
    if not isinstance(opset, int) or opset < 1:
        raise SymbolicError(f"opset must be a positive int, got {opset!r}.")
    table: dict[torch._ops.OpOverload, Any] = {}
    for target in reg.targets():
        if target.function is not None:
            continue
        for overload in resolve_overloads(target):
            ovl_target = Target(QualifiedName(target.name.namespace, target.name.name, overload._overloadname))  # type: ignore[union-attr]
            candidates = [e for e in reg.entries_for(ovl_target) if e.opset <= opset]
            if not candidates:
                continue
            entry = reg.lookup(ovl_target, opset, exporter="dynamo")
            table[overload] = _translation(reg, ovl_target, overload, opset, entry)
    return table
