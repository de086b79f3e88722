"""``fuse=``: known pure-PyTorch implementations replaced by our ops for one export.

`fusing` finds the recognised implementations a model uses (module instances whose class is, or
derives from, a known class; module-level names bound to a known function), runs the model once
on the example inputs with every one of them wrapped, and compares, on each call of that run,
the original's result with the replacement's (the same arguments). Those that agree are replaced
until the ``with`` block ends; the others keep running the original code and are reported with
the reason. Everything is restored when the block ends, also on an error.

Patching is process-wide for functions (module globals are rebound), so the block holds the
export lock: no other export sees a half-patched process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx
import torch

from onnx_custom.errors import InvalidArgumentError
from onnx_custom.exporter.pipeline import EXPORT_LOCK
from onnx_custom.fusion import bev_pool, msda

__all__ = [
    "METADATA_KEY",
    "TOLERANCES",
    "FusionReport",
    "FusionRule",
    "FusionSite",
    "check_fuse",
    "fusing",
    "fusion_report",
    "register_fusion",
    "registered_fusions",
    "unregister_fusion",
]

METADATA_KEY = "onnx_custom.fusion"
"""``metadata_props`` key of the file's fusion report (JSON)."""

# dtype -> (rtol, atol) of the numeric check: a few float32 ulps of the sums MSDA makes.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


@dataclasses.dataclass(frozen=True)
class FusionRule:
    """``target`` (a function, or an ``nn.Module`` class: its instances' ``forward``) computed by
    ``replacement`` (same arguments as the function / as ``forward`` without ``self``)."""

    target: Any
    replacement: Callable[..., Any]
    op: str = msda.MSDA_OP
    source: str = "user"
    # A function ``target``'s forward calls: then only the instance's calls of that function are
    # replaced (``replacement`` takes the function's arguments); the rest of forward runs as is.
    inner: Any = None

    @property
    def is_module(self) -> bool:
        return isinstance(self.target, type)


@dataclasses.dataclass(frozen=True)
class FusionSite:
    """One recognised implementation in the exported model, fused or not (``reason`` says why)."""

    name: str  # the module's path in the model, or the function's module-qualified name
    implementation: str  # the recognised class or function
    op: str
    fused: bool
    reason: str = ""
    calls: int = 0
    max_abs_diff: float | None = None

    def describe(self) -> str:
        diff = "" if self.max_abs_diff is None else f", max |diff| {self.max_abs_diff:.3g}"
        calls = f"{self.calls} call{'s' if self.calls != 1 else ''}"
        head = f"{self.name} ({self.implementation}; {calls}{diff})"
        return f"{head} -> {self.op}" if self.fused else f"{head}: {self.reason}"


