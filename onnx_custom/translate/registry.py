"""The translation registry: frozen entries keyed by validated targets, opset-versioned."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import numbers
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from onnx_custom.errors import InvalidArgumentError, SymbolicError, UnsupportedOpError
from onnx_custom.translate.names import Target, normalize_target
from onnx_custom.translate.torch_style import (
    TORCH_STYLE_MARK,
    binds_torch_style,
    check_codes,
    parse_args_codes,
    torch_style_translation,
)

__all__ = [
    "DEFAULT_VARIANT",
    "Registry",
    "SymbolicEntry",
    "check_translation_result",
    "check_translation_signature",
    "default_registry",
    "is_tensor_argument",
    "resolve_registry",
    "same_definition",
    "symbolic",
]

DEFAULT_VARIANT = "default"
Translation = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class SymbolicEntry:
    """One translation: ``fn(g, *tensor_inputs, **attributes)`` valid from ``opset`` on."""

    target: Target
    opset: int
    fn: Translation
    variant: str = DEFAULT_VARIANT
    # Custom node types ("onnx_custom::my_add") this translation emits; used by pre-flight checks.
    emits: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.target.key, self.opset, self.variant)

    @property
    def source(self) -> str:
        fn = self.fn
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    def describe(self) -> str:
        variant = "" if self.variant == DEFAULT_VARIANT else f", variant={self.variant!r}"
        return f"{self.target} (opset>={self.opset}{variant}) -> {self.source}"

    def call(
        self, g: Any, inputs: Sequence[Any], attrs: Mapping[str, Any], *, outputs: int | None = None
    ) -> tuple[Any, ...]:
        """Run the translation as the exporter adapters do and check what it returned.

        ``fn(g, *inputs, **attrs)``; the result (one value or a tuple) comes back as a tuple of
        graph values, one per torch output (``outputs``, when the adapter knows it).
        """
        return check_translation_result(self, g, self.fn(g, *inputs, **dict(attrs)), outputs)


# -- what a translation returns -------------------------------------------------------------


def _describe_bad_value(value: Any) -> tuple[str, str] | None:
    """(what it is, how to fix it) for a value that is not a graph value, else None."""
    if value is None:
        return "None", "return the value(s) g.op(...) produced (a missing `return`?)"
    if isinstance(value, torch.Tensor):
        return (
            f"an eager torch.Tensor (shape {list(value.shape)}, {value.dtype})",
            "compute it in the graph with g.op(...), or wrap a true constant in g.constant(tensor)",
        )
    if isinstance(value, (np.ndarray, np.generic)):
        return f"a numpy {type(value).__name__}", "wrap a constant in g.constant(array)"
    if isinstance(value, (numbers.Number, str)):
        return (
            f"a Python {type(value).__name__} ({value!r})",
            f"wrap it in g.constant({value!r}, like=<an input>) so it becomes a graph value",
        )
    return None


def _defined_at(fn: Any) -> str:
    """`` (file.py:12)`` for a function (two lambdas share a name; their lines tell them apart)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return (
        f" ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
        if code is not None
        else ""
    )


def check_translation_result(
    entry: SymbolicEntry, g: Any, result: Any, outputs: int | None = None
) -> tuple[Any, ...]:
    """``result`` of ``entry.fn`` as a tuple of graph values; `SymbolicError` naming the op else.

    Refuses None, Python numbers, eager tensors and arrays (alone or inside the tuple), anything
    ``g.is_value`` rejects, and a count different from ``outputs`` (when given).
    """
    values = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    where = f"The translation of {entry.target} ({entry.source}, opset>={entry.opset})"
    if len(values) > 1 and any(v is None for v in values):
        values = _unused_outputs(where, g, values)
    for index, value in enumerate(values):
        if g.is_value(value):
            continue
        what, fix = _describe_bad_value(value) or (
            f"a {type(value).__name__}",
            "return graph values made by g.op(...)",
        )
        position = (
            ""
            if len(values) == 1 and not isinstance(result, (tuple, list))
            else f" as output {index}"
        )
        raise SymbolicError(
            f"{where} returned {what}{position}; expected a graph value for each of the op's "
            f"{outputs if outputs is not None else len(values)} output(s); fix: {fix}."
        )
    if outputs is not None and len(values) != outputs:
        raise SymbolicError(
            f"{where} returned {len(values)} output(s) but the torch op has {outputs}; fix: return "
            "one value per torch output (a tuple for several)."
        )
    return values


