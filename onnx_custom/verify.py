"""``onnx_custom.verify``: PyTorch eager vs ONNX Runtime, dtype-aware tolerances, hard pass/fail."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import torch

from onnx_custom.compare import OutputComparison, compare_arrays, flatten_outputs
from onnx_custom.errors import OnnxCustomError, VerificationError
from onnx_custom.localize import localize as localize_trial
from onnx_custom.runner import input_names, load_model, make_reference, make_session, run_onnx

if TYPE_CHECKING:
    from onnx_custom.registry import Registry

__all__ = [
    "BACKENDS",
    "OutputComparison",
    "VerificationReport",
    "compare_arrays",
    "flatten_outputs",
    "load_model",
    "make_reference",
    "make_session",
    "verify",
]

BACKENDS = ("onnxruntime", "reference")

InputGenerator = Callable[[int, tuple[Any, ...]], tuple[Any, ...]]


@dataclasses.dataclass
class VerificationReport:
    """Every comparison of every trial; ``str(report)`` is a table."""

    comparisons: list[OutputComparison]
    trials: int
    backends: tuple[str, ...] = ("onnxruntime",)
    localization: Any = None  # filled by verify(..., localize=True)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def failures(self) -> list[OutputComparison]:
        return [c for c in self.comparisons if not c.passed]

    def table(self) -> str:
        header = f"{'trial':>5} {'backend':<12} {'output':<24} {'shape':<18} {'dtype':<9} {'max_abs':>10} {'max_rel':>10} {'mismatch':>16} {'rtol':>8} {'atol':>8}  tolerance"
        rows = [header]
        for c in self.comparisons:
            mism = f"{c.mismatched}/{c.total} ({c.mismatched_percent:.2f}%)"
            rows.append(
                f"{c.trial:>5} {c.backend:<12} {c.name[:24]:<24} {str(list(c.shape))[:18]:<18} {c.dtype:<9} "
                f"{c.max_abs_diff:>10.3g} {c.max_rel_diff:>10.3g} {mism:>16} {c.rtol:>8.2g} {c.atol:>8.2g}  {c.tolerance_source}"
            )
        return "\n".join(rows)

    def passed_by_backend(self) -> dict[str, bool]:
        return {b: all(c.passed for c in self.comparisons if c.backend == b) for b in self.backends}

    def diagnosis(self) -> str:
        """Which side to suspect when backends disagree (empty when they agree)."""
        by_backend = self.passed_by_backend()
        if len(by_backend) < 2 or len(set(by_backend.values())) == 1:
            return ""
        good = [b for b, ok in by_backend.items() if ok]
        bad = [b for b, ok in by_backend.items() if not ok]
        return (
            f"Backends disagree: {', '.join(bad)} mismatch PyTorch but {', '.join(good)} match(es) it. "
            "The translation is likely right; suspect the runtime or a custom kernel of the failing backend."
        )

    def __str__(self) -> str:
        status = "PASSED" if self.passed else "FAILED"
        text = f"Verification {status}: {len(self.comparisons)} comparison(s) over {self.trials} trial(s)\n{self.table()}"
        diagnosis = self.diagnosis()
        if diagnosis:
            text += f"\n{diagnosis}"
        if self.localization is not None:
            text += f"\n{self.localization}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "trials": self.trials,
            "backends": list(self.backends),
            "outputs": [
                {k: v for k, v in dataclasses.asdict(c).items() if k != "abs_diffs"} | {"passed": c.passed}
                for c in self.comparisons
            ],
            "diagnosis": self.diagnosis(),
            "localization": self.localization.to_dict() if hasattr(self.localization, "to_dict") else (None if self.localization is None else str(self.localization)),
        }


def _random_like(example: tuple[Any, ...], generator: torch.Generator) -> tuple[Any, ...]:
    """Same shapes/dtypes; floats redrawn from N(0, 1), ints/bools kept (they are often indices)."""

    def redraw(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.dtype)
        if isinstance(x, (tuple, list)):
            return type(x)(redraw(v) for v in x)
        return x

    return tuple(redraw(x) for x in example)


def _make_backend(name: str, proto: onnx.ModelProto, kernels: Any = None) -> Any:
    try:
        return make_session(proto, kernels) if name == "onnxruntime" else make_reference(proto, kernels)
    except OnnxCustomError:
        raise
    except Exception as exc:
        raise VerificationError(f"Could not load the ONNX model in backend {name!r}: {type(exc).__name__}: {exc}") from exc


def _localize_safely(model: Any, args: tuple[Any, ...], proto: onnx.ModelProto, trial: int, **options: Any) -> Any:
    """A `Localization`, or a one-line reason why none could be made (never raises)."""
    if not isinstance(model, torch.nn.Module):
        return f"Localization unavailable: it needs a torch.nn.Module, got {type(model).__name__}."
    try:
        return localize_trial(model, args, proto, trial=trial, **options)
    except Exception as exc:
        return f"Localization unavailable: {type(exc).__name__}: {exc}"


def verify(
    model: torch.nn.Module | Callable[..., Any],
    args: tuple[Any, ...] | torch.Tensor,
    onnx_model: onnx.ModelProto | str | os.PathLike[str] | bytes,
    *,
    trials: int = 1,
    input_generator: InputGenerator | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    raise_on_mismatch: bool = True,
    seed: int = 0,
    backends: Sequence[str] = ("onnxruntime",),
    localize: bool = False,
    exporter: str | None = None,
    opset: int | None = None,
    registry: Registry | None = None,
    progress: Callable[[str], None] | None = None,
    kernels: Any = None,
) -> VerificationReport:
    """Run PyTorch eager and ONNX Runtime on the example inputs (+ ``trials - 1`` random ones).

    Outputs (nested tuples/lists/dicts, flattened in order) are compared with torch.testing's
    per-dtype default tolerances unless ``rtol``/``atol`` are given; NaN/Inf positions must agree;
    ints and bools compare exactly. ``input_generator(trial, example_args)`` makes the extra
    inputs (default: floats redrawn from N(0, 1) at the same shapes, ints/bools kept).

    ``backends``: any of ``"onnxruntime"`` and ``"reference"`` (onnx's ReferenceEvaluator with
    our kernels); every comparison names its backend, and a disagreement between backends points
    at the runtime/kernels rather than the translation. ``localize=True``: on the first failing
    trial, compare every intermediate value (`onnx_custom.localize.localize`) and attach the
    result as ``report.localization`` (also in the `VerificationError` message); ``exporter``,
    ``opset`` and ``registry`` tell it how the file was made (defaults: inferred from the file,
    the default registry). ``progress`` receives one line per trial. ``kernels``: the
    `onnx_custom.runtime.KernelRegistry` for custom nodes (default: the default kernel registry).
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of example inputs (or one tensor), got {type(args).__name__}.")
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}.")
    backends = (backends,) if isinstance(backends, str) else tuple(backends)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise ValueError(f"backends must be a non-empty subset of {BACKENDS}, got {list(backends)!r}.")
    proto = load_model(onnx_model)
    input_names(proto, args)  # fail on an arity mismatch before running anything
    sessions = {name: _make_backend(name, proto, kernels) for name in backends}
    generator = torch.Generator().manual_seed(seed)
    comparisons: list[OutputComparison] = []
    localization: Any = None
    for trial in range(trials):
        if progress is not None:
            progress(f"verify: trial {trial + 1}/{trials}")
        trial_args = args if trial == 0 else (input_generator(trial, args) if input_generator else _random_like(args, generator))
        try:
            with torch.no_grad():
                expected = model(*trial_args)
        except Exception as exc:
            raise VerificationError(f"The PyTorch model raised in eager mode on trial {trial}: {type(exc).__name__}: {exc}") from exc
        flat = flatten_outputs(expected)
        non_tensor = [name for name, leaf in flat if not isinstance(leaf, torch.Tensor)]
        if non_tensor:
            raise VerificationError(f"Model outputs {non_tensor} are not tensors; only tensor outputs can be compared with ONNX.")
        onnx_names = [o.name for o in proto.graph.output]
        if len(onnx_names) != len(flat):
            raise VerificationError(
                f"Output structure mismatch: the PyTorch model returns {len(flat)} tensor(s) "
                f"({[n for n, _ in flat]}) but the ONNX model has {len(onnx_names)} output(s) "
                f"({onnx_names}). Was the file exported from this model?"
            )
        trial_failed = False
        for backend, session in sessions.items():
            try:
                actual = run_onnx(session, proto, tuple(trial_args))
            except OnnxCustomError:
                raise
            except Exception as exc:
                raise VerificationError(f"Backend {backend!r} failed to run the ONNX model on trial {trial}: {type(exc).__name__}: {exc}") from exc
            for (path, exp), act, onnx_name in zip(flat, actual, onnx_names, strict=True):
                comparison = compare_arrays(exp, np.asarray(act), name=f"{path}={onnx_name}", trial=trial, rtol=rtol, atol=atol, backend=backend)
                trial_failed |= not comparison.passed
                comparisons.append(comparison)
        if localize and trial_failed and localization is None:
            if progress is not None:
                progress(f"verify: localizing the mismatch of trial {trial}")
            localization = _localize_safely(model, tuple(trial_args), proto, trial, exporter=exporter, opset=opset, registry=registry, rtol=rtol, atol=atol, kernels=kernels)
    report = VerificationReport(comparisons, trials, backends, localization)
    if raise_on_mismatch and not report.passed:
        raise VerificationError(str(report), report)
    return report
