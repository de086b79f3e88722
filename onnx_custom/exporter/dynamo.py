"""Adapter for the torch.export-based exporter (``torch.onnx.export(..., dynamo=True)``).

Each registry target becomes a plain Python function in ``custom_translation_table``. When the
exporter calls it, an onnxscript tracer (torch's ``OpRecorder``) is the active evaluator; our
builder appends ``onnx_ir`` nodes to it directly, so custom domains need no onnxscript schema and
attribute kinds stay exactly those of `onnx_custom.translate.attributes`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import inspect
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxscript
import onnxscript.evaluator
import torch
from onnxscript.onnx_types import TensorType

from onnx_custom.common.torch_onnx import dynamo_exporter
from onnx_custom.errors import InvalidArgumentError, OpsetError, SymbolicError, UnsupportedOpError
from onnx_custom.exporter.dynamo_output_types import fx_node, fx_outputs, value_outputs
from onnx_custom.exporter.output_meta import Outputs, flat_outputs, layout
from onnx_custom.translate.attributes import AttrKind, AttrValue, c_contiguous
from onnx_custom.translate.builder import GraphBuilder, OutputMeta, call_translation
from onnx_custom.translate.names import QualifiedName, Target
from onnx_custom.translate.registry import Registry, SymbolicEntry, resolve_registry
from onnx_custom.translate.scalar_types import dtype_argument
from onnx_custom.translate.torch_symbolics import torch_builtin_newer

_building = dynamo_exporter("_building")
_tensors = dynamo_exporter("_tensors")

__all__ = [
    "DynamoBuilder",
    "check_recording_opset",
    "program_constants",
    "resolve_overloads",
    "translation_table",
    "with_output_count",
]

_IR_KIND = {
    AttrKind.INT: ir.AttributeType.INT,
    AttrKind.FLOAT: ir.AttributeType.FLOAT,
    AttrKind.STRING: ir.AttributeType.STRING,
    AttrKind.INTS: ir.AttributeType.INTS,
    AttrKind.FLOATS: ir.AttributeType.FLOATS,
    AttrKind.STRINGS: ir.AttributeType.STRINGS,
}


# Placeholder name -> value of the program's buffers, parameters and lifted constants, for the
# translations torch's exporter runs: they see those as graph inputs, their values attached later.
_constants: contextvars.ContextVar[Mapping[str, torch.Tensor] | None] = contextvars.ContextVar(
    "onnx_custom_program_constants", default=None
)


@contextlib.contextmanager
def program_constants(program: torch.export.ExportedProgram) -> Iterator[None]:
    """Make the values of ``program``'s buffers, parameters and lifted constants known to
    `DynamoBuilder.constant_value` while it is exported."""
    signature = program.graph_signature
    named = {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **signature.inputs_to_lifted_tensor_constants,
    }
    values: dict[str, torch.Tensor] = {}
    for placeholder, fqn in named.items():
        tensor = program.state_dict.get(fqn)
        if tensor is None:
            tensor = program.constants.get(fqn)
        if isinstance(tensor, torch.Tensor):
            values[placeholder] = tensor
    token = _constants.set(values)
    try:
        yield
    finally:
        _constants.reset(token)


class DynamoBuilder(GraphBuilder):
    exporter = "dynamo"

    def __init__(
        self,
        recorder: Any,
        opset: int,
        target: str,
        outputs: Sequence[OutputMeta] | None = None,
        typings: Sequence[Sequence[int | str | None]] | None = None,
    ) -> None:
        super().__init__(opset, target, outputs)
        self.recorder = recorder
        # How the file spells each output's dims (torch's symbols, renamed after export), and
        # for output_types=: a dim name -> that spelling.
        self._typings = None if typings is None else [list(t) for t in typings]
        self._spelling: dict[str, int | str | None] = {}
        for meta, typing in zip(self._outputs or (), self._typings or (), strict=False):
            for name, spelled in zip(meta.shape or (), typing, strict=False):
                if isinstance(name, str):
                    self._spelling.setdefault(name, spelled)

    fx_node: torch.fx.Node | None = None  # the FX node being translated, when found

    def is_value(self, value: Any) -> bool:
        return isinstance(value, ir.Value)

    def output_users(self, index: int) -> list[str] | None:
        node = self.fx_node
        if node is None or self._outputs is None or not 0 <= index < len(self._outputs):
            return None
        users: list[str] = []
        for user in node.users:
            if user.target is not operator.getitem:
                return None  # the whole tuple flows on: cannot tell per output
            if user.args[1] == index:
                users.extend(str(u.name) for u in user.users)
        return users

    def _is_constant(self, value: Any) -> bool:
        producer = value.producer()
        return (
            producer is not None
            and producer.op_type == "Constant"
            and producer.domain in ("", "ai.onnx")
        )

    def constant_value(self, value: Any) -> np.ndarray | None:
        if not isinstance(value, ir.Value):
            return None
        while (
            (producer := value.producer()) is not None
            and producer.op_type == "Identity"
            and producer.domain in ("", "ai.onnx")
        ):
            value = producer.inputs[0]  # lift_fresh_copy / clone of a constant made in forward
            if value is None:
                return None
        program_value = (_constants.get() or {}).get(value.name or "")  # buffers, lifted constants
        if program_value is not None and value.producer() is None:
            return program_value.detach().cpu().numpy()
        tensor = value.const_value
        if tensor is None and self._is_constant(value):
            attr = value.producer().attributes.get("value")
            tensor = None if attr is None else attr.value
        try:
            return None if tensor is None else np.asarray(tensor.numpy())
        except Exception:  # external data that cannot be read here
            return None

    def dtype(self, value: Any) -> torch.dtype | None:
        return self.dtype_of(value)

    def _small_int_constant(self, value: Any) -> np.ndarray | None:
        """A Constant node's int64 contents when small (axes, shapes, starts): what ONNX shape
        inference needs to infer Unsqueeze/Reshape/Slice outputs, as TorchScript's does."""
        if value.dtype != ir.DataType.INT64 or not self._is_constant(value):
            return None
        array = self.constant_value(value)
        return array if array is not None and array.size <= 64 else None

    @staticmethod
    def dtype_of(value: Any) -> torch.dtype | None:
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

    def _add_node(
        self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int
    ) -> list[Any]:
        ir_attrs = []
        for attr in attrs:
            if attr.kind is AttrKind.TENSOR:
                ir_attrs.append(ir.AttrTensor(attr.name, ir.tensor(c_contiguous(attr.value))))
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
        if not domain:
            _infer_types(node, self.recorder.opset.version, self._small_int_constant)
        return list(node.outputs)

    def _set_type(self, value: Any, meta: OutputMeta, index: int | None = None) -> None:
        if meta.dtype is not None:
            value.dtype = ir.DataType(_TORCH_TO_ONNX[meta.dtype])
        typing = None if index is None or self._typings is None else self._typings[index]
        if typing is not None and meta.shape is not None:
            value.shape = ir.Shape(typing)
        elif meta.shape is not None:
            value.shape = ir.Shape(
                [self._spelling.get(d, d) if isinstance(d, str) else d for d in meta.shape]
            )

    def _constant(self, array: np.ndarray) -> Any:
        (value,) = self._add_node(
            "", "Constant", [], [AttrValue("value", AttrKind.TENSOR, array)], 1
        )
        value.dtype = ir.DataType(_numpy_to_onnx(array.dtype))
        value.shape = ir.Shape(array.shape)
        return value


