"""Adapter for the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``).

Our registry entries become symbolic functions registered with torch for the duration of a
``with registered(...)`` block; on exit torch's symbolic table is restored exactly as it was.
(torch's own ``unregister_custom_op_symbolic`` leaves an empty function group behind, which makes
the next export fail with ``min() arg is an empty sequence``; we restore the raw entries instead.)
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.onnx._internal.torchscript_exporter import registration as ts_registration
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from onnx_custom.attributes import AttrKind, AttrValue
from onnx_custom.builder import GraphBuilder
from onnx_custom.errors import SymbolicError
from onnx_custom.names import Target
from onnx_custom.registry import Registry, resolve_registry

__all__ = ["TS_MAX_OPSET", "TS_MIN_OPSET", "TorchScriptBuilder", "registered"]

_MISSING = object()

TS_MIN_OPSET = 7
TS_MAX_OPSET = 20  # highest opset the TorchScript exporter supports in torch 2.13

_SUFFIX = {
    AttrKind.INT: "i",
    AttrKind.INTS: "i",
    AttrKind.FLOAT: "f",
    AttrKind.FLOATS: "f",
    AttrKind.STRING: "s",
    AttrKind.STRINGS: "s",
    AttrKind.TENSOR: "t",
}


class TorchScriptBuilder(GraphBuilder):
    exporter = "torchscript"

    def __init__(self, ctx: Any, target: str) -> None:
        super().__init__(ctx.opset, target)
        self.ctx = ctx

    def is_value(self, value: Any) -> bool:
        return isinstance(value, torch._C.Value)

    def dtype(self, value: Any) -> torch.dtype | None:
        try:
            return value.type().dtype()
        except Exception:
            return None

    def shape(self, value: Any) -> tuple[int | None, ...] | None:
        try:
            sizes = value.type().varyingSizes()
        except Exception:  # not a tensor type with a known rank
            return None
        return None if sizes is None else tuple(sizes)

    def _add_node(self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int) -> list[Any]:
        kwargs: dict[str, Any] = {}
        for attr in attrs:
            value = attr.value
            if attr.kind is AttrKind.TENSOR:
                value = torch.from_numpy(np.ascontiguousarray(value))
            elif attr.kind in (AttrKind.INTS, AttrKind.FLOATS, AttrKind.STRINGS):
                value = list(value)
            kwargs[f"{attr.name}_{_SUFFIX[attr.kind]}"] = value
        args = [self._none() if v is None else v for v in inputs]
        name = f"{domain}::{op_type}" if domain else op_type
        result = self.ctx.op(name, *args, outputs=outputs, **kwargs)
        values = list(result) if outputs > 1 else [result]
        if domain:
            # ONNX shape inference cannot see custom nodes: give their outputs a provisional type
            # (dtype of the first tensor input); outputs returned to torch get the exact type later.
            dtype = next((self.dtype(v) for v in inputs if v is not None and self.dtype(v) is not None), None)
            for value in values:
                typ = torch._C.TensorType.get()
                value.setType(typ.with_dtype(dtype) if dtype is not None else typ)
        return values

    def _none(self) -> Any:
        return self.ctx.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())

    def _constant(self, array: np.ndarray) -> Any:
        return self.ctx.op("Constant", value_t=torch.from_numpy(np.ascontiguousarray(array)))


# -- argument parsing ---------------------------------------------------------------------


def _schema_for(ctx: Any, op_name: str) -> torch._C.FunctionSchema | None:
    node = getattr(ctx, "original_node", None)
    if node is not None:
        with contextlib.suppress(Exception):
            return node.schema() if not isinstance(node.schema(), str) else torch._C.parse_schema(node.schema())
    ns, _, name = op_name.partition("::")
    with contextlib.suppress(Exception):
        packet = getattr(getattr(torch.ops, ns), name)
        overloads = packet.overloads()
        if len(overloads) == 1:
            return getattr(packet, overloads[0])._schema
    return None


def _is_tensor_type(typ: Any) -> bool:
    text = str(typ)
    return text.startswith("Tensor") or text in ("Optional[Tensor]", "List[Tensor]")


def _constant(value: Any, typ: Any) -> Any:
    text = str(typ)
    if symbolic_helper._is_none(value):
        return None
    optional = text.startswith("Optional[")
    inner = text[len("Optional[") : -1] if optional else text
    desc = {"int": "i", "float": "f", "bool": "b", "str": "s", "List[int]": "is", "List[float]": "fs", "SymInt": "i", "List[SymInt]": "is"}.get(inner)
    if desc is not None:
        return symbolic_helper._parse_arg(value, desc)  # type: ignore[arg-type]
    const = symbolic_helper._maybe_get_const(value, "t")
    if isinstance(const, torch.Tensor):
        return const.item() if const.numel() == 1 else const.tolist()
    return const


def _split_args(op_name: str, schema: Any, args: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    if schema is None:  # no schema: everything that is a graph value is an input
        return list(args), {}
    inputs: list[Any] = []
    attrs: dict[str, Any] = {}
    params = schema.arguments
    for param, value in zip(params, args, strict=False):
        if _is_tensor_type(param.type):
            if str(param.type) == "List[Tensor]":
                inputs.append(symbolic_helper._unpack_list(value))
            elif symbolic_helper._is_none(value):
                inputs.append(None)
            else:
                inputs.append(value)
        else:
            attrs[param.name] = _constant(value, param.type) if isinstance(value, torch._C.Value) else value
    return inputs, attrs


def _expected_outputs(ctx: Any) -> int | None:
    node = getattr(ctx, "original_node", None)
    return node.outputsSize() if node is not None else None


def _finish(ctx: Any, target: str, result: Any, expected: int | None) -> Any:
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    if expected is not None and len(values) != expected:
        raise SymbolicError(
            f"The translation for {target} returned {len(values)} output(s) but the torch op has "
            f"{expected}. Return one value per torch output (a tuple for several)."
        )
    node = getattr(ctx, "original_node", None)
    if node is not None:
        for value, original in zip(values, node.outputs(), strict=False):
            # Exact output types (incl. dynamic shapes) come from the traced torch op.
            if value is not None and value.node().kind().split("::")[0] not in ("onnx", "prim"):
                value.setType(original.type())
    return result


def _op_symbolic(registry: Registry, target: Target) -> Any:
    op_name = target.name.op if target.name is not None else ""

    def symbolic(ctx: Any, *args: Any, **_node_attrs: Any) -> Any:
        entry = registry.lookup(target, ctx.opset, exporter="torchscript")
        inputs, attrs = _split_args(op_name, _schema_for(ctx, op_name), args)
        builder = TorchScriptBuilder(ctx, str(target))
        result = entry.fn(builder, *inputs, **attrs)
        return _finish(ctx, str(target), result, _expected_outputs(ctx))

    symbolic.__qualname__ = f"onnx_custom_symbolic[{target}]"
    return symbolic


def _function_symbolic(registry: Registry, target: Target) -> Any:
    assert target.function is not None
    params = list(inspect.signature(target.function.forward).parameters)[1:]  # type: ignore[attr-defined]  # drop ctx

    def symbolic(ctx: Any, *args: Any) -> Any:
        entry = registry.lookup(target, ctx.opset, exporter="torchscript")
        inputs = [a for a in args if isinstance(a, torch._C.Value)]
        attrs = {name: a for name, a in zip(params, args, strict=False) if not isinstance(a, torch._C.Value)}
        result = entry.fn(TorchScriptBuilder(ctx, str(target)), *inputs, **attrs)
        return _finish(ctx, str(target), result, None)

    return staticmethod(symbolic)


@contextlib.contextmanager
def registered(registry: Registry | None = None, *, opset: int | None = None) -> Iterator[Registry]:
    """Make ``registry``'s translations visible to ``torch.onnx.export(..., dynamo=False)``.

    Without ``opset`` they are registered for every opset torch supports (your export's opset is
    unknown here); `onnx_custom.export` passes its opset so only that one is touched.

    Torch's symbolic table (and any ``symbolic`` attribute of autograd.Functions) is restored to
    its exact previous state on exit, also when the body raises.
    """
    reg = resolve_registry(registry)
    table = ts_registration.registry._registry
    # name -> (group existed before, {opset: previous override or _MISSING})
    touched: dict[str, tuple[bool, dict[int, Any]]] = {}
    saved_functions: list[tuple[type, Any]] = []
    try:
        for target in reg.targets():
            if target.function is not None:
                saved_functions.append((target.function, target.function.__dict__.get("symbolic", _MISSING)))
                target.function.symbolic = _function_symbolic(reg, target)  # type: ignore[attr-defined]
                continue
            assert target.name is not None
            name = target.name.op
            group = table.get(name)
            # An empty group is the leftover of torch's unregister_custom_op_symbolic; it breaks
            # the next export ("min() arg is an empty sequence"), so we treat it as absent.
            existed, previous = touched.setdefault(name, (group is not None and bool(group._functions), {}))
            # Custom namespaces start at 1: after export torch looks a custom node named like a
            # torch op (bev::bev_pool_v2) up at its domain version (1). Our lookup still refuses
            # opsets below the translation's own.
            low = max(TS_MIN_OPSET, min(reg.opsets_for(target))) if target.name.namespace == "aten" else 1
            fn = _op_symbolic(reg, target)
            wanted = range(low, TS_MAX_OPSET + 1) if opset is None else sorted({v for v in (opset, low) if v >= low and (v == opset or low == 1)})
            for version in wanted:
                if version not in previous:
                    overrides = group._functions._overrides if group is not None else {}
                    previous[version] = overrides.get(version, _MISSING)
                ts_registration.registry.register(name, version, fn, custom=True)
                group = table[name]
        yield reg
    finally:
        # Undo only our overrides: base symbolics torch registered lazily meanwhile must stay.
        for name, (existed, previous) in touched.items():
            group = table.get(name)
            if group is None:
                continue
            for opset, old in previous.items():
                if old is _MISSING:
                    group._functions.remove_override(opset)
                else:
                    group._functions.override(opset, old)
            if not existed and not group._functions:
                del table[name]  # an empty group is what breaks torch's next export
        for cls, old in reversed(saved_functions):
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(cls, "symbolic")
            else:
                cls.symbolic = old
