"""Build ONNX function bodies from translations: one decomposition serves both routes.

A translation ``fn(g, *inputs, **attributes)`` written against the exporter-neutral builder ``g``
normally runs inside an exporter with Python attribute values. `build_function` runs the same
function with a `FunctionBuilder`, which records plain ``onnx.NodeProto``s into a
``FunctionProto``, and passes every attribute as an `AttrRef`: a stand-in that becomes an
attribute *reference* (``ref_attr_name``) wherever it reaches the graph, so one body serves every
node of the op type whatever its attribute values.

What a translation must do to be usable as a body:

* turn attributes into graph values with ``g.constant(attr, dtype=...)`` / ``g.constant(attr,
  like=x)`` (also inside lists: ``g.constant([pad_h, pad_w], dtype=np.int64)``) or pass them
  straight to a node attribute (``g.op("LeakyRelu", x, alpha=alpha)``). Python arithmetic or
  branching on an `AttrRef` raises `SymbolicError` (its value is only known at run time);
* take sizes from ``Shape`` at run time, not from ``g.shape`` (a body's shapes are unknown);
* cast with `cast_like` (``Cast`` when the dtype is known, ``CastLike`` from opset 15 on).

Bodies are built at the model's opset (ONNX Runtime inlines a body against the model's
``opset_import``). Below opset 15 ONNX has no ``CastLike``, so there the body is specialised to
the dtypes the model feeds the node (`embed_functions` passes them).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import onnx
import torch
from onnx import AttributeProto, helper, numpy_helper

from onnx_custom.errors import KernelError, SymbolicError
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.translate.attributes import AttrKind, AttrValue
from onnx_custom.translate.builder import GraphBuilder, OutputMeta, onnx_dtype

__all__ = [
    "INT_ATTRIBUTE_LIMIT",
    "AttrRef",
    "FunctionBuilder",
    "TranslationBody",
    "build_function",
    "cast_like",
    "onnx_dtype",
]

_CAST_LIKE_OPSET = 15
_CONSTANT_REF_OPSET = 12  # Constant(value_int=..., value_float=...) exists from opset 12
INT_ATTRIBUTE_LIMIT = 4096  # below opset 12 a body reads INT attributes in [0, 4096) only
_ATTR_TYPES = {
    "int": AttributeProto.INT,
    "float": AttributeProto.FLOAT,
    "string": AttributeProto.STRING,
    "ints": AttributeProto.INTS,
    "floats": AttributeProto.FLOATS,
    "strings": AttributeProto.STRINGS,
}
_CONSTANT_DTYPES = {"int": np.int64, "ints": np.int64, "float": np.float32, "floats": np.float32}


@dataclasses.dataclass(frozen=True)
class AttrRef:
    """The node attribute ``name`` (of kernel attribute type ``kind``) inside a function body."""

    name: str
    kind: str  # int | float | string | ints | floats | strings

    def _runtime_only(self, what: str) -> NoReturn:
        raise SymbolicError(
            f"attribute {self.name!r} is a reference to the node's attribute inside an ONNX "
            f"function body; its value is only known at run time, so {what} is impossible; fix: "
            f"turn it into a graph value with g.constant({self.name}, dtype=...) or "
            f"g.constant({self.name}, like=x) and compute with graph ops."
        )

    def __bool__(self) -> bool:
        self._runtime_only("branching on it in Python")

    def __int__(self) -> int:
        self._runtime_only("int() of it")

    def __float__(self) -> float:
        self._runtime_only("float() of it")

    def __index__(self) -> int:
        self._runtime_only("using it as an index")

    def __iter__(self) -> NoReturn:
        self._runtime_only("iterating over it")

    def __len__(self) -> int:
        self._runtime_only("len() of it")


def _holds_ref(value: Any) -> bool:
    return isinstance(value, AttrRef) or (
        isinstance(value, (list, tuple)) and any(isinstance(v, AttrRef) for v in value)
    )


def _torch_dtype(elem_type: int) -> torch.dtype | None:
    if elem_type == onnx.TensorProto.BFLOAT16:  # NumPy's is ml_dtypes', which torch cannot take
        return torch.bfloat16
    try:
        return torch.from_numpy(np.empty(0, helper.tensor_dtype_to_np_dtype(elem_type))).dtype
    except (KeyError, TypeError, ValueError):
        return None


def cast_like(g: GraphBuilder, value: Any, like: Any) -> Any:
    """``value`` cast to ``like``'s dtype: ``Cast`` when the builder knows it, else ``CastLike``."""
    dtype = g.dtype(like)
    if dtype is not None:
        return g.op("Cast", value, to=onnx_dtype(dtype))
    if g.opset >= _CAST_LIKE_OPSET:
        return g.op("CastLike", value, like)
    raise SymbolicError(
        f"{g.target}: the dtype of a value is unknown and opset {g.opset} has no CastLike "
        f"(opset {_CAST_LIKE_OPSET}+); fix: export at opset >= {_CAST_LIKE_OPSET}, or build the "
        "function body with the dtypes of the node's inputs (embed_functions does this)."
    )


