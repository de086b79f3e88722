"""Comparing one PyTorch tensor with one ONNX output: dtype-aware tolerances, a hard verdict.

The lowest layer of the verify path (`runner` runs models, `verify` and `localize` sit on top);
it imports nothing else from onnx_custom, so every module above can use it without a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.testing._comparison import default_tolerances

__all__ = ["OutputComparison", "compare_arrays", "flatten_outputs", "to_numpy", "tolerances"]


@dataclasses.dataclass(frozen=True)
class OutputComparison:
    """How one output of one trial compares. ``tolerance_source`` says why these tolerances."""

    trial: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    mismatched: int
    total: int
    rtol: float
    atol: float
    tolerance_source: str
    nonfinite_mismatch: int = 0
    backend: str = "onnxruntime"
    abs_diffs: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    @property
    def mismatched_percent(self) -> float:
        return 100.0 * self.mismatched / self.total if self.total else 0.0


def flatten_outputs(value: Any, prefix: str = "output") -> list[tuple[str, Any]]:
    """Nested tuples/lists/dicts -> ``[(path, leaf), ...]`` in order (dict keys in insertion order)."""
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in flatten_outputs(v, f"{prefix}.{k}")]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in flatten_outputs(v, f"{prefix}[{i}]")]
    return [(prefix, value)]


def tolerances(dtype: torch.dtype, rtol: float | None, atol: float | None) -> tuple[float, float, str]:
    default_rtol, default_atol = default_tolerances(dtype)
    if rtol is None and atol is None:
        return default_rtol, default_atol, f"torch.testing default for {str(dtype).removeprefix('torch.')}"
    if rtol is None or atol is None:
        raise TypeError("Pass both rtol and atol, or neither (then dtype defaults apply).")
    return float(rtol), float(atol), "user override"


def compare_arrays(expected: torch.Tensor, actual: np.ndarray, *, name: str, trial: int, rtol: float | None = None, atol: float | None = None, backend: str = "onnxruntime") -> OutputComparison:
    """Compare one output. NaN/Inf must sit at the same positions; ints/bools compare exactly."""
    exp = expected.detach().cpu()
    act = torch.from_numpy(np.ascontiguousarray(actual)) if actual.dtype.name != "bfloat16" else torch.from_numpy(actual.view(np.int16)).view(torch.bfloat16)
    r, a, source = tolerances(exp.dtype, rtol, atol)
    common = dict(trial=trial, name=name, shape=tuple(exp.shape), dtype=str(exp.dtype).removeprefix("torch."), rtol=r, atol=a, tolerance_source=source, backend=backend)
    if tuple(act.shape) != tuple(exp.shape) or act.dtype != exp.dtype:
        why = f"shape {list(act.shape)} vs {list(exp.shape)}" if tuple(act.shape) != tuple(exp.shape) else f"dtype {act.dtype} vs {exp.dtype}"
        return OutputComparison(max_abs_diff=float("inf"), max_rel_diff=float("inf"), mismatched=max(exp.numel(), 1), total=max(exp.numel(), 1), **common | {"tolerance_source": f"{source}; ONNX {why}"})  # type: ignore[arg-type]
    total = exp.numel()
    if total == 0:
        return OutputComparison(max_abs_diff=0.0, max_rel_diff=0.0, mismatched=0, total=0, **common)  # type: ignore[arg-type]
    if exp.dtype == torch.bool or not (exp.is_floating_point() or exp.is_complex()):
        bad = exp != act
        diff = (exp.to(torch.float64) - act.to(torch.float64)).abs() if exp.dtype != torch.bool else bad.to(torch.float64)
        mism = int(bad.sum())
        return OutputComparison(max_abs_diff=float(diff.max()), max_rel_diff=float((diff / exp.to(torch.float64).abs().clamp_min(1)).max()), mismatched=mism, total=total, abs_diffs=diff.numpy().ravel(), **common)  # type: ignore[arg-type]
    e64 = exp.to(torch.complex128 if exp.is_complex() else torch.float64)
    a64 = act.to(e64.dtype)
    finite_e, finite_a = torch.isfinite(e64), torch.isfinite(a64)
    # Non-finite values must agree exactly (same NaN positions, same signed infinities).
    nonfinite_bad = (finite_e != finite_a) | (~finite_e & ~finite_a & ~((e64 == a64) | (torch.isnan(e64) & torch.isnan(a64))))
    both = finite_e & finite_a
    diff = torch.zeros_like(e64.real if e64.is_complex() else e64)
    diff[both] = (e64[both] - a64[both]).abs()
    rel = torch.zeros_like(diff)
    rel[both] = diff[both] / e64[both].abs().clamp_min(torch.finfo(torch.float64).tiny)
    bad = nonfinite_bad | (both & (diff > a + r * e64.abs()))
    return OutputComparison(
        max_abs_diff=float(diff.max()), max_rel_diff=float(rel.max()), mismatched=int(bad.sum()), total=total,
        nonfinite_mismatch=int(nonfinite_bad.sum()), abs_diffs=diff[both].numpy().ravel(), **common,  # type: ignore[arg-type]
    )


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
