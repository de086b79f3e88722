"""Which input shapes `verify` tries: the dynamic dims a file claims, their ranges, the trials.

A file *claims* a dim is dynamic when its input has a ``dim_param`` there (or a dim with neither
value nor name). Dims sharing a ``dim_param`` are one dim: they always get the same size.
Unnamed dynamic dims are called ``"<input>.shape[<axis>]"``.

Ranges, first found wins: the ``dynamic_shapes=`` given to `verify` (``torch.export.Dim`` min/max,
matched to the file's dims through the argument and axis they describe, so ``Dim("batch")`` also
names a dim the exporter called ``s77``), then the file's metadata
``metadata_props["onnx_custom.dynamic_dims"]`` (JSON ``{"<dim name>": {"min": int|null, "max":
int|null}}``), else unbounded.

Default trials (`default_cases`): up to `DEFAULT_SHAPE_TRIALS` shapes; trial *k* gives every
dynamic dim its *k*-th candidate size from ``1, e + 1, 2e, e + 2, 3e, e + 3, ...`` (``e`` = the
export size), keeping those inside the dim's range and different from ``e``. A dim with fewer
candidates keeps its last one. Candidates depend only on the export size and the range, so dims
that must agree but that an exporter named apart (the inner dims of a matmul exported with
``Dim.AUTO``) still get equal sizes in every trial.

The apart trial (`apart_case`): that same rule hides a file reading one dim for another of the
same export size (height for width of a square image, one input's batch for another's), so when
dims the file names apart share their export size and range, one more trial gives each of them
its own size: ``2e``, ``3e``, then ``e + 1, e + 2, ...`` (multiples first: models that need
sizes divisible by a stride take them), never below 2 (size 1 broadcasts: eager would run
another computation, not refuse) and never ``e``, inside the range; the other dims keep their
export size. A model that ties the dims (they must agree) refuses it: verify reports it skipped,
with a note, not a failure.

Inputs at a new shape (`resize_inputs`): floats are drawn from N(0, 1); integer and bool tensors
whose shape does not change keep their values (they are often indices); those whose shape changes
are drawn uniformly from the example's [min, max] (its values are assumed to be valid there).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import torch

from onnx_custom.errors import ShapeSpecError
from onnx_custom.verification.runner import (
    InputBinding,
    argument_names,
    graph_inputs,
    tensor_inputs,
)

__all__ = [
    "DEFAULT_SHAPE_TRIALS",
    "METADATA_KEY",
    "ApartCase",
    "DimPlan",
    "DynamicDim",
    "ShapeSpecError",
    "apart_case",
    "default_cases",
    "describe_sizes",
    "map_tensors",
    "one_dim_cases",
    "plan_dims",
    "resize_inputs",
    "resolve_cases",
]

DEFAULT_SHAPE_TRIALS = 3
METADATA_KEY = "onnx_custom.dynamic_dims"
_UNBOUNDED = 2**62


@dataclasses.dataclass(frozen=True)
class DynamicDim:
    """One dynamic dim of the file: its sizes are varied together wherever it appears."""

    key: str
    export_size: int
    min: int | None
    max: int | None
    range_source: str
    slots: tuple[tuple[int, int], ...]  # (tensor position among the arguments' tensors, axis)
    where: tuple[str, ...]  # "x[0]": ONNX input and axis

    def admits(self, size: int) -> bool:
        return (self.min is None or size >= self.min) and (self.max is None or size <= self.max)

    def describe_range(self) -> str:
        lo = "-inf" if self.min is None else self.min
        hi = "inf" if self.max is None else self.max
        return f"[{lo}, {hi}] (from {self.range_source})"


@dataclasses.dataclass(frozen=True)
class DimPlan:
    """The file's dynamic dims (by key), their aliases (``Dim`` names), static input dims."""

    dims: dict[str, DynamicDim]
    aliases: dict[str, str]
    axes: dict[str, tuple[str | int, ...]]  # ONNX input -> per axis: dim key or static size
    notes: tuple[str, ...] = ()

    def key(self, name: str) -> str | None:
        return name if name in self.dims else self.aliases.get(name)


def describe_sizes(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items()) or "the export shape"


# ----------------------------------------------------------------------------- ranges


