"""What torch computes for an op's outputs, with symbolic dims, for both exporters.

The dynamo exporter hands us nothing but the inputs, yet its FX node carries ``meta["val"]``: the
fake tensors torch.export computed, with SymInt dims. The TorchScript exporter has no fake
tensors at all (its traced nodes carry no shapes once an input is dynamic), so there we run the
op's fake kernel ourselves: inputs become fake tensors whose dynamic dims are SymInts of a fresh
ShapeEnv, and the outputs' sizes come back as sympy expressions of those dims.

Either way a dim ends up as an int or an expression over "root" symbols that `DimNames` maps to
the user's dim names, and `OutputMeta` spells it the same way for both exporters ("batch",
"2*batch").
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import sympy
import torch
from torch._library import custom_ops, simple_registry

from onnx_custom.translate.builder import OutputMeta

__all__ = [
    "DimNames",
    "Outputs",
    "TensorDesc",
    "cached_run_fake",
    "clear_fake_cache",
    "fake_fingerprint",
    "flat_outputs",
    "layout",
    "name_of",
    "run_fake",
]

_MIN_HINT = 2  # torch specializes sizes 0 and 1; a hint of 2 keeps the dim symbolic
DEFAULT_HINT = 8


@dataclasses.dataclass(frozen=True)
class TensorDesc:
    """An input or output described symbolically: dims are ints or sympy expressions of roots."""

    dtype: torch.dtype | None
    shape: tuple[int | sympy.Expr | None, ...] | None


@dataclasses.dataclass
class DimNames:
    """Root symbols -> the user's dim names, plus example sizes (hints) for fake runs."""

    names: dict[sympy.Symbol, str] = dataclasses.field(default_factory=dict)
    hints: dict[sympy.Symbol, int] = dataclasses.field(default_factory=dict)

    def hint(self, expr: sympy.Expr) -> int:
        values = {s: max(self.hints.get(s, DEFAULT_HINT), _MIN_HINT) for s in expr.free_symbols}
        try:
            return max(int(expr.xreplace(values)), _MIN_HINT)
        except (TypeError, ValueError):
            return DEFAULT_HINT

    def name(self, dim: int | sympy.Expr | None) -> int | str | None:
        """How `OutputMeta` spells ``dim``: an int, a name / expression of names, or None."""
        return name_of(dim, self.names)

    def meta(self, desc: TensorDesc) -> OutputMeta:
        shape = None if desc.shape is None else tuple(self.name(d) for d in desc.shape)
        return OutputMeta(desc.dtype, shape)


def name_of(dim: int | sympy.Expr | None, names: Mapping[sympy.Symbol, str]) -> int | str | None:
    if dim is None or isinstance(dim, int):
        return dim
    if dim.is_Integer:
        return int(dim)
    if dim in names:
        return names[dim]  # type: ignore[index]
    if not dim.free_symbols or not all(s in names for s in dim.free_symbols):
        return None
    # Printed like torch prints symbolic dims ("2*s77"), with the user's names substituted.
    return str(dim.xreplace({s: sympy.Symbol(names[s]) for s in dim.free_symbols}))  # type: ignore[index]


def _specialized(env: Any, symbols: Sequence[sympy.Symbol]) -> bool:
    """Did the fake kernel pin a dynamic dim to a constant (e.g. an int() of a size)?"""
    for sym in symbols:
        replaced = env.replacements.get(sym)
        if replaced is not None and replaced.is_number:
            return True
        bounds = env.var_to_range.get(sym)
        if bounds is not None and bounds.lower == bounds.upper:
            return True
    return False


Outputs = list[TensorDesc | list[TensorDesc]]  # per torch return: a tensor or a Tensor[]


