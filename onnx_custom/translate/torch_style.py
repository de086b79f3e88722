"""Symbolic functions written for torch's API (``torch.onnx.register_custom_op_symbolic``), run
unchanged by our exporter-neutral builder under BOTH exporters.

A torch-style symbolic takes every op argument positionally, in schema order and under any
parameter names (``def roi_align(g, input, rois, output_size, scale, ...)``), often decorated
with torch's ``@symbolic_helper.parse_args("v", "v", "is", "f", ...)``, and builds nodes with
torch's ``g.op("Foo", x, alpha_f=0.5, axes_i=[1], outputs=2)`` and
``g.op("Constant", value_t=tensor)``. `torch_style_translation` wraps such a function into one
of our translations: `TorchStyleGraph` speaks torch's ``GraphContext`` API on top of our
`GraphBuilder`, so the nodes are checked and typed exactly as ours are, and under the dynamo
exporter (where torch itself cannot run these functions) tensor values are `TorchStyleValue`s
that answer ``x.type().sizes()`` / ``dim()`` / ``scalarType()`` as TorchScript values do, so
torch's own helpers (``symbolic_helper._get_tensor_sizes``, ``_unsqueeze_helper``,
``_slice_helper``, ...) work on them.

Non-tensor arguments arrive as Python values (what ``parse_args`` or ``_get_const`` would make of
them); an absent ``Tensor?`` as None. A ``Tensor[]`` argument is a `TorchStyleList`: a Python
list of its values that also answers as torch's packed ``prim::ListConstruct`` value, so torch's
own idiom ``symbolic_helper._unpack_list(tensors)`` (its ``cat``/``stack`` symbolics, the tutorials')
works as well as iterating it.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.errors import SymbolicError
from onnx_custom.translate.attributes import AttrKind, TypedList, floats, ints, strings
from onnx_custom.translate.scalar_types import scalar_type_index

__all__ = [
    "TORCH_STYLE_MARK",
    "TorchStyleGraph",
    "TorchStyleList",
    "TorchStyleValue",
    "binds_torch_style",
    "check_codes",
    "parse_args_codes",
    "torch_style_translation",
]

# Our `onnx_custom.translate.builder.GraphBuilder` (not imported: the registry imports this
# module, and the builder imports the registry's error helpers).
Builder = Any

TORCH_STYLE_MARK = "__onnx_custom_torch_style__"  # on a wrapper: the user's function

_CODES = {
    "v": "a value, unconverted",
    "i": "an int",
    "f": "a float",
    "b": "a bool",
    "s": "a str",
    "t": "a torch.Tensor",
    "is": "a list of ints",
    "fs": "a list of floats",
    "none": "unused",
}
_ATTR = re.compile(r"^(?P<name>.+)_(?P<kind>is|fs|ss|ty|[ifstgz])$")


def _is_tensor_type(type_text: str) -> bool:
    return type_text.startswith("Tensor") or type_text in (
        "Optional[Tensor]",
        "List[Tensor]",
        "List[Optional[Tensor]]",
    )


def _code_for(type_text: str) -> str:
    """The parse_args code that fits a schema argument type."""
    inner = type_text[len("Optional[") : -1] if type_text.startswith("Optional[") else type_text
    if _is_tensor_type(inner):
        return "v"
    return {
        "int": "i",
        "SymInt": "i",
        "float": "f",
        "bool": "b",
        "str": "s",
        "List[int]": "is",
        "List[SymInt]": "is",
        "List[float]": "fs",
    }.get(inner, "v")


def parse_args_codes(fn: Any) -> tuple[str, ...] | None:
    """The codes of torch's ``@parse_args(...)`` on ``fn`` (or on a function it wraps), else None."""
    seen = 0
    while fn is not None and seen < 10:
        codes = getattr(fn, "_arg_descriptors", None)
        if isinstance(codes, tuple) and all(isinstance(c, str) for c in codes):
            return codes
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