def _unused_outputs(where: str, g: Any, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``return value, None`` as torch takes it: None for an output the model never uses
    becomes a stand-in that the exporter drops; `SymbolicError` naming the output and what
    uses it otherwise."""
    users_of = getattr(g, "output_users", None)
    result = list(values)
    for index, value in enumerate(values):
        if value is not None:
            continue
        users = users_of(index) if users_of is not None else None
        if users == []:
            result[index] = g.unused_output(index)
            continue
        used = (
            f"the model uses it ({', '.join(users)})"
            if users
            else "the exporter cannot tell whether the model uses it"
        )
        raise SymbolicError(
            f"{where} returned None as output {index} of {len(values)}, but {used}; None is"
            " accepted only for an output the model never uses. Fix: return a graph value for"
            f" output {index} (made with g.op(...)), or do not use that output of the op in the"
            " model."
        )
    return tuple(result)


# -- signatures against the torch schema ------------------------------------------------------

_TENSOR_TYPES = ("Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]")


def is_tensor_argument(type_text: str) -> bool:
    """Schema argument types the adapters hand to translations as positional inputs."""
    return type_text.startswith("Tensor") or type_text in _TENSOR_TYPES


def _schema_of(target: Target) -> Any:
    """The torch schema a translation for ``target`` receives, or None (unknown or ambiguous).

    A named overload gives its own schema; a bare ``ns::op`` gives the default overload's, or the
    only overload's. Looked up without touching ``torch.ops`` (no side effects).
    """
    if target.name is None:
        return None
    try:
        schemas = torch._C._jit_get_schemas_for_operator(target.name.op)
    except RuntimeError:
        return None
    wanted = "" if target.name.overload in ("", "default") else target.name.overload
    chosen = [s for s in schemas if s.overload_name == wanted]
    if not chosen and not target.name.overload and len(schemas) == 1:
        chosen = list(schemas)
    return chosen[0] if chosen else None


def check_translation_signature(entry: SymbolicEntry, schema: Any) -> None:
    """`SymbolicError` unless ``entry.fn(g, *tensor_args, **other_args)`` binds for ``schema``."""
    try:
        signature = inspect.signature(entry.fn)
    except (TypeError, ValueError):  # builtins and some C callables: nothing to check
        return
    tensors = [a.name for a in schema.arguments if is_tensor_argument(str(a.type))]
    others = [a.name for a in schema.arguments if not is_tensor_argument(str(a.type))]
    try:
        signature.bind(None, *tensors, **dict.fromkeys(others))
    except TypeError as exc:
        listed = ", ".join(f"{a.name}: {a.type}" for a in schema.arguments)
        expected = ", ".join(["g", *tensors] + (["*", *others] if others else []))
        raise SymbolicError(
            f"The translation of {entry.target} ({entry.source}) does not match the op's torch"
            f" schema: {_signature_problem(signature, tensors, others) or exc}. The schema's"
            f" arguments are [{listed}]; expected `def"
            f" {getattr(entry.fn, '__name__', 'fn')}({expected})` (tensor arguments positional in"
            " schema order, other arguments keyword-named as in the schema, or **kwargs); received"
            f" `{getattr(entry.fn, '__name__', 'fn')}{signature}`. Fix: rename or reorder the"
            " translation's parameters (or, for a function written for torch's API, take all"
            f" {len(schema.arguments)} arguments positionally after g)."
        ) from None


def _signature_problem(signature: inspect.Signature, tensors: list[str], others: list[str]) -> str:
    """What exactly does not fit, in the schema's terms ('' when it is not that simple)."""
    params = list(signature.parameters.values())
    kinds = inspect.Parameter
    positional = [
        p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind == kinds.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == kinds.VAR_KEYWORD for p in params)
    problems: list[str] = []
    takes = len(positional) - 1  # after g
    if takes < len(tensors) and not var_positional:
        problems.append(
            f"it takes {max(takes, 0)} tensor input(s) after g, the schema has {len(tensors)}"
            f" ({', '.join(tensors)})"
        )
    filled = {p.name for p in positional[: 1 + len(tensors)]}
    keywords = {
        p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
    } - filled
    unaccepted = [name for name in others if name not in keywords and not var_keyword]
    if unaccepted:
        problems.append(f"it does not accept the schema argument(s) {unaccepted} as keywords")
    extra = [
        p.name
        for p in params
        if p.name not in filled
        and p.name not in others
        and p.default is p.empty
        and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
    ]
    if extra:
        problems.append(f"it requires {extra}, which the schema does not have")
    return "; ".join(problems)


def _check_torch_style(entry: SymbolicEntry, fn: Any, schema: Any) -> None:
    """A torch-style symbolic against the schema: its parse_args codes, and that it takes every
    argument positionally."""
    arguments = [(a.name, str(a.type)) for a in schema.arguments]
    codes = parse_args_codes(fn)
    if codes is not None:
        check_codes(str(entry.target), fn, codes, arguments)
    if not binds_torch_style(fn, len(arguments)):
        listed = ", ".join(f"{n}: {t}" for n, t in arguments)
        raise SymbolicError(
            f"The torch-style symbolic for {entry.target} ({entry.source}{_defined_at(fn)}) cannot"
            f" take the op's {len(arguments)} argument(s) [{listed}] positionally after g, as torch"
            f" calls it; received `{getattr(fn, '__name__', 'fn')}{inspect.signature(fn)}`. Fix:"
            " one parameter per argument (any names), or defaults for trailing ones."
        )


# -- same definition (re-import) vs a different one -----------------------------------------


def _code_key(code: Any) -> tuple[Any, ...]:
    consts = tuple(
        _code_key(c) if inspect.iscode(c) else (type(c).__name__, repr(c)) for c in code.co_consts
    )
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars)


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # arrays and other values without a plain truth value
        return False