def run_fake(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], dims: DimNames
) -> Outputs | None:
    """Run ``fn`` (an OpOverload or an autograd.Function's ``apply``) on fake inputs.

    ``args``/``kwargs`` hold `TensorDesc` where tensors go. Returns one entry per torch return (a
    `TensorDesc`, or a list of them for a ``Tensor[]`` return), or None when the fake run is
    impossible or fails (no fake kernel, an input of unknown dtype/rank, a kernel that needs
    real data).
    """
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    # duck_shape=False: two roots with equal hints must stay two symbols.
    env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
    to_env: dict[sympy.Symbol, sympy.Symbol] = {}
    fresh: list[sympy.Symbol] = []

    def symbol(root: sympy.Symbol | None, hint: int) -> sympy.Symbol:
        if root is not None and root in to_env:
            return to_env[root]
        source = ConstantSource(f"onnx_custom_dim_{len(to_env) + len(fresh)}")
        sym = env.create_symbol(hint, source=source, dynamic_dim=DimDynamic.DYNAMIC)
        if root is None:
            fresh.append(sym)
        else:
            to_env[root] = sym
        return sym

    def size(dim: int | sympy.Expr | None) -> Any:
        if isinstance(dim, int):
            return dim
        if dim is None:
            sym = symbol(None, DEFAULT_HINT)
            return env.create_symintnode(sym, hint=DEFAULT_HINT)
        if dim.is_Integer:
            return int(dim)
        for root in dim.free_symbols:
            symbol(root, dims.hint(root))  # type: ignore[arg-type]
        return env.create_symintnode(dim.xreplace(to_env), hint=dims.hint(dim))

    class _Unknown(Exception):
        pass

    def fake(value: Any) -> Any:
        if isinstance(value, TensorDesc):
            if value.dtype is None or value.shape is None:
                raise _Unknown
            return torch.empty([size(d) for d in value.shape], dtype=value.dtype)
        if isinstance(value, (list, tuple)) and any(isinstance(v, TensorDesc) for v in value):
            return [fake(v) for v in value]
        return value

    try:
        with FakeTensorMode(shape_env=env, allow_non_fake_inputs=True):
            fake_args = [fake(a) for a in args]
            fake_kwargs = {k: fake(v) for k, v in kwargs.items()}
            result = fn(*fake_args, **fake_kwargs)
    except (
        Exception
    ):  # no fake kernel, data-dependent kernel, unknown input type: caller falls back
        return None
    back = {env_sym: root for root, env_sym in to_env.items()}
    pinned = _specialized(env, [*to_env.values(), *fresh])

    def describe(out: Any) -> TensorDesc:
        if not isinstance(out, torch.Tensor):
            return TensorDesc(None, None)
        shape: list[int | sympy.Expr | None] = []
        for d in out.shape:
            if pinned:
                shape.append(None)  # sizes computed from a pinned dim would be baked-in constants
            elif isinstance(d, int):
                shape.append(d)
            else:
                expr = env.replace(d.node.expr)
                shape.append(
                    int(expr)
                    if expr.is_Integer
                    else expr.xreplace(back)
                    if expr.free_symbols <= set(back)
                    else None
                )
        return TensorDesc(out.dtype, tuple(shape))

    returns = list(result) if isinstance(result, tuple) else [result]
    return [[describe(o) for o in r] if isinstance(r, list) else describe(r) for r in returns]


def flat_outputs(outputs: Outputs) -> list[TensorDesc]:
    return [d for r in outputs for d in (r if isinstance(r, list) else [r])]


def layout(outputs: Outputs) -> list[int | None]:
    """Per torch return: None for a tensor, the element count for a ``Tensor[]``."""
    return [len(r) if isinstance(r, list) else None for r in outputs]


# -- fake outputs remembered across exports ----------------------------------------------------
#
# A symbolic fake run is costly (a ShapeEnv, a FakeTensorMode, torch's dispatch), more than
# the rest of a custom node's translation; the same model exported again asks the same
# questions. Entries are keyed by the op's fake implementation as registered now
# (`fake_fingerprint`: a re-registered fake kernel is another key), the argument types (scalars
# keep their Python type: 1, 1.0 and True are equal dict keys) and the input dims with the
# export's own symbols renamed by first appearance, plus the hints the fake run would use.

_FAKE_CACHE_SIZE = 512
_fake_cache: collections.OrderedDict[Hashable, Outputs | None] = collections.OrderedDict()
_fake_lock = threading.Lock()


def clear_fake_cache() -> None:
    """Forget every remembered fake run (tests; a user who changed a fake kernel in place)."""
    with _fake_lock:
        _fake_cache.clear()