def _name_of(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _parameter_names(fn: Any, count: int) -> list[str]:
    """The user's own names for the op's arguments (after g), for error messages."""
    try:
        params = list(inspect.signature(inspect.unwrap(fn)).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"<argument {i}>" for i in range(count)]


def binds_torch_style(fn: Any, count: int) -> bool:
    """Whether ``fn(g, a0, ..., a{count-1})`` binds (torch's calling convention)."""
    try:
        inspect.signature(fn).bind(None, *range(count))
    except TypeError:
        return False
    except ValueError:  # no signature (a C callable): let the call decide
        return True
    return True


def check_codes(
    target: str, fn: Any, codes: Sequence[str], arguments: Sequence[tuple[str, str]]
) -> None:
    """`SymbolicError` when ``parse_args`` codes cannot fit the op's schema arguments."""
    names = _parameter_names(fn, len(arguments))
    unknown = [c for c in codes if c not in _CODES]
    if unknown:
        raise SymbolicError(
            f"{target}: the torch-style symbolic {_name_of(fn)} uses @parse_args code(s) {unknown};"
            f" expected codes from {sorted(_CODES)}. Fix: use the code for each argument's type"
            f" ({_codes_hint(arguments)})."
        )
    if len(codes) < len(arguments):
        raise SymbolicError(
            f"{target}: the torch-style symbolic {_name_of(fn)} is decorated"
            f" @parse_args{tuple(codes)!r} ({len(codes)} code(s)) but the op passes"
            f" {len(arguments)} argument(s) [{', '.join(f'{n}: {t}' for n, t in arguments)}]."
            f" Expected one code per argument. Fix: @parse_args({_codes_hint(arguments)})."
        )
    for index, (code, (name, type_text), param) in enumerate(
        zip(codes, arguments, names, strict=False)
    ):
        problem = _static_mismatch(code, type_text)
        if problem:
            raise SymbolicError(
                f"{target}: the torch-style symbolic {_name_of(fn)} declares @parse_args code "
                f"{code!r} ({_CODES[code]}) for argument {index} ({param!r}; schema: {name}: "
                f"{type_text}), but the op passes {problem}. Fix: use {_code_for(type_text)!r} "
                f"for it: @parse_args({_codes_hint(arguments)})."
            )


def _codes_hint(arguments: Sequence[tuple[str, str]]) -> str:
    return ", ".join(repr(_code_for(t)) for _, t in arguments)


def _static_mismatch(code: str, type_text: str) -> str:
    """What the op passes when ``code`` cannot hold it ('' when it fits)."""
    inner = type_text[len("Optional[") : -1] if type_text.startswith("Optional[") else type_text
    if code in ("v", "none"):
        return ""
    if _is_tensor_type(inner):
        return f"a tensor ({type_text}), which stays a graph value"
    fits = {
        "i": ("int", "SymInt", "bool"),
        "b": ("bool", "int"),
        "f": ("float", "int", "SymInt"),
        "s": ("str",),
        "is": ("List[int]", "List[SymInt]"),
        "fs": ("List[float]", "List[int]"),
        "t": ("int", "float", "bool", "List[int]", "List[float]", "Scalar", "number"),
    }[code]
    return "" if inner in fits or inner in ("Any",) else f"a {type_text}"


def _convert(
    target: str, fn: Any, index: int, param: str, code: str, value: Any, type_text: str
) -> Any:
    """``value`` as torch's ``_parse_arg`` would hand it over for ``code``; SymbolicError else."""
    if value is None or code in ("v", "none"):
        return value

    def refuse(expected: str) -> SymbolicError:
        return SymbolicError(
            f"{target}: the torch-style symbolic {_name_of(fn)} declares @parse_args code {code!r}"
            f" for argument {index} ({param!r}; schema type {type_text}) and expects {expected},"
            f" but the op passes {type(value).__name__} {value!r:.60}. Fix: use"
            f" {_code_for(type_text)!r} for it (or convert inside the function)."
        )

    if code in ("i", "b"):
        if isinstance(value, (bool, numbers.Integral)):
            return bool(value) if code == "b" else int(value)
        raise refuse("an int" if code == "i" else "a bool")
    if code == "f":
        if isinstance(value, numbers.Real):
            return float(value)
        raise refuse("a float")
    if code == "s":
        if isinstance(value, str):
            return value
        raise refuse("a str")
    if code in ("is", "fs"):
        if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Real) for v in value):
            if code == "is" and any(not isinstance(v, numbers.Integral) for v in value):
                raise refuse("a list of ints")
            return [int(v) if code == "is" else float(v) for v in value]
        raise refuse("a list of ints" if code == "is" else "a list of floats")
    if code == "t":
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (numbers.Number, list, tuple)):
            return torch.tensor(value)
        raise refuse("a constant convertible to a tensor")
    return value


