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

import functools
from collections.abc import Callable
from typing import Any

import torch

from onnx_custom.common.torch_onnx import optional_torchscript_exporter, torchscript_exporter
from onnx_custom.errors import SymbolicError
from onnx_custom.translate.names import Target, normalize_target
from onnx_custom.translate.registry import Registry, SymbolicEntry, resolve_registry
from onnx_custom.translate.torch_style import TORCH_STYLE_MARK, torch_style_translation

__all__ = [
    "import_torch_symbolics",
    "register_custom_op_symbolic",
    "torch_builtin_newer",
    "unregister_custom_op_symbolic",
]

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
    override_builtins: bool = False,
) -> SymbolicEntry:
    """Register ``symbolic_fn``, written for ``torch.onnx.register_custom_op_symbolic``, unchanged.

    ``symbolic_fn(g, *args)`` receives every op argument positionally (any parameter names;
    torch's ``@symbolic_helper.parse_args`` works) and builds nodes with torch's
    ``g.op("Foo", x, alpha_f=0.5, outputs=2)``. ``onnx_custom.export`` then uses it under BOTH
    exporters. As in torch, ``"::op"`` means ``aten::op``, the function serves ``opset_version``
    and up, and registering the same name and opset again replaces the previous function.

    Precedence is torch's: for an ATen op that torch itself translates anew at a version after
    ``opset_version`` and up to the export's opset (``grid_sampler`` at 16, ``layer_norm`` at
    17, ``softmax`` at 13), torch's newer translation is used (`torch_builtin_newer`);
    ``override_builtins=True`` makes this function win at every opset it serves.
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
    if not isinstance(override_builtins, bool):
        raise SymbolicError(
            f"override_builtins for {symbolic_name!r} must be a bool; received"
            f" {override_builtins!r}. Fix: pass True to use this function over torch's own newer"
            " translation of the op, or leave it out."
        )
    reg = resolve_registry(registry)
    translation = torch_style_translation(symbolic_fn)
    if override_builtins:
        translation = _forced(translation)
    return reg.add(SymbolicEntry(target, opset, translation), replace=True)


_OVERRIDE_MARK = "__onnx_custom_override_builtins__"


def _forced(translation: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of the torch-style ``translation`` marked to win over torch's built-ins."""
    forced = functools.wraps(translation)(lambda *a, **k: translation(*a, **k))
    for name in (TORCH_STYLE_MARK, "__signature__"):
        if hasattr(translation, name):
            setattr(forced, name, getattr(translation, name))
    setattr(forced, _OVERRIDE_MARK, True)
    return forced


def _torch_builtin_versions(name: str) -> tuple[int, ...]:
    """The opsets at which torch's TorchScript exporter has its own symbolic for ``name``."""
    registration = torchscript_exporter("registration")
    _load_torch_symbolics()  # torch registers each opset's symbolics when its module loads
    group = registration.registry.get_function_group(name)
    return tuple(sorted(getattr(getattr(group, "_functions", None), "_base", None) or ()))


@functools.cache
def _load_torch_symbolics() -> None:

    for version in range(7, 30):
        optional_torchscript_exporter(f"symbolic_opset{version}")


def torch_builtin_newer(entry: SymbolicEntry, opset: int) -> int | None:
    """The opset of torch's own translation of ``entry``'s ATen op that torch would prefer at
    ``opset`` over ``entry`` (a torch-style symbolic registered for an older opset), or None
    (ours serves: not ATen, not torch-style, forced with ``override_builtins``, or torch has
    nothing newer). Torch's rule: at each opset the newest registration at or below it wins,
    its own built-ins included."""
    fn = entry.fn
    if getattr(fn, TORCH_STYLE_MARK, None) is None or getattr(fn, _OVERRIDE_MARK, False):
        return None
    name = entry.target.name
    if name is None or name.namespace != "aten":
        return None
    newer = [v for v in _torch_builtin_versions(name.op) if entry.opset < v <= opset]
    return max(newer) if newer else None


def unregister_custom_op_symbolic(
    symbolic_name: str, opset_version: int, *, registry: Registry | None = None
) -> None:
    """Remove what `register_custom_op_symbolic` registered for ``symbolic_name`` at
    ``opset_version``."""
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
