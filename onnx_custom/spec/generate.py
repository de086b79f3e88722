"""What one spec generates, and registering it.

Everything a spec generates is made from it once per process and shared:

1. the ``torch.library`` op (schema from the spec), its fake kernel and its autograd formula
   (`define_op`);
2. the translations (both exporters): the custom-node translation where the spec places it
   (`OpSpec.node_placements`) and each standard translation from its opset on
   (`spec_translations`, a module-local `Registry`);
3. the Python kernel (a `KernelSpec` with the spec's dtypes and shape rules) and the node's
   ONNX function body (`spec_kernels`, a module-local `KernelRegistry`);
4. the node's ONNX ``OpSchema`` (registered with the kernel).

Built-in op families call `define_op` when their ops module is imported and build their
``registry``/``kernels`` with `spec_translations`/`spec_kernels`; the default registries
assemble those lazily (`onnx_custom.common.builtins`), so nothing global changes at import time.

`register_spec` puts all of it into the default registries at once (a user's op, or a built-in
spec again, e.g. inside `onnx_custom.testing.check_op`): all or nothing, undoable. Registering an
identical spec again is a no-op; a different spec under a registered name is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from onnx_custom.errors import SymbolicError
from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.runtime import registry as kernel_registry
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.runtime.registry import KernelRegistry, default_kernel_registry
from onnx_custom.spec import onnx_side, signatures, torch_op
from onnx_custom.spec.spec import EAGER, NODE, OpSpec, SpecError
from onnx_custom.translate.names import Target, normalize_target
from onnx_custom.translate.registry import (
    DEFAULT_VARIANT,
    Registry,
    SymbolicEntry,
    default_registry,
    same_definition,
)

__all__ = [
    "CUSTOM_VARIANT",
    "SpecRegistration",
    "define_op",
    "register_spec",
    "registered_specs",
    "spec_kernels",
    "spec_scope",
    "spec_translations",
    "unregister_spec",
]

CUSTOM_VARIANT = "custom"

_lock = threading.RLock()
_registered: dict[str, SpecRegistration] = {}
# Per thread: the open spec_scope blocks, innermost last, each with what was registered in it.
_scopes = threading.local()


def _open_scopes() -> list[list[SpecRegistration]]:
    stack: list[list[SpecRegistration]] | None = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    return stack


# -- the parts one spec generates -----------------------------------------------------------------


def _torch_side(spec: OpSpec) -> tuple[Any, ...]:
    """What the torch op is made from: two specs equal here share one torch op (they may differ
    on the ONNX side, e.g. a custom node in another domain)."""
    return (
        spec.name,
        spec.inputs,
        spec.outputs,
        spec.attributes,
        spec.impl,
        spec.check,
        spec.backward,
        spec.setup_context,
        spec.shape,
        spec.devices,
    )


class _Parts:
    """Everything ``spec`` generates, each part resolved, checked and made on first use.

    The torch side (impl, check, meta, backward) and the ONNX side (translations, kernel,
    function body) resolve separately: defining the torch op never imports translation or
    kernel modules."""

    def __init__(self, spec: OpSpec) -> None:
        self.spec = spec
        self._lock = threading.RLock()

    def _get(self, field: str, what: str) -> Any:
        return signatures.resolve(self.spec, (field,), getattr(self.spec, field), what)

    @functools.cached_property
    def torch_refs(self) -> tuple[Any, Any, Any, Any, Any]:
        """(impl, meta, check, backward, setup_context), checked against the spec."""
        spec = self.spec
        impl, meta = self._get("impl", "impl"), self._get("shape", "shape (meta function)")
        for fn, role in ((impl, "impl"), (meta, "shape")):
            if fn is not None:
                signatures.check_math_signature(spec, fn, role, (role,), getattr(spec, role))
        impl, meta = signatures.inputs_first(spec, impl), signatures.inputs_first(spec, meta)
        impl = signatures.with_taken_constants(spec, impl)
        check = self._get("check", "check")
        if check is not None:
            signatures.check_check_signature(spec, check, spec.check)
        backward, setup_context = (
            self._get("backward", "backward"),
            self._get("setup_context", "setup_context"),
        )
        signatures.check_backward(spec, backward, setup_context)
        return impl, meta, check, backward, setup_context

    @functools.cached_property
    def translations(self) -> tuple[tuple[int, str, Any], ...]:
        """(opset, variant, fn) of the standard translations, checked against the spec."""
        out = []
        for opset, variant, ref in self.spec.translation_refs:
            if ref == NODE:
                continue
            key = (
                ("translations", opset)
                if variant == DEFAULT_VARIANT
                else ("translations", opset, variant)
            )
            fn = signatures.resolve(self.spec, key, ref, f"translation for opset {opset}")
            signatures.check_math_signature(self.spec, fn, "translation", key, ref)
            out.append((opset, variant, fn))
        return tuple(out)

    @functools.cached_property
    def entries(self) -> tuple[SymbolicEntry, ...]:
        """The registry entries: standard translations and the custom node where placed."""
        spec, target = self.spec, normalize_target(self.spec.name)
        entries = [
            SymbolicEntry(target, opset, onnx_side.with_node_constants(spec, fn), variant)
            for opset, variant, fn in self.translations
        ]
        if spec.node_type is not None:
            node = onnx_side.custom_node_translation(spec)
            entries += [
                SymbolicEntry(target, opset, node, variant, (spec.node_type,))
                for opset, variant in spec.node_placements()
            ]
        return tuple(sorted(entries, key=lambda e: e.key))

    @functools.cached_property
    def function(self) -> Any:
        """The node's function body: a translation becomes a `TranslationBody` valid from the
        first opset the spec's translations use it at."""
        fn = self._get("function", "function")
        if fn is None or isinstance(fn, TranslationBody) or not _is_translation(fn):
            return fn
        opsets = [opset for opset, _, t in self.translations if t is fn]
        return TranslationBody(fn, min_opset=min(opsets, default=1))

    @functools.cached_property
    def kernels(self) -> tuple[KernelSpec | None, KernelSpec | None]:
        """(served, declaration): the kernel ONNX Runtime runs (None: no Python kernel) and the
        node's declaration (schema, function body; None without a custom node)."""
        spec = self.spec
        if spec.node_type is None:
            return None, None
        kernel = spec.kernel if spec.kernel == EAGER else self._get("kernel", "kernel")
        if isinstance(kernel, (KernelSpec, KernelRegistry)):
            declared = onnx_side.check_kernel_spec(spec, kernel)
            if self.function is not None:
                onnx_side.check_function_body(
                    spec, dataclasses.replace(declared, function=self.function)
                )
            return declared, declared
        if kernel is not None and kernel != EAGER:
            signatures.check_math_signature(spec, kernel, "kernel", ("kernel",), spec.kernel)
        meta = self.torch_refs[1] if spec.shape is not None else None
        declaration = onnx_side.kernel_spec(
            spec, kernel, meta, self.function, check=self._get("check", "check")
        )
        if self.function is not None:
            onnx_side.check_function_body(spec, declaration)
        return (declaration if kernel is not None else None), declaration

    def resolve_all(self) -> None:
        """Resolve and check every reference now (registration reports problems up front)."""
        with self._lock:
            _ = self.torch_refs, self.entries, self.kernels


