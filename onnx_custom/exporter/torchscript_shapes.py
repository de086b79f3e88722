"""Symbolic dims inside the TorchScript exporter.

TorchScript types carry a symbolic dim as a ``ShapeSymbol``: a negative id shared by every value
with that dim. ``dynamic_axes`` gives each named input dim one symbol, and torch writes a symbol
it knows a name for as that ``dim_param``. So a custom node's output keeps "batch" exactly when
its type reuses the input's symbol, which is what `TsDims` arranges: it maps symbol ids to sympy
roots (named from ``dynamic_axes``), and an output dim computed by the fake kernel back to a
symbol id (the input's own when it is the same dim, one fresh symbol per new expression such as
``2*batch``, reused wherever that expression recurs).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx
import sympy
import torch

from onnx_custom.common.onnx_utils import ModelCensus
from onnx_custom.exporter.dim_params import rename_dims, tensor_dims, value_infos
from onnx_custom.exporter.output_meta import DimNames, Outputs, TensorDesc, cached_run_fake
from onnx_custom.translate.builder import OutputMeta

__all__ = [
    "TAG",
    "ExportDims",
    "TsDims",
    "drop_contradicted_output_dims",
    "export_dims",
    "name_derived_dims",
    "recorded_outputs",
    "session",
    "ts_dims",
]


TAG = "onnx_custom_tag"  # temporary attribute marking our custom nodes in our own exports


@dataclasses.dataclass(frozen=True)
class ExportDims:
    """What onnx_custom.export tells the symbolics: input names, their dynamic axes, examples.

    ``tagged`` comes back filled: (node tag, output index) -> that output's dims by name, for
    `name_derived_dims` to give torch's made-up names of derived dims ("2*batch") after export.
    """

    input_names: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]]
    example_shapes: tuple[tuple[int, ...], ...]
    tagged: dict[tuple[int, int], tuple[int | str | None, ...]] = dataclasses.field(
        default_factory=dict
    )


class TsDims:
    """ShapeSymbol ids <-> sympy expressions of named roots, for one TorchScript export graph."""

    def __init__(self, graph: Any, spec: ExportDims | None, *, ours: bool = False) -> None:
        self.graph = graph
        self.spec = spec
        self.tagging = ours and spec is not None  # never tag nodes in the user's own export
        self.next_tag = 0
        self.dims = DimNames()
        self._exprs: dict[int, sympy.Expr] = {}  # fresh symbol id -> the expression it stands for
        self._ids: dict[sympy.Expr, int] = {}
        self._by_name: dict[str, int] = {}
        if spec is None:
            return
        inputs = list(graph.inputs())
        for index, name in enumerate(spec.input_names[: len(inputs)]):
            sizes = _symbolic_sizes(inputs[index])
            for axis, dim_name in spec.dynamic_axes.get(name, {}).items():
                if sizes is None or axis >= len(sizes) or sizes[axis] >= 0:
                    continue
                root = _root(sizes[axis])
                self.dims.names.setdefault(root, dim_name)
                self._by_name.setdefault(dim_name, sizes[axis])
                if index < len(spec.example_shapes) and axis < len(spec.example_shapes[index]):
                    self.dims.hints.setdefault(root, spec.example_shapes[index][axis])

    def expr(self, size: int) -> int | sympy.Expr:
        if size >= 0:
            return size
        return self._exprs.get(size, _root(size))

    def symbol_id(self, dim: int | sympy.Expr | None) -> int:
        """The ShapeSymbol id (or static size) a type should carry for ``dim``."""
        if isinstance(dim, int):
            return dim
        if dim is None:
            return _fresh()  # unknown: a dim of its own
        if dim.is_Integer:
            return int(dim)
        if isinstance(dim, sympy.Symbol) and dim.name.startswith("ts") and dim not in self._ids:
            return -int(dim.name[2:])
        if dim not in self._ids:
            fresh = _fresh()
            self._ids[dim] = fresh
            self._exprs[fresh] = dim
            named = self.dims.name(dim)
            if isinstance(named, str):
                self._by_name.setdefault(named, fresh)
        return self._ids[dim]

    def id_for_name(self, dim: int | str | None) -> int:
        """A user-declared dim (``output_types=``) as a ShapeSymbol id: a known name reuses its
        symbol, a new name gets one fresh symbol (the same for every later use)."""
        if isinstance(dim, int):
            return dim
        if dim is None:
            return _fresh()
        if dim not in self._by_name:
            self._by_name[dim] = _fresh()
        return self._by_name[dim]

    def fake_outputs(
        self, fn: Any, args: Sequence[Any], agrees: Callable[[Outputs], bool] | None = None
    ) -> Outputs | None:
        """`run_fake` through `cached_run_fake`: a symbolic fake run costs milliseconds, a
        model repeats its blocks and is exported again (``agrees``: see there)."""
        return cached_run_fake(fn, args, self.dims, agrees=agrees)

    def describe(self, value: Any) -> TensorDesc:
        typ = value.type()
        dtype = None
        with contextlib.suppress(Exception):
            dtype = typ.dtype()
        sizes = _symbolic_sizes(value)
        shape = None if sizes is None else tuple(self.expr(s) for s in sizes)
        return TensorDesc(dtype, shape)

    def tensor_type(self, meta: OutputMeta, desc: TensorDesc | None = None) -> Any:
        """A TorchScript tensor type for ``meta`` (from ``desc``'s expressions when given)."""
        typ: Any = torch._C.TensorType.get()
        if meta.dtype is not None:
            typ = typ.with_dtype(meta.dtype)
        if desc is not None and desc.shape is not None:
            return typ.with_sizes([self.symbol_id(d) for d in desc.shape])
        if meta.shape is not None:
            return typ.with_sizes([self.id_for_name(d) for d in meta.shape])
        return typ


def _fresh() -> int:
    """A new ShapeSymbol id: a symbolic dim equal to no other."""
    return int(torch._C._new_symbolic_shape_symbol())  # type: ignore[attr-defined]


def _root(symbol_id: int) -> sympy.Symbol:
    return sympy.Symbol(f"ts{-symbol_id}", integer=True, positive=True)


def _symbolic_sizes(value: Any) -> list[int] | None:
    try:
        sizes = value.type().symbolic_sizes()
    except Exception:  # not a tensor type
        return None
    return None if sizes is None else list(sizes)


# -- one state per export -----------------------------------------------------------------


@dataclasses.dataclass
class _Session:
    spec: ExportDims | None = None
    dims: TsDims | None = None


_session: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "onnx_custom_ts_session", default=None
)
_export_spec: contextvars.ContextVar[ExportDims | None] = contextvars.ContextVar(
    "onnx_custom_ts_export", default=None
)


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Scope of a ``registered()`` block: symbol bookkeeping lives and dies with it."""
    token = _session.set(_Session(spec=_export_spec.get()))
    try:
        yield
    finally:
        _session.reset(token)


@contextlib.contextmanager
def export_dims(spec: ExportDims) -> Iterator[None]:
    """Set by onnx_custom.export around its TorchScript export: the dim names it asked for."""
    token = _export_spec.set(spec)
    try:
        yield
    finally:
        _export_spec.reset(token)


def ts_dims(ctx: Any) -> TsDims:
    """The `TsDims` of the graph ``ctx`` is building (made on first use in each export)."""
    graph = ctx.graph
    state = _session.get()
    if state is None:  # a symbolic called outside registered(): nothing to share across calls
        return TsDims(graph, _spec_from_torch())
    if state.dims is None or state.dims.graph is not graph:
        state.dims = TsDims(graph, state.spec or _spec_from_torch(), ours=state.spec is not None)
    return state.dims


def name_derived_dims(model: Any, spec: ExportDims, *, census: ModelCensus | None = None) -> None:
    """Drop our node tags; where torch named a dim we derived (``Relu4_dim_0``), use the
    expression's name (``2*batch``), as the dynamo exporter writes it; then name the dims
    torch lost downstream of our nodes (`_adopt_inferred_names`). ``census``: the model's, read
    before (tags sit only on nodes with a domain: the others' attributes are not read)."""
    declared = {name for axes in spec.dynamic_axes.values() for name in axes.values()}
    named = any(isinstance(d, str) for names in spec.tagged.values() for d in names)
    infos: dict[str, Any] | None = None  # built only when a tagged output has named dims
    mapping: dict[str, str] = {}
    for node in _all_nodes(model.graph) if census is None else census.domain_nodes:
        tag = next((a for a in node.attribute if a.name == TAG), None)
        if tag is None:
            continue
        node.attribute.remove(tag)
        if not named:
            continue
        if infos is None:
            infos = {info.name: info for info in value_infos(model.graph)}
        for position, output in enumerate(node.output):
            names = spec.tagged.get((tag.i, position))
            info = infos.get(output)
            if names is None or info is None or not info.type.tensor_type.HasField("shape"):
                continue
            for dim, name in zip(info.type.tensor_type.shape.dim, names, strict=False):
                if isinstance(name, str) and dim.dim_param and dim.dim_param not in declared:
                    mapping.setdefault(dim.dim_param, name)
    rename_dims(model, mapping, exact=True, graphs=None if census is None else census.graphs)
    known = declared | {d for names in spec.tagged.values() for d in names if isinstance(d, str)}
    if known:
        _adopt_inferred_names(model, known)


def _adopt_inferred_names(model: Any, known: set[str]) -> None:
    """torch trusts a custom node's declared type only when every output has a static dim; past
    an output like ``[batch, seq]`` it renames the dims of everything downstream
    (``Relu3_dim_0``). ONNX shape inference from our typed custom outputs finds their real names
    again; a torch-made name that inference equates with a known name is renamed to it (a name
    stands for one symbol, so the rename is global). Static sizes are never introduced."""

    def made_up(dim: Any) -> bool:
        return bool(dim.dim_param) and dim.dim_param not in known

    trial = onnx.ModelProto()
    trial.CopyFrom(model)
    for info in [*trial.graph.value_info, *trial.graph.output]:
        if not any(d.dim_param in known for d in tensor_dims(info)):  # not one of our typed outputs
            for dim in tensor_dims(info):
                if made_up(dim):
                    dim.Clear()
    try:
        inferred = onnx.shape_inference.infer_shapes(trial, strict_mode=False)
    except (
        Exception
    ):  # too big for in-memory inference, or a graph onnx cannot read: keep torch's names
        return
    found = {info.name: list(tensor_dims(info)) for info in value_infos(inferred.graph)}
    mapping: dict[str, str] = {}
    clashes: set[str] = set()
    for info in value_infos(model.graph):
        for old, new in zip(tensor_dims(info), found.get(info.name, ()), strict=False):
            if (
                made_up(old)
                and new.dim_param in known
                and mapping.setdefault(old.dim_param, new.dim_param) != new.dim_param
            ):
                clashes.add(old.dim_param)
    rename_dims(model, {k: v for k, v in mapping.items() if k not in clashes}, exact=True)


@contextlib.contextmanager
def recorded_outputs(model: Any) -> Iterator[list[tuple[int, ...]]]:
    """Inside the block, the shapes of the tensors the first call of ``model`` (an nn.Module:
    the trace's call) returns, flattened in order (empty for other callables and ScriptModules)."""
    shapes: list[tuple[int, ...]] = []

    def hook(module: Any, inputs: Any, output: Any) -> None:
        if shapes:
            return
        leaves = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
        # traced sizes are tensors: read with the tracer paused, so nothing is recorded
        state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)  # type: ignore[attr-defined]
        try:
            shapes.extend(tuple(int(d) for d in t.shape) for t in leaves)
        finally:
            torch._C._set_tracing_state(state)  # type: ignore[attr-defined]

    # a ScriptModule takes no Python hooks: its outputs stay unrecorded (nothing is cleared)
    hooked = isinstance(model, torch.nn.Module) and not isinstance(model, torch.jit.ScriptModule)
    handle = model.register_forward_hook(hook) if hooked else None
    try:
        yield shapes
    finally:
        if handle is not None:
            handle.remove()