@dataclasses.dataclass(frozen=True)
class _Value:
    """A named value inside a function body."""

    name: str


# Output dtype rules for dtype tracking inside a body (None: unknown).
_LIKE_INPUT0 = frozenset(
    {
        "Abs",
        "Add",
        "Ceil",
        "Clip",
        "Concat",
        "CumSum",
        "Div",
        "Expand",
        "Flatten",
        "Floor",
        "Gather",
        "GatherElements",
        "Gemm",
        "Identity",
        "MatMul",
        "Max",
        "Min",
        "Mul",
        "Neg",
        "Pad",
        "ReduceProd",
        "ReduceSum",
        "Relu",
        "Reshape",
        "ScatterND",
        "Slice",
        "Squeeze",
        "Sub",
        "Sum",
        "Tile",
        "Transpose",
        "Unsqueeze",
    }
)
_BOOLEAN = frozenset({"And", "Equal", "Greater", "IsInf", "IsNaN", "Less", "Not", "Or"})


class FunctionBuilder(GraphBuilder):
    """A `GraphBuilder` that records ``NodeProto``s for a ``FunctionProto``.

    ``dtypes`` maps input names to known dtypes (a body specialised to them); unknown dtypes make
    ``g.constant(v, like=x)`` and `cast_like` emit ``CastLike`` (opset 15+).
    """

    exporter = "function"

    def __init__(
        self,
        opset: int,
        target: str,
        dtypes: Mapping[str, torch.dtype] | None = None,
        *,
        prefix: str = "",
    ) -> None:
        super().__init__(opset, target)
        self.nodes: list[onnx.NodeProto] = []
        self._prefix = prefix  # keeps a loop body's names apart from its enclosing scope's
        self._known = dict(dtypes or {})
        self._dtypes: dict[str, torch.dtype | None] = {}
        self._pending_refs: list[AttributeProto] = []
        self._count = 0
        self.decoded_ints: set[str] = set()  # INT attributes read through EyeLike (opset < 12)

    # -- values -----------------------------------------------------------------------------
    def input(self, name: str) -> _Value:
        self._dtypes[name] = self._known.get(name)
        return _Value(name)

    def is_value(self, value: Any) -> bool:
        return isinstance(value, _Value)

    def dtype(self, value: Any) -> torch.dtype | None:
        return self._dtypes.get(value.name) if isinstance(value, _Value) else None

    def shape(self, value: Any) -> tuple[int | None, ...] | None:
        return None  # a body serves every node: shapes exist only at run time

    # -- nodes ------------------------------------------------------------------------------
    def op(
        self,
        node_type: str,
        *inputs: Any,
        outputs: int = 1,
        output_types: Any = None,
        **attributes: Any,
    ) -> Any:
        refs = {k: v for k, v in attributes.items() if isinstance(v, AttrRef)}
        plain = {k: v for k, v in attributes.items() if k not in refs}
        # Arrays become Constants now, so that the one _add_node below is this node's.
        ready = [
            self.constant(v) if isinstance(v, (np.ndarray, torch.Tensor, np.generic)) else v
            for v in inputs
        ]
        self._pending_refs = [
            AttributeProto(name=k, type=_ATTR_TYPES[v.kind], ref_attr_name=v.name)
            for k, v in refs.items()
        ]
        try:
            return super().op(
                node_type, *ready, outputs=outputs, output_types=output_types, **plain
            )
        finally:
            self._pending_refs = []

    def _set_type(self, value: Any, meta: OutputMeta, index: int | None = None) -> None:
        # A body's values carry no declared types (ORT infers them when it inlines the body);
        # only the dtype is kept, for g.dtype() and g.constant(like=...) in later nodes.
        if meta.dtype is not None and isinstance(value, _Value):
            self._dtypes[value.name] = meta.dtype

    def _add_node(
        self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int
    ) -> list[Any]:
        self._count += 1
        names = [
            f"{self._prefix}_{op_type}{self._count}" + (f"_{i}" if outputs > 1 else "")
            for i in range(outputs)
        ]
        node = helper.make_node(
            op_type,
            ["" if v is None else v.name for v in inputs],
            names,
            name=f"{self._prefix}{op_type}{self._count}",
            domain=domain or None,
        )
        node.attribute.extend(_attribute_proto(a) for a in attrs)
        node.attribute.extend(self._pending_refs)
        self._pending_refs = []
        self.nodes.append(node)
        dtype = self._result_dtype(op_type, inputs, attrs)
        for name in names:
            self._dtypes[name] = dtype
        return [_Value(n) for n in names]

    def _result_dtype(
        self, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue]
    ) -> torch.dtype | None:
        if op_type == "Cast":
            return _torch_dtype(next(a.value for a in attrs if a.name == "to"))
        if op_type in ("Shape", "Size"):
            return torch.int64
        if op_type in _BOOLEAN:
            return torch.bool
        source = {"CastLike": 1, "Where": 1}.get(op_type, 0 if op_type in _LIKE_INPUT0 else None)
        if source is None or len(inputs) <= source:
            return None
        return self.dtype(inputs[source])

    def _constant(self, array: np.ndarray) -> Any:
        (value,) = self._add_node(
            "", "Constant", [], [AttrValue("value", AttrKind.TENSOR, array)], 1
        )
        self._dtypes[value.name] = _torch_dtype(helper.np_dtype_to_tensor_dtype(array.dtype))
        return value

    # -- control flow -----------------------------------------------------------------------
    def loop(
        self,
        trip_count: Any,
        carried: Sequence[Any],
        body: Callable[[FunctionBuilder, Any, list[Any]], Sequence[Any]],
        *,
        scans: int = 0,
    ) -> list[Any]:
        """``Loop`` over ``trip_count`` (int64 scalar) iterations: ``body(sub, i, values)`` builds
        the next ``carried`` values with ``sub``, a builder whose nodes form the loop's body
        graph (outer values may be used in it directly; attribute references may not: read
        them outside the loop), followed by ``scans`` values per iteration that the Loop stacks
        along a new first axis (each iteration's of one shape). Returns the final carried values,
        then the stacked ones."""
        self._count += 1
        sub = FunctionBuilder(self.opset, self.target, prefix=f"{self._prefix}_loop{self._count}")
        sub._dtypes = dict(self._dtypes)  # outer values keep their known dtypes inside
        iteration, condition = sub.input(f"{sub._prefix}_i"), sub.input(f"{sub._prefix}_cond")
        sub._dtypes[iteration.name], sub._dtypes[condition.name] = torch.int64, torch.bool
        state = [sub.input(f"{sub._prefix}_v{j}") for j in range(len(carried))]
        for value, outer in zip(state, carried, strict=True):
            sub._dtypes[value.name] = self.dtype(outer)
        results = list(body(sub, iteration, state))
        if len(results) != len(carried) + scans:
            raise SymbolicError(
                f"{self.target}: a loop body returned {len(results)} values for {len(carried)}"
                f" carried and {scans} scanned."
            )
        keep = sub.op("Identity", condition)
        results = [
            sub.op("Identity", r) if r.name in {v.name for v in state} else r for r in results
        ]
        graph = helper.make_graph(
            sub.nodes,
            f"{sub._prefix}_body",
            [
                helper.make_tensor_value_info(iteration.name, onnx.TensorProto.INT64, []),
                helper.make_tensor_value_info(condition.name, onnx.TensorProto.BOOL, []),
                *(onnx.ValueInfoProto(name=v.name) for v in state),
            ],
            [onnx.ValueInfoProto(name=v.name) for v in (keep, *results)],
        )
        # an explicit (true) condition: onnx.reference's Loop runs no iteration without one
        true = super().constant(np.asarray(True))
        outs = self._add_node("", "Loop", [trip_count, true, *carried], [], len(results))
        self.nodes[-1].attribute.append(helper.make_attribute("body", graph))
        for out, inner in zip(outs, results, strict=True):
            self._dtypes[out.name] = sub.dtype(inner)
        return outs

    # -- constants that may hold attribute references ----------------------------------------
    def constant(self, value: Any, *, dtype: Any = None, like: Any = None) -> Any:
        if _holds_ref(value):
            out = self._reference_constant(value)
            if like is not None:
                return cast_like(self, out, like)
            if dtype is not None and self.dtype(out) != _as_torch(dtype):
                return self.op("Cast", out, to=onnx_dtype(dtype))
            return out
        if like is not None and self.dtype(like) is None:
            return cast_like(self, super().constant(value, dtype=dtype), like)
        return super().constant(value, dtype=dtype, like=like)

    def _reference_constant(self, value: Any) -> Any:
        if isinstance(value, AttrRef):
            if value.kind not in _CONSTANT_DTYPES:
                raise SymbolicError(
                    f"{self.target}: attribute {value.name!r} ({value.kind}) cannot become a"
                    " numeric constant."
                )
            if self.opset < _CONSTANT_REF_OPSET:
                return self._read_attribute_before_12(value)
            (out,) = self._add_node("", "Constant", [], [], 1)
            self.nodes[-1].attribute.append(
                AttributeProto(
                    name=f"value_{value.kind}",
                    type=_ATTR_TYPES[value.kind],
                    ref_attr_name=value.name,
                )
            )
            self._dtypes[out.name] = _as_torch(_CONSTANT_DTYPES[value.kind])
            return out
        pieces = [self._piece(v) for v in value]
        kinds = {self.dtype(p) for p in pieces}
        if len(kinds) > 1:
            raise SymbolicError(
                f"{self.target}: a constant list mixes {sorted(map(str, kinds))}; keep it all ints"
                " or all floats."
            )
        return pieces[0] if len(pieces) == 1 else self.op("Concat", *pieces, axis=0)

    def _read_attribute_before_12(self, ref: AttrRef) -> Any:
        """Constant has no value_int/value_float before opset 12: read the attribute through an
        op that takes one. INT (opset 9+): the column of EyeLike(k=ref)'s 1 in a (1, limit) row,
        so the value must lie in [0, limit) (`build_function` checks the nodes); FLOAT: Gemm(1, 1,
        0, alpha=ref). Both fold to constants when ONNX Runtime loads the model."""
        scalar_shape = super().constant(np.zeros(0, dtype=np.int64))
        if ref.kind == "int":
            if self.opset < 9:
                raise SymbolicError(
                    f"{self.target}: a function body reads INT attribute {ref.name!r} with EyeLike "
                    f"below opset 12, which needs opset >= 9; the model is at opset {self.opset}; "
                    "fix: export at opset >= 9 (>= 12 for any value)."
                )
            row = self.op(
                "ConstantOfShape",
                super().constant(np.asarray([1, INT_ATTRIBUTE_LIMIT], dtype=np.int64)),
            )
            self.decoded_ints.add(ref.name)
            column = self.op("ArgMax", self.op("EyeLike", row, k=ref), axis=1, keepdims=0)
            return self.op("Reshape", column, scalar_shape)
        if ref.kind == "float":
            one = super().constant(np.ones((1, 1), dtype=np.float32))
            zero = super().constant(
                np.zeros((1, 1), dtype=np.float32)
            )  # C is optional only from 11
            return self.op("Reshape", self.op("Gemm", one, one, zero, alpha=ref), scalar_shape)
        raise SymbolicError(
            f"{self.target}: a function body reads list attribute {ref.name!r} ({ref.kind}) only "
            f"from opset {_CONSTANT_REF_OPSET} on (Constant value_{ref.kind}); the model is at "
            f"opset {self.opset}; fix: export at opset >= {_CONSTANT_REF_OPSET}."
        )

    def _piece(self, item: Any) -> Any:
        """One element of a constant list as a 1-D value."""
        if isinstance(item, AttrRef):
            scalar = self._reference_constant(item)
            if item.kind in ("ints", "floats"):
                return scalar
            return self.op("Reshape", scalar, super().constant(np.asarray([1], dtype=np.int64)))
        array = np.asarray([item])
        return super().constant(array.astype(np.int64 if array.dtype.kind in "iub" else np.float32))

    # -- outputs ----------------------------------------------------------------------------
    def bind_outputs(
        self, values: Sequence[Any], names: Sequence[str], inputs: Iterable[str]
    ) -> None:
        """Name the body's outputs: rename their producers, or add Identity where that can't be."""
        renames: dict[str, str] = {}
        produced = {o for n in self.nodes for o in n.output}
        taken = set(inputs)
        for value, name in zip(values, names, strict=True):
            if not isinstance(value, _Value):
                raise SymbolicError(
                    f"{self.target}: output {name!r} is {value!r}; expected a graph value."
                )
            if value.name in produced and value.name not in renames and value.name not in taken:
                renames[value.name] = name
            else:
                self.nodes.append(
                    helper.make_node("Identity", [renames.get(value.name, value.name)], [name])
                )
        for node in self.nodes:
            node.input[:] = [renames.get(n, n) for n in node.input]
            node.output[:] = [renames.get(n, n) for n in node.output]