def _enum_int(value: Any) -> Any:
    """A torch C enum (``symbolic_helper.cast_pytorch_to_onnx["Long"]``,
    ``JitScalarType.onnx_type()``) as the int torch's ``g.op`` writes; anything else unchanged."""
    if type(value).__module__ == "torch._C._onnx" and hasattr(value, "__index__"):
        return int(value)
    return value


# -- values and types under the dynamo exporter -------------------------------------------------


class _TorchStyleType:
    """What ``value.type()`` answers for a TorchScript tensor value, for an ONNX IR value."""

    def __init__(self, builder: Builder, value: Any) -> None:
        self._builder, self._value = builder, value

    def varyingSizes(self) -> list[int | None] | None:
        shape = self._builder.shape(self._value)
        return None if shape is None else list(shape)

    def sizes(self) -> list[int]:
        shape = self.varyingSizes()
        if shape is None or any(d is None for d in shape):
            raise SymbolicError(
                f"{self._builder.target}: x.type().sizes() needs every dim static; this value's "
                f"shape is {shape} (None: dynamic). Fix: use x.type().varyingSizes() or "
                "symbolic_helper._get_tensor_sizes(x), which give None for dynamic dims, or "
                "compute the size in the graph with g.op('Shape', x)."
            )
        return shape  # type: ignore[return-value]

    def dim(self) -> int | None:
        shape = self._builder.shape(self._value)
        return None if shape is None else len(shape)

    def dtype(self) -> torch.dtype | None:
        return self._builder.dtype(self._value)

    def scalarType(self) -> str | None:
        dtype = self.dtype()
        if dtype is None:
            return None
        from onnx_custom.common.torch_onnx import torchscript_exporter

        _type_utils = torchscript_exporter("_type_utils")

        return str(_type_utils.JitScalarType.from_dtype(dtype).scalar_name())

    def isSubtypeOf(self, other: Any) -> bool:
        # a tensor: torch's helpers ask `x.type().isSubtypeOf(TensorType.get())` (and
        # `ListType.ofTensors()` to tell a Tensor[] value: a `TorchStyleList`'s type answers that)
        return isinstance(other, torch._C.TensorType)

    def kind(self) -> str:
        return "TensorType"

    # `out.setType(x.type().with_sizes(...))` / `.with_dtype(...)` (mmcv's symbolics): setType
    # is a no-op here (custom nodes are typed from the fake kernel), so these only need to exist
    def with_sizes(self, _sizes: Any) -> _TorchStyleType:
        return self

    def with_dtype(self, _dtype: Any) -> _TorchStyleType:
        return self

    def __repr__(self) -> str:
        return f"Tensor({self.dtype()}, {self.varyingSizes()})"