def _bound(value: Any) -> int | None:
    """An int bound, or None for no bound (torch's ``int_oo``, null, huge values)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        bound = int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):  # sympy's oo: AttributeError
        return None
    return bound if abs(bound) < _UNBOUNDED else None


def _metadata_ranges(
    proto: onnx.ModelProto, notes: list[str]
) -> dict[str, tuple[int | None, int | None]]:
    text = next((p.value for p in proto.metadata_props if p.key == METADATA_KEY), None)
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        notes.append(f"metadata {METADATA_KEY} is not JSON ({exc}); dim ranges ignored")
        return {}
    if not isinstance(data, dict):
        notes.append(f"metadata {METADATA_KEY} is not a JSON object; dim ranges ignored")
        return {}
    return {
        str(k): (_bound(v.get("min")), _bound(v.get("max")))
        for k, v in data.items()
        if isinstance(v, dict)
    }


def _dim_spec(value: Any) -> tuple[str | None, int | None, int | None] | None:
    """A dynamic_shapes entry for one axis -> (name, min, max), or None when static."""
    if value is None:
        return None
    if isinstance(value, str):
        return (value, None, None)
    hint = type(value).__name__
    if hint == "_DimHint":  # Dim.AUTO / Dim.DYNAMIC are dynamic without a name, STATIC is static
        return None if "STATIC" in str(value) else (None, None, None)
    name = getattr(value, "__name__", None)
    if name is not None and hasattr(value, "min"):
        return (name, _bound(value.min), _bound(value.max))
    raise ShapeSpecError(
        "dynamic_shapes: expected a torch.export.Dim, a dim name (str), Dim.AUTO/DYNAMIC/STATIC or"
        f" None per axis, got {value!r}. Fix: pass the dynamic_shapes given to export."
    )


def _axes_spec(
    spec: Any, where: str, rank: int
) -> dict[int, tuple[str | None, int | None, int | None]]:
    if spec is None:
        return {}
    items: list[tuple[Any, Any]]
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, (tuple, list)):
        items = list(enumerate(spec))
    else:
        raise ShapeSpecError(
            f"dynamic_shapes[{where}]: expected {{axis: Dim}} or a per-axis list for a tensor, got"
            f" {spec!r}."
        )
    out = {}
    for axis, value in items:
        if not isinstance(axis, int) or not -rank <= axis < rank:
            raise ShapeSpecError(
                f"dynamic_shapes[{where}]: axis {axis!r} does not exist in a rank-{rank} tensor."
                f" Fix: use axes 0..{rank - 1}."
            )
        dim = _dim_spec(value)
        if dim is not None:
            out[axis % rank] = dim
    return out


def _leaf_specs(
    model: Any, args: tuple[Any, ...], dynamic_shapes: Any
) -> dict[int, dict[int, tuple[str | None, int | None, int | None]]]:
    """``dynamic_shapes`` (torch.export style) -> {tensor position: {axis: (name, min, max)}}."""
    if dynamic_shapes is None:
        return {}
    params = _top_level_names(model, args)
    if isinstance(dynamic_shapes, Mapping):
        unknown = [k for k in dynamic_shapes if k not in params]
        if unknown:
            raise ShapeSpecError(
                f"dynamic_shapes names {unknown} but forward's parameters are {params}. Fix: key "
                "dynamic_shapes by forward's parameter names (or pass a tuple by position)."
            )
        specs = [dynamic_shapes.get(p) for p in params]
    elif isinstance(dynamic_shapes, (tuple, list)):
        if len(dynamic_shapes) > len(args):
            raise ShapeSpecError(
                f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(args)} argument(s)."
                " Fix: one entry per argument."
            )
        specs = list(dynamic_shapes) + [None] * (len(args) - len(dynamic_shapes))
    else:
        raise ShapeSpecError(
            "dynamic_shapes: expected a dict keyed by forward's parameter names or a tuple, got"
            f" {type(dynamic_shapes).__name__}."
        )
    out: dict[int, dict[int, tuple[str | None, int | None, int | None]]] = {}
    position = 0

    def walk(value: Any, spec: Any, where: str) -> None:
        nonlocal position
        if isinstance(value, torch.Tensor):
            axes = _axes_spec(spec, where, value.dim())
            if axes:
                out[position] = axes
            position += 1
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, spec.get(k) if isinstance(spec, Mapping) else None, f"{where}.{k}")
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(
                    v,
                    spec[i] if isinstance(spec, (tuple, list)) and i < len(spec) else None,
                    f"{where}[{i}]",
                )

    for name, value, spec in zip(params, args, specs, strict=True):
        walk(value, spec, name)
    return out


def _top_level_names(model: Any, args: tuple[Any, ...]) -> list[str]:
    names = argument_names(model, args) if model is not None else None
    return names if names is not None else [f"input_{i}" for i in range(len(args))]


# ----------------------------------------------------------------------------- the plan


def plan_dims(
    proto: onnx.ModelProto,
    binding: InputBinding,
    args: tuple[Any, ...],
    *,
    model: Any = None,
    dynamic_shapes: Any = None,
) -> DimPlan:
    """The dynamic dims of ``proto``'s inputs, with export sizes from ``args`` and their ranges."""
    tensors = tensor_inputs(args)
    notes: list[str] = []
    metadata = _metadata_ranges(proto, notes)
    specs = _leaf_specs(model, args, dynamic_shapes)
    positions = dict(zip(binding.onnx_names, binding.positions, strict=True))
    slots: dict[str, list[tuple[int, int]]] = {}
    where: dict[str, list[str]] = {}
    sizes: dict[str, set[int]] = {}
    axes: dict[str, tuple[str | int, ...]] = {}
    for info in graph_inputs(proto):
        tensor = tensors[positions[info.name]]
        tensor_type = info.type.tensor_type
        if not tensor_type.HasField("shape") or len(tensor_type.shape.dim) != tensor.dim():
            continue  # rank unknown or wrong: ORT will say so at the first run
        entries: list[str | int] = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                entries.append(dim.dim_value)
                continue
            key = dim.dim_param or f"{info.name}.shape[{axis}]"
            entries.append(key)
            slots.setdefault(key, []).append((positions[info.name], axis))
            where.setdefault(key, []).append(f"{info.name}[{axis}]")
            sizes.setdefault(key, set()).add(int(tensor.shape[axis]))
        axes[info.name] = tuple(entries)
    aliases: dict[str, str] = {}
    ranges: dict[str, tuple[int | None, int | None, str]] = {}
    slot_keys = {slot: key for key, found in slots.items() for slot in found}
    for position, axis_specs in specs.items():
        for axis, (name, lo, hi) in axis_specs.items():
            key = slot_keys.get((position, axis))
            if key is None:
                key = aliases.get(name or "") or (name if name in slots else None)
                if key is not None and position not in binding.positions:  # a pruned tensor
                    slots[key].append((position, axis))
                continue
            if name and name != key:
                aliases[name] = key
            if lo is not None or hi is not None:
                ranges[key] = (lo, hi, "dynamic_shapes")
    dims: dict[str, DynamicDim] = {}
    for key, found in slots.items():
        if len(sizes[key]) > 1:
            notes.append(
                f"dim {key!r} has different sizes {sorted(sizes[key])} in the example"
                f" ({', '.join(where[key])}); it is not varied"
            )
            continue
        (export_size,) = sizes[key]
        names = [key, *(a for a, k in aliases.items() if k == key)]
        lo, hi, source = ranges.get(key) or next(
            ((*metadata[n], f"metadata {METADATA_KEY}") for n in names if n in metadata),
            (None, None, "no range given"),
        )
        dim = DynamicDim(key, export_size, lo, hi, source, tuple(found), tuple(where[key]))
        if not dim.admits(export_size):
            raise ShapeSpecError(
                f"Dynamic dim {key!r} ({', '.join(dim.where)}) has the export size {export_size},"
                f" outside its range {dim.describe_range()}. Fix: give a range that includes the"
                " example's size."
            )
        dims[key] = dim
    return DimPlan(dims, aliases, axes, tuple(notes))


