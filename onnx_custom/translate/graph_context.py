"""Torch's ``GraphContext`` API emulated on our `GraphBuilder`, for torch-style symbolics.

`TorchStyleGraph` answers ``g.op("Foo", x, alpha_f=0.5, axes_i=[1], outputs=2)``,
``g.op("Constant", value_t=tensor)`` and ``g.opset``, so the nodes are checked and typed exactly
as ours are. Under the dynamo exporter (where torch itself cannot run these functions) tensor
values are `TorchStyleValue`s that answer ``x.type().sizes()`` / ``dim()`` / ``scalarType()`` as
TorchScript values do, so torch's own helpers (``symbolic_helper._get_tensor_sizes``,
``_unsqueeze_helper``, ``_slice_helper``, ...) work on them; a ``Tensor[]`` argument is a
`TorchStyleList` that also answers as torch's packed ``prim::ListConstruct`` value.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.errors import SymbolicError
from onnx_custom.translate.attributes import AttrKind, TypedList, floats, ints, strings
from onnx_custom.translate.parse_args import is_tensor_type

__all__ = ["TorchStyleGraph", "TorchStyleList", "TorchStyleValue"]

# Our `onnx_custom.translate.builder.GraphBuilder` (not imported: the registry imports this
# module, and the builder imports the registry's error helpers).
Builder = Any

_ATTR = re.compile(r"^(?P<name>.+)_(?P<kind>is|fs|ss|ty|[ifstgz])$")


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

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch._C.TensorType  # `isinstance(x.type(), TensorType)` (torch's helpers)

    def symbolic_sizes(self) -> list[int] | None:
        shape = self.varyingSizes()  # torch: a negative number for a symbolic dim
        return None if shape is None else [-1 if d is None else d for d in shape]

    def strides(self) -> list[int] | None:
        shape = self.varyingSizes()
        if shape is None or any(d is None for d in shape):
            return None
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= max(int(size), 1)  # type: ignore[arg-type]
        return strides[::-1]

    def device(self) -> None:
        return None  # the export's values have no device

    def requires_grad(self) -> bool:
        return False

    def undefined(self) -> bool:
        return False

    def contiguous(self) -> _TorchStyleType:
        return self

    def with_device(self, _device: Any) -> _TorchStyleType:
        return self

    def __repr__(self) -> str:
        return f"Tensor({self.dtype()}, {self.varyingSizes()})"

    str = __repr__  # TensorType.str()


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
        raise self._owner.node_error(f"node().kindOf({name!r})")

    def t(self, name: str) -> torch.Tensor:
        tensor = self._constant() if name == "value" else None
        if tensor is None:
            raise self._owner.node_error(f"node().t({name!r})")
        return tensor

    def mustBeNone(self) -> bool:
        return False

    def sourceRange(self) -> str:
        return ""  # torch's SymbolicValueError reads it to build its message: keep that message

    def scopeName(self) -> str:
        return ""

    def output(self) -> TorchStyleValue:
        return self._owner

    def outputs(self) -> list[TorchStyleValue]:
        return [self._owner]

    def hasAttribute(self, name: str) -> bool:
        return name == "value" and self._constant() is not None

    def attributeNames(self) -> list[str]:
        return ["value"] if self._constant() is not None else []

    def __getattr__(self, name: str) -> Any:
        raise self._owner.node_error(f"node().{name}")


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

    def node_error(self, what: str = "node()") -> SymbolicError:
        return SymbolicError(
            f"{self._builder.target}: a torch-style symbolic called value.node(), TorchScript IR "
            "that the dynamo exporter does not have"
            f"{'' if what == 'node()' else f' (it read value.{what})'}. Fix: read shapes and types"
            " with value.type() (sizes, varyingSizes, dim, scalarType) or symbolic_helper's "
            "_get_tensor_sizes/_get_tensor_rank; non-tensor arguments already arrive as Python "
            "values. Or export this op with exporter='torchscript'."
        )

    def debugName(self) -> str:
        return str(getattr(self.value, "name", "") or "")

    def setType(self, _type: Any) -> TorchStyleValue:
        # Custom nodes are typed from torch's fake kernel (g.outputs) under both exporters.
        return self

    def setTypeAs(self, _other: Any) -> TorchStyleValue:
        return self

    def inferTypeFrom(self, _tensor: Any) -> None:
        return None

    def setDebugName(self, _name: str) -> TorchStyleValue:
        return self  # the exporter names the file's values

    def isCompleteTensor(self) -> bool:
        """Dtype and every dim known (mmcv's adaptive pooling asks before reading sizes())."""
        shape = self._builder.shape(self.value)
        return (
            self._builder.dtype(self.value) is not None
            and shape is not None
            and all(isinstance(d, int) for d in shape)
        )

    def unique(self) -> int:
        return id(self.value)

    def offset(self) -> int:
        index = getattr(self.value, "index", None)
        found = index() if callable(index) else None
        return found if isinstance(found, int) else 0

    def requires_grad(self) -> bool:
        return False

    requiresGrad = requires_grad

    def toIValue(self) -> torch.Tensor | None:
        return self.node()._constant()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise SymbolicError(
            f"{self._builder.target}: a torch-style symbolic called value.{name}, part of"
            " TorchScript's graph API (it rewrites or walks the graph), which the dynamo exporter"
            " does not have. Expected only what reads the value: type() (sizes, varyingSizes,"
            " dim, scalarType, dtype), isCompleteTensor(), node().kind(), debugName(),"
            " toIValue(). Fix: compute with g.op(...) on the value instead of editing the graph,"
            " or export this op with exporter='torchscript'."
        )

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
                if is_tensor_type(type_text)
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
