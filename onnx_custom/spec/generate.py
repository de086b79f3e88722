"""Registering a spec: everything one declaration generates, all or nothing, undoable.

`register_spec` checks every referenced function against the spec first, then registers

1. the ``torch.library`` op (schema from the spec), its fake kernel and its autograd formula;
2. the translations, into the default translation registry (both exporters): the custom-node
   translation (variant ``"custom"`` when standard translations exist, else the default) and
   each standard translation from its opset on;
3. the Python kernel (a `KernelSpec` with the spec's dtypes and shape rules) into the default
   kernel registry, which `onnx_custom.InferenceSession` uses;
4. the node's ONNX ``OpSchema``.

If any step fails, the steps already done are undone and the error propagates. Registering an
identical spec again is a no-op; a different spec under a registered name is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from onnx_custom.errors import SymbolicError
from onnx_custom.names import Target, normalize_target
from onnx_custom.registry import DEFAULT_VARIANT, SymbolicEntry, default_registry
from onnx_custom.runtime import registry as kernel_registry
from onnx_custom.runtime.registry import KernelRegistry, KernelSpec, default_kernel_registry
from onnx_custom.spec import onnx_side, signatures, torch_op
from onnx_custom.spec.spec import OpSpec, SpecError

__all__ = ["CUSTOM_VARIANT", "SpecRegistration", "register_spec", "registered_specs", "spec_scope", "unregister_spec"]

CUSTOM_VARIANT = "custom"

_lock = threading.RLock()
_registered: dict[str, SpecRegistration] = {}


@dataclasses.dataclass
class SpecRegistration:
    """What registering ``spec`` produced. A context manager: leaving the block unregisters what
    this registration added (nothing, for a repeated registration of an identical spec)."""

    spec: OpSpec
    op: Any  # the torch OpOverload (ns::op.default)
    kernel: KernelSpec | None  # the Python kernel served to InferenceSession (None: none declared)
    declaration: KernelSpec | None  # the node's declaration (schema, function body), if it has a node
    translations: tuple[SymbolicEntry, ...]
    owned: bool = True
    _undo: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False)

    def unregister(self) -> None:
        """Take back everything this registration added (idempotent)."""
        if not self.owned:
            return
        with _lock:
            if _registered.get(self.spec.name) is self:
                del _registered[self.spec.name]
            _run_undo(self._undo)
            self.owned = False

    def __enter__(self) -> SpecRegistration:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.unregister()
            return
        try:  # the block's error wins; a failure while undoing becomes a warning
            self.unregister()
        except Exception as error:
            warnings.warn(f"onnx-custom: undoing the registration of {self.spec.name} failed: {error!r}", RuntimeWarning, stacklevel=2)


def _run_undo(steps: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []
    while steps:
        try:
            steps.pop()()
        except Exception as exc:  # keep undoing the rest; report the first failure
            errors.append(exc)
    if errors:
        raise errors[0]


def _difference(old: OpSpec, new: OpSpec) -> str:
    fields = [f.name for f in dataclasses.fields(OpSpec) if f.compare and getattr(old, f.name) != getattr(new, f.name)]
    return ", ".join(f"{f}: {getattr(old, f)!r} -> {getattr(new, f)!r}" for f in fields)


@dataclasses.dataclass(frozen=True)
class _Resolved:
    impl: Any
    meta: Any
    backward: Any
    setup_context: Any
    kernel_fn: Any
    kernel_decl: KernelSpec | None
    function: Any
    translations: tuple[tuple[int, Any], ...]


def _resolve(spec: OpSpec) -> _Resolved:
    """Import every reference and check its parameters against the spec."""
    def get(field: str, what: str) -> Any:
        return signatures.resolve(spec, (field,), getattr(spec, field), what)

    impl, meta = get("impl", "impl"), get("shape", "shape (meta function)")
    for fn, role, field in ((impl, "impl", "impl"), (meta, "shape", "shape")):
        if fn is not None:
            signatures.check_math_signature(spec, fn, role, (field,), getattr(spec, field))
    backward, setup_context = get("backward", "backward"), get("setup_context", "setup_context")
    signatures.check_backward(spec, backward, setup_context)
    kernel = get("kernel", "kernel")
    kernel_fn: Any = None
    kernel_decl: KernelSpec | None = None
    if isinstance(kernel, (KernelSpec, KernelRegistry)):
        kernel_decl = onnx_side.check_kernel_spec(spec, kernel)
    elif kernel is not None:
        signatures.check_math_signature(spec, kernel, "kernel", ("kernel",), spec.kernel)
        kernel_fn = kernel
    translations = []
    for opset, ref in spec.translation_refs:
        fn = signatures.resolve(spec, ("translations", opset), ref, f"translation for opset {opset}")
        signatures.check_math_signature(spec, fn, "translation", ("translations", opset), ref)
        translations.append((opset, fn))
    return _Resolved(impl, meta, backward, setup_context, kernel_fn, kernel_decl, get("function", "function"), tuple(translations))


def _translation_entries(spec: OpSpec, resolved: _Resolved) -> list[SymbolicEntry]:
    entries = [SymbolicEntry(_target(spec), opset, fn, DEFAULT_VARIANT) for opset, fn in resolved.translations]
    if spec.node_type is not None:
        node = onnx_side.custom_node_translation(spec)
        variant = CUSTOM_VARIANT if entries else DEFAULT_VARIANT
        # One custom entry per opset that starts a standard translation: the registry prefers a
        # variant only among entries at the best opset, so `with_variants("custom")` finds it.
        for opset in sorted({1} | {e.opset for e in entries}):
            entries.append(SymbolicEntry(_target(spec), opset, node, variant, (spec.node_type,)))
    return entries


def _target(spec: OpSpec) -> Target:
    return normalize_target(spec.name)


def _user_kernels() -> KernelRegistry:
    # The registry `onnx_custom.kernel(...)` fills; `default_kernel_registry()` serves it to
    # every InferenceSession. (runtime.registry has no public remove, hence the private name.)
    return kernel_registry._user


def register_spec(spec: OpSpec) -> SpecRegistration:
    """Register everything ``spec`` generates (see the module docstring); returns the handle.

    Raises `SpecError` (a `SymbolicError`) naming the op, the offending key and the fix, with
    nothing registered, when a referenced function does not match the spec, a name is taken, or
    a different spec is registered under the same name.
    """
    if not isinstance(spec, OpSpec):
        raise SpecError(f"register_spec expects an onnx_custom.OpSpec; received {type(spec).__name__}; fix: build one with OpSpec(...) or load_specs(path).")
    with _lock:
        current = _registered.get(spec.name)
        if current is not None:
            if current.spec == spec:
                return dataclasses.replace(current, owned=False, _undo=[])
            raise SpecError(
                f"op {spec.name} is already registered from a different spec ({current.spec.source or 'Python'}); "
                f"differences: {_difference(current.spec, spec)}; fix: unregister the first "
                "(onnx_custom.spec.unregister_spec) or give the new op another name.",
                op=spec.name, key=("name",),
            )
        resolved = _resolve(spec)
        undo: list[Callable[[], None]] = []
        try:
            registration = _register(spec, resolved, undo)
        except BaseException:
            _run_undo(undo)
            raise
        _registered[spec.name] = registration
        return registration


def _register(spec: OpSpec, resolved: _Resolved, undo: list[Callable[[], None]]) -> SpecRegistration:
    declaration = resolved.kernel_decl
    if declaration is None and spec.node_type is not None:
        declaration = onnx_side.kernel_spec(spec, resolved.kernel_fn, resolved.meta, resolved.function)
    if declaration is not None and resolved.function is not None:
        onnx_side.check_function_body(spec, declaration)
    served = declaration if resolved.kernel_fn is not None or resolved.kernel_decl is not None else None
    present = None if served is None else default_kernel_registry().get(served.name)
    if served is not None and present is not None and present is not served:
        raise SpecError(f"op {spec.name}: a kernel for {served.name} is already registered ({present.fn!r}); fix: pick another op_type/domain, or drop the other kernel.", op=spec.name, key=("op_type",))
    op = torch_op.define_op(spec, resolved.impl, resolved.meta, resolved.backward, resolved.setup_context)
    undo.append(op.undo)
    registry = default_registry()
    entries = _translation_entries(spec, resolved)
    for entry in entries:
        try:
            registry.add(entry)
        except SymbolicError as exc:
            key = ("translations", entry.opset) if not entry.emits else ("op_type",)
            raise SpecError(f"op {spec.name}: {exc}", op=spec.name, key=key) from None
        undo.append(functools.partial(registry.remove, str(entry.target), opset=entry.opset, variant=entry.variant))
    if served is not None and present is None:  # a built-in kernel is served already
        _user_kernels().add(served)
        undo.append(functools.partial(_user_kernels().remove, served.name))
    if declaration is not None:
        schema_undo = onnx_side.register_onnx_schema(declaration)
        if schema_undo is not None:
            undo.append(schema_undo)
    return SpecRegistration(spec, op.overload, served, declaration, tuple(entries), True, undo)


def unregister_spec(spec: OpSpec | str) -> None:
    """Unregister the spec registered under ``spec``'s name (`SpecError` if none is)."""
    name = spec.name if isinstance(spec, OpSpec) else spec
    with _lock:
        registration = _registered.get(name)
        if registration is None:
            raise SpecError(f"no spec is registered under {name!r}; registered: {sorted(_registered) or 'none'}.", op=str(name))
        registration.unregister()


def registered_specs() -> dict[str, OpSpec]:
    """The registered specs by op name."""
    with _lock:
        return {name: r.spec for name, r in _registered.items()}


@contextlib.contextmanager
def spec_scope() -> Iterator[None]:
    """Specs registered inside the block (``load_specs``, ``register_spec``) are unregistered on
    exit, also when the block raises (its error then wins over any error while undoing, which
    becomes a warning); specs registered before the block stay."""
    with _lock:
        before = set(_registered)
    try:
        yield
    except BaseException:
        for error in _unregister_since(before):
            warnings.warn(f"onnx-custom: undoing a spec registration failed: {error!r}", RuntimeWarning, stacklevel=3)
        raise
    errors = _unregister_since(before)
    if errors:
        raise errors[0]


def _unregister_since(before: set[str]) -> list[Exception]:
    with _lock:
        added = [r for name, r in _registered.items() if name not in before]
    errors: list[Exception] = []
    for registration in reversed(added):
        try:
            registration.unregister()
        except Exception as exc:  # undo the others regardless
            errors.append(exc)
    return errors
