"""One reading of ``dynamic_shapes`` / ``dynamic_axes`` for both exporters.

`resolve_dynamic_shapes` turns every form ``torch.onnx.export`` accepts (a dict keyed by
``forward``'s parameter names, a tuple/list by position, nested containers, string dim names,
``torch.export.Dim`` with ranges, ``Dim.AUTO``/``DYNAMIC``/``STATIC``, TorchScript-style
``dynamic_axes``) into a `DynamicSpec`: the ONNX input names (``forward``'s parameter names,
nested inputs as ``pair_0``/``d_key`` like torch.export), each dynamic axis's dim name, the
``dynamic_shapes`` torch.export needs and the ``dynamic_axes`` the TorchScript exporter needs.
Both exporters read the same spec, so the user's dim names ("batch" stays "batch") and the input
names come out the same from either.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import keyword
import re
import types
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.export.dynamic_shapes import Dim, _DerivedDim, _DimHint, _DimHintType

from onnx_custom.errors import DynamicShapesError

__all__ = ["DimSpec", "DynamicSpec", "InputLeaf", "resolve_dynamic_shapes"]

_FORMS = (
    "a dict keyed by forward's parameter names ({'x': {0: 'batch'}}), a tuple/list with one entry"
    " per input, per tensor a dict {axis: dim} or a list with one entry per axis; a dim is a name"
    " ('batch'), torch.export.Dim('batch', min=.., max=..), Dim.AUTO, Dim.DYNAMIC, Dim.STATIC or"
    " None"
)


@dataclasses.dataclass(frozen=True)
class InputLeaf:
    """One tensor input: where it sits in ``forward``'s arguments and its ONNX name."""

    param: str
    path: tuple[Any, ...]  # keys/indices inside the parameter's value (empty for a plain tensor)
    onnx_name: str
    tensor: torch.Tensor

    @property
    def label(self) -> str:
        inner = "".join(f"[{k!r}]" for k in self.path)
        return f"{self.param}{inner}" if inner else self.param


@dataclasses.dataclass(frozen=True)
class DimSpec:
    """A named dynamic dim: its ONNX ``dim_param``, declared range and where it occurs."""

    name: str
    min: int | None
    max: int | None
    sites: tuple[tuple[str, int], ...]  # (ONNX input name, axis)
    derived: bool = False  # 2 * Dim("n"): an expression of another dim, not a dim of its own
    root: str | None = None  # the dim a derived one is an expression of


@dataclasses.dataclass(frozen=True)
class DynamicSpec:
    """``dynamic_shapes`` resolved against the model's signature and example inputs."""

    leaves: tuple[InputLeaf, ...]
    axes: Mapping[str, Mapping[int, str]]  # ONNX input name -> axis -> dim name
    dims: Mapping[str, DimSpec]
    export_shapes: Any  # for torch.export.export (None when nothing is dynamic)
    torch_names: Mapping[str, str]  # torch.export Dim name -> user dim name (error messages)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(leaf.onnx_name for leaf in self.leaves)

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """TorchScript ``dynamic_axes``: ONNX input name -> {axis: dim name}."""
        return {name: dict(axes) for name, axes in self.axes.items() if axes}

    def without(self, sites: set[tuple[str, int]]) -> DynamicSpec:
        """This spec with the axes at ``sites`` (ONNX input name, axis) made static."""
        if not sites:
            return self
        axes = {
            name: {a: d for a, d in leaf_axes.items() if (name, a) not in sites}
            for name, leaf_axes in self.axes.items()
        }
        used = {d for leaf_axes in axes.values() for d in leaf_axes.values()}
        dims = {
            name: dataclasses.replace(spec, sites=tuple(s for s in spec.sites if s not in sites))
            for name, spec in self.dims.items()
            if name in used or any(d.root == name for d in self.dims.values() if d.name in used)
        }
        return dataclasses.replace(self, axes=axes, dims=dims)

    def metadata(self, used: set[str] | None = None) -> str | None:
        """The ``onnx_custom.dynamic_dims`` JSON for the dims in ``used`` (default: all)."""
        entries = {
            name: {"min": spec.min, "max": spec.max}
            for name, spec in sorted(self.dims.items())
            if not spec.derived and (used is None or name in used)
        }
        return json.dumps(entries, sort_keys=True) if entries else None