def _as_torch(dtype: Any) -> torch.dtype | None:
    return dtype if isinstance(dtype, torch.dtype) else _torch_dtype(onnx_dtype(dtype))


def _attribute_proto(attr: AttrValue) -> AttributeProto:
    if attr.kind is AttrKind.TENSOR:
        # not np.ascontiguousarray: it turns a 0-d array (a scalar constant) into shape (1,)
        return helper.make_attribute(
            attr.name, numpy_helper.from_array(np.asarray(attr.value, order="C"))
        )
    kind = {
        AttrKind.INTS: AttributeProto.INTS,
        AttrKind.FLOATS: AttributeProto.FLOATS,
        AttrKind.STRINGS: AttributeProto.STRINGS,
    }
    value = list(attr.value) if isinstance(attr.value, tuple) else attr.value
    return helper.make_attribute(attr.name, value, attr_type=kind.get(attr.kind))


def _resolve(translation: Callable[..., Any] | str) -> Callable[..., Any]:
    if callable(translation):
        return translation
    module_name, _, qualname = str(translation).partition(":")
    if not module_name or not qualname:
        raise KernelError(
            f"function body {translation!r}: expected 'package.module:function' naming a "
            "translation fn(g, *inputs, **attributes); fix: write it like "
            "'onnx_custom.symbolics.bev_pool:bev_pool_v2'."
        )
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise KernelError(
            f"function body {translation!r}: {qualname!r} is not a callable in module"
            f" {module_name!r}."
        )
    return obj  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class TranslationBody:
    """``KernelSpec.function``: the body is ``translation`` (a callable or ``"module:function"``)
    built at the model's opset; ``min_opset`` is the lowest opset its ops exist at."""

    translation: Callable[..., Any] | str
    min_opset: int = 1

    def build(
        self,
        spec: KernelSpec,
        opset: int,
        dtypes: Mapping[str, torch.dtype] | None = None,
        nodes: Sequence[onnx.NodeProto] = (),
    ) -> onnx.FunctionProto:
        if opset < self.min_opset:
            raise KernelError(
                f"the function body of {spec.name} needs opset >= {self.min_opset}, but the model"
                f" imports opset {opset}; fix: export at opset >= {self.min_opset}, or run the"
                " model with the op's kernel instead of its function body."
            )
        return build_function(_resolve(self.translation), spec, opset, dtypes, nodes)