def same_definition(a: Translation, b: Translation) -> bool:
    """Re-importing a module re-runs its decorators with new function objects: the same module,
    qualname, code (bytecode and constants), defaults and closure values is the same definition.
    Two different lambdas share module and qualname but not their code, so they differ."""
    if (
        getattr(a, TORCH_STYLE_MARK, None) is not None
        and getattr(b, TORCH_STYLE_MARK, None) is not None
    ):
        # Torch-style: the user's functions under our wrapper and torch's @parse_args wrapper
        # (whose closure holds the function, a new object on every import), and their codes.
        a, b = getattr(a, TORCH_STYLE_MARK), getattr(b, TORCH_STYLE_MARK)
        if parse_args_codes(a) != parse_args_codes(b):
            return False
        a, b = inspect.unwrap(a), inspect.unwrap(b)
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_b is None:
        return False
    if (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) != (
        getattr(b, "__module__", None),
        getattr(b, "__qualname__", None),
    ):
        return False
    if _code_key(code_a) != _code_key(code_b):
        return False
    cells_a = [c.cell_contents for c in getattr(a, "__closure__", None) or ()]
    cells_b = [c.cell_contents for c in getattr(b, "__closure__", None) or ()]
    return (
        _same_value(getattr(a, "__defaults__", None), getattr(b, "__defaults__", None))
        and _same_value(getattr(a, "__kwdefaults__", None), getattr(b, "__kwdefaults__", None))
        and len(cells_a) == len(cells_b)
        and all(_same_value(x, y) for x, y in zip(cells_a, cells_b, strict=True))
    )


