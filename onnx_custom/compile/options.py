"""The backend's options, validated once (`CompileOptions.create`) with typed errors."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnx_custom.errors import InvalidArgumentError, OpsetError
from onnx_custom.translate.registry import Registry

__all__ = ["DEFAULT_CACHE_SIZE", "DEFAULT_OPSET", "FALLBACKS", "KERNELS", "CompileOptions"]

DEFAULT_OPSET = 18
DEFAULT_CACHE_SIZE = 32
"""Sessions kept per backend (LRU): a static compile makes one graph, and so one session, per
input signature torch specialises on; the oldest unused one is dropped past this many."""
FALLBACKS = ("eager", "error")
KERNELS = ("python", "native")
_MIN_OPSET = 13  # our opset lowering relabels torchlib's opset-18 nodes down to here at most


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """What ``compile_backend(**options)`` accepts (each documented in the torch.compile how-to).

    - ``opset``: default-domain opset of the ONNX graphs (13..max; built at >= 18, then lowered).
    - ``registry`` / ``variants``: our translations (default registry), preferring ``variants``.
    - ``kernels``: ``"python"`` (Python kernels through the C shim) or ``"native"`` (the compiled
      ``libonnx_custom_ops.so``, Python kernels only for domains it lacks).
    - ``providers`` / ``session_options``: for every ``onnxruntime.InferenceSession``.
    - ``fallback``: ``"eager"`` runs nodes without a translation in PyTorch; ``"error"`` raises
      `CompileError` naming them.
    - ``verify``: compare each ORT partition's first call with eager (verifier tolerances) and
      raise `VerificationError` on a mismatch.
    - ``save_dir``: write each ORT partition's ``.onnx`` there.
    - ``cache_size``: sessions kept (LRU) per backend.
    - ``fuse``: as `onnx_custom.export`'s: the traced code of each recognised attention module
      and of each call of a recognised MSDA function is replaced by our op (static or symbolic
      level sizes; checked on each graph's first inputs); the backend's ``fusion_reports`` say
      what was fused.
    """

    opset: int = DEFAULT_OPSET
    registry: Registry | None = None
    variants: tuple[str, ...] = ()
    kernels: str = "python"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    session_options: Any = None
    fallback: str = "eager"
    verify: bool = False
    save_dir: Path | None = None
    cache_size: int = DEFAULT_CACHE_SIZE
    fuse: Any = False

    @property
    def build_opset(self) -> int:
        """The opset torchlib builds at (its own is 18; lower ones are relabelled afterwards)."""
        return max(self.opset, DEFAULT_OPSET)

    def resolved_registry(self) -> Registry:
        from onnx_custom.translate.registry import resolve_registry

        registry = resolve_registry(self.registry)
        return registry.with_variants(*self.variants) if self.variants else registry

    @classmethod
    def create(cls, **options: Any) -> CompileOptions:
        """Validate ``options`` (unknown names and wrong types or values raise
        `InvalidArgumentError`; an opset outside the range `OpsetError`)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - fields)
        if unknown:
            import difflib

            hints = [difflib.get_close_matches(u, fields, n=1) for u in unknown]
            hint = "; ".join(
                f"{u!r} -> {h[0]!r}?" for u, h in zip(unknown, hints, strict=True) if h
            )
            raise InvalidArgumentError(
                f"unknown compile option(s) {unknown}; expected some of {sorted(fields)}. "
                f"Fix: {hint or 'remove them'} (see onnx_custom.compile.CompileOptions)."
            )
        values = dict(options)
        values["opset"] = _opset(values.get("opset", DEFAULT_OPSET))
        registry = values.get("registry")
        if registry is not None and not isinstance(registry, Registry):
            raise InvalidArgumentError(
                "registry must be an onnx_custom.Registry or None; received"
                f" {type(registry).__name__}. Fix: pass onnx_custom.default_registry() (or your own"
                " Registry)."
            )
        values["variants"] = _strings(
            values.get("variants", ()), "variants", "variants=('custom',)"
        )
        values["kernels"] = _choice(values.get("kernels", "python"), "kernels", KERNELS)
        values["providers"] = _providers(values.get("providers", ("CPUExecutionProvider",)))
        values["session_options"] = _session_options(values.get("session_options"))
        values["fallback"] = _choice(values.get("fallback", "eager"), "fallback", FALLBACKS)
        verify = values.get("verify", False)
        if not isinstance(verify, bool):
            raise InvalidArgumentError(
                f"verify must be True or False; received {verify!r}. Fix: pass verify=True."
            )
        values["save_dir"] = _save_dir(values.get("save_dir"))
        size = values.get("cache_size", DEFAULT_CACHE_SIZE)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidArgumentError(
                f"cache_size must be an int >= 1; received {size!r}. Fix: pass e.g."
                f" cache_size={DEFAULT_CACHE_SIZE}."
            )
        from onnx_custom.fusion import check_fuse

        check_fuse(values.get("fuse", False))
        options_obj = cls(**values)
        if options_obj.variants:
            # unknown variants raise SymbolicError now, not mid-compile
            options_obj.resolved_registry()
        return options_obj


def _opset(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"opset must be an int such as 18; received {value!r}. Fix: pass opset=18."
        )
    from onnx_custom.exporter.arguments import dynamo_max_opset

    high = dynamo_max_opset()
    if not _MIN_OPSET <= value <= high:
        raise OpsetError(
            f"the compile backend builds opsets {_MIN_OPSET}..{high}; received opset={value}. Fix:"
            f" pass an opset in {_MIN_OPSET}..{high}.",
            exporter="dynamo",
            minimum=_MIN_OPSET,
            maximum=high,
        )
    return value


def _choice(value: Any, name: str, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidArgumentError(
            f"{name} must be one of {tuple(allowed)}; received {value!r}. Fix: pass"
            f" {name}={allowed[0]!r}."
        )
    return value


def _strings(value: Any, name: str, example: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise InvalidArgumentError(
            f"{name} must be a sequence of non-empty strings; received {value!r}. Fix: pass e.g."
            f" {example}."
        )
    return tuple(value)


def _providers(value: Any) -> tuple[str, ...]:
    import onnxruntime as ort

    names = _strings(value, "providers", "providers=['CPUExecutionProvider']")
    if not names:
        raise InvalidArgumentError(
            "providers must name at least one execution provider; received an empty list. Fix: pass"
            " providers=['CPUExecutionProvider']."
        )
    available = ort.get_available_providers()
    unknown = [n for n in names if n not in available]
    if unknown:
        raise InvalidArgumentError(
            f"providers {unknown} are not available in this onnxruntime; available: {available}. "
            "Fix: pass providers from that list (or install the onnxruntime build that has them)."
        )
    return names


def _session_options(value: Any) -> Any:
    if value is None:
        return None
    import onnxruntime as ort

    if not isinstance(value, ort.SessionOptions):
        raise InvalidArgumentError(
            "session_options must be an onnxruntime.SessionOptions or None; received"
            f" {type(value).__name__}. Fix: pass onnxruntime.SessionOptions() with your settings"
            " (custom-op kernels are added per session)."
        )
    return value


def _save_dir(value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise InvalidArgumentError(
            f"save_dir must be a folder path or None; received {value!r}. Fix: pass"
            " save_dir='onnx_graphs'."
        )
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise InvalidArgumentError(
            f"save_dir {str(path)!r} exists and is not a folder. Fix: pass a folder path (it is"
            " created if missing)."
        )
    return path