def default_cases(plan: DimPlan, count: int = DEFAULT_SHAPE_TRIALS) -> list[dict[str, int]]:
    """Up to ``count`` size assignments (module doc), without repeats."""
    candidates = {key: _candidates(dim, count) for key, dim in plan.dims.items()}
    candidates = {k: c for k, c in candidates.items() if c}
    cases: list[dict[str, int]] = []
    for k in range(count):
        case = {key: c[min(k, len(c) - 1)] for key, c in candidates.items()}
        if case and case not in cases:
            cases.append(case)
    return cases


@dataclasses.dataclass(frozen=True)
class ApartCase:
    """The apart trial's sizes, and the groups of dims it moves apart (each group: dims named
    apart that every default trial gives one size)."""

    sizes: dict[str, int]
    groups: tuple[tuple[str, ...], ...]

    def describe_groups(self, plan: DimPlan) -> str:
        """``"h (x[2]) and w (x[3])"``, groups separated by ``"; "``."""
        return "; ".join(
            " and ".join(f"{k} ({', '.join(plan.dims[k].where)})" for k in group)
            for group in self.groups
        )


def apart_case(plan: DimPlan) -> ApartCase | None:
    """The apart trial (module doc), or None when no two dims share export size and range."""
    groups: dict[tuple[int, int | None, int | None], list[str]] = {}
    for key, dim in plan.dims.items():
        groups.setdefault((dim.export_size, dim.min, dim.max), []).append(key)
    sizes: dict[str, int] = {}
    moved: list[tuple[str, ...]] = []
    for keys in groups.values():
        group_sizes = _apart_sizes(plan.dims[keys[0]], len(keys)) if len(keys) > 1 else []
        if group_sizes:
            sizes.update(zip(keys, group_sizes, strict=True))
            moved.append(tuple(keys))
    return ApartCase(sizes, tuple(moved)) if moved else None