def _infer_types(
    node: ir.Node, opset: int, int_constant: Callable[[ir.Value], np.ndarray | None]
) -> None:
    """ONNX type inference for one standard node, so ``g.dtype``/``g.shape`` see its outputs
    (the TorchScript exporter infers each node as it is added; torch's dynamo exporter only
    types the values a translation returns). Small int64 Constant inputs (axes, shapes) are
    given as data, so Unsqueeze/Reshape/Slice get their output shapes too: torch's own helpers
    branch on a dim's size (``symbolic_opset11.squeeze`` builds an If when it is unknown).
    Nothing is set when inference cannot tell."""
    import onnx

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
        types, data = {}, {}
        names = []
        for index, value in enumerate(node.inputs):
            if value is None:
                names.append("")
                continue
            if value.dtype is None:
                return
            shape = (
                None
                if value.shape is None
                else [d if isinstance(d, int) else d.value for d in value.shape]
            )
            names.append(f"in{index}")
            types[names[-1]] = onnx.helper.make_tensor_type_proto(int(value.dtype), shape)
            array = int_constant(value)
            if array is not None:
                data[names[-1]] = onnx.numpy_helper.from_array(
                    np.asarray(array, dtype=np.int64), names[-1]
                )
        proto = onnx.helper.make_node(
            node.op_type, names, [f"out{i}" for i in range(len(node.outputs))]
        )
        proto.attribute.extend(ir.serde.serialize_attribute(a) for a in node.attributes.values())
        inferred = onnx.shape_inference.infer_node_outputs(schema, proto, types, data or None)
    except Exception:  # an op or attribute inference does not handle: leave the outputs untyped
        return
    for index, value in enumerate(node.outputs):
        typ = inferred.get(f"out{index}")
        if typ is None or not typ.HasField("tensor_type") or not typ.tensor_type.elem_type:
            continue
        value.dtype = ir.DataType(typ.tensor_type.elem_type)
        if typ.tensor_type.HasField("shape"):
            value.shape = ir.Shape(
                [
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in typ.tensor_type.shape.dim
                ]
            )