_built: list[_Parts] = []  # parts of the specs built-in families generate (define_op & co.)
_ops: dict[str, tuple[tuple[Any, ...], torch_op.TorchOp]] = {}  # torch ops made by define_op


def _built_parts(spec: OpSpec) -> _Parts:
    with _lock:
        for parts in _built:
            if parts.spec == spec:
                return parts
        parts = _Parts(spec)
        _built.append(parts)
        return parts


def _is_translation(fn: Any) -> bool:
    """A function taking the builder first (``fn(g, ...)``), not a zero-argument body builder."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].kind in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    )


def define_op(spec: OpSpec) -> Any:
    """The torch op ``spec`` declares: defined (or, without ``impl``, adopted from the library
    that defines it) once per process, with its fake kernel and autograd formula. Returns what
    users call (the ``CustomOpDef``, or ``torch.ops.<ns>.<op>`` for an adopted op).

    A built-in op family calls this when its ops module is imported. A different spec under the
    same name raises `SpecError`.
    """
    if not isinstance(spec, OpSpec):
        raise SpecError(
            f"define_op expects an onnx_custom.OpSpec; received {type(spec).__name__}; fix: build"
            " one with OpSpec(...)."
        )
    with _lock:
        made = _ops.get(spec.name)
        if made is not None:
            if made[0] != _torch_side(spec):
                raise SpecError(
                    f"op {spec.name} is already defined from a different spec; fix: give the new op"
                    " another name.",
                    op=spec.name,
                    key=("name",),
                )
            return made[1].callable
        user = _registered.get(spec.name)
        if user is not None:
            raise SpecError(
                f"op {spec.name} is registered with register_spec ({user.spec.source or 'Python'});"
                " fix: use that registration's op (handle.op), or unregister it first.",
                op=spec.name,
                key=("name",),
            )
        parts = _built_parts(spec)
        op = torch_op.make_op(spec, *_torch_args(parts))
        _ops[spec.name] = (_torch_side(spec), op)
        return op.callable


def _torch_args(parts: _Parts) -> tuple[Any, ...]:
    impl, meta, check, backward, setup_context = parts.torch_refs
    return impl, meta, backward, setup_context, check


def spec_translations(*specs: OpSpec) -> Registry:
    """A new `Registry` with the translations of ``specs`` (for a family module's ``registry``)."""
    registry = Registry()
    for spec in specs:
        for entry in _built_parts(spec).entries:
            registry.add(entry)
    return registry


def spec_kernels(*specs: OpSpec) -> KernelRegistry:
    """A new `KernelRegistry` with the Python kernels of ``specs`` (for a family's ``kernels``)."""
    registry = KernelRegistry()
    for spec in specs:
        served, _ = _built_parts(spec).kernels
        if served is not None:
            registry.add(served)
    return registry


# -- registering into the default registries ---------------------------------------------------


@dataclasses.dataclass
class SpecRegistration:
    """What registering ``spec`` produced. A context manager: leaving the block unregisters what
    this registration added (nothing, for a repeated registration of an identical spec)."""

    spec: OpSpec
    op: Any  # the torch OpOverload (ns::op.default)
    kernel: KernelSpec | None  # the Python kernel served to InferenceSession (None: none declared)
    declaration: (
        KernelSpec | None
    )  # the node's declaration (schema, function body), if it has a node
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
            warnings.warn(
                f"onnx-custom: undoing the registration of {self.spec.name} failed: {error!r}",
                RuntimeWarning,
                stacklevel=2,
            )


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
    fields = [
        f.name
        for f in dataclasses.fields(OpSpec)
        if f.compare and getattr(old, f.name) != getattr(new, f.name)
    ]
    return ", ".join(f"{f}: {getattr(old, f)!r} -> {getattr(new, f)!r}" for f in fields)


def _target(spec: OpSpec) -> Target:
    return normalize_target(spec.name)


def _user_kernels() -> KernelRegistry:
    # The registry `onnx_custom.kernel(...)` fills; `default_kernel_registry()` serves it to
    # every InferenceSession.
    return kernel_registry.user_kernel_registry()


def register_spec(spec: OpSpec) -> SpecRegistration:
    """Register everything ``spec`` generates (see the module docstring); returns the handle.

    Raises `SpecError` (a `SymbolicError`) naming the op, the offending key and the fix, with
    nothing registered, when a referenced function does not match the spec, a name is taken, or
    a different spec is registered under the same name. A built-in spec (its op already defined
    by its family) registers what is not yet in the default registries and owns only that.
    """
    if not isinstance(spec, OpSpec):
        raise SpecError(
            f"register_spec expects an onnx_custom.OpSpec; received {type(spec).__name__}; fix:"
            " build one with OpSpec(...) or load_specs(path)."
        )
    # Assemble the default registries *before* taking _lock: building them imports the family
    # modules, which take _lock (define_op) while holding the registries' own lock; taking the two
    # locks in the other order here would deadlock against a first export in another thread.
    default_registry()
    default_kernel_registry()
    with _lock:
        current = _registered.get(spec.name)
        if current is not None:
            if current.spec == spec:
                return dataclasses.replace(current, owned=False, _undo=[])
            raise SpecError(
                f"op {spec.name} is already registered from a different spec"
                f" ({current.spec.source or 'Python'}); differences:"
                f" {_difference(current.spec, spec)}; fix: unregister the first"
                " (onnx_custom.spec.unregister_spec) or give the new op another name.",
                op=spec.name,
                key=("name",),
            )
        made = _ops.get(spec.name)
        if made is not None and made[0] != _torch_side(spec):
            raise SpecError(
                f"op {spec.name} is a built-in op defined from a different spec; fix: give your op"
                " another name.",
                op=spec.name,
                key=("name",),
            )
        # A built-in spec reuses what its family generated (the objects in the default
        # registries); anything else is resolved afresh, so edited user modules are seen.
        parts = _built_parts(spec) if made is not None else _Parts(spec)
        parts.resolve_all()
        undo: list[Callable[[], None]] = []
        try:
            registration = _register(spec, parts, made[1] if made is not None else None, undo)
        except BaseException:
            _run_undo(undo)
            raise
        _registered[spec.name] = registration
        scopes = _open_scopes()
        if scopes:
            scopes[-1].append(registration)
        return registration


def _register(
    spec: OpSpec, parts: _Parts, made: torch_op.TorchOp | None, undo: list[Callable[[], None]]
) -> SpecRegistration:
    served, declaration = parts.kernels
    present = None if served is None else default_kernel_registry().get(served.name)
    if (
        served is not None and present is not None and present.fn is not served.fn
    ):  # same fn: the built-in one
        raise SpecError(
            f"op {spec.name}: a kernel for {served.name} is already registered ({present.fn!r});"
            " fix: pick another op_type/domain, or drop the other kernel.",
            op=spec.name,
            key=("op_type",),
        )
    op = made
    if op is None:
        op = torch_op.make_op(spec, *_torch_args(parts))
        undo.append(op.undo)
    registry = default_registry()
    for entry in parts.entries:
        same = [
            e
            for e in registry.entries_for(entry.target)
            if (e.opset, e.variant) == (entry.opset, entry.variant)
        ]
        if any(e is entry or same_definition(e.fn, entry.fn) for e in same):
            continue  # already there (built in, or registered by its author): not ours to undo
        try:
            registry.add(entry)
        except SymbolicError as exc:
            key = ("translations", entry.opset) if not entry.emits else ("op_type",)
            raise SpecError(f"op {spec.name}: {exc}", op=spec.name, key=key) from None
        undo.append(
            functools.partial(
                registry.remove, str(entry.target), opset=entry.opset, variant=entry.variant
            )
        )
    if served is not None and present is None:
        _user_kernels().add(served)
        undo.append(functools.partial(_user_kernels().remove, served.name))
    if declaration is not None:
        schema_undo = onnx_side.register_onnx_schema(declaration)
        if schema_undo is not None:
            undo.append(schema_undo)
    return SpecRegistration(spec, op.overload, served, declaration, parts.entries, True, undo)


def unregister_spec(spec: OpSpec | str) -> None:
    """Unregister the spec registered under ``spec``'s name (`SpecError` if none is)."""
    name = spec.name if isinstance(spec, OpSpec) else spec
    with _lock:
        registration = _registered.get(name)
        if registration is None:
            raise SpecError(
                f"no spec is registered under {name!r}; registered:"
                f" {sorted(_registered) or 'none'}.",
                op=str(name),
            )
        registration.unregister()


def registered_specs() -> dict[str, OpSpec]:
    """The registered specs by op name."""
    with _lock:
        return {name: r.spec for name, r in _registered.items()}


@contextlib.contextmanager
def spec_scope() -> Iterator[None]:
    """Specs this thread registers inside the block (``load_specs``, ``register_spec``) are
    unregistered on exit, also when the block raises (its error then wins over any error while
    undoing, which becomes a warning); specs registered before the block, or by other threads
    meanwhile, stay. Scopes are per thread: two threads each in their own scope (e.g. exporting
    with different specs) never take back each other's registrations."""
    mine: list[SpecRegistration] = []
    stack = _open_scopes()
    stack.append(mine)
    try:
        yield
    except BaseException:
        stack.remove(mine)
        for error in _unregister_all(mine):
            warnings.warn(
                f"onnx-custom: undoing a spec registration failed: {error!r}",
                RuntimeWarning,
                stacklevel=3,
            )
        raise
    stack.remove(mine)
    errors = _unregister_all(mine)
    if errors:
        raise errors[0]


def _unregister_all(registrations: list[SpecRegistration]) -> list[Exception]:
    errors: list[Exception] = []
    for registration in reversed(registrations):
        try:
            registration.unregister()
        except Exception as exc:  # undo the others regardless
            errors.append(exc)
    return errors