class Registry:
    """Holds translations. Copy/extend it freely; the default registry is never touched by copies.

    ``prefer`` lists variants (e.g. ``("custom",)``). Lookup picks, per variant, its entry with
    the highest opset <= the export opset; the first preferred variant that has such an entry
    wins (at any opset, even below the default variant's newest), then the default variant.
    """

    def __init__(
        self,
        entries: Iterator[SymbolicEntry] | list[SymbolicEntry] = (),  # type: ignore[assignment]
        *,
        prefer: tuple[str, ...] = (),
    ) -> None:
        self._entries: dict[tuple[str, int, str], SymbolicEntry] = {}
        # Entries whose signature matched the torch schema (checked once: at registration when
        # the op exists, else at the first lookup after its library loaded).
        self._checked: set[tuple[tuple[str, int, str], int]] = set()
        self._lock = threading.RLock()
        # Entries sorted by key and grouped by target key, rebuilt after a change: every
        # TorchScript symbolic call looks its op up, and sorting all entries per lookup cost
        # more than the translation itself.
        self._sorted: tuple[SymbolicEntry, ...] | None = None
        self._by_target: dict[str, list[SymbolicEntry]] = {}
        self.prefer: tuple[str, ...] = tuple(prefer)
        for entry in entries:
            self.add(entry)

    # -- registration ---------------------------------------------------------------------
    def add(self, entry: SymbolicEntry, *, replace: bool = False) -> SymbolicEntry:
        if not isinstance(entry.opset, int) or isinstance(entry.opset, bool) or entry.opset < 1:
            raise SymbolicError(
                f"opset must be a positive int (the first opset the translation for {entry.target}"
                f" serves); received {entry.opset!r}. Fix: pass e.g. opset=9 (it then serves 9 and"
                " up)."
            )
        if not callable(entry.fn):
            raise SymbolicError(
                f"The translation for {entry.target} must be callable (a function taking g and the"
                f" op's inputs); received {type(entry.fn).__name__} ({entry.fn!r:.60}). Fix:"
                " decorate a function: @registry.symbolic(...) above def my_translation(g, x): ..."
            )
        if (
            getattr(entry.fn, TORCH_STYLE_MARK, None) is None
            and parse_args_codes(entry.fn) is not None
        ):
            entry = dataclasses.replace(
                entry, fn=torch_style_translation(entry.fn)
            )  # @parse_args: torch's API
        with self._lock:
            existing = self._entries.get(entry.key)
            if existing is not None and not replace and not same_definition(existing.fn, entry.fn):
                raise SymbolicError(
                    f"A different translation for {entry.target} at opset {entry.opset} (variant"
                    f" {entry.variant!r}) is already registered:"
                    f" {existing.source}{_defined_at(existing.fn)}; received"
                    f" {entry.source}{_defined_at(entry.fn)}. Fix: pass replace=True to override"
                    " it, or register at another opset/variant."
                )
            entry = self._check_signature(entry)
            self._entries[entry.key] = entry
            self._sorted = None
        return entry

    def _check_signature(self, entry: SymbolicEntry) -> SymbolicEntry:
        """Check ``entry`` against its op's torch schema once that op exists (else later).

        A function written for torch's API (every argument positional, named freely) that does
        not fit our convention comes back wrapped as a torch-style translation."""
        mark = (entry.key, id(entry.fn))
        if mark in self._checked:
            return entry
        schema = _schema_of(entry.target)
        if schema is None:
            return entry
        torch_style = getattr(entry.fn, TORCH_STYLE_MARK, None)
        if torch_style is not None:
            _check_torch_style(entry, torch_style, schema)
        else:
            try:
                check_translation_signature(entry, schema)
            except SymbolicError:
                if not binds_torch_style(entry.fn, len(schema.arguments)):
                    raise
                entry = dataclasses.replace(entry, fn=torch_style_translation(entry.fn))
        self._checked.add((entry.key, id(entry.fn)))
        return entry

    def symbolic(
        self,
        target: Any,
        *,
        opset: int = 1,
        variant: str = DEFAULT_VARIANT,
        emits: tuple[str, ...] | list[str] = (),
        replace: bool = False,
    ) -> Callable[[Translation], Translation]:
        """Decorator: register ``fn(g, *inputs, **attributes)`` for ``target`` from ``opset`` on."""
        normalized = normalize_target(target)
        if not isinstance(variant, str) or not variant:
            raise SymbolicError(f"variant must be a non-empty string, got {variant!r}.")

        def decorate(fn: Translation) -> Translation:
            self.add(SymbolicEntry(normalized, opset, fn, variant, tuple(emits)), replace=replace)
            return fn

        return decorate

    def remove(self, target: Any, *, opset: int, variant: str = DEFAULT_VARIANT) -> None:
        key = (normalize_target(target).key, opset, variant)
        with self._lock:
            if key not in self._entries:
                have = sorted(e.opset for e in self.entries_for(target) if e.variant == variant)
                raise SymbolicError(
                    f"No translation registered for {key[0]} at opset {opset} (variant"
                    f" {variant!r}); expected one of the registered opsets {have}. Fix: pass the"
                    " opset it was registered with."
                )
            entry = self._entries.pop(key)
            self._sorted = None
            self._checked.discard((key, id(entry.fn)))

    def update(self, other: Registry, *, replace: bool = False) -> Registry:
        for entry in other:
            self.add(entry, replace=replace)
        return self

    def copy(self) -> Registry:
        return Registry(list(self), prefer=self.prefer)

    def with_variants(self, *variants: str) -> Registry:
        """A copy that prefers the given variants, e.g. ``registry.with_variants("custom")``."""
        known = {e.variant for e in self}
        unknown = [v for v in variants if v not in known]
        if unknown:
            raise SymbolicError(
                f"Unknown variant(s) {unknown}; expected variants this registry has:"
                f" {sorted(known)}. Fix: pick one of those, or register translations with"
                " variant=<name> first."
            )
        out = self.copy()
        out.prefer = tuple(variants)
        return out

    # -- lookup ---------------------------------------------------------------------------
    def _snapshot(self) -> tuple[tuple[SymbolicEntry, ...], dict[str, list[SymbolicEntry]]]:
        with self._lock:
            if self._sorted is None:
                ordered = tuple(sorted(self._entries.values(), key=lambda e: e.key))
                groups: dict[str, list[SymbolicEntry]] = {}
                for entry in ordered:
                    groups.setdefault(entry.target.key, []).append(entry)
                self._sorted, self._by_target = ordered, groups
            return self._sorted, self._by_target

    def __iter__(self) -> Iterator[SymbolicEntry]:
        return iter(self._snapshot()[0])

    def entries(self) -> tuple[SymbolicEntry, ...]:
        """Every entry, sorted: an immutable snapshot, a new tuple object after any change (so
        data derived from a registry can be cached against it with ``is``)."""
        return self._snapshot()[0]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, target: object) -> bool:
        try:
            key = normalize_target(target).key
        except SymbolicError:
            return False
        return any(e.target.key == key for e in self)

    def targets(self) -> list[Target]:
        # the snapshot's groups: one per target, in entry order (no key built per entry)
        return [entries[0].target for entries in self._snapshot()[1].values()]

    def entries_for(self, target: Any) -> list[SymbolicEntry]:
        """Entries for ``target``; an overload (``ns::op.ovl``) falls back to ``ns::op`` entries."""
        tgt = target if isinstance(target, Target) else normalize_target(target)
        groups = self._snapshot()[1]
        exact = list(groups.get(tgt.key, ()))
        if exact or tgt.name is None or not tgt.name.overload:
            return exact
        return list(groups.get(tgt.name.op, ()))

    def opsets_for(self, target: Any) -> list[int]:
        return sorted({e.opset for e in self.entries_for(target)})

    def lookup(self, target: Any, opset: int, *, exporter: str = "") -> SymbolicEntry:
        """The entry that serves ``opset``: a preferred variant's newest entry <= ``opset`` if one
        has any, else the default variant's (see the class docstring)."""
        tgt = target if isinstance(target, Target) else normalize_target(target)
        entries = [e for e in self.entries_for(tgt) if e.opset <= opset]
        if not entries:
            available = self.opsets_for(tgt)
            where = f" for the {exporter} exporter" if exporter else ""
            if available:
                msg = (
                    f"No translation for {tgt}{where} at opset {opset}: translations exist from "
                    f"opset {available} on. Export with opset>={available[0]} or register a "
                    f"translation with @symbolic({str(tgt)!r}, opset={opset})."
                )
            else:
                msg = (
                    f"No translation registered for {tgt}{where}. Register one with"
                    f" @onnx_custom.symbolic({str(tgt)!r})."
                )
            raise UnsupportedOpError(msg, missing=(tgt.key,))
        # One rule for variants: each variant's own best entry (its highest opset <= the export
        # opset); the first preferred variant that has one wins, then the default variant, then
        # (no default at all) the variant with the highest opset. A preferred variant registered
        # at opset 11 so still wins when the default has an entry at 19 and the export is at 20.
        newest: dict[str, SymbolicEntry] = {}
        for entry in entries:
            if entry.variant not in newest or entry.opset > newest[entry.variant].opset:
                newest[entry.variant] = entry
        chosen = next((newest[v] for v in (*self.prefer, DEFAULT_VARIANT) if v in newest), None)
        if chosen is None:
            chosen = min(newest.values(), key=lambda e: (-e.opset, e.variant))
        with self._lock:
            checked = self._check_signature(chosen)  # registered before its op's library was loaded
            if checked is not chosen and self._entries.get(chosen.key) is chosen:
                self._entries[chosen.key] = checked
                self._sorted = None
        return checked

    def __repr__(self) -> str:
        return f"Registry({len(self)} translations, prefer={self.prefer})"