# -- inputs -------------------------------------------------------------------------------


# forward's function -> (what inspect.signature reads off it, the bound method's signature, its
# `_Positional`): inspect.signature was a third of resolving a small model's inputs, on every export
_SIGNATURES: weakref.WeakKeyDictionary[
    types.FunctionType, tuple[tuple[Any, ...], inspect.Signature, _Positional | None]
] = weakref.WeakKeyDictionary()
_POSITIONAL_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class _Positional:
    """A signature whose parameters are all positional: their names and how many lack a default.
    Binding ``required..len(names)`` positional arguments to it needs no ``Signature.bind``."""

    names: tuple[str, ...]
    required: int


def _positional(signature: inspect.Signature) -> _Positional | None:
    params = list(signature.parameters.values())
    if not params or any(p.kind not in _POSITIONAL_KINDS for p in params):
        return None
    return _Positional(
        tuple(p.name for p in params), sum(p.default is inspect.Parameter.empty for p in params)
    )


def _signature_basis(function: types.FunctionType) -> tuple[Any, ...]:
    """Everything ``inspect.signature`` of a method of ``function`` depends on, compared by
    identity (a default value may be a tensor, whose ``==`` is no bool)."""
    extra = function.__dict__
    annotations = function.__annotations__
    return (
        function.__code__,
        function.__defaults__,
        function.__kwdefaults__,
        extra.get("__signature__"),
        extra.get("__wrapped__"),
        *annotations.keys(),
        *annotations.values(),
    )


def _signature(model: Any) -> inspect.Signature | None:
    return _signature_entry(model)[0]


def _signature_entry(model: Any) -> tuple[inspect.Signature | None, _Positional | None]:
    """``forward``'s signature and, for a cached plain method, its `_Positional` (None: bind)."""
    forward = getattr(model, "forward", model)
    function = getattr(forward, "__func__", None)
    if not isinstance(function, types.FunctionType) or getattr(forward, "__self__", None) is None:
        function = None  # not a plain method: no cache
    basis = () if function is None else _signature_basis(function)
    cached = None if function is None else _SIGNATURES.get(function)
    if (
        cached is not None
        and len(cached[0]) == len(basis)
        and all(a is b for a, b in zip(cached[0], basis, strict=True))
    ):
        return cached[1], cached[2]
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None, None
    if function is None:
        return signature, None
    positional = _positional(signature)
    _SIGNATURES[function] = (basis, signature, positional)
    return signature, positional


def _signature_params(model: Any) -> list[inspect.Parameter]:
    signature = _signature(model)
    return [] if signature is None else list(signature.parameters.values())