def build_function(
    translation: Callable[..., Any],
    spec: KernelSpec,
    opset: int,
    dtypes: Mapping[str, torch.dtype] | None = None,
    nodes: Sequence[onnx.NodeProto] = (),
) -> onnx.FunctionProto:
    """``spec``'s node as a ``FunctionProto`` of the nodes ``translation`` emits at ``opset``.

    ``dtypes``: input name -> dtype the body may assume (needed below opset 15 when it casts);
    ``nodes``: the nodes it will serve, checked to have attribute values the body can read.
    """
    if any(p.kind == "variadic" for p in spec.inputs + spec.outputs):
        raise KernelError(f"{spec.name}: a function body cannot have variadic inputs or outputs.")
    g = FunctionBuilder(opset, spec.name, dtypes)
    inputs = [g.input(p.name) for p in spec.inputs]
    attrs = {a.name: AttrRef(a.name, a.type) for a in spec.attrs}
    accepted = inspect.signature(translation).parameters
    unknown = [name for name in attrs if name not in accepted]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        raise KernelError(
            f"{spec.name}: its function body {_name(translation)} does not accept the "
            f"node attribute(s) {unknown}; expected keyword parameters named like the kernel's "
            "attributes."
        )
    result = translation(g, *inputs, **attrs)
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(values) != len(spec.outputs):
        raise KernelError(
            f"{spec.name}: its function body returned {len(values)} value(s) but the node has "
            f"{len(spec.outputs)} output(s) {[p.name for p in spec.outputs]}."
        )
    g.bind_outputs(values, [p.name for p in spec.outputs], [p.name for p in spec.inputs])
    _check_readable(spec, g.decoded_ints, nodes)
    imports = [helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, 1) for d in sorted(g.custom_domains)
    ]
    defaults = [
        helper.make_attribute(a.name, a.default, attr_type=_ATTR_TYPES[a.type])
        for a in spec.attrs
        if not a.required and a.default is not None
    ]
    required = [a.name for a in spec.attrs if a.required or a.default is None]
    return helper.make_function(
        spec.domain,
        spec.op_type,
        [p.name for p in spec.inputs],
        [p.name for p in spec.outputs],
        g.nodes,
        opset_imports=imports,
        attributes=required,
        attribute_protos=defaults,
        doc_string=f"{spec.name} in standard ONNX ops (opset {opset}), from {_name(translation)}",
    )


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_readable(spec: KernelSpec, decoded: set[str], nodes: Sequence[onnx.NodeProto]) -> None:
    defaults = spec.attr_defaults()
    for node in nodes:
        given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for name in sorted(decoded):
            value = given.get(name, defaults.get(name))
            if value is not None and not 0 <= value < INT_ATTRIBUTE_LIMIT:
                raise KernelError(
                    f"{spec.name} node {node.name or '<unnamed>'!r}: attribute {name}={value} is "
                    f"outside [0, {INT_ATTRIBUTE_LIMIT}), the range a function body can read below "
                    f"opset {_CONSTANT_REF_OPSET}; fix: export at opset >= {_CONSTANT_REF_OPSET}."
                )