_default: Registry | None = None
_default_lock = threading.Lock()


def resolve_registry(registry: Registry | None) -> Registry:
    """``registry`` or the default one; a clear TypeError for anything else."""
    if registry is None:
        return default_registry()
    if not isinstance(registry, Registry):
        raise InvalidArgumentError(
            f"registry must be an onnx_custom.Registry or None; received {type(registry).__name__}."
            " Fix: build one with onnx_custom.Registry() or default_registry().copy(), or leave it"
            " out."
        )
    return registry


def default_registry() -> Registry:
    """The registry holding the built-in translations (assembled on first use) plus user ones."""
    global _default
    with _default_lock:
        if _default is None:
            from onnx_custom.common.builtins import SYMBOLIC_MODULES

            registry = Registry()
            for module_name in SYMBOLIC_MODULES:
                module = importlib.import_module(module_name)
                registry.update(module.registry)
            _default = registry
        return _default


def symbolic(
    target: Any,
    *,
    opset: int = 1,
    registry: Registry | None = None,
    variant: str = DEFAULT_VARIANT,
    emits: tuple[str, ...] | list[str] = (),
    replace: bool = False,
) -> Callable[[Translation], Translation]:
    """Register a translation ``fn(g, *inputs, **attributes)`` for ``target``.

    ``target`` is a qualified torch op name (``"aten::asinh"``, ``"mylib::my_add.default"``), an
    ``OpOverload``, or a ``torch.autograd.Function`` subclass (TorchScript exporter only).
    ``opset`` is the first opset the translation is valid for; the highest ``opset`` <= the export
    opset wins. Without ``registry`` it goes to the default registry.
    """
    reg = resolve_registry(registry)
    return reg.symbolic(target, opset=opset, variant=variant, emits=emits, replace=replace)