def _bound_inputs(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[tuple[str, Any]]:
    """(parameter name, value) for every input given, in ``forward``'s order."""
    signature, positional = _signature_entry(
        model
    )  # once: inspect.signature is a good part of a small export's own time
    if signature is None or not signature.parameters:  # positional names as torch would make them
        return [(f"input_{i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    if (
        positional is not None
        and not kwargs
        and positional.required <= len(args) <= len(positional.names)
    ):
        return list(
            zip(positional.names, args, strict=False)
        )  # what bind gives: the given arguments, no defaults
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise DynamicShapesError(
            f"The example inputs do not fit forward{signature}: {exc}. "
            "Pass one example per parameter (args tuple, kwargs= for keyword-only ones)."
        ) from exc
    result: list[tuple[str, Any]] = []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            result.extend((f"{name}_{i}", v) for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            result.extend(value.items())
        else:
            result.append((name, value))
    return result


def _walk(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, (*path, i))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, (*path, key))


def _flat_name(param: str, path: tuple[Any, ...]) -> str:
    # torch.export names a nested placeholder by its path: pair[0] -> pair_0, d["a"] -> d_a.
    return "_".join([param, *(re.sub(r"\W", "_", str(k)) for k in path)])


def _leaves(bound: list[tuple[str, Any]], input_names: Sequence[str] | None) -> list[InputLeaf]:
    flat = [(param, path, tensor) for param, value in bound for path, tensor in _walk(value)]
    names = list(input_names or ())
    if len(names) > len(flat):
        raise DynamicShapesError(
            f"input_names has {len(names)} names {names} but the model takes {len(flat)} tensor"
            f" input(s) {[_flat_name(p, k) for p, k, _ in flat]}. Pass at most one name per tensor"
            " input."
        )
    names += [_flat_name(param, path) for param, path, _ in flat[len(names) :]]
    if len(set(names)) != len(names):
        raise DynamicShapesError(
            f"ONNX input names must be unique, got {names}. Pass distinct input_names."
        )
    return [
        InputLeaf(param, path, name, tensor)
        for (param, path, tensor), name in zip(flat, names, strict=True)
    ]


# -- per-tensor axes ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Axis:
    name: str
    torch_dim: Any  # Dim / _DerivedDim / _DimHint, or None for a string name (a Dim is made later)
    min: int | None
    max: int | None
    derived: bool = False
    root: str | None = None


def _bound(value: Any, *, lower: bool) -> int | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return None  # int_oo / None: unbounded
    return None if lower and value <= 0 else int(value)


def _where(leaf: InputLeaf, axis: int) -> str:
    return f"input {leaf.onnx_name!r} (forward argument {leaf.label}) axis {axis}"


def _axis(leaf: InputLeaf, axis: int, dim: Any) -> _Axis | None:
    size = int(leaf.tensor.shape[axis])
    if dim is None:
        return None
    if isinstance(dim, _DimHint):
        if dim.type is _DimHintType.STATIC:
            return None
        return _Axis(
            f"{leaf.onnx_name}_dim{axis}",
            dim,
            _bound(dim.min, lower=True),
            _bound(dim.max, lower=False),
        )
    if isinstance(dim, _DerivedDim):
        return _Axis(dim.__name__, dim, None, None, derived=True, root=dim.root.__name__)  # type: ignore[attr-defined]
    if isinstance(dim, Dim):
        return _Axis(dim.__name__, dim, _bound(dim.min, lower=True), _bound(dim.max, lower=False))
    if isinstance(dim, str):
        if not dim.strip():
            raise DynamicShapesError(
                f"{_where(leaf, axis)}: a dim name must be a non-empty string, got {dim!r}."
            )
        return _Axis(dim, None, None, None)
    if isinstance(dim, int) and not isinstance(dim, bool):
        if dim != size:
            raise DynamicShapesError(
                f"{_where(leaf, axis)} is declared static with size {dim} but the example has size "
                f"{size}. Fix: pass an example of size {dim}, or name the dim to make it dynamic."
            )
        return None
    raise DynamicShapesError(
        f"{_where(leaf, axis)}: unsupported dim {dim!r} ({type(dim).__name__}). Expected {_FORMS}."
    )


def _axes_of(leaf: InputLeaf, spec: Any) -> dict[int, _Axis]:
    if spec is None:
        return {}
    rank = leaf.tensor.dim()
    shape = list(leaf.tensor.shape)
    if isinstance(spec, Mapping):
        items = []
        for key, dim in spec.items():
            if not isinstance(key, int) or isinstance(key, bool):
                raise DynamicShapesError(
                    f"dynamic_shapes for input {leaf.onnx_name!r} has key {key!r}: axes are ints "
                    f"(0..{rank - 1} for its shape {shape}). Fix: {{0: 'batch'}}."
                )
            if not -rank <= key < rank:
                raise DynamicShapesError(
                    f"dynamic_shapes for input {leaf.onnx_name!r} names axis {key}, but the example"
                    f" has {rank} dim(s) (shape {shape}). Fix: use an axis in 0..{rank - 1}."
                )
            items.append((key % rank, dim))
    elif isinstance(spec, (list, tuple)):
        if len(spec) != rank:
            raise DynamicShapesError(
                f"dynamic_shapes for input {leaf.onnx_name!r} lists {len(spec)} dim(s) but the"
                f" example has {rank} (shape {shape}). Fix: one entry per axis (None for static),"
                " or a dict {axis: dim}."
            )
        items = list(enumerate(spec))
    else:
        raise DynamicShapesError(
            f"dynamic_shapes for input {leaf.onnx_name!r} is {spec!r} ({type(spec).__name__}); "
            f"expected {_FORMS}."
        )
    result = {}
    for axis, dim in items:
        resolved = _axis(leaf, axis, dim)
        if resolved is not None:
            result[axis] = resolved
    return result


# -- matching the spec to the inputs ------------------------------------------------------


def _match(
    value: Any, spec: Any, where: str, path: tuple[Any, ...], out: dict[tuple[Any, ...], Any]
) -> None:
    """Walk ``spec`` alongside ``value``; per tensor leaf record its axes spec under its path."""
    if isinstance(value, torch.Tensor):
        out[path] = spec
        return
    if spec is None:
        return
    if isinstance(value, (list, tuple)):
        if not isinstance(spec, (list, tuple)) or len(spec) != len(value):
            raise DynamicShapesError(
                f"dynamic_shapes for {where} must mirror its value, a {type(value).__name__} of"
                f" {len(value)}: expected a list/tuple of {len(value)} entries (None for static),"
                f" got {spec!r}."
            )
        for i, (item, sub) in enumerate(zip(value, spec, strict=True)):
            _match(item, sub, f"{where}[{i}]", (*path, i), out)
    elif isinstance(value, Mapping):
        if not isinstance(spec, Mapping) or set(spec) - set(value):
            raise DynamicShapesError(
                f"dynamic_shapes for {where} must mirror its value, a dict with keys "
                f"{sorted(map(str, value))}: got {spec!r}."
            )
        for key, item in value.items():
            _match(item, spec.get(key), f"{where}[{key!r}]", (*path, key), out)
    else:
        raise DynamicShapesError(
            f"dynamic_shapes gives {spec!r} for {where}, which is a {type(value).__name__}, not a "
            "tensor: only tensor inputs have dynamic dims. Fix: use None for it."
        )


def _specs_by_param(
    dynamic_shapes: Any, bound: list[tuple[str, Any]], model: Any
) -> dict[str, Any]:
    names = [name for name, _ in bound]
    if isinstance(dynamic_shapes, Mapping):
        unknown = [k for k in dynamic_shapes if k not in names]
        if unknown:
            params = [p.name for p in _signature_params(model)]
            missing = [k for k in unknown if k in params]
            why = (
                f"parameter(s) {missing} have no example input"
                if missing and len(missing) == len(unknown)
                else (
                    f"forward{_signature_text(model)} has no parameter(s)"
                    f" {[k for k in unknown if k not in params] or unknown}"
                )
            )
            raise DynamicShapesError(
                f"dynamic_shapes has key(s) {unknown} but {why}. Valid keys: {names} (forward's"
                " parameter names). Fix: key the dict by those names, or pass a tuple with one"
                " entry per input in order."
            )
        return dict(dynamic_shapes)
    if isinstance(dynamic_shapes, (list, tuple)):
        if len(dynamic_shapes) != len(bound):
            raise DynamicShapesError(
                f"dynamic_shapes is a {type(dynamic_shapes).__name__} of {len(dynamic_shapes)} "
                f"entries but the model takes {len(bound)} input(s) {names}. Fix: one entry per "
                "input, in order (None for an input with no dynamic dim), or a dict keyed by name."
            )
        return dict(zip(names, dynamic_shapes, strict=True))
    raise DynamicShapesError(
        f"dynamic_shapes must be {_FORMS}; got a {type(dynamic_shapes).__name__}:"
        f" {dynamic_shapes!r}."
    )


def _signature_text(model: Any) -> str:
    try:
        return str(inspect.signature(model.forward))
    except (TypeError, ValueError, AttributeError):
        return "(...)"


def _axes_from_dynamic_axes(
    dynamic_axes: Mapping[str, Any], leaves: list[InputLeaf], output_names: Sequence[str]
) -> dict[str, Any]:
    by_name = {leaf.onnx_name: leaf for leaf in leaves}
    specs: dict[str, Any] = {}
    for key, axes in dynamic_axes.items():
        if key in output_names:
            continue  # output dims follow from the inputs' dims; both exporters derive them
        if key not in by_name:
            raise DynamicShapesError(
                f"dynamic_axes names input {key!r}, but the ONNX inputs are {list(by_name)}"
                + (f" and the outputs {list(output_names)}" if output_names else "")
                + ". Fix: key dynamic_axes by those names (set them with input_names=)."
            )
        if isinstance(axes, Mapping):
            specs[key] = dict(axes)
        elif isinstance(axes, (list, tuple)) and all(
            isinstance(a, int) and not isinstance(a, bool) for a in axes
        ):
            specs[key] = {
                int(a): f"{key}_dim{int(a) % max(by_name[key].tensor.dim(), 1)}" for a in axes
            }
        else:
            raise DynamicShapesError(
                f"dynamic_axes[{key!r}] is {axes!r}; expected {{axis: 'name'}} or a list of axes."
            )
    return specs


# -- the whole spec -----------------------------------------------------------------------


def _identifier(name: str, taken: set[str]) -> str:
    """A torch.export Dim name for ``name`` (Dim names must be Python identifiers)."""
    base = (
        name
        if name.isidentifier() and not keyword.iskeyword(name)
        else "dim_" + re.sub(r"\W", "_", name)
    )
    candidate, i = base, 1
    while candidate in taken:
        candidate, i = f"{base}_{i}", i + 1
    taken.add(candidate)
    return candidate


def _check_sites(
    name: str, sites: list[tuple[InputLeaf, int, _Axis]]
) -> tuple[int | None, int | None]:
    lows = {a.min for _, _, a in sites if a.min is not None}
    highs = {a.max for _, _, a in sites if a.max is not None}
    if len(lows) > 1 or len(highs) > 1:
        ranges = [f"{leaf.onnx_name}[{axis}]: min={a.min} max={a.max}" for leaf, axis, a in sites]
        raise DynamicShapesError(
            f"Dim {name!r} is declared with different ranges ({'; '.join(ranges)}). Fix: one range "
            "per name (declare the Dim once and reuse it)."
        )
    low, high = (lows.pop() if lows else None), (highs.pop() if highs else None)
    sizes = {(leaf.onnx_name, axis): int(leaf.tensor.shape[axis]) for leaf, axis, _ in sites}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{n}[{a}]={s}" for (n, a), s in sizes.items())
        raise DynamicShapesError(
            f"Dim {name!r} names axes whose example sizes differ ({listed}). One name means one"
            " size in the ONNX file. Fix: give the axes different names, or pass examples whose"
            " sizes agree."
        )
    (size,) = set(sizes.values())
    if (low is not None and size < low) or (high is not None and size > high):
        leaf, axis, _ = sites[0]
        raise DynamicShapesError(
            f"Dim {name!r} ({_where(leaf, axis)}) allows sizes [{low if low is not None else 0}, "
            f"{high if high is not None else 'inf'}] but the example has size {size}. Fix: pass an "
            "example inside the range, or widen the Dim's min/max."
        )
    return low, high


def resolve_dynamic_shapes(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
) -> DynamicSpec:
    """Check ``dynamic_shapes`` (or ``dynamic_axes``) against ``model``'s inputs; raise
    `DynamicShapesError` naming the input, the dim and the fix on anything that does not fit."""
    if dynamic_shapes is not None and dynamic_axes is not None:
        raise DynamicShapesError(
            "Pass dynamic_shapes or dynamic_axes, not both (dynamic_axes is the TorchScript-era"
            " form)."
        )
    bound = _bound_inputs(model, args, kwargs or {})
    leaves = _leaves(bound, input_names)
    raw = _raw_axes(model, bound, leaves, dynamic_shapes, dynamic_axes, output_names)

    axes: dict[str, dict[int, _Axis]] = {
        leaf.onnx_name: _axes_of(leaf, raw.get(leaf.onnx_name)) for leaf in leaves
    }
    by_name: dict[str, list[tuple[InputLeaf, int, _Axis]]] = {}
    for leaf in leaves:
        for axis, ax in axes[leaf.onnx_name].items():
            by_name.setdefault(ax.name, []).append((leaf, axis, ax))
    dims = _dim_specs(by_name)
    torch_dims, torch_names = _torch_dims(by_name, dims)

    per_leaf = {
        leaf.onnx_name: {
            axis: torch_dims[ax.name] if ax.torch_dim is None else ax.torch_dim
            for axis, ax in axes[leaf.onnx_name].items()
        }
        for leaf in leaves
    }
    export_shapes = None
    if any(per_leaf.values()):
        export_shapes = {param: _rebuild(value, param, leaves, per_leaf) for param, value in bound}
    return DynamicSpec(
        leaves=tuple(leaves),
        axes={
            name: {axis: ax.name for axis, ax in leaf_axes.items()}
            for name, leaf_axes in axes.items()
        },
        dims=dims,
        export_shapes=export_shapes,
        torch_names=torch_names,
    )


def _raw_axes(
    model: Any,
    bound: list[tuple[str, Any]],
    leaves: list[InputLeaf],
    dynamic_shapes: Any,
    dynamic_axes: Mapping[str, Any] | None,
    output_names: Sequence[str] | None,
) -> dict[str, Any]:
    """ONNX input name -> its axes spec, from ``dynamic_shapes`` or ``dynamic_axes``."""
    raw: dict[str, Any] = {}
    if dynamic_shapes is not None:
        per_param = _specs_by_param(dynamic_shapes, bound, model)
        for param, value in bound:
            paths: dict[tuple[Any, ...], Any] = {}
            _match(value, per_param.get(param), repr(param), (), paths)
            for leaf in leaves:
                if leaf.param == param and leaf.path in paths:
                    raw[leaf.onnx_name] = paths[leaf.path]
    elif dynamic_axes is not None:
        if not isinstance(dynamic_axes, Mapping):
            raise DynamicShapesError(
                "dynamic_axes must be a dict keyed by input name, got"
                f" {type(dynamic_axes).__name__}."
            )
        raw = _axes_from_dynamic_axes(dynamic_axes, leaves, list(output_names or ()))
    return raw


def _dim_specs(by_name: dict[str, list[tuple[InputLeaf, int, _Axis]]]) -> dict[str, DimSpec]:
    """One `DimSpec` per dim name (sizes checked across its sites), plus derived dims' roots."""
    dims: dict[str, DimSpec] = {}
    for name, sites in by_name.items():
        derived = sites[0][2].derived
        low, high = (None, None) if derived else _check_sites(name, sites)
        dims[name] = DimSpec(
            name,
            low,
            high,
            tuple((leaf.onnx_name, axis) for leaf, axis, _ in sites),
            derived,
            sites[0][2].root,
        )
        for _, _, ax in sites:
            if ax.derived and ax.root and ax.root not in dims and ax.root not in by_name:
                root = ax.torch_dim.root
                dims[ax.root] = DimSpec(
                    ax.root, _bound(root.min, lower=True), _bound(root.max, lower=False), ()
                )
    return dims


def _torch_dims(
    by_name: dict[str, list[tuple[InputLeaf, int, _Axis]]], dims: dict[str, DimSpec]
) -> tuple[dict[str, Any], dict[str, str]]:
    """torch.export needs Dim objects: one per string name (shared with a Dim of the same name).
    Returns (dim name -> torch dim, torch Dim name -> dim name)."""
    taken = {
        ax.torch_dim.__name__
        for sites in by_name.values()
        for _, _, ax in sites
        if isinstance(ax.torch_dim, Dim)
    }
    torch_dims: dict[str, Any] = {}
    torch_names: dict[str, str] = {}
    for name, sites in by_name.items():
        given = next((ax.torch_dim for _, _, ax in sites if ax.torch_dim is not None), None)
        if given is None:
            spec = dims[name]
            given = Dim(_identifier(name, taken), min=spec.min, max=spec.max)
        torch_dims[name] = given
        if isinstance(given, Dim):
            torch_names[given.__name__] = name
    return torch_dims, torch_names


def _rebuild(
    value: Any,
    param: str,
    leaves: list[InputLeaf],
    per_leaf: dict[str, dict[int, Any]],
    path: tuple[Any, ...] = (),
) -> Any:
    """``dynamic_shapes`` for one parameter in the structure torch.export expects."""
    if isinstance(value, torch.Tensor):
        leaf = next(leaf for leaf in leaves if leaf.param == param and leaf.path == path)
        return per_leaf[leaf.onnx_name] or None
    if isinstance(value, (list, tuple)):
        items = [_rebuild(v, param, leaves, per_leaf, (*path, i)) for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, Mapping):
        return {k: _rebuild(v, param, leaves, per_leaf, (*path, k)) for k, v in value.items()}
    return None