def _numpy_to_onnx(dtype: np.dtype) -> int:
    import onnx

    if dtype.name == "bfloat16":
        return onnx.TensorProto.BFLOAT16
    return onnx.helper.np_dtype_to_tensor_dtype(dtype)


def _build_onnx_to_torch() -> dict[int, torch.dtype]:
    import onnx

    table: dict[int, torch.dtype] = {}
    for dt in (
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    ):
        table[onnx.helper.np_dtype_to_tensor_dtype(torch.empty((), dtype=dt).numpy().dtype)] = dt
    table[onnx.TensorProto.BFLOAT16] = torch.bfloat16
    return table


_ONNX_TO_TORCH = _build_onnx_to_torch()
_DYNAMO_LOWEST_RECORDING = 18  # torch's dynamo exporter records at 18 or later
_TORCH_TO_ONNX = {v: k for k, v in _ONNX_TO_TORCH.items()}


def _split(
    schema: torch._C.FunctionSchema, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
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
        if text.startswith("Tensor") or text in (
            "Optional[Tensor]",
            "List[Tensor]",
            "List[Optional[Tensor]]",
        ):
            inputs.append(list(value) if isinstance(value, (list, tuple)) else value)
        else:
            if isinstance(
                value, ir.DataType
            ):  # torch's dispatcher turned the torch.dtype into ONNX's enum
                value = _ONNX_TO_TORCH[int(value)]
            attrs[param.name] = dtype_argument(value, param)
    return inputs, attrs


def _torch_outputs(
    overload: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[Outputs, Any, Any] | None:
    found = fx_outputs(overload)
    if found is None:
        found = value_outputs(overload, args, kwargs, DynamoBuilder.dtype_of)
    return found


def _pack(
    target: Target, values: list[Any], returns: list[int | None] | None, expected: int
) -> Any:
    if returns is None:  # the count was checked by call_translation
        return values[0] if expected == 1 else tuple(values)
    if returns == [None]:
        return values[0]
    if all(r is None for r in returns) or len(returns) == 1:
        return tuple(values)  # several tensors, or the elements of a single Tensor[] return
    raise SymbolicError(
        f"{target} returns a Tensor[] next to other outputs, which the dynamo exporter cannot"
        " carry. Fix: return the list alone (or tensors only), or export with"
        " exporter='torchscript'."
    )


def check_recording_opset(
    target: Target, table_opset: int, recording: int | None, build_opset: int
) -> None:
    """`OpsetError` when the exporter records at another opset than the table was made for: its
    translations were picked (and ``g.opset`` answers) for ``table_opset``, so the file would mix
    opsets or hold the wrong translation, without a word."""
    if recording is None or recording == build_opset:
        return
    raise OpsetError(
        f"translation_table(opset={table_opset}) is used by a dynamo export that records at opset"
        f" {recording} (op {target}); expected the opset the table was made for ({build_opset});"
        f" its translations were chosen for opset {table_opset}. Fix: pass"
        f" translation_table(opset={recording}) to this export (torch's dynamo exporter records at"
        " opset >= 18 and converts down afterwards), or use onnx_custom.export(...,"
        f" opset={table_opset}), which lowers the file itself when that is provably safe.",
        exporter="dynamo",
    )


def _translation(
    registry: Registry,
    target: Target,
    overload: torch._ops.OpOverload,
    opset: int | None,
    entry: SymbolicEntry | None,
    build_opset: int | None = None,
) -> Any:
    """The table's function for ``overload``. ``opset`` None (with ``entry`` None): the entry
    is chosen when the exporter calls it, for the opset it records at."""
    schema = overload._schema
    expected = len(schema.returns)
    arguments = tuple((a.name, str(a.type)) for a in schema.arguments)

    def translate(*args: Any, **kwargs: Any) -> Any:
        recorder = onnxscript.evaluator.default()
        if not isinstance(recorder, _building.OpRecorder):
            raise SymbolicError(
                f"The translation for {target} was called outside the dynamo exporter."
            )
        recording = getattr(recorder.opset, "version", None)
        if opset is None:
            if not isinstance(recording, int):
                raise OpsetError(
                    f"translation_table() for {target}: the dynamo exporter did not say which"
                    f" opset it records at (received {recording!r}); expected an int. Fix: pass"
                    " translation_table(opset=<the opset_version of your export>).",
                    exporter="dynamo",
                )
            at = recording
            chosen = registry.lookup(target, recording, exporter="dynamo")
        else:
            check_recording_opset(
                target, opset, recording, opset if build_opset is None else build_opset
            )
            assert entry is not None
            at, chosen = opset, entry
        found = _torch_outputs(overload, args, kwargs)
        inputs, attrs = _split(schema, args, kwargs)
        if found is None:
            builder = DynamoBuilder(recorder, at, str(target))
            returns = None
        else:
            outputs, typings, names = found
            builder = DynamoBuilder(
                recorder,
                at,
                str(target),
                [names.meta(d) for d in flat_outputs(outputs)],
                typings,
            )
            returns = layout(outputs)
        builder.arguments = arguments
        builder.fx_node = fx_node(overload)
        count = (
            expected if builder._outputs is None else None
        )  # else finish() counts Tensor[] elements
        names = [f"{a.name}: {a.type}" for a in schema.arguments]
        values = builder.finish(
            call_translation(chosen, builder, inputs, attrs, outputs=count, schema_args=names)
        )
        for index, (value, meta) in enumerate(zip(values, builder._outputs or (), strict=False)):
            producer = value.producer()
            if producer is not None and producer.domain not in ("", "ai.onnx"):
                builder._set_type(
                    value, meta, index
                )  # torch re-types it too; in-graph uses see it now
        return _pack(target, values, returns, expected)

    # Plain parameters without annotations: torch treats every one as an input and dispatches
    # all calls for this overload to us (no signature mismatch warnings).
    translate.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for a in schema.arguments
        ]
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
            raise SymbolicError(
                f"{name.op} has no overload {ovl!r}; it has {packet.overloads()}."
            ) from exc
    return result


def translation_table(
    opset: int | None = None,
    registry: Registry | None = None,
    *,
    build_opset: int | None = None,
    extra: Mapping[Any, Any] | None = None,
) -> dict[torch._ops.OpOverload, Any]:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``.

    ``opset`` None (the default): each translation is chosen when the exporter calls it, for
    the opset the export records at (torch's default, or its ``opset_version``), so the table
    fits any export. An explicit ``opset`` picks the translations now and refuses an export
    that records at another opset.

    ``extra``: your own entries (torch op -> translation), merged over ours;
    ``@onnxscript.script`` functions without a return annotation are passed as
    `with_output_count` copies so torch records their outputs.

    Only torch ops that exist in this process (their library is loaded) and have a translation
    valid at ``opset`` are included; autograd.Function targets are skipped (TorchScript only).
    A translation called by an export recording at another opset raises `OpsetError` naming
    both (``build_opset``: the opset the export records at when it is lowered to ``opset``
    afterwards, as `onnx_custom.export` does).
    """
    reg = resolve_registry(registry)
    if opset is not None and (not isinstance(opset, int) or isinstance(opset, bool) or opset < 1):
        raise SymbolicError(
            f"opset must be a positive int; received {opset!r}. Fix: pass the opset of your"
            " torch.onnx.export call, e.g. opset=18."
        )
    table: dict[torch._ops.OpOverload, Any] = {}
    for target in reg.targets():
        if target.function is not None:
            continue
        for overload in resolve_overloads(target):
            ovl_target = Target(
                QualifiedName(target.name.namespace, target.name.name, overload._overloadname)  # type: ignore[union-attr]
            )
            candidates = [
                e for e in reg.entries_for(ovl_target) if opset is None or e.opset <= opset
            ]
            if not candidates:
                continue
            if _torch_translates_anew(reg, ovl_target, opset):
                continue  # torch's precedence: its own newer translation of the ATen op serves
            entry = None if opset is None else reg.lookup(ovl_target, opset, exporter="dynamo")
            table[overload] = _translation(reg, ovl_target, overload, opset, entry, build_opset)
    if extra is not None and not isinstance(extra, Mapping):
        raise InvalidArgumentError(
            "extra must be a mapping from torch ops to translations; received"
            f" {type(extra).__name__}. Fix: pass e.g. extra={{torch.ops.aten.add.Tensor:"
            " my_onnxscript_function}."
        )
    for op, fn in (extra or {}).items():
        table[op] = with_output_count(fn)
    return table


def _torch_translates_anew(reg: Registry, target: Target, opset: int | None) -> bool:
    """Whether torch's own translation of an ATen op is newer than a torch-style symbolic
    registered for an older opset (`torch_builtin_newer`), at ``opset`` (None: the lowest opset
    torch's dynamo exporter records at)."""
    at = _DYNAMO_LOWEST_RECORDING if opset is None else opset
    try:
        entry = reg.lookup(target, at, exporter="dynamo")
    except UnsupportedOpError:
        return False
    return torch_builtin_newer(entry, at) is not None


def with_output_count(fn: Any) -> Any:
    """``fn``, or when it is an ``@onnxscript.script`` function without a return annotation, a
    copy annotated with its real number of outputs.

    torch 2.13's exporter counts a script function's outputs from the return annotation alone:
    without one it records a call with no outputs, which onnxscript 0.7's InlinePass rejects
    ("The number of values and replacements must match"; 0.6 silently dropped the node). The
    copy has its own ``__annotations__`` so the caller's function is left as it was.
    """
    if not isinstance(fn, onnxscript.OnnxFunction) or "return" in fn.__annotations__:
        return fn
    count = len(fn.function_ir.outputs)
    if count == 0:
        return fn
    returns: Any = TensorType if count == 1 else tuple.__class_getitem__((TensorType,) * count)
    annotated = copy.copy(fn)
    annotated.__annotations__ = {**fn.__annotations__, "return": returns}
    return annotated