def _apart_sizes(dim: DynamicDim, count: int) -> list[int]:
    """``count`` sizes, not all equal, for dims sharing ``dim``'s export size and range (all
    distinct when the range allows; [] when it allows no second size of at least 2)."""
    e = dim.export_size
    found: list[int] = []
    # bounded search: multiples first, then e + k, then downwards (a range capped near e)
    for size in (
        2 * e,
        3 * e,
        *range(e + 1, e + count + 3),
        *range(e - 1, max(1, e - count - 3), -1),
    ):
        if len(found) == count:
            break
        if size >= 2 and size != e and size not in found and dim.admits(size):
            found.append(size)
    if len(found) < count and e >= 2:
        found.append(
            e
        )  # too narrow a range: one dim keeps the export size, the others still differ
    if len(set(found)) < 2:
        return []
    return [found[i % len(found)] for i in range(count)]


def one_dim_cases(plan: DimPlan, count: int = DEFAULT_SHAPE_TRIALS) -> list[dict[str, int]]:
    """Each dynamic dim alone at up to ``count`` other sizes (the rest at the export size): for
    ops that refuse `default_cases`' all-dims-at-once sizes (a dim tied to a constant or to
    another input's dim under another name), so every dim that can vary still does."""
    return [{key: size} for key, dim in plan.dims.items() for size in _candidates(dim, count)]


def _candidates(dim: DynamicDim, count: int) -> list[int]:
    e = dim.export_size
    found: list[int] = []
    for step in range(1, 4 * count + 2):
        for size in (1, e + 1, 2 * e) if step == 1 else (e + step, (step + 1) * e):
            if size != e and size >= 1 and dim.admits(size) and size not in found:
                found.append(size)
    if dim.max is not None and dim.max != e and dim.max not in found and len(found) < count:
        found.append(dim.max)
    return found[:count]


# ----------------------------------------------------------------------------- explicit shapes=


def _fix_hint(plan: DimPlan) -> str:
    dims = (
        ", ".join(
            f"{k} ({', '.join(d.where)}, range {d.describe_range()})" for k, d in plan.dims.items()
        )
        or "none"
    )
    return f"dynamic dims of the file: {dims}; inputs: {list(plan.axes)}"


def resolve_cases(shapes: Sequence[Mapping[str, Any]], plan: DimPlan) -> list[dict[str, int]]:
    """``shapes=`` -> size assignments; typed errors name the input, the dim and the fix.

    Each case maps dim names (``dim_param``, a ``Dim`` name given in ``dynamic_shapes``, or
    ``"x.shape[0]"``) to sizes, and/or ONNX input names to full shapes; dims left out keep the
    export size.
    """
    if isinstance(shapes, Mapping) or not isinstance(shapes, Sequence):
        raise ShapeSpecError(
            "shapes= expects a list of dicts such as [{'batch': 5}, {'x': (7, 3)}], got"
            f" {type(shapes).__name__}. Fix: wrap a single case in a list."
        )
    return [_resolve_case(i, case, plan) for i, case in enumerate(shapes)]


