"""Torch's symbolic registration API on our registry, and the import of what users already
registered with torch.

``onnx_custom.register_custom_op_symbolic(symbolic_name, symbolic_fn, opset_version)`` has
``torch.onnx.register_custom_op_symbolic``'s signature and semantics (``"::op"`` means
``aten::op``; the function serves ``opset_version`` and up; registering again replaces), but the
function then serves both exporters (`onnx_custom.translate.torch_style`).
``import_torch_symbolics()`` copies the symbolics registered with
``torch.onnx.register_custom_op_symbolic`` into our registry, for the dynamo exporter too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from onnx_custom.common.torch_onnx import torchscript_exporter
from onnx_custom.errors import SymbolicError
from onnx_custom.translate.names import Target, normalize_target
from onnx_custom.translate.registry import Registry, SymbolicEntry, resolve_registry
from onnx_custom.translate.torch_style import torch_style_translation

__all__ = ["import_torch_symbolics", "register_custom_op_symbolic", "unregister_custom_op_symbolic"]

# Our own symbolics, registered with torch only inside `onnx_custom.registered()`.
_OURS = "onnx_custom_symbolic["


def _target(symbolic_name: Any) -> Target:
    if not isinstance(symbolic_name, str):
        raise SymbolicError(
            "symbolic_name must be a string '<namespace>::<op>' (as for"
            f" torch.onnx.register_custom_op_symbolic); received {type(symbolic_name).__name__}"
            f" {symbolic_name!r:.60}. Fix: pass e.g. 'mmcv::roi_align', or '::grid_sampler' for an"
            " ATen op."
        )
    name = f"aten{symbolic_name}" if symbolic_name.startswith("::") else symbolic_name
    target = normalize_target(name)
    if target.name is not None and target.name.overload:
        raise SymbolicError(
            f"symbolic_name {symbolic_name!r} names an overload; torch's symbolic table (and this"
            " call) is keyed by '<namespace>::<op>' for every overload. Fix: pass"
            f" {target.name.op!r}."
        )
    return target


def _opset(opset_version: Any, symbolic_name: str) -> int:
    if isinstance(opset_version, bool) or not isinstance(opset_version, int) or opset_version < 1:
        raise SymbolicError(
            f"opset_version for {symbolic_name!r} must be a positive int (the first opset the "
            "symbolic serves, as in torch.onnx.register_custom_op_symbolic); received "
            f"{opset_version!r}. Fix: pass e.g. 11 (it then serves opsets 11 and up)."
        )
    return opset_version


def register_custom_op_symbolic(
    symbolic_name: str,
    symbolic_fn: Callable[..., Any],
    opset_version: int,
    *,
    registry: Registry | None = None,
) -> SymbolicEntry:
    """Register ``symbolic_fn``, written for ``torch.onnx.register_custom_op_symbolic``, unchanged.

    ``symbolic_fn(g, *args)`` receives every op argument positionally (any parameter names;
    torch's ``@symbolic_helper.parse_args`` works) and builds nodes with torch's
    ``g.op("Foo", x, alpha_f=0.5, outputs=2)``. ``onnx_custom.export`` then uses it under BOTH
    exporters. As in torch, ``"::op"`` means ``aten::op``, the function serves ``opset_version``
    and up, and registering the same name and opset again replaces the previous function.
    """
    target = _target(symbolic_name)
    opset = _opset(opset_version, symbolic_name)
    if not callable(symbolic_fn):
        raise SymbolicError(
            f"symbolic_fn for {symbolic_name!r} must be callable (a function taking g and the op's"
            f" arguments); received {type(symbolic_fn).__name__} {symbolic_fn!r:.60}. Fix: pass the"
            " symbolic function itself, e.g. register_custom_op_symbolic('mmcv::nms',"
            " nms_symbolic, 11)."
        )
    reg = resolve_registry(registry)
    return reg.add(SymbolicEntry(target, opset, torch_style_translation(symbolic_fn)), replace=True)


def unregister_custom_op_symbolic(
    symbolic_name: str, opset_version: int, *, registry: Registry | None = None
) -> None:
    """Remove what `register_custom_op_symbolic` registered for ``symbolic_name`` at ``opset_version``."""
    target = _target(symbolic_name)
    resolve_registry(registry).remove(str(target), opset=_opset(opset_version, symbolic_name))


def _torch_custom_symbolics() -> dict[str, dict[int, Callable[..., Any]]]:
    """``{name: {opset: fn}}`` registered with ``torch.onnx.register_custom_op_symbolic``."""
    registration = torchscript_exporter("registration")

    found: dict[str, dict[int, Callable[..., Any]]] = {}
    for name, group in list(registration.registry._registry.items()):
        if name.startswith("::") and not hasattr(torch.ops.aten, name[2:]):
            # torch files an autograd.Function's `symbolic` under "::ClassName" while it exports
            # one: not an op a user registered, and not a name an export can target
            continue
        overrides = dict(getattr(group._functions, "_overrides", {}))
        user = {
            v: fn
            for v, fn in overrides.items()
            if not getattr(fn, "__qualname__", "").startswith(_OURS)
        }
        if user:
            found[name] = user
    return found


def import_torch_symbolics(
    *names: str, registry: Registry | None = None, replace: bool = False
) -> list[SymbolicEntry]:
    """Copy symbolics registered with ``torch.onnx.register_custom_op_symbolic`` into our registry.

    Without ``names`` every one torch holds is copied; with names (``"mmcv::roi_align"``,
    ``"::grid_sampler"``) only those, and a name torch has no symbolic for is a `SymbolicError`.
    Each becomes a torch-style translation at the opset it was registered for, usable by
    `onnx_custom.export` under both exporters. A different translation already registered for
    the same op and opset raises unless ``replace=True``. Returns the entries added.
    """
    reg = resolve_registry(registry)
    available = _torch_custom_symbolics()
    wanted = [_target(n) for n in names]
    if wanted:
        missing = [str(t) for t in wanted if str(t) not in available]
        if missing:
            raise SymbolicError(
                f"torch has no custom symbolic for {missing}; expected names registered with "
                f"torch.onnx.register_custom_op_symbolic, which are {sorted(available) or 'none'}. "
                "Fix: register them with torch first (or import the library that does), or pass "
                "one of those names."
            )
        chosen = {str(t): available[str(t)] for t in wanted}
    else:
        chosen = available
    added = []
    for name, by_opset in sorted(chosen.items()):
        for opset, fn in sorted(by_opset.items()):
            added.append(
                reg.add(
                    SymbolicEntry(normalize_target(name), opset, torch_style_translation(fn)),
                    replace=replace,
                )
            )
    return added
