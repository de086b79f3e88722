"""Adapter for the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``).

Our registry entries become symbolic functions registered with torch for the duration of a
``with registered(...)`` block; on exit torch's symbolic table is restored exactly as it was.
(torch's own ``unregister_custom_op_symbolic`` leaves an empty function group behind, which makes
the next export fail with ``min() arg is an empty sequence``; we restore the raw entries instead.)
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.common.torch_onnx import torchscript_exporter
from onnx_custom.errors import InvalidArgumentError, SymbolicError
from onnx_custom.exporter.output_meta import Outputs, TensorDesc, flat_outputs, layout
from onnx_custom.exporter.torchscript_mutation import mutations_refused
from onnx_custom.exporter.torchscript_shapes import TAG, TsDims, session, ts_dims
from onnx_custom.translate.attributes import AttrKind, AttrValue, c_contiguous
from onnx_custom.translate.builder import GraphBuilder, OutputMeta, call_translation
from onnx_custom.translate.names import QualifiedName, Target
from onnx_custom.translate.registry import Registry, resolve_registry
from onnx_custom.translate.scalar_types import dtype_argument
from onnx_custom.translate.torch_errors import check_functional
from onnx_custom.translate.torch_symbolics import torch_builtin_newer

ts_registration = torchscript_exporter("registration")
symbolic_helper = torchscript_exporter("symbolic_helper")

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

    def __init__(
        self, ctx: Any, target: str, outputs: Sequence[TensorDesc | None] | None = None
    ) -> None:
        self.ctx = ctx
        self.dims = ts_dims(ctx)
        self._descs = None if outputs is None else list(outputs)
        metas = (
            None
            if outputs is None
            else [OutputMeta() if d is None else self.dims.dims.meta(d) for d in outputs]
        )
        super().__init__(ctx.opset, target, metas)

    def is_value(self, value: Any) -> bool:
        return isinstance(value, torch._C.Value)

    def output_users(self, index: int) -> list[str] | None:
        node = getattr(self.ctx, "original_node", None)
        if (
            node is None
            or self._outputs is None
            or node.outputsSize() != len(self._outputs)
            or not 0 <= index < len(self._outputs)
        ):
            return None  # a Tensor[] return: flat outputs do not map onto the node's
        return [use.user.kind() for use in node.outputsAt(index).uses()]

    def dtype(self, value: Any) -> torch.dtype | None:
        try:
            return value.type().dtype()
        except Exception:
            return None

    def _is_constant(self, value: Any) -> bool:
        return bool(value.node().kind() == "onnx::Constant")

    def constant_value(self, value: Any) -> np.ndarray | None:
        # Module parameters and buffers are graph inputs here (their values are not visible to
        # translations); the trace itself ran the eager op on them.
        if not isinstance(value, torch._C.Value) or value.node().kind() != "onnx::Constant":
            return None
        try:
            return np.asarray(value.node().t("value").numpy())
        except Exception:  # a non-tensor constant
            return None

    def shape(self, value: Any) -> tuple[int | None, ...] | None:
        return self.shape_of(value)

    @staticmethod
    def shape_of(value: Any) -> tuple[int | None, ...] | None:
        try:
            sizes = value.type().varyingSizes()
        except Exception:  # not a tensor type with a known rank
            return None
        return None if sizes is None else tuple(sizes)

    def _add_node(
        self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int
    ) -> list[Any]:
        kwargs: dict[str, Any] = {}
        for attr in attrs:
            value = attr.value
            if attr.kind is AttrKind.TENSOR:
                value = _tensor(value)
            elif attr.kind in (AttrKind.INTS, AttrKind.FLOATS, AttrKind.STRINGS):
                value = list(value)
            kwargs[f"{attr.name}_{_SUFFIX[attr.kind]}"] = value
        args = [self._none() if v is None else v for v in inputs]
        name = f"{domain}::{op_type}" if domain else op_type
        if domain and self.dims.tagging:
            kwargs[f"{TAG}_i"] = self.dims.next_tag  # removed after export (name_derived_dims)
            self.dims.next_tag += 1
        result = self.ctx.op(name, *args, outputs=outputs, **kwargs)
        values = list(result) if outputs > 1 else [result]
        if domain:
            # ONNX shape inference cannot see custom nodes: without a declared type (g.op types
            # them from g.outputs or output_types=) they stay untyped, never a guessed one.
            for value in values:
                value.setType(torch._C.TensorType.get())
        return values

    def _set_type(self, value: Any, meta: OutputMeta, index: int | None = None) -> None:
        desc = None if index is None or self._descs is None else self._descs[index]
        value.setType(self.dims.tensor_type(meta, desc))
        node = value.node()
        if (
            self.dims.tagging
            and self.dims.spec is not None
            and meta.shape is not None
            and node.hasAttribute(TAG)
        ):
            self.dims.spec.tagged[(node.i(TAG), value.offset())] = meta.shape

    def _none(self) -> Any:
        return self.ctx.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())

    def _constant(self, array: np.ndarray) -> Any:
        return self.ctx.op("Constant", value_t=_tensor(array))


def _tensor(array: np.ndarray) -> torch.Tensor:
    """numpy -> torch, bfloat16 included (torch.from_numpy does not know ml_dtypes' bfloat16)."""
    array = c_contiguous(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy() if not array.flags.writeable else array)


# -- argument parsing ---------------------------------------------------------------------


def _schema_for(ctx: Any, op_name: str) -> torch._C.FunctionSchema | None:
    node = getattr(ctx, "original_node", None)
    if node is not None:
        with contextlib.suppress(Exception):
            return (
                node.schema()
                if not isinstance(node.schema(), str)
                else torch._C.parse_schema(node.schema())
            )
    fits = _overload_schemas(op_name, node)
    return fits[0] if len(fits) == 1 else None


def _overload_schemas(op_name: str, node: Any) -> list[torch._C.FunctionSchema]:
    """The op's overload schemas that can have made ``node``. By the ONNX pass torch has turned
    its scalar arguments into tensor constants, so the node has no schema of its own; its input
    count still tells overloads of different arity apart. Named-tensor overloads (``Dimname``
    arguments, which a trace never records) do not count: torch 2.11 still has
    ``aten::softmax.Dimname`` beside ``aten::softmax.int``, both of three arguments."""
    ns, _, name = op_name.partition("::")
    schemas: list[torch._C.FunctionSchema] = []
    with contextlib.suppress(Exception):
        packet = getattr(getattr(torch.ops, ns), name)
        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    if len(schemas) <= 1 or node is None:
        return schemas
    count = node.inputsSize()
    fits = [s for s in schemas if len(s.arguments) == count]
    unnamed = [s for s in fits if "Dimname" not in s.overload_name]
    return unnamed if unnamed else fits


def _is_tensor_type(typ: Any) -> bool:
    text = str(typ)
    return text.startswith("Tensor") or text in ("Optional[Tensor]", "List[Tensor]")


def _constant(value: Any, typ: Any) -> Any:
    text = str(typ)
    if symbolic_helper._is_none(value):
        return None
    optional = text.startswith("Optional[")
    inner = text[len("Optional[") : -1] if optional else text
    desc = {
        "int": "i",
        "float": "f",
        "bool": "b",
        "str": "s",
        "List[int]": "is",
        "List[float]": "fs",
        "SymInt": "i",
        "List[SymInt]": "is",
    }.get(inner)
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
            value = _constant(value, param.type) if isinstance(value, torch._C.Value) else value
            attrs[param.name] = dtype_argument(value, param)
    return inputs, attrs


def _overload(schema: Any) -> Any:
    if schema is None:
        return None
    ns, _, name = schema.name.partition("::")
    with contextlib.suppress(AttributeError, RuntimeError):
        return getattr(getattr(getattr(torch.ops, ns), name), schema.overload_name or "default")
    return None


def _fake_arg(value: Any, typ: Any, dims: TsDims) -> Any:
    if not _is_tensor_type(typ):
        return _constant(value, typ) if isinstance(value, torch._C.Value) else value
    if symbolic_helper._is_none(value):
        return None
    if str(typ) == "List[Tensor]":
        return [dims.describe(v) for v in symbolic_helper._unpack_list(value)]
    return dims.describe(value)


def _node_outputs(node: Any) -> list[Any]:
    """``list(node.outputs())`` without torch's iterator over the values (slow per call; the
    indexed reads are cheap)."""
    return [node.outputsAt(i) for i in range(node.outputsSize())]


def _list_length(output: Any) -> int | None:
    """Elements of a traced ``Tensor[]`` output, read off the prim::ListUnpack that uses it."""
    for use in output.uses():
        if use.user.kind() == "prim::ListUnpack":
            return int(use.user.outputsSize())
    return None


def _traced_outputs(ctx: Any, inputs: Sequence[Any]) -> Outputs | None:
    """No fake run possible: what the trace recorded. Its sizes are the example's, so with any
    dynamic input only the rank is kept (every dim unknown: a symbol of its own in the file)."""
    node = getattr(ctx, "original_node", None)
    if node is None:
        return None
    static = all(
        v is None or (TorchScriptBuilder.shape_of(v) or (None,)).count(None) == 0 for v in inputs
    )
    result: Outputs = []
    for output in _node_outputs(node):
        if str(output.type()).startswith("List["):
            count = _list_length(output)
            if count is None:
                return None
            result.append([TensorDesc(None, None)] * count)
            continue
        dtype, shape = None, None
        with contextlib.suppress(Exception):
            dtype = output.type().dtype()
        with contextlib.suppress(Exception):
            rank = output.type().dim()
            shape = (
                None if rank is None else tuple(output.type().sizes()) if static else (None,) * rank
            )
        result.append(TensorDesc(dtype, shape))
    return result


def _trace_check(ctx: Any) -> Any:
    """``agrees(outputs)`` for `cached_run_fake`: a remembered fake answer must match what the
    trace recorded for this very call (it ran the real op): output count, dtypes, ranks and the
    sizes the fake answer says are static. None without a traced node."""
    node = getattr(ctx, "original_node", None)
    if node is None:
        return None

    def agrees(outputs: Outputs) -> bool:
        traced = _node_outputs(node)
        if len(traced) != len(outputs):
            return False
        for value, desc in zip(traced, outputs, strict=True):
            if isinstance(desc, list):
                count = _list_length(value)
                if count is not None and count != len(desc):
                    return False
                continue
            if not _desc_agrees(value.type(), desc):
                return False
        return True

    return agrees


def _desc_agrees(typ: Any, desc: TensorDesc) -> bool:
    dtype = rank = sizes = None
    with contextlib.suppress(Exception):
        dtype = typ.dtype()
    with contextlib.suppress(Exception):
        rank = typ.dim()
    with contextlib.suppress(Exception):
        sizes = typ.sizes()  # raises unless every size is known
    if dtype is not None and desc.dtype is not None and dtype != desc.dtype:
        return False
    if rank is not None and desc.shape is not None and rank != len(desc.shape):
        return False
    if sizes is not None and desc.shape is not None:
        return all(
            not isinstance(d, int) or d == s for d, s in zip(desc.shape, sizes, strict=False)
        )
    return True


def _expected_outputs(ctx: Any, builder: TorchScriptBuilder) -> int | None:
    """How many values the translation must return when torch's outputs are unknown: the traced
    node's output count (known outputs are counted by `GraphBuilder.finish`, per element of a
    Tensor[] return)."""
    if builder._outputs is not None:
        return None
    node = getattr(ctx, "original_node", None)
    return None if node is None else int(node.outputsSize())


def _finish(
    builder: TorchScriptBuilder, values: tuple[Any, ...], returns: Sequence[int | None] | None
) -> Any:
    """Checked translation values (`call_translation`) -> what torch's symbolic table expects."""
    values = tuple(builder.finish(values))
    if builder._outputs is None:
        return values[0] if len(values) == 1 else values
    for index, (value, meta) in enumerate(zip(values, builder.outputs, strict=True)):
        kind = value.node().kind().split("::")[0]
        # Custom nodes get torch's exact types (symbolic dims included); standard nodes keep
        # ONNX's inference unless it could not even tell the rank.
        if kind not in ("onnx", "prim") or (
            kind == "onnx" and value.type().dim() is None and meta.shape is not None
        ):
            builder._set_type(value, meta, index)
    if returns is None:
        return values[0] if len(values) == 1 else tuple(values)
    packed: list[Any] = []
    position = 0
    for count in returns:
        if count is None:
            packed.append(values[position])
            position += 1
        else:  # a Tensor[] return: torch's prim::ListUnpack symbolic unpacks it again
            items = values[position : position + count]
            packed.append(
                builder.ctx.op("prim::ListConstruct", *items).setType(torch._C.ListType.ofTensors())
            )
            position += count
    return packed[0] if len(packed) == 1 else tuple(packed)


def _call_target(targets: Sequence[Target], schema: Any) -> Target:
    """The target whose translation serves this call. TorchScript keys symbolics by ``ns::op``
    without the overload, so translations of several overloads share one symbolic: the call's
    overload comes from the node's schema (``ns::op.scaled``; a registry lookup falls back to a
    translation of ``ns::op``, all overloads). One overload-less translation serves every call."""
    first = targets[0]
    assert first.name is not None
    if len(targets) == 1 and (schema is None or not first.name.overload):
        return first
    if schema is None:
        names = ", ".join(sorted(str(t) for t in targets))
        raise SymbolicError(
            f"{first.name.op}: the TorchScript exporter records this op without its overload, and "
            "by its ONNX pass the scalar arguments are tensors, so overloads taking as many "
            "arguments cannot be told apart (torch's tracer itself replays one for the other); "
            f"expected one translation for the op, received one per overload ({names}). Fix: "
            "export with exporter='dynamo' (it keeps the overload), or give the overloads "
            "different numbers of arguments or op names."
        )
    return Target(
        QualifiedName(first.name.namespace, first.name.name, schema.overload_name or "default")
    )


def _op_symbolic(registry: Registry, targets: Sequence[Target]) -> Any:
    op_name = targets[0].name.op if targets[0].name is not None else ""

    def symbolic(ctx: Any, *args: Any, **_node_attrs: Any) -> Any:
        schema = _schema_for(ctx, op_name)
        target = _call_target(targets, schema)
        entry = registry.lookup(target, ctx.opset, exporter="torchscript")
        newer = torch_builtin_newer(entry, ctx.opset)
        if newer is not None:  # torch's precedence: its own newer translation of the ATen op
            return _torch_builtin(op_name, newer)(ctx, *args, **_node_attrs)
        check_functional(str(target), schema)
        inputs, attrs = _split_args(op_name, schema, args)
        dims = ts_dims(ctx)
        overload = _overload(schema)
        outputs = None
        if overload is not None and schema is not None:
            fake_args = [
                _fake_arg(v, p.type, dims) for p, v in zip(schema.arguments, args, strict=False)
            ]
            outputs = dims.fake_outputs(overload, fake_args, _trace_check(ctx))
        if outputs is None:
            outputs = _traced_outputs(ctx, [v for v in args if isinstance(v, torch._C.Value)])
        builder = TorchScriptBuilder(
            ctx, str(target), None if outputs is None else flat_outputs(outputs)
        )
        if schema is not None:
            builder.arguments = tuple((a.name, str(a.type)) for a in schema.arguments)
        names = None if schema is None else [f"{a.name}: {a.type}" for a in schema.arguments]
        values = call_translation(
            entry,
            builder,
            inputs,
            attrs,
            outputs=_expected_outputs(ctx, builder),
            schema_args=names,
        )
        return _finish(builder, values, None if outputs is None else layout(outputs))

    symbolic.__qualname__ = f"onnx_custom_symbolic[{op_name}]"
    return symbolic


def _torch_builtin(name: str, opset: int) -> Any:
    """torch's own symbolic for ``name`` registered at ``opset``."""
    group = ts_registration.registry.get_function_group(name)
    assert group is not None
    return group._functions._base[opset]


def _function_symbolic(registry: Registry, target: Target) -> Any:
    assert target.function is not None
    function = target.function
    params = list(inspect.signature(function.forward).parameters)[1:]  # type: ignore[attr-defined]  # drop ctx

    def symbolic(ctx: Any, *args: Any) -> Any:
        entry = registry.lookup(target, ctx.opset, exporter="torchscript")
        inputs = [a for a in args if isinstance(a, torch._C.Value)]
        attrs = {
            name: a
            for name, a in zip(params, args, strict=False)
            if not isinstance(a, torch._C.Value)
        }
        dims = ts_dims(ctx)
        fake_args = [dims.describe(a) if isinstance(a, torch._C.Value) else a for a in args]
        apply = function.apply  # type: ignore[attr-defined]
        outputs = dims.fake_outputs(apply, fake_args, _trace_check(ctx)) or _traced_outputs(
            ctx, inputs
        )
        builder = TorchScriptBuilder(
            ctx, str(target), None if outputs is None else flat_outputs(outputs)
        )
        builder.arguments = tuple(
            (n, "Tensor" if isinstance(a, torch._C.Value) else "Any")
            for n, a in zip(params, args, strict=False)
        )
        values = call_translation(
            entry,
            builder,
            inputs,
            attrs,
            outputs=_expected_outputs(ctx, builder),
            schema_args=params,
        )
        return _finish(builder, values, None)

    return staticmethod(symbolic)


_Plan = tuple[tuple[tuple[type, Any], ...], tuple[tuple[str, Any, tuple[int, ...]], ...]]
# registry -> (its entries when planned, opset, plan): what `registered` installs depends only on
# those, and building the symbolics for every translation again was a third of its time
_PLANS: weakref.WeakKeyDictionary[Registry, tuple[tuple[Any, ...], int | None, _Plan]] = (
    weakref.WeakKeyDictionary()
)


def _plan(reg: Registry, opset: int | None) -> _Plan:
    """``(autograd.Function class, its symbolic)`` and ``(torch op name, symbolic, opsets)`` to
    install for ``reg``'s translations; remembered until ``reg`` changes."""
    entries = reg.entries()
    cached = _PLANS.get(reg)
    if cached is not None and cached[0] is entries and cached[1] == opset:
        return cached[2]
    functions: list[tuple[type, Any]] = []
    ops: list[tuple[str, Any, tuple[int, ...]]] = []
    # the symbolics see the registry through a weak proxy: the cache must not keep it alive (a
    # registry is alive whenever its symbolics run: `registered` holds it)
    weak = weakref.proxy(reg)
    by_name: dict[
        str, list[Target]
    ] = {}  # torch's table is keyed by ns::op: overloads share one symbolic
    for target in reg.targets():
        if target.function is not None:
            functions.append((target.function, _function_symbolic(weak, target)))
            continue
        assert target.name is not None
        by_name.setdefault(target.name.op, []).append(target)
    for name, targets in by_name.items():
        # Custom namespaces start at 1: after export torch looks a custom node named like a
        # torch op (onnx_custom::bev_pool_v2) up at its domain version (1). Our lookup still refuses
        # opsets below the translation's own.
        aten = targets[0].name is not None and targets[0].name.namespace == "aten"
        low = max(TS_MIN_OPSET, min(min(reg.opsets_for(t)) for t in targets)) if aten else 1
        wanted = (
            range(low, TS_MAX_OPSET + 1)
            if opset is None
            else sorted({v for v in (opset, low) if v >= low and (v == opset or low == 1)})
        )
        ops.append((name, _op_symbolic(weak, tuple(targets)), tuple(wanted)))
    plan = (tuple(functions), tuple(ops))
    _PLANS[reg] = (entries, opset, plan)
    return plan


def _new_group(name: str) -> Any:
    """An empty symbolic function group for ``name``, as torch's ``registry.register`` makes one.

    We add our overrides to the group directly: ``register`` builds a new group (and its dicts)
    on every call, even when one exists, which was half of `registered`'s cost.
    """
    if "::" not in name:  # torch's own check in register
        raise ValueError(f"The name must be in the form of 'domain::op', not '{name}'")
    return ts_registration._SymbolicFunctionGroup(name)


@contextlib.contextmanager
def registered(registry: Registry | None = None, *, opset: int | None = None) -> Iterator[Registry]:
    """Make ``registry``'s translations visible to ``torch.onnx.export(..., dynamo=False)``.

    Without ``opset`` they are registered for every opset torch supports (your export's opset is
    unknown here); `onnx_custom.export` passes its opset so only that one is touched.

    Torch's symbolic table (and any ``symbolic`` attribute of autograd.Functions) is restored to
    its exact previous state on exit, also when the body raises. Inside the block a custom op that
    writes into its arguments raises `SymbolicError` (torch's TorchScript passes would drop it).
    """
    reg = resolve_registry(registry)
    if opset is not None and (
        not isinstance(opset, int)
        or isinstance(opset, bool)
        or not TS_MIN_OPSET <= opset <= TS_MAX_OPSET
    ):
        raise InvalidArgumentError(
            f"opset must be None (every opset) or an int in {TS_MIN_OPSET}..{TS_MAX_OPSET} (the"
            f" TorchScript exporter's range); received {opset!r}. Fix: pass your"
            " torch.onnx.export's opset_version, e.g. opset=17."
        )
    table = ts_registration.registry._registry
    # name -> (group existed before, {opset: previous override or _MISSING})
    touched: dict[str, tuple[bool, dict[int, Any]]] = {}
    saved_functions: list[tuple[type, Any]] = []
    try:
        functions, ops = _plan(reg, opset)
        for cls, symbolic in functions:
            saved_functions.append((cls, cls.__dict__.get("symbolic", _MISSING)))
            cls.symbolic = symbolic  # type: ignore[attr-defined]
        for name, fn, wanted in ops:
            group = table.get(name)
            # An empty group is the leftover of torch's unregister_custom_op_symbolic; it breaks
            # the next export ("min() arg is an empty sequence"), so we treat it as absent.
            existed, previous = touched.setdefault(
                name, (group is not None and bool(group._functions), {})
            )
            if not wanted:  # no opset to override: an empty group would break torch's lookup
                continue
            if group is None:
                group = table[name] = _new_group(name)
            by_opset = group._functions
            for version in wanted:
                if version not in previous:
                    previous[version] = by_opset._overrides.get(version, _MISSING)
                by_opset.override(version, fn)  # what registry.register(custom=True) does
        with session(), mutations_refused():
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