def _resolve_case(index: int, case: Any, plan: DimPlan) -> dict[str, int]:
    where = f"shapes[{index}]"
    if not isinstance(case, Mapping):
        raise ShapeSpecError(
            f"{where}: expected a dict of dim name -> size or input name -> shape, got {case!r}."
        )
    sizes: dict[str, int] = {}

    def assign(key: str, size: Any, origin: str) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ShapeSpecError(f"{where}: {origin} must be a non-negative int, got {size!r}.")
        dim = plan.dims[key]
        if not dim.admits(size):
            raise ShapeSpecError(
                f"{where}: {origin} = {size} is outside the range {dim.describe_range()} of dim"
                f" {key!r} ({', '.join(dim.where)}). Fix: pick a size inside the range."
            )
        if sizes.get(key, size) != size:
            raise ShapeSpecError(
                f"{where}: dim {key!r} ({', '.join(dim.where)}) gets both {sizes[key]} and {size}"
                f" ({origin}). Fix: give it one size."
            )
        sizes[key] = size

    for name, value in case.items():
        key = plan.key(name) if isinstance(name, str) else None
        if key is not None and not isinstance(value, (tuple, list, torch.Size)):
            assign(key, value, f"dim {name!r}")
        elif name in plan.axes and isinstance(value, (tuple, list, torch.Size)):
            _assign_shape(where, name, tuple(value), plan, assign)
        else:
            static = _static_axis(name, plan)
            if static:
                raise ShapeSpecError(
                    f"{where}: {name!r} {static}; only dynamic dims can change. Fix: leave it out."
                    f" {_fix_hint(plan)}."
                )
            raise ShapeSpecError(
                f"{where}: unknown name {name!r} (with {value!r}); expected a dynamic dim name ->"
                f" size or an ONNX input name -> full shape. {_fix_hint(plan)}. Fix: use one of"
                " those names, e.g."
                f" shapes=[{{{next(iter(plan.dims), next(iter(plan.axes), 'batch'))!r}:"
                f" {value!r}}}]."
            )
    return sizes


def _static_axis(name: Any, plan: DimPlan) -> str:
    for input_name, entries in plan.axes.items():
        for axis, entry in enumerate(entries):
            if isinstance(entry, int) and name == f"{input_name}.shape[{axis}]":
                return f"is static ({entry}) in the file"
    return ""


def _assign_shape(
    where: str,
    name: str,
    shape: tuple[Any, ...],
    plan: DimPlan,
    assign: Callable[[str, Any, str], None],
) -> None:
    entries = plan.axes[name]
    if len(shape) != len(entries):
        raise ShapeSpecError(
            f"{where}: input {name!r} has rank {len(entries)} in the file, got shape {list(shape)}."
            f" Fix: give {len(entries)} sizes."
        )
    for axis, (size, entry) in enumerate(zip(shape, entries, strict=True)):
        if isinstance(entry, int):
            if size != entry:
                raise ShapeSpecError(
                    f"{where}: input {name!r} axis {axis} is static ({entry}) in the file, got"
                    f" {size}. Fix: keep {entry} there, or re-export with that dim dynamic."
                )
        else:
            assign(entry, size, f"{name}[{axis}]")


# ----------------------------------------------------------------------------- new inputs


def _map_tensors(
    value: Any, fn: Callable[[int, torch.Tensor], torch.Tensor], counter: list[int]
) -> Any:
    if isinstance(value, torch.Tensor):
        counter[0] += 1
        return fn(counter[0] - 1, value)
    if isinstance(value, Mapping):
        return type(value)({k: _map_tensors(v, fn, counter) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn, counter) for v in value)
    return value


def map_tensors(args: tuple[Any, ...], fn: Callable[[int, torch.Tensor], torch.Tensor]) -> Any:
    """``args`` with its ``i``-th tensor ``t`` (flattened in order) replaced by ``fn(i, t)``."""
    return _map_tensors(args, fn, [0])


def resize_inputs(
    args: tuple[Any, ...], sizes: Mapping[str, int], plan: DimPlan, generator: torch.Generator
) -> tuple[Any, ...]:
    """``args`` with the dims in ``sizes`` changed, values drawn as the module doc says."""
    targets: dict[int, dict[int, int]] = {}
    for key, size in sizes.items():
        for position, axis in plan.dims[key].slots:
            targets.setdefault(position, {})[axis] = size

    def redraw(position: int, tensor: torch.Tensor) -> torch.Tensor:
        shape = list(tensor.shape)
        for axis, size in targets.get(position, {}).items():
            shape[axis] = size
        if tensor.is_floating_point() or tensor.is_complex():
            return torch.randn(shape, generator=generator, dtype=torch.float32).to(tensor.dtype)
        if shape == list(tensor.shape):
            return tensor
        if tensor.numel() == 0:
            return torch.zeros(shape, dtype=tensor.dtype)
        lo, hi = int(tensor.min()), int(tensor.max())
        return torch.randint(lo, hi + 1, shape, generator=generator, dtype=torch.int64).to(
            tensor.dtype
        )

    return tuple(_map_tensors(args, redraw, [0]))
