"""Kernel registries: :class:`KernelRegistry`, the default registry (built-in family modules
listed in ``onnx_custom.common.builtins`` plus :func:`kernel` registrations) and :func:`kernel`.
The declarations they hold are in :mod:`onnx_custom.runtime.kernel_spec`."""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from onnx_custom.errors import KernelError
from onnx_custom.runtime.kernel_spec import AttrSpec, KernelSpec, ParamSpec, make_spec, split_name

__all__ = [
    "AttrSpec",
    "KernelRegistry",
    "KernelSpec",
    "ParamSpec",
    "default_kernel_registry",
    "kernel",
    "split_name",
    "user_kernel_registry",
]


def _defined_at(fn: Any) -> str:
    """``module.qualname (file.py:12)``: which function, and where (two lambdas differ by line)."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return (
        name
        if code is None
        else f"{name} at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
    )


class KernelRegistry:
    """A set of kernels keyed by ``domain::OpType``. Copy with :meth:`copy`,
    merge with :meth:`update`."""

    def __init__(self, specs: Iterable[KernelSpec] = ()) -> None:
        self._specs: dict[str, KernelSpec] = {}
        self._lock = threading.RLock()
        for s in specs:
            self.add(s)

    def kernel(
        self,
        name: str,
        *,
        inputs: Sequence[str],
        outputs: Sequence[str],
        attrs: Mapping[str, Any] | None = None,
        dtypes: Any = None,
        shape_fn: Callable[..., Any] | str | None = None,
        function: Any = None,
        tensor_type: str = "numpy",
        out: bool | None = None,
        replace: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` as the kernel of ``name`` (returns ``fn`` unchanged).

        ``inputs``/``outputs``: names, ``"x?"`` optional, ``"xs*"`` variadic (last).
        ``attrs``: ``{"alpha": "float"}`` (required) or ``{"alpha": ("float", 2.0)}`` (default).
        ``dtypes``: allowed dtype names for every input/output, or ``{param: [...]}``; None = all.
        ``shape_fn``: output types and shapes for shape inference and ``out=`` buffers.
        ``None`` (default): each output's dtype is its declared dtype when exactly one is
        declared, else input 0's, and its shape is unknown (nothing is claimed).
        ``"like:x"`` (``"like0"`` = the first input): every output has input ``x``'s dtype and
        shape. ``"broadcast"``: input 0's dtype, the inputs' broadcast shape. A callable
        ``(inputs: list[TensorInfo|None], attrs) -> TensorInfo | list[TensorInfo|None]``.
        ``function``: FunctionProto (or callable/onnxscript function producing one) used by
        :func:`onnx_custom.function_bodies.embed_functions`. ``tensor_type="torch"`` passes torch
        tensors instead of numpy. A kernel with an ``out`` keyword gets preallocated writable
        outputs (``out=(y0, ...)``) shaped by ``shape_fn`` and should return None.

        Inputs (and ``out`` buffers) are zero-copy views of ONNX Runtime memory, valid only
        during the call: inputs are read-only, and anything kept after returning must be copied.
        """

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            spec = make_spec(
                name,
                fn,
                inputs=inputs,
                outputs=outputs,
                attrs=attrs,
                dtypes=dtypes,
                shape_fn=shape_fn,
                function=function,
                tensor_type=tensor_type,
                out=out,
            )
            self.add(spec, replace=replace)
            return fn

        return deco

    def add(self, spec: KernelSpec, *, replace: bool = False) -> KernelSpec:
        if not isinstance(spec, KernelSpec):
            raise KernelError(
                f"expected a KernelSpec, received {type(spec).__name__}. Fix: register a function"
                " with @registry.kernel('domain::Op', inputs=[...], outputs=[...]), or add another"
                " registry's spec."
            )
        split_name(spec.name)
        with self._lock:
            existing = self._specs.get(spec.name)
            if existing is not None and not replace and existing is not spec:
                raise KernelError(
                    f"kernel {spec.name!r} is already registered ({_defined_at(existing.fn)}); "
                    f"received another one ({_defined_at(spec.fn)}); expected one kernel per "
                    "'domain::OpType'; fix: pass replace=True to override it, or register under "
                    "another 'domain::OpType'."
                )
            self._specs[spec.name] = spec
        return spec

    def alias(self, name: str, existing: str, *, replace: bool = False) -> KernelSpec:
        """Register the kernel of ``existing`` again as ``name`` (e.g. in your own domain)."""
        return self.add(self[existing].renamed(name), replace=replace)

    def remove(self, name: str) -> None:
        """Unregister ``name``; a `KernelError` (listing what is registered) when it is absent."""
        with self._lock:
            if name not in self._specs:
                self[name]  # raises with the list of registered names
            del self._specs[name]

    def get(self, name: str) -> KernelSpec | None:
        return self._specs.get(name)

    def lookup(self, domain: str, op_type: str) -> KernelSpec | None:
        return self._specs.get(f"{domain}::{op_type}")

    def find(self, node: Any) -> KernelSpec | None:
        """Kernel for ``"domain::OpType"`` or for an ``onnx.NodeProto`` (None if absent)."""
        if isinstance(node, str):
            return self._specs.get(node)
        return self.lookup(getattr(node, "domain", ""), getattr(node, "op_type", ""))

    def __getitem__(self, name: str) -> KernelSpec:
        spec = self._specs.get(name)
        if spec is None:
            known = ", ".join(sorted(self._specs)) or "(none)"
            raise KernelError(
                f"no kernel registered for {name!r}; expected one of the registered names: {known}."
                f" Fix: register it first with @registry.kernel({name!r}, ...), or correct the"
                " name."
            )
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[KernelSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def copy(self) -> KernelRegistry:
        # this registry's specs are valid and distinct already: no per-spec checks again (every
        # export and session copies the default registry)
        out = KernelRegistry()
        with self._lock:
            out._specs = dict(self._specs)
        return out

    def update(
        self, other: KernelRegistry | Iterable[KernelSpec], *, replace: bool = False
    ) -> KernelRegistry:
        """Add every kernel of ``other`` (raises on a clash unless ``replace``); returns self."""
        for spec in other:
            self.add(spec, replace=replace)
        return self

    def __repr__(self) -> str:
        return f"KernelRegistry({self.names()})"


# ---- the default registry ------------------------------------------------------------------
_user = KernelRegistry()
_builtin: KernelRegistry | None = None
_builtin_lock = threading.Lock()


def _builtin_registry() -> KernelRegistry:
    global _builtin
    with _builtin_lock:
        if _builtin is None:
            from onnx_custom.common.builtins import KERNEL_MODULES

            reg = KernelRegistry()
            for mod_name in KERNEL_MODULES:
                mod = importlib.import_module(mod_name)
                kernels = getattr(mod, "kernels", None)
                if not isinstance(kernels, KernelRegistry):
                    raise KernelError(
                        f"{mod_name} is listed in onnx_custom.common.builtins.KERNEL_MODULES but"
                        " defines no `kernels: KernelRegistry`."
                    )
                reg.update(kernels)
            _builtin = reg
        return _builtin


def default_kernel_registry() -> KernelRegistry:
    """Built-in kernels (``onnx_custom.common.builtins.KERNEL_MODULES``) plus :func:`kernel`
    registrations.

    Returns a fresh copy: mutating it does not change the default.
    """
    reg = _builtin_registry().copy()
    return reg.update(_user, replace=True)


def user_kernel_registry() -> KernelRegistry:
    """The live registry :func:`kernel` fills (not a copy): what registering code such as
    ``onnx_custom.register_spec`` adds to, and removes from when its handle is closed."""
    return _user


def kernel(
    name: str,
    *,
    inputs: Sequence[str],
    outputs: Sequence[str],
    attrs: Mapping[str, Any] | None = None,
    dtypes: Any = None,
    shape_fn: Callable[..., Any] | str | None = None,
    function: Any = None,
    tensor_type: str = "numpy",
    out: bool | None = None,
    replace: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a kernel into the default registry (see :meth:`KernelRegistry.kernel`)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not replace and name in _builtin_registry():
            raise KernelError(
                f"kernel {name!r} is a built-in kernel; fix: pass replace=True to override it."
            )
        return _user.kernel(
            name,
            inputs=inputs,
            outputs=outputs,
            attrs=attrs,
            dtypes=dtypes,
            shape_fn=shape_fn,
            function=function,
            tensor_type=tensor_type,
            out=out,
            replace=replace,
        )(fn)

    return deco