@dataclasses.dataclass
class FusionReport:
    """What ``fuse=`` did: ``fused`` sites, and ``not_fused`` ones with the reason."""

    sites: list[FusionSite] = dataclasses.field(default_factory=list)

    @property
    def fused(self) -> list[FusionSite]:
        return [s for s in self.sites if s.fused]

    @property
    def not_fused(self) -> list[FusionSite]:
        return [s for s in self.sites if not s.fused]

    def __str__(self) -> str:
        lines = [f"fusion: {len(self.fused)} fused, {len(self.not_fused)} recognised but not fused"]
        lines += [f"  fused: {s.describe()}" for s in self.fused]
        lines += [f"  not fused: {s.describe()}" for s in self.not_fused]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps([dataclasses.asdict(s) for s in self.sites], sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FusionReport:
        return cls([FusionSite(**entry) for entry in json.loads(text)])

    def attach(self, model: onnx.ModelProto) -> None:
        """Record the report in ``model.metadata_props`` (`fusion_report` reads it back)."""
        for i, entry in enumerate(model.metadata_props):
            if entry.key == METADATA_KEY:
                del model.metadata_props[i]
                break
        model.metadata_props.add(key=METADATA_KEY, value=self.to_json())


def fusion_report(model: onnx.ModelProto) -> FusionReport | None:
    """The `FusionReport` an ``export(..., fuse=...)`` recorded in the file, or None."""
    for entry in model.metadata_props:
        if entry.key == METADATA_KEY:
            return FusionReport.from_json(entry.value)
    return None


# ---------------------------------------------------------------------------- rules

_registered: dict[Any, FusionRule] = {}
_registered_lock = threading.Lock()


def _default_replacement(target: Any) -> Callable[..., Any]:
    return msda.msda_from_module_args if isinstance(target, type) else msda.msda_from_function_args


def _rule(target: Any, replacement: Callable[..., Any] | None, source: str) -> FusionRule:
    if isinstance(target, type):
        if not issubclass(target, torch.nn.Module):
            raise InvalidArgumentError(
                f"fuse: a class to fuse must be a torch.nn.Module subclass; received {target!r}."
                " Fix: pass the attention module's class, or the function it calls."
            )
    elif not inspect.isfunction(target):
        raise InvalidArgumentError(
            f"fuse: expected a Python function or an nn.Module class to replace; received"
            f" {target!r:.80}. Fix: pass e.g. fuse=[my_msda_function] (mmcv's signature"
            " (value, value_spatial_shapes, sampling_locations, attention_weights))."
        )
    if replacement is not None and not callable(replacement):
        raise InvalidArgumentError(
            f"fuse: the replacement of {_qualname(target)} must be callable; received"
            f" {replacement!r:.80}. Fix: pass (target, replacement_function)."
        )
    if replacement is None and bev_pool.has_bev_pool_signature(target):
        return FusionRule(
            target, bev_pool.bev_pool_from_function_args, bev_pool.BEV_POOL_OP, source
        )
    if replacement is None:
        return FusionRule(target, _default_replacement(target), source=source)
    return FusionRule(target, replacement, op=_qualname(replacement), source=source)


def register_fusion(target: Any, replacement: Callable[..., Any] | None = None) -> None:
    """Fuse ``target`` in every ``fuse=True`` export of this process.

    ``target``: a function with mmcv's ``multi_scale_deformable_attn_pytorch`` signature
    ``(value, value_spatial_shapes, sampling_locations, attention_weights)``, or an ``nn.Module``
    class whose ``forward`` has transformers' ``MultiScaleDeformableAttention`` signature
    ``(value, value_spatial_shapes, value_spatial_shapes_list, level_start_index,
    sampling_locations, attention_weights, im2col_step)``, or a function with BEVDet's
    ``bev_pool_v2`` signature ``(depth, feat, ranks_depth, ranks_feat, ranks_bev,
    bev_feat_shape, interval_starts, interval_lengths)``; ``replacement`` (optional): your own
    function of the same arguments (default: ours for that signature). Each use is still checked
    numerically on the example input."""
    rule = _rule(target, replacement, "registered")
    with _registered_lock:
        _registered[target] = rule


def unregister_fusion(target: Any) -> None:
    """Undo `register_fusion` (a target never registered is ignored)."""
    with _registered_lock:
        _registered.pop(target, None)


def registered_fusions() -> list[FusionRule]:
    with _registered_lock:
        return list(_registered.values())


def check_fuse(fuse: Any) -> list[FusionRule]:
    """The rules ``fuse=`` asks for (none for False/None); a malformed value raises
    `InvalidArgumentError` before anything runs."""
    if fuse is None or fuse is False:
        return []
    extra: list[FusionRule] = []
    if fuse is not True:
        if isinstance(fuse, (str, bytes)) or not isinstance(fuse, Sequence):
            raise InvalidArgumentError(
                f"fuse must be True, False or a list of functions/classes to fuse; received"
                f" {fuse!r:.80}. Fix: pass fuse=True, or fuse=[my_msda_function]."
            )
        for item in fuse:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise InvalidArgumentError(
                        f"fuse: a pair must be (target, replacement); received {item!r:.80}."
                        " Fix: pass (my_function, my_replacement)."
                    )
                extra.append(_rule(item[0], item[1], "user"))
            else:
                extra.append(_rule(item, None, "user"))
    rules: dict[Any, FusionRule] = {}
    for fn in bev_pool.library_functions():
        replace = bev_pool.bev_pool_from_function_args
        rules[fn] = FusionRule(fn, replace, bev_pool.BEV_POOL_OP, _library(fn))
    for cls in msda.library_modules():
        rules[cls] = FusionRule(cls, msda.msda_from_module_args, source=_library(cls))
    for fn in msda.library_functions():
        rules[fn] = FusionRule(fn, msda.msda_from_function_args, source=_library(fn))
    for cls, fn in msda.library_v2_modules():
        rules[cls] = FusionRule(
            cls, msda.msda_v2_from_function_args, source=_library(cls), inner=fn
        )
    for rule in [*registered_fusions(), *extra]:
        known = rules.get(rule.target)
        if (
            known is not None
            and known.inner is not None
            and rule.replacement is msda.msda_from_module_args
        ):  # a v2 class named without a replacement: it is fused the library's way
            continue
        rules[rule.target] = rule
    return list(rules.values())


def _library(obj: Any) -> str:
    return str(getattr(obj, "__module__", "")).split(".")[0] or "user"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


# ---------------------------------------------------------------------------- sites


class _Site:
    """One patched place: a module instance's ``forward`` or a function's name bindings."""

    def __init__(self, name: str, rule: FusionRule, original: Callable[..., Any]) -> None:
        self.name = name
        self.rule = rule
        self.original = original
        self.signature = _signature(original)
        self.probing = True
        self.fused = False
        self.calls = 0
        self.reason = "not called on the example input"
        self.max_abs_diff: float | None = None
        self.bound = True
        self.depth = 0

    def call(self, *args: Any, **kwargs: Any) -> Any:
        if self.depth:  # the replacement (or original) calls the target by its patched name
            return self.original(*args, **kwargs)
        self.depth += 1
        try:
            return self._call(args, kwargs)
        finally:
            self.depth -= 1

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.probing:
            if self.fused:
                return self.rule.replacement(*self._positional(args, kwargs))
            return self.original(*args, **kwargs)
        result = self.original(*args, **kwargs)
        self.calls += 1
        if self.calls == 1:
            self.fused = True
        if self.fused:  # every call of the run must agree (the first failure unfuses the site)
            self._agrees(args, kwargs, result)
        return result

    def _positional(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        if not kwargs or self.signature is None:
            return args
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.args)

    def _agrees(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], result: Any) -> bool:
        """Compare the replacement with ``result`` (the original's) on these arguments."""
        try:
            with torch.no_grad():
                ours = self.rule.replacement(*self._positional(args, kwargs))
        except msda.NotFusable as exc:
            return self._refuse(str(exc))
        except Exception as exc:
            return self._refuse(f"the replacement raised {type(exc).__name__}: {exc}"[:300])
        if not isinstance(result, torch.Tensor) or not isinstance(ours, torch.Tensor):
            return self._refuse(
                f"the original returned {type(result).__name__}, the replacement"
                f" {type(ours).__name__}; expected one tensor each"
            )
        if ours.shape != result.shape or ours.dtype != result.dtype:
            return self._refuse(
                f"the replacement's output is {tuple(ours.shape)} {ours.dtype}, the original's"
                f" {tuple(result.shape)} {result.dtype}"
            )
        rtol, atol = TOLERANCES.get(result.dtype, (1e-4, 1e-5))
        expected = result.detach()
        diff = (ours.detach() - expected).abs()
        finite = torch.isfinite(expected)
        worst = float(diff[finite].max()) if bool(finite.any()) else 0.0
        self.max_abs_diff = worst if self.max_abs_diff is None else max(worst, self.max_abs_diff)
        if not torch.allclose(ours.detach(), expected, rtol=rtol, atol=atol, equal_nan=True):
            return self._refuse(
                f"the numeric check failed on the example input (max |diff| {worst:.3g} >"
                f" atol {atol:g} + rtol {rtol:g} * |expected|): it computes something else"
                " (a changed subclass, other align_corners/padding?); it runs unfused"
            )
        self.reason = ""
        return True

    def _refuse(self, reason: str) -> bool:
        self.fused = False
        self.reason = reason
        return False

    def report(self) -> FusionSite:
        reason = self.reason
        if not self.bound:
            reason = (
                "no module-level name refers to this function (a local or closure reference"
                " cannot be rebound); call it through a module-level name"
            )
        return FusionSite(
            self.name,
            _qualname(self.rule.target),
            self.rule.op,
            self.fused and self.bound,
            "" if self.fused and self.bound else reason,
            self.calls,
            self.max_abs_diff,
        )


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


