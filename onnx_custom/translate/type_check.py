"""Input types of every node a translation adds, checked against the node's ONNX schema.

The dynamo exporter writes ``Concat(float, double)`` or ``Reshape(x, float shape)`` as is and ONNX
Runtime refuses the file later, far from the translation. Here both exporters refuse it in
``g.op``, naming the torch op, the node, the input types and the fix. (The ops torch promotes --
``Mul(float16, float constant)``, ``Add(int64, float)`` -- are converted first, as torch would,
by `implicit_casts`.) Standard ops use ``onnx.defs``; a custom node is checked when a schema for
it is registered (kernels and op specs register theirs).

A float16/bfloat16 input that a standard op's schema refuses (``Sin`` before opset 22, ``Mul``
before 13, ...) is deferred, inside our own exports, to the export's half-precision pass, which
computes such nodes in float32 (or, with ``half_precision="strict"``, refuses them naming the op,
dtype and provider): see `deferring_half_precision`. Everywhere else (``half_precision="off"``,
a user's own ``torch.onnx.export`` with our translation table) the schema is enforced here.

Cost: one cached schema digest per (domain, op type, opset) and one dtype read per input.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import onnx
import onnx.defs
import torch

from onnx_custom.errors import SymbolicError

__all__ = [
    "NodeInput",
    "check_node_types",
    "deferring_half_precision",
    "half_precision_deferred",
    "input_constant_dtype",
    "onnx_type_name",
]

_HALF = frozenset({"float16", "bfloat16"})
_HALF_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "onnx_custom_half_deferred", default=False
)


@contextlib.contextmanager
def deferring_half_precision(enabled: bool = True) -> Iterator[None]:
    """Within the block, a standard op's float16/bfloat16 input that its schema refuses but whose
    type constraint takes float is left to the export's half-precision pass (see module doc)."""
    token = _HALF_DEFERRED.set(enabled)
    try:
        yield
    finally:
        _HALF_DEFERRED.reset(token)


def half_precision_deferred() -> bool:
    """Whether `check_node_types` is inside a `deferring_half_precision` block (its verdicts
    depend on it: `GraphBuilder.op` keys the checks it remembers with it)."""
    return _HALF_DEFERRED.get()


_TORCH_TO_ONNX_NAME = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
_FROM_ONNX_NAME = {v: k for k, v in _TORCH_TO_ONNX_NAME.items()}


def onnx_type_name(dtype: torch.dtype) -> str | None:
    """``torch.float32`` -> ``"float"`` (the spelling of ``tensor(float)`` in ONNX schemas)."""
    return _TORCH_TO_ONNX_NAME.get(dtype)


@dataclasses.dataclass(frozen=True)
class NodeInput:
    """One actual input of a node: its dtype (None: unknown, not checked) and whether it is a
    Constant node's output (the fix then is to type the constant)."""

    dtype: torch.dtype | None
    constant: bool = False


@dataclasses.dataclass(frozen=True)
class _Formal:
    name: str
    type_str: str  # a type parameter ("T") or a concrete type ("tensor(int64)")
    variadic: bool
    homogeneous: bool


@dataclasses.dataclass(frozen=True)
class _Digest:
    formals: tuple[_Formal, ...]
    allowed: dict[str, frozenset[str]]  # type parameter -> allowed element type names


def _digest(schema: Any) -> _Digest:
    formals = tuple(
        _Formal(
            f.name,
            f.type_str,
            f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic,
            bool(f.is_homogeneous),
        )
        for f in schema.inputs
    )
    allowed = {
        c.type_param_str: frozenset(
            t[len("tensor(") : -1] for t in c.allowed_type_strs if t.startswith("tensor(")
        )
        for c in schema.type_constraints
    }
    return _Digest(formals, allowed)


@functools.cache
def _standard_digest(op_type: str, opset: int) -> _Digest | None:
    try:
        return _digest(onnx.defs.get_schema(op_type, opset, ""))
    except onnx.defs.SchemaError:
        return None


def input_constant_dtype(op_type: str, opset: int, index: int) -> torch.dtype | None:
    """The torch dtype a constant for input ``index`` of a standard op should have: its concrete
    type, or the preferred allowed type of its type parameter; None when it shares input 0's type
    parameter (the constant then follows input 0's dtype) or the schema does not say."""
    digest = _standard_digest(op_type, opset)
    formal = None if digest is None else _formal_of(digest, index)
    if digest is None or formal is None:
        return None
    if formal.type_str.startswith("tensor("):
        return _FROM_ONNX_NAME.get(formal.type_str[len("tensor(") : -1])
    if digest.formals and formal.type_str == digest.formals[0].type_str:
        return None
    allowed = digest.allowed.get(formal.type_str)
    return _FROM_ONNX_NAME.get(_preferred(allowed)) if allowed else None


