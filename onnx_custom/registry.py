"""The translation registry: frozen entries keyed by validated targets, opset-versioned."""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from onnx_custom.errors import SymbolicError, UnsupportedOpError
from onnx_custom.names import Target, normalize_target

__all__ = [
    "DEFAULT_VARIANT",
    "Registry",
    "SymbolicEntry",
    "default_registry",
    "resolve_registry",
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
    # Custom node types ("custom::my_add") this translation emits; used by pre-flight checks.
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


def _same_definition(a: Translation, b: Translation) -> bool:
    # Re-importing a module re-runs its decorators with new function objects; treat the same
    # module + qualname as the same definition so a double import is harmless.
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None),
        getattr(b, "__qualname__", None),
    ) and getattr(a, "__qualname__", None) is not None


class Registry:
    """Holds translations. Copy/extend it freely; the default registry is never touched by copies.

    ``prefer`` lists variants (e.g. ``("custom",)``) that win over the default variant when a
    target has several translations at the chosen opset.
    """

    def __init__(self, entries: Iterator[SymbolicEntry] | list[SymbolicEntry] = (), *, prefer: tuple[str, ...] = ()) -> None:  # type: ignore[assignment]
        self._entries: dict[tuple[str, int, str], SymbolicEntry] = {}
        self._lock = threading.RLock()
        self.prefer: tuple[str, ...] = tuple(prefer)
        for entry in entries:
            self.add(entry)

    # -- registration ---------------------------------------------------------------------
    def add(self, entry: SymbolicEntry, *, replace: bool = False) -> SymbolicEntry:
        if not isinstance(entry.opset, int) or isinstance(entry.opset, bool) or entry.opset < 1:
            raise SymbolicError(f"opset must be a positive int, got {entry.opset!r} for {entry.target}.")
        if not callable(entry.fn):
            raise SymbolicError(f"The translation for {entry.target} must be callable, got {entry.fn!r}.")
        with self._lock:
            existing = self._entries.get(entry.key)
            if existing is not None and not replace and not _same_definition(existing.fn, entry.fn):
                raise SymbolicError(
                    f"A translation for {entry.target} at opset {entry.opset} (variant "
                    f"{entry.variant!r}) is already registered: {existing.source}. Pass "
                    "replace=True to override it, or register at another opset/variant."
                )
            self._entries[entry.key] = entry
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
                raise SymbolicError(f"No translation registered for {key[0]} at opset {opset} (variant {variant!r}).")
            del self._entries[key]

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
            raise SymbolicError(f"Unknown variant(s) {unknown}; this registry has {sorted(known)}.")
        out = self.copy()
        out.prefer = tuple(variants)
        return out

    # -- lookup ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[SymbolicEntry]:
        with self._lock:
            return iter(sorted(self._entries.values(), key=lambda e: e.key))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, target: object) -> bool:
        try:
            key = normalize_target(target).key
        except SymbolicError:
            return False
        return any(e.target.key == key for e in self)

    def targets(self) -> list[Target]:
        seen: dict[str, Target] = {}
        for entry in self:
            seen.setdefault(entry.target.key, entry.target)
        return list(seen.values())

    def entries_for(self, target: Any) -> list[SymbolicEntry]:
        """Entries for ``target``; an overload (``ns::op.ovl``) falls back to ``ns::op`` entries."""
        tgt = target if isinstance(target, Target) else normalize_target(target)
        exact = [e for e in self if e.target.key == tgt.key]
        if exact or tgt.name is None or not tgt.name.overload:
            return exact
        return [e for e in self if e.target.key == tgt.name.op]

    def opsets_for(self, target: Any) -> list[int]:
        return sorted({e.opset for e in self.entries_for(target)})

    def lookup(self, target: Any, opset: int, *, exporter: str = "") -> SymbolicEntry:
        """The entry with the highest ``opset`` <= ``opset`` (preferred variants first)."""
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
                msg = f"No translation registered for {tgt}{where}. Register one with @onnx_custom.symbolic({str(tgt)!r})."
            raise UnsupportedOpError(msg, missing=(tgt.key,))
        best = max(e.opset for e in entries)
        at_best = {e.variant: e for e in entries if e.opset == best}
        for variant in (*self.prefer, DEFAULT_VARIANT):
            if variant in at_best:
                return at_best[variant]
        return at_best[sorted(at_best)[0]]

    def __repr__(self) -> str:
        return f"Registry({len(self)} translations, prefer={self.prefer})"


_default: Registry | None = None
_default_lock = threading.Lock()


def resolve_registry(registry: Registry | None) -> Registry:
    """``registry`` or the default one; a clear TypeError for anything else."""
    if registry is None:
        return default_registry()
    if not isinstance(registry, Registry):
        raise TypeError(f"registry must be an onnx_custom.Registry or None, got {type(registry).__name__}. Build one with onnx_custom.Registry() or default_registry().copy().")
    return registry


def default_registry() -> Registry:
    """The registry holding the built-in translations (assembled on first use) plus user ones."""
    global _default
    with _default_lock:
        if _default is None:
            from onnx_custom._builtins import SYMBOLIC_MODULES

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