class _TorchStyleNode:
    """What ``value.node()`` answers under dynamo: what torch's helpers ask of a graph value.
    A Constant node's output is an ``onnx::Constant`` whose ``t("value")`` is its tensor, as in
    TorchScript: torch's own symbolics (``opset9.select`` under ``_size_helper``, ``squeeze``)
    read such constants with ``_get_const``/``_maybe_get_scalar`` and fail on anything else. Any
    other value is not a constant; other TorchScript IR is a SymbolicError."""

    __slots__ = ("_owner",)

    def __init__(self, owner: TorchStyleValue) -> None:
        self._owner = owner

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch._C.Node  # `_node_get` asserts isinstance(node, _C.Node) before reading t()

    def _constant(self) -> torch.Tensor | None:
        builder, value = self._owner._builder, self._owner.value
        if not builder._is_constant(value):
            return None  # an initializer (buffer, parameter) is a graph input in TorchScript
        array = builder.constant_value(value)
        return None if array is None else torch.from_numpy(np.array(array))

    def kind(self) -> str:
        # neither onnx::Constant nor prim::Constant: not a constant to torch's helpers
        return "onnx_custom::Value" if self._constant() is None else "onnx::Constant"

    def kindOf(self, name: str) -> str:
        if name == "value" and self._constant() is not None:
            return "t"
        raise self._owner.node_error()

    def t(self, name: str) -> torch.Tensor:
        tensor = self._constant() if name == "value" else None
        if tensor is None:
            raise self._owner.node_error()
        return tensor

    def mustBeNone(self) -> bool:
        return False

    def sourceRange(self) -> str:
        return ""  # torch's SymbolicValueError reads it to build its message: keep that message

    def __getattr__(self, name: str) -> Any:
        raise self._owner.node_error()


class TorchStyleValue:
    """A graph value handed to a torch-style symbolic under the dynamo exporter (TorchScript's
    own ``torch._C.Value``s need no wrapper)."""

    __slots__ = ("_builder", "value")

    def __init__(self, builder: Builder, value: Any) -> None:
        self._builder, self.value = builder, value

    # torch's helpers branch on `symbolic_helper._is_value(x)` (isinstance of torch._C.Value):
    # a graph value must not be taken for a Python constant (`_select_helper` would build
    # torch.LongTensor([x])). isinstance reads __class__ after type(); type(x) stays ours.
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch._C.Value

    def type(self) -> _TorchStyleType:
        return _TorchStyleType(self._builder, self.value)

    def node(self) -> _TorchStyleNode:
        return _TorchStyleNode(self)

    def node_error(self) -> SymbolicError:
        return SymbolicError(
            f"{self._builder.target}: a torch-style symbolic called value.node(), TorchScript IR "
            "that the dynamo exporter does not have. Fix: read shapes and types with "
            "value.type() (sizes, varyingSizes, dim, scalarType) or symbolic_helper's "
            "_get_tensor_sizes/_get_tensor_rank; non-tensor arguments already arrive as Python "
            "values. Or export this op with exporter='torchscript'."
        )

    def debugName(self) -> str:
        return str(getattr(self.value, "name", "") or "")

    def setType(self, _type: Any) -> TorchStyleValue:
        # Custom nodes are typed from torch's fake kernel (g.outputs) under both exporters.
        return self

    def __repr__(self) -> str:
        return f"TorchStyleValue({self.value!r})"


class _TensorListType:
    """What ``value.type()`` answers for a TorchScript ``Tensor[]`` value: torch's helpers test
    ``isinstance(x.type(), ListType)`` (`_is_list`, `_is_tensor_list`) and its element type."""

    __slots__ = ()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch._C.ListType

    def getElementType(self) -> Any:
        return torch._C.TensorType.get()

    def isSubtypeOf(self, other: Any) -> bool:
        return isinstance(other, torch._C.ListType) and isinstance(
            other.getElementType(), torch._C.TensorType
        )

    def kind(self) -> str:
        return "ListType"

    def __repr__(self) -> str:
        return "Tensor[]"