def drop_contradicted_output_dims(
    model: Any, spec: ExportDims, example_outputs: Sequence[tuple[int, ...]]
) -> None:
    """Clear the graph outputs' ``dim_param``s that the traced outputs contradict.

    torch's shape inference can give one name to dims of different sizes (``squeeze(1)`` of a
    ``[batch, 1, h, w]`` output is declared ``[Squeeze_dim_0, Squeeze_dim_0, Squeeze_dim_2]``);
    a runtime or a user reading that declaration is misled. A name stands for one size in the
    traced example: an input's dim name for that input's example size, any other name for one
    size everywhere it appears. An output dim whose example size is not its name's is left
    unnamed (unknown), which is true. Nothing changes when the outputs' count differs."""
    outputs = list(model.graph.output)
    if len(outputs) != len(example_outputs):
        return
    sizes: dict[str, set[int]] = {}
    for name, shape in zip(spec.input_names, spec.example_shapes, strict=False):
        for axis, dim_name in spec.dynamic_axes.get(name, {}).items():
            if axis < len(shape):
                sizes.setdefault(dim_name, set()).add(shape[axis])
    inputs = set(sizes)
    seen: dict[str, set[int]] = {}
    for info, shape in zip(outputs, example_outputs, strict=True):
        for dim, size in zip(tensor_dims(info), shape, strict=False):
            if dim.dim_param and dim.dim_param not in inputs:
                seen.setdefault(dim.dim_param, set()).add(size)
    sizes |= {name: found for name, found in seen.items() if len(found) == 1}
    for info, shape in zip(outputs, example_outputs, strict=True):
        dims = list(tensor_dims(info))
        if len(dims) != len(shape):
            continue
        for dim, size in zip(dims, shape, strict=True):
            if dim.dim_param and sizes.get(dim.dim_param) != {size}:
                dim.Clear()


def _all_nodes(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def _spec_from_torch() -> ExportDims | None:
    """In the user's own torch.onnx.export: read its dynamic_axes/input_names/args from the
    exporter's frame (torch passes them nowhere we can see). None when not found."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_model_to_graph" and "torch" in frame.f_code.co_filename:
            local = frame.f_locals
            axes = local.get("dynamic_axes") or {}
            names = tuple(local.get("input_names") or ())
            args = local.get("args")
            examples = tuple(tuple(t.shape) for t in _tensors(args))
            if isinstance(axes, Mapping):
                clean = {k: dict(v) for k, v in axes.items() if isinstance(v, Mapping)}
                return ExportDims(names, clean, examples)
            return None
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _tensors(value: Any) -> Sequence[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, Mapping):
        return [t for item in value.values() for t in _tensors(item)]
    return []