def fake_fingerprint(fn: Any) -> Hashable:
    """What, besides its arguments, decides ``fn``'s fake run: for an OpOverload its Python fake
    kernel (``register_fake``'s newest registration), a custom_op's fake function and the
    Python-dispatcher kernels; for an autograd.Function's ``apply`` the class's ``forward``.
    The objects themselves, not their ids: a key holds them alive, so an id is never reused."""
    if isinstance(fn, torch._ops.OpOverload):
        qualname = fn._schema.name
        kernel = simple_registry.singleton.find(qualname).fake_impl.kernel
        opdef = custom_ops.OPDEFS.get(qualname)
        return (
            fn,
            None if kernel is None else kernel.func,
            opdef,
            getattr(opdef, "_abstract_fn", None),
            tuple(fn.py_kernels.items()),
        )
    owner = getattr(fn, "__self__", None)
    return (fn, getattr(owner, "forward", None))


class _Canon:
    """The export's root symbols renamed ``c0, c1, ...`` in order of first appearance."""

    def __init__(self) -> None:
        self.to_canon: dict[sympy.Symbol, sympy.Symbol] = {}

    def dim(self, dim: int | sympy.Expr | None) -> Any:
        if dim is None or isinstance(dim, int):
            return dim
        # sorted by name only inside one expression: an order that differs between exports
        # costs a miss, never a wrong hit (the renaming is applied consistently within a key)
        for root in sorted(dim.free_symbols, key=str):
            if root not in self.to_canon:
                self.to_canon[root] = sympy.Symbol(
                    f"c{len(self.to_canon)}", integer=True, positive=True
                )  # type: ignore[index]
        return dim.xreplace(self.to_canon)

    def value(self, value: Any) -> Hashable:
        if isinstance(value, TensorDesc):
            return (
                TensorDesc,
                value.dtype,
                None if value.shape is None else tuple(self.dim(d) for d in value.shape),
            )
        if isinstance(value, (list, tuple)):
            return (type(value), tuple(self.value(v) for v in value))
        return (type(value), value)


def _renamed(
    outputs: Outputs | None, mapping: Mapping[sympy.Symbol, sympy.Symbol]
) -> Outputs | None:
    if outputs is None or not mapping:
        return outputs

    def desc(d: TensorDesc) -> TensorDesc:
        if d.shape is None:
            return d
        return TensorDesc(
            d.dtype, tuple(s.xreplace(mapping) if isinstance(s, sympy.Expr) else s for s in d.shape)
        )

    return [[desc(o) for o in r] if isinstance(r, list) else desc(r) for r in outputs]


def cached_run_fake(
    fn: Callable[..., Any],
    args: Sequence[Any],
    dims: DimNames,
    *,
    agrees: Callable[[Outputs], bool] | None = None,
) -> Outputs | None:
    """`run_fake` (no kwargs), remembered across exports in a bounded LRU (see above).

    ``agrees(outputs)``: whether a remembered answer fits what this call knows for sure (under
    TorchScript the traced node's dtypes, ranks and static sizes); when not, the fake kernel
    changed in a way the fingerprint cannot see (it calls another op that was re-registered, a
    global it reads): run again and replace the entry."""
    canon = _Canon()
    try:
        frozen = tuple(canon.value(a) for a in args)
        hints = tuple(dims.hint(root) for root in canon.to_canon)
        key = (fake_fingerprint(fn), frozen, hints)
        hash(key)
    except TypeError:  # an argument that cannot be a dict key: just run
        return run_fake(fn, args, {}, dims)
    back = {c: root for root, c in canon.to_canon.items()}
    with _fake_lock:
        found = _fake_cache.get(key, _MISSING)
        if found is not _MISSING:
            _fake_cache.move_to_end(key)
    if found is not _MISSING:
        outputs = _renamed(found, back)
        if outputs is None or agrees is None or agrees(outputs):
            return outputs
    result = run_fake(fn, args, {}, dims)
    with _fake_lock:
        _fake_cache[key] = _renamed(result, canon.to_canon)
        while len(_fake_cache) > _FAKE_CACHE_SIZE:
            _fake_cache.popitem(last=False)
    return result


_MISSING: Any = object()