class _ListConstructNode:
    """What ``value.node()`` answers for a `TorchStyleList`: the ``prim::ListConstruct`` that
    torch's ``_unpack_list`` / ``_is_packed_list`` look for, with the list's values as inputs."""

    __slots__ = ("_owner",)

    def __init__(self, owner: TorchStyleList) -> None:
        self._owner = owner

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch._C.Node

    def kind(self) -> str:
        return "prim::ListConstruct"

    def inputs(self) -> list[Any]:
        return list(self._owner)

    def mustBeNone(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise self._owner.node_error(name)


class TorchStyleList(list):  # type: ignore[type-arg]
    """A ``Tensor[]`` argument, under both exporters. In torch's exporter it is one packed value
    (``prim::ListConstruct``) that symbolics unpack with ``symbolic_helper._unpack_list``; a list
    of values here would make that helper fail (``'list' object has no attribute 'node'``), so
    this list also passes `_is_value` and answers ``node()``/``type()`` as that packed value."""

    __slots__ = ("_target",)

    def __init__(self, values: Sequence[Any], target: str) -> None:
        super().__init__(values)
        self._target = target

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch._C.Value  # isinstance(x, list) still holds: it reads type(x) first

    def node(self) -> _ListConstructNode:
        return _ListConstructNode(self)

    def type(self) -> _TensorListType:
        return _TensorListType()

    def debugName(self) -> str:
        return ""

    def node_error(self, name: str) -> SymbolicError:
        return SymbolicError(
            f"{self._target}: a torch-style symbolic called node().{name}() on a Tensor[] "
            "argument; only its kind() and inputs() (what symbolic_helper._unpack_list reads) "
            "exist here. Fix: unpack it with symbolic_helper._unpack_list(x) or iterate it."
        )


class TorchStyleGraph:
    """Torch's ``GraphContext`` API (``g.op`` with ``_i/_f/_s/_t`` attribute suffixes,
    ``outputs=n``, ``Constant`` with ``value_t``, ``g.opset``) on top of our `GraphBuilder`."""

    def __init__(self, builder: Builder) -> None:
        self._builder = builder
        self._wrap = builder.exporter != "torchscript"  # TorchScript values are torch's own

    @property
    def opset(self) -> int:
        return self._builder.opset

    @property
    def exporter(self) -> str:
        return self._builder.exporter

    # -- values ------------------------------------------------------------------------------
    def wrap(self, value: Any, type_text: str = "") -> Any:
        if isinstance(value, list):
            values = [self.wrap(v) for v in value]
            return (
                TorchStyleList(values, self._builder.target)
                if _is_tensor_type(type_text)
                else values
            )
        if self._wrap and value is not None and self._builder.is_value(value):
            return TorchStyleValue(self._builder, value)
        return value

    def unwrap(self, value: Any) -> Any:
        if isinstance(value, TorchStyleValue):
            return value.value
        if isinstance(value, (tuple, list)):
            return type(value)(self.unwrap(v) for v in value)
        return value

    # -- torch's GraphContext API ----------------------------------------------------------
    def op(self, opname: str, *raw_args: Any, outputs: int = 1, **kwargs: Any) -> Any:
        """``g.op`` as torch's symbolic functions call it."""
        if not isinstance(opname, str):
            raise SymbolicError(
                f"{self._builder.target}: g.op expects an op name string like 'Add' or"
                f" 'mydomain::Foo'; received {opname!r}."
            )
        node_type = opname.removeprefix("onnx::")
        if node_type.startswith(("aten::", "prim::")):
            raise SymbolicError(
                f"{self._builder.target}: g.op({opname!r}) adds a TorchScript"
                f" {node_type.split('::')[0]} node, which is not ONNX (the dynamo exporter has"
                " none, and ONNX Runtime cannot run it). Fix: build the computation from ONNX ops,"
                " or a custom-domain node with a kernel."
            )
        if node_type in ("If", "Loop") and not any(
            k.split("_")[0] in ("then", "else", "body") for k in kwargs
        ):
            raise SymbolicError(
                f"{self._builder.target}: g.op({opname!r}) without its subgraph attributes: torch's"
                " helpers add the branches afterwards as TorchScript blocks"
                " (jit_utils.add_op_with_blocks; torch's own symbolic_opset11.squeeze does so for"
                " a dim whose size is not known at export), which a translation here cannot build."
                " Fix: avoid the control flow (e.g. g.op('Squeeze', x, axes) when the dim is known"
                " to be 1, or compute the condition with Where), or export this op with"
                " exporter='torchscript' and torch.onnx's own registration."
            )
        attrs = {}
        for key, value in kwargs.items():
            if value is None:
                continue  # torch drops None attributes
            name, converted = self._attribute(opname, key, value)
            attrs[name] = converted
        if node_type == "Constant" and not raw_args and len(attrs) == 1 and "value" in attrs:
            value = attrs["value"]
            if isinstance(value, TypedList) and value.kind in (
                AttrKind.INTS,
                AttrKind.FLOATS,
            ):  # value_i=[1, 2]
                value = np.array(
                    value.values, dtype=np.int64 if value.kind is AttrKind.INTS else np.float32
                )
            return self.wrap(self._builder.constant(value))
        inputs = [self._input(value, raw_args) for value in raw_args]
        result = self._builder.op(node_type, *inputs, outputs=outputs, **attrs)
        return tuple(self.wrap(v) for v in result) if outputs > 1 else self.wrap(result)

    def aten_op(self, operator: str, *args: Any, overload_name: str = "", **kwargs: Any) -> Any:
        raise SymbolicError(
            f"{self._builder.target}: g.at/g.aten_op({operator!r}) emits an ATen fallback node,"
            " which ONNX Runtime cannot run and the dynamo exporter does not have. Fix: express it"
            " with ONNX ops, or a custom-domain node with a kernel (onnx_custom.kernel)."
        )

    at = aten_op

    def onnxscript_op(self, onnx_fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise SymbolicError(
            f"{self._builder.target}: g.onnxscript_op is not supported by onnx-custom's adapter. "
            "Fix: call the ONNX ops with g.op, or register the onnxscript function with "
            "torch.onnx.export(custom_translation_table=...) yourself."
        )

    def __getattr__(self, name: str) -> Any:
        ctx = getattr(self._builder, "ctx", None)
        if ctx is not None and not name.startswith("__"):  # TorchScript: torch's own context
            return getattr(ctx, name)
        raise SymbolicError(
            f"{self._builder.target}: a torch-style symbolic used g.{name}, part of the TorchScript"
            f" graph API, which the {self._builder.exporter} exporter does not have. Expected only"
            " g.op(...) and g.opset. Fix: build nodes with g.op, or export with"
            " exporter='torchscript'."
        )

    # -- conversions --------------------------------------------------------------------------
    def _attribute(self, opname: str, key: str, value: Any) -> tuple[str, Any]:
        match = _ATTR.match(key)
        if match is None:
            return key, value  # no suffix: typed from the Python value, as in our own g.op
        name, kind = match["name"], match["kind"]
        where = f"{self._builder.target}: g.op({opname!r}, {key}=...)"

        def bad(expected: str) -> SymbolicError:
            return SymbolicError(
                f"{where}: the suffix _{kind} means {expected}; received {type(value).__name__} "
                f"{value!r:.60}. Fix: pass {expected}, or use the suffix of the value's type "
                "(_i int(s), _f float(s), _s str(s), _t tensor)."
            )

        if (
            isinstance(value, torch.Tensor)
            and kind in ("i", "f")
            and value.numel() == 1
            and value.dim() <= 1
        ):
            value = value.item()
        many = isinstance(value, (list, tuple))
        if kind in (
            "i",
            "is",
        ):  # torch's own helpers write Cast(to_i=TensorProtoDataType.INT64), a pybind enum
            value = [_enum_int(v) for v in value] if many else _enum_int(value)
        if kind in ("i", "is"):
            items = list(value) if many else [value]
            if not all(isinstance(v, (bool, numbers.Integral)) for v in items):
                raise bad("int(s)")
            return name, (ints([int(v) for v in items]) if many or kind == "is" else int(value))
        if kind in ("f", "fs"):
            items = list(value) if many else [value]
            if not all(isinstance(v, numbers.Real) for v in items):
                raise bad("float(s)")
            return name, (
                floats([float(v) for v in items]) if many or kind == "fs" else float(value)
            )
        if kind in ("s", "ss"):
            items = [
                v.decode() if isinstance(v, bytes) else v
                for v in (list(value) if many else [value])
            ]
            if not all(isinstance(v, str) for v in items):
                raise bad("str(s)")
            return name, (strings(items) if many or kind == "ss" else items[0])
        if kind in ("t", "z"):
            if isinstance(value, (torch.Tensor, np.ndarray)):
                return name, value
            if isinstance(value, (numbers.Number, list, tuple)):
                return name, torch.tensor(value)
            raise bad("a tensor")
        raise SymbolicError(
            f"{where}: attribute kind _{kind} ({'a subgraph' if kind == 'g' else 'a type'}) is not "
            "supported by onnx-custom's torch-style adapter. Expected _i, _f, _s, _t (and their "
            "lists). Fix: express the computation without subgraph/type attributes."
        )

    def _input(self, value: Any, siblings: Sequence[Any]) -> Any:
        if isinstance(value, TorchStyleValue):
            return value.value
        builder = self._builder
        if value is None or builder.is_value(value):
            return value
        if isinstance(value, (bool, numbers.Number)):
            # torch's scalar type analysis: a Python number takes the type of the tensor it meets.
            like = next(
                (builder.dtype(self.unwrap(s)) for s in siblings if self._is_graph_value(s)), None
            )
            if (
                like is not None
                and (like.is_floating_point or not isinstance(value, float))
                and not isinstance(value, bool)
            ):
                return builder.constant(value, dtype=like)
            return builder.constant(value)
        if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Number) for v in value):
            return builder.constant(torch.tensor(value))
        return value  # tensors and arrays: g.op makes constants, anything else it refuses

    def _is_graph_value(self, value: Any) -> bool:
        return isinstance(value, TorchStyleValue) or (
            value is not None and self._builder.is_value(value)
        )