def _custom_digest(domain: str, op_type: str) -> _Digest | None:
    # Not cached: a kernel or spec may register its schema between two exports.
    if not onnx.defs.has(op_type, domain):
        return None
    try:
        return _digest(onnx.defs.get_schema(op_type, domain=domain))
    except onnx.defs.SchemaError:
        return None


def _formal_of(digest: _Digest, index: int) -> _Formal | None:
    if index < len(digest.formals):
        return digest.formals[index]
    last = digest.formals[-1] if digest.formals else None
    return last if last is not None and last.variadic else None


def _label(index: int, formal: _Formal, item: NodeInput) -> str:
    kind = ", a Constant" if item.constant else ""
    return f"input {index} ({formal.name}: {_name(item.dtype)}{kind})"


def _name(dtype: torch.dtype | None) -> str:
    return "unknown" if dtype is None else (onnx_type_name(dtype) or str(dtype))


def check_node_types(
    target: str,
    node: str,
    domain: str,
    op_type: str,
    opset: int,
    inputs: Sequence[NodeInput | None],
) -> None:
    """`SymbolicError` when the inputs' element types break the node's schema: a type outside a
    constraint's allowed set, or two inputs bound to one type parameter with different types.
    ``node`` names the node before its type (e.g. ``"the translation's node 2,"``); unknown
    dtypes are not checked."""
    digest = _custom_digest(domain, op_type) if domain else _standard_digest(op_type, opset)
    if digest is None:
        return
    bound: dict[str, tuple[int, _Formal, NodeInput]] = {}
    for index, item in enumerate(inputs):
        if item is None or item.dtype is None:
            continue
        formal = _formal_of(digest, index)
        if formal is None:
            return  # arity is checked elsewhere
        name = onnx_type_name(item.dtype)
        if name is None:
            continue
        if formal.type_str.startswith("tensor("):
            wanted = formal.type_str[len("tensor(") : -1]
            if name != wanted:
                raise SymbolicError(
                    f"{_where(target, node, domain, op_type, opset)}: {_label(index, formal, item)}"
                    f" must be {wanted}; received {name}. Fix: {_fix(item, wanted)}."
                )
            continue
        allowed = digest.allowed.get(formal.type_str)
        deferred = (
            not domain
            and name in _HALF
            and allowed is not None
            and "float" in allowed
            and _HALF_DEFERRED.get()
        )
        if allowed is not None and name not in allowed and not deferred:
            raise SymbolicError(
                f"{_where(target, node, domain, op_type, opset)}: {_label(index, formal, item)} has"
                f" type {name}, which {op_type} does not accept for {formal.type_str}; expected one"
                f" of {sorted(allowed)}. Fix: {_fix(item, _preferred(allowed))}."
            )
        if not formal.homogeneous and formal.variadic:
            continue
        first = bound.get(formal.type_str)
        if first is None:
            bound[formal.type_str] = (index, formal, item)
            continue
        first_index, first_formal, first_item = first
        if first_item.dtype != item.dtype:
            # Fix the input that is a constant (or else the later one) to match the other.
            fixed, other, other_index = (
                (first_item, item, index)
                if first_item.constant and not item.constant
                else (item, first_item, first_index)
            )
            raise SymbolicError(
                f"{_where(target, node, domain, op_type, opset)}:"
                f" {_label(first_index, first_formal, first_item)} and"
                f" {_label(index, formal, item)} share type {formal.type_str} and must have the"
                f" same element type; received {_name(first_item.dtype)} and {_name(item.dtype)}."
                " Under the dynamo exporter this file would be invalid (ONNX Runtime refuses it),"
                " under TorchScript it depends on torch's implicit casts. Fix:"
                f" {_fix(fixed, _name(other.dtype), like=f'<input {other_index}>')}."
            )


def _where(target: str, node: str, domain: str, op_type: str, opset: int) -> str:
    return f"{target}: {node} {domain + '::' if domain else ''}{op_type} (opset {opset})"


def _preferred(allowed: frozenset[str]) -> str:
    return next((t for t in ("float", "int64", "bool") if t in allowed), sorted(allowed)[0])


def _fix(item: NodeInput, wanted: str, like: str | None = None) -> str:
    cast = f"g.op('Cast', value, to=onnx.TensorProto.{wanted.upper()})"
    if item.constant:
        hint = (
            f"g.constant(value, like={like})"
            if like
            else f"g.constant(value, dtype=torch.{_torch_name(wanted)})"
        )
        return (
            f"cast the constant: `{hint}` (or in torch style g.op('Constant',"
            f" value_t=torch.tensor(value, dtype=...))), or insert `{cast}`"
        )
    return f"insert `{cast}` before the node"


def _torch_name(onnx_name: str) -> str:
    dtype = _FROM_ONNX_NAME.get(onnx_name)
    return str(dtype).removeprefix("torch.") if dtype is not None else onnx_name