class _Patches:
    """The installed wrappers, removed in reverse order."""

    def __init__(self) -> None:
        self.sites: list[_Site] = []
        self._undo: list[Callable[[], None]] = []
        self._local = threading.local()  # per thread: the scoped sites whose forward is running

    def _swap_forward(
        self, module: torch.nn.Module, forward: Callable[..., Any], site: _Site
    ) -> None:
        """``module.forward`` becomes ``forward`` until `remove` (an instance attribute of its
        own, if it had one, comes back; else the class's forward shows through again)."""
        had_own = "forward" in module.__dict__
        previous = module.__dict__.get("forward")
        module.forward = forward  # type: ignore[method-assign]

        def undo() -> None:
            if had_own:
                module.forward = previous  # type: ignore[method-assign,assignment]
            else:
                module.__dict__.pop("forward", None)

        self.sites.append(site)
        self._undo.append(undo)

    def patch_module(self, path: str, module: torch.nn.Module, rule: FusionRule) -> None:
        site = _Site(path or type(module).__name__, rule, module.forward)

        @functools.wraps(module.forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return site.call(*args, **kwargs)

        self._swap_forward(module, forward, site)

    def patch_function(self, rule: FusionRule) -> None:
        fn = rule.target
        site = _Site(_qualname(fn), rule, fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return site.call(*args, **kwargs)

        bindings = [
            namespace
            for module in list(sys.modules.values())
            if (namespace := getattr(module, "__dict__", None)) is not None
        ]
        rebound: list[tuple[dict[str, Any], str]] = []
        for namespace in bindings:
            try:
                names = [k for k, v in list(namespace.items()) if v is fn]
            except Exception:  # an exotic module namespace: nothing of ours there
                continue
            for key in names:
                namespace[key] = wrapper
                rebound.append((namespace, key))
        if not rebound:
            if rule.source == "user":  # asked for by name: say why it cannot be fused
                site.bound = False
                self.sites.append(site)
            return  # otherwise nothing calls it by a name we can rebind: not in this model

        def undo() -> None:
            for namespace, key in rebound:
                if namespace.get(key) is wrapper:
                    namespace[key] = fn

        self.sites.append(site)
        self._undo.append(undo)

    def patch_scoped(self, path: str, module: torch.nn.Module, rule: FusionRule) -> None:
        """``module``'s calls of ``rule.inner`` (during its ``forward``) go to one site."""
        original_forward = module.forward
        site = _Site(path or type(module).__name__, rule, rule.inner)

        @functools.wraps(original_forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            stack = self._scopes()
            stack.append(site)
            try:
                return original_forward(*args, **kwargs)
            finally:
                stack.pop()

        self._swap_forward(module, forward, site)

    def _scopes(self) -> list[_Site]:
        stack: list[_Site] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def patch_dispatch(self, fn: Callable[..., Any], model: Any) -> None:
        """Rebind ``fn`` (module-level names, and attributes of ``model``'s modules holding it) to
        a dispatcher: called inside a scoped instance's ``forward`` it is that site's call,
        elsewhere the original."""

        @functools.wraps(fn)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            stack = self._scopes()
            if stack and stack[-1].original is fn:
                return stack[-1].call(*args, **kwargs)
            return fn(*args, **kwargs)

        rebound: list[tuple[dict[str, Any], str]] = []
        namespaces = [
            namespace
            for module in list(sys.modules.values())
            if (namespace := getattr(module, "__dict__", None)) is not None
        ]
        if isinstance(model, torch.nn.Module):
            namespaces += [m.__dict__ for m in model.modules()]
        for namespace in namespaces:
            try:
                names = [k for k, v in list(namespace.items()) if v is fn]
            except Exception:  # an exotic module namespace: nothing of ours there
                continue
            for key in names:
                namespace[key] = dispatch
                rebound.append((namespace, key))

        def undo() -> None:
            for namespace, key in rebound:
                if namespace.get(key) is dispatch:
                    namespace[key] = fn

        self._undo.append(undo)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


def _find_sites(model: Any, rules: Sequence[FusionRule], patches: _Patches) -> None:
    classes = [r for r in rules if r.is_module]
    if isinstance(model, torch.nn.Module) and classes:
        for path, module in model.named_modules():
            # the most specific known class first (a registered subclass over its base)
            matches = [r for r in classes if isinstance(module, r.target)]
            if matches:
                best = max(matches, key=lambda r: len(r.target.__mro__))
                if best.inner is None:
                    patches.patch_module(path, module, best)
                else:
                    patches.patch_scoped(path, module, best)
        inner = {id(r.inner): r.inner for r in classes if r.inner is not None}
        for fn in inner.values():
            if any(s.original is fn for s in patches.sites):
                patches.patch_dispatch(fn, model)
    for rule in rules:
        if not rule.is_module:
            patches.patch_function(rule)


def _probe(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> None:
    """One eager run (no grad, buffers restored): each site checks its first call."""
    buffers = (
        {name: b.detach().clone() for name, b in model.named_buffers()}
        if isinstance(model, torch.nn.Module)
        else {}
    )
    try:
        with torch.no_grad():
            model(*args, **dict(kwargs or {}))
    finally:
        if buffers:
            with torch.no_grad():
                for name, b in model.named_buffers():
                    if name in buffers and b.shape == buffers[name].shape:
                        b.copy_(buffers[name])


@contextlib.contextmanager
def fusing(
    model: Any, args: tuple[Any, ...], fuse: Any, kwargs: Mapping[str, Any] | None = None
) -> Iterator[FusionReport | None]:
    """Within the block, the recognised implementations ``model`` uses on ``args`` run our ops
    (those that pass the numeric check); yields the `FusionReport` (None when ``fuse`` asks for
    nothing). Restores everything on exit, also on an error."""
    rules = check_fuse(fuse)
    if fuse not in (None, False) and isinstance(model, torch.export.ExportedProgram):
        raise InvalidArgumentError(
            "fuse= replaces Python code before tracing, but an ExportedProgram is already traced."
            " Fix: pass the nn.Module (fuse=True), or export without fuse."
        )
    if fuse is None or fuse is False:
        yield None
        return
    if not rules:  # asked for, but nothing known is imported in this process
        yield FusionReport()
        return
    with EXPORT_LOCK:
        patches = _Patches()
        try:
            _find_sites(model, rules, patches)
            if patches.sites:
                _probe(model, args, kwargs)
            for site in patches.sites:
                site.probing = False
            sites = [
                s for s in patches.sites if s.calls or s.rule.is_module or s.rule.source == "user"
            ]
            yield FusionReport([s.report() for s in sites])
        finally:
            patches.remove()