def torch_style_translation(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Our translation ``(g, *inputs, **attributes)`` running the torch-style symbolic ``fn``."""
    if getattr(fn, TORCH_STYLE_MARK, None) is not None:
        return fn
    codes = parse_args_codes(fn)

    def translate(g: Builder, *inputs: Any, **attrs: Any) -> Any:
        arguments = g.arguments
        if arguments is None:  # no schema known: inputs, then the other arguments
            arguments = tuple((f"input{i}", "Tensor") for i in range(len(inputs))) + tuple(
                (k, "Any") for k in attrs
            )
        pending = iter(inputs)
        # a dtype argument as torch.onnx hands it over: its ScalarType index, not a torch.dtype
        values = [
            next(pending, None) if _is_tensor_type(t) else scalar_type_index(attrs.get(n))
            for n, t in arguments
        ]
        if codes is not None:
            check_codes(g.target, fn, codes, arguments)
            names = _parameter_names(fn, len(values))
            values = [
                _convert(g.target, fn, i, names[i], code, value, t)
                for i, (code, value, (_, t)) in enumerate(
                    zip(codes, values, arguments, strict=False)
                )
            ]
        if not binds_torch_style(fn, len(values)):
            raise SymbolicError(
                f"{g.target}: the torch-style symbolic {_name_of(fn)}{_signature(fn)} cannot take"
                f" the op's {len(values)} argument(s)"
                f" [{', '.join(f'{n}: {t}' for n, t in arguments)}] positionally after g, as torch"
                " calls it. Fix: give it one parameter per argument (any names), or defaults for"
                " trailing ones."
            )
        adapter = TorchStyleGraph(g)
        wrapped = (adapter.wrap(v, t) for v, (_, t) in zip(values, arguments, strict=False))
        return adapter.unwrap(fn(adapter, *wrapped))

    functools.update_wrapper(translate, fn)
    setattr(translate, TORCH_STYLE_MARK, fn)
    translate.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("g", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("inputs", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("attributes", inspect.Parameter.VAR_KEYWORD),
        ]
    )
    return translate


def _signature(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
