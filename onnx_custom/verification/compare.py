"""Comparing one PyTorch tensor with one ONNX output: dtype-aware tolerances, a hard verdict.

The lowest layer of the verify path (`runner` runs models, `verify` and `localize` sit on top);
it imports nothing else from onnx_custom but its errors, so every module above can use it
without a cycle.

Speed: a comparison is a handful of passes in the tensor's own precision (float32 for float32,
float16 and bfloat16), with no float64 copy of the tensor. Every statistic is still the exact
float64 one: the float32 pass only picks *candidates* (elements that may fail, may hold the
largest absolute or relative difference) with a safety margin far above float32 rounding, and
those few are recomputed in float64. Outputs with NaN/Inf, complex outputs and unusual
tolerances take the general float64 path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.testing._comparison import default_tolerances

from onnx_custom.errors import InvalidArgumentError, OnnxCustomError

__all__ = [
    "HALF_BUDGET",
    "OutputComparison",
    "ReferencePoint",
    "check_tolerances",
    "compare_arrays",
    "flatten_outputs",
    "to_numpy",
    "to_tensor",
    "tolerances",
]

# Float32 pass -> float64 recheck: the margin covers float32 rounding of |e - a|, |e| * rtol + atol
# and |e - a| / |e| (a few units in 2**-24) many times over.
_MARGIN = 2.0**-20
# Below this the float32 tolerance |e| * rtol + atol could lose relative precision to underflow.
_SMALLEST_SAFE_ATOL = 2.0**-100
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT64_TINY = float(np.finfo(np.float64).tiny)

DiffsThunk = Callable[[], np.ndarray]

# Factor on a half output's per-element budget (spread + |eager - float32|, see
# `onnx_custom.verification.half_reference`). Right files measured up to 5.4 (deform_conv's
# standard DeformConv at bfloat16, eager and ORT rounding in different places), 4.0 (bev_pool
# bfloat16), 3.2 (msda float16); wrong-in-a-few-elements files needed 1000s.
HALF_BUDGET = 16.0


@dataclasses.dataclass(frozen=True)
class ReferencePoint:
    """One half output computed in float32 (``value``) and how far it moves (``spread``,
    elementwise) when the half inputs and weights move by one rounding: what half precision may
    legitimately cost each element. Made by `onnx_custom.verification.half_reference`."""

    value: torch.Tensor
    spread: torch.Tensor


class _LazyArray:
    """Data descriptor for a dataclass field that may be set to an array or to a thunk.

    The thunk runs on first read and its result replaces it, so ``abs_diffs`` (needed only when a
    report draws its histogram) costs nothing in the common case.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}_value"

    def __get__(self, obj: Any, objtype: type | None = None) -> np.ndarray | None:
        if obj is None:
            return None  # the dataclass default
        value = obj.__dict__.get(self._slot)
        if callable(value):
            value = value()
            obj.__dict__[self._slot] = value
        return value

    def __set__(self, obj: Any, value: np.ndarray | DiffsThunk | None) -> None:
        # The dataclass passes the descriptor itself as the default value: that means "none".
        obj.__dict__[self._slot] = None if isinstance(value, _LazyArray) else value


@dataclasses.dataclass(frozen=True)
class OutputComparison:
    """How one output of one trial compares. ``tolerance_source`` says why these tolerances.

    ``abs_diffs``: ``|torch - onnx|`` in float64 for the elements finite on both sides (all
    elements for ints/bools), for histograms; for passing outputs computed on first access from
    the compared tensors (an error if they were modified in place since).
    """

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
    worst: str = ""  # a failing output's worst element: index, expected, received, tolerance there
    abs_diffs: _LazyArray = dataclasses.field(default=_LazyArray(), repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    @property
    def mismatched_percent(self) -> float:
        return 100.0 * self.mismatched / self.total if self.total else 0.0

    def __getstate__(self) -> dict[str, Any]:
        _ = self.abs_diffs  # a thunk does not pickle; its array does
        return dict(self.__dict__)


@dataclasses.dataclass(frozen=True)
class _Stats:
    max_abs_diff: float
    max_rel_diff: float
    mismatched: int
    nonfinite_mismatch: int = 0
    checksum: float = 0.0  # float32 sum of |exp - act| (the fast path), to detect later edits


def flatten_outputs(value: Any, prefix: str = "output") -> list[tuple[str, Any]]:
    """Nested tuples/lists/dicts -> ``[(path, leaf), ...]`` in order
    (dict keys in insertion order)."""
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in flatten_outputs(v, f"{prefix}.{k}")]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in flatten_outputs(v, f"{prefix}[{i}]")]
    return [(prefix, value)]


def tolerances(
    dtype: torch.dtype, rtol: float | None, atol: float | None
) -> tuple[float, float, str]:
    default_rtol, default_atol = default_tolerances(dtype)
    if rtol is None and atol is None:
        return (
            default_rtol,
            default_atol,
            f"torch.testing default for {str(dtype).removeprefix('torch.')}",
        )
    check_tolerances(rtol, atol)
    return float(rtol), float(atol), "user override"  # type: ignore[arg-type]


_HALF = (torch.float16, torch.bfloat16)


def _half_atol(exp: torch.Tensor, atol: float, source: str) -> tuple[float, str]:
    """torch.testing's half-precision defaults are for one op; a graph rounds after every node
    (ONNX Runtime's Mul then Add where the eager op rounds once), and a difference of one unit in
    the last place at the output's largest magnitude survives any later cancellation. So the
    default atol is at least that unit (``eps * max|expected|``)."""
    finite = exp[torch.isfinite(exp)]
    if not finite.numel():
        return atol, source
    unit = float(torch.finfo(exp.dtype).eps) * float(finite.abs().max())
    if unit <= atol:
        return atol, source
    return unit, f"{source}, atol raised to 1 ulp of max|expected| (half precision rounds per node)"


def check_tolerances(rtol: float | None, atol: float | None) -> None:
    """Both None (per-dtype defaults) or both non-negative numbers."""
    if rtol is None and atol is None:
        return
    if rtol is None or atol is None:
        given, missing = ("rtol", "atol") if atol is None else ("atol", "rtol")
        raise InvalidArgumentError(
            f"rtol and atol go together; received {given}={rtol if atol is None else atol!r}"
            f" without {missing}. Fix: pass both (e.g. rtol=1e-4, atol=1e-5), or neither for the"
            " per-dtype defaults."
        )
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise InvalidArgumentError(
                f"{name} must be a non-negative number; received {value!r}. Fix: pass e.g."
                f" {name}=1e-5."
            )


def to_tensor(array: Any) -> torch.Tensor:
    """A CPU tensor viewing ``array`` (ONNX Runtime's output) with its shape, 0-d included.

    bfloat16 (ml_dtypes) is reinterpreted bit for bit; byte-swapped or negatively strided arrays
    are copied (torch cannot view them).
    """
    arr = np.asarray(array)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr.view(np.int16)).reshape(arr.shape)).view(
            torch.bfloat16
        )
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if any(s < 0 for s in arr.strides) or not arr.flags.writeable:
        arr = arr.copy()  # torch views neither negative strides nor read-only memory (it warns)
    return torch.from_numpy(arr)


def compare_arrays(
    expected: torch.Tensor,
    actual: np.ndarray,
    *,
    name: str,
    trial: int,
    rtol: float | None = None,
    atol: float | None = None,
    backend: str = "onnxruntime",
    keep_diffs: bool = True,
    reference: ReferencePoint | Callable[[], ReferencePoint | None] | None = None,
) -> OutputComparison:
    """Compare one output. NaN/Inf must sit at the same positions; ints/bools compare exactly.

    ``keep_diffs=False`` leaves ``abs_diffs`` empty (None): for callers that never draw a
    histogram, so no copy of the tensors is kept. ``reference``: for a float16/bfloat16 output
    with default tolerances, its float32 reference (or a function making it, called only when
    some element is outside torch.testing's default); each element may then also differ by
    `HALF_BUDGET` times its own budget (``spread + |expected - reference|``). Without one (or if
    the function returns None), the default atol is raised to one ulp of max|expected| (a coarser
    bound, kept for callers that have no model to run in float32).
    """
    exp = expected.detach().cpu()
    act = to_tensor(actual)
    r, a, source = tolerances(exp.dtype, rtol, atol)
    half_default = rtol is None and atol is None and exp.dtype in _HALF
    if half_default and reference is None:
        a, source = _half_atol(exp, a, source)
    common = dict(
        trial=trial,
        name=name,
        shape=tuple(exp.shape),
        dtype=str(exp.dtype).removeprefix("torch."),
        rtol=r,
        atol=a,
        tolerance_source=source,
        backend=backend,
    )
    if tuple(act.shape) != tuple(exp.shape) or act.dtype != exp.dtype:
        why = (
            f"shape {list(act.shape)} vs {list(exp.shape)}"
            if tuple(act.shape) != tuple(exp.shape)
            else f"dtype {act.dtype} vs {exp.dtype}"
        )
        return OutputComparison(
            max_abs_diff=float("inf"),
            max_rel_diff=float("inf"),
            mismatched=max(exp.numel(), 1),
            total=max(exp.numel(), 1),
            **common | {"tolerance_source": f"{source}; ONNX {why}"},  # type: ignore[arg-type]
        )
    total = exp.numel()
    if total == 0:
        return OutputComparison(max_abs_diff=0.0, max_rel_diff=0.0, mismatched=0, total=0, **common)  # type: ignore[arg-type]
    stats, diffs = _stats(exp, act, r, a, None, keep_diffs, name, trial)
    budget: torch.Tensor | None = None
    if half_default and reference is not None and stats.mismatched > stats.nonfinite_mismatch:
        # Some element is outside torch.testing's default: only now is the reference worth making.
        point = reference() if callable(reference) else reference
        if point is not None and tuple(point.value.shape) == tuple(exp.shape):
            budget = _half_budget(exp, point)
            source = (
                f"{source}, plus {HALF_BUDGET:g} x each element's half-precision budget (float32"
                " reference)"
            )
        else:
            a, source = _half_atol(exp, a, source)
        common |= {"atol": a, "tolerance_source": source}
        stats, diffs = _stats(exp, act, r, a, budget, keep_diffs, name, trial)
    worst = (
        _worst_element(exp, act, r, a, budget)
        if stats.mismatched and exp.is_floating_point()
        else ""
    )
    return OutputComparison(
        max_abs_diff=stats.max_abs_diff,
        max_rel_diff=stats.max_rel_diff,
        mismatched=stats.mismatched,
        total=total,
        nonfinite_mismatch=stats.nonfinite_mismatch,
        worst=worst,
        abs_diffs=diffs,
        **common,  # type: ignore[arg-type]
    )


def _stats(
    exp: torch.Tensor,
    act: torch.Tensor,
    r: float,
    a: float,
    budget: torch.Tensor | None,
    keep_diffs: bool,
    name: str,
    trial: int,
) -> tuple[_Stats, np.ndarray | DiffsThunk | None]:
    """Statistics of a same-shape, same-dtype, non-empty pair, and its differences
    (kept or lazy)."""
    total = exp.numel()
    if exp.dtype == torch.bool or not (exp.is_floating_point() or exp.is_complex()):
        stats = _exact_stats(exp, act)
        return stats, (
            (_zeros(total) if stats.mismatched == 0 else _exact_diffs(exp, act))
            if keep_diffs
            else None
        )
    fast = _float_stats(exp, act, r, a) if exp.is_floating_point() and budget is None else None
    if fast is None:
        stats, all_diffs = _general_float_stats(exp, act, r, a, budget)
        return stats, all_diffs if keep_diffs else None
    # Failing outputs keep their differences now; passing ones compute them when a report asks.
    return fast, (
        (
            _finite_diffs(exp, act)
            if fast.mismatched
            else _guarded_diffs(exp, act, fast.checksum, name, trial)
        )
        if keep_diffs
        else None
    )


def _half_budget(exp: torch.Tensor, reference: ReferencePoint) -> torch.Tensor:
    """``HALF_BUDGET * (spread + |expected - reference|)`` in float64, per element. A spread that
    is NaN (a perturbed run gave NaN) is unbounded; a NaN reference adds nothing."""
    spread = reference.spread.to(torch.float64).nan_to_num(nan=float("inf"))
    own = (exp.to(torch.float64) - reference.value.to(torch.float64)).abs().nan_to_num(nan=0.0)
    return HALF_BUDGET * (spread + own)


def _worst_element(
    exp: torch.Tensor, act: torch.Tensor, rtol: float, atol: float, budget: torch.Tensor | None
) -> str:
    """The failing element furthest past its tolerance (or the first NaN/Inf mismatch): its
    index, expected and received values and the tolerance used there."""
    e64, a64 = exp.to(torch.float64).reshape(-1), act.to(torch.float64).reshape(-1)
    tol = atol + rtol * e64.abs()
    if budget is not None:
        tol = tol + budget.reshape(-1)
    with torch.no_grad():
        both = torch.isfinite(e64) & torch.isfinite(a64)
        excess = torch.where(
            both, (e64 - a64).abs() - tol, torch.tensor(-float("inf"), dtype=torch.float64)
        )
        same = (e64 == a64) | (torch.isnan(e64) & torch.isnan(a64))
        if bool((excess > 0).any()):
            flat = int(excess.argmax())
        else:
            flat = int((~both & ~same).nonzero()[0, 0])
    index = [int(i) for i in np.unravel_index(flat, tuple(exp.shape))] if exp.dim() else []
    parts = f"atol {atol:.2g} + rtol {rtol:.2g} x |expected|"
    if budget is not None:
        parts += f" + budget {float(budget.reshape(-1)[flat]):.3g}"
    return (
        f"element {index}: expected {float(e64[flat]):.6g}, received {float(a64[flat]):.6g}, |diff|"
        f" {float((e64[flat] - a64[flat]).abs()):.3g} > tolerance {float(tol[flat]):.3g} ({parts})"
    )


def _zeros(total: int) -> DiffsThunk:
    return lambda: np.zeros(total)


def _guarded_diffs(
    exp: torch.Tensor, act: torch.Tensor, checksum: float, name: str, trial: int
) -> DiffsThunk:
    """Differences computed on first read from the compared tensors themselves (no copy: copying
    would cost more than the comparison). A tensor modified since is detected (torch's version
    counter, and the float32 sum of |exp - act|) and refused rather than histogrammed."""
    version = exp._version

    def diffs() -> np.ndarray:
        if exp._version != version or _abs_diff_sum(exp, act) != checksum:
            raise OnnxCustomError(
                f"abs_diffs of output {name!r} (trial {trial}): the compared tensors were modified"
                " in place after compare_arrays, so their differences are no longer the compared"
                " ones. Fix: read abs_diffs (or write the report) before modifying them, or"
                " compare copies."
            )
        return _finite_diffs(exp, act)

    return diffs


def _abs_diff_sum(exp: torch.Tensor, act: torch.Tensor) -> float:
    e, x = _work_arrays(exp, act)
    with np.errstate(all="ignore"):
        d = np.abs(np.subtract(e, x))
    return float(np.add.reduce(d, axis=None))


def _exact_diffs(exp: torch.Tensor, act: torch.Tensor) -> np.ndarray:
    if exp.dtype == torch.bool:
        return (exp != act).to(torch.float64).numpy().ravel()
    return (exp.to(torch.float64) - act.to(torch.float64)).abs().numpy().ravel()


def _finite_diffs(exp: torch.Tensor, act: torch.Tensor) -> np.ndarray:
    """Float64 ``|exp - act|`` of an all-finite pair (what the general path keeps)."""
    return (exp.to(torch.float64) - act.to(torch.float64)).abs().numpy().ravel()


def _exact_stats(exp: torch.Tensor, act: torch.Tensor) -> _Stats:
    """Ints and bools: every differing element is a mismatch; statistics over those only."""
    bad = exp != act
    mismatched = int(torch.count_nonzero(bad))
    if mismatched == 0:
        return _Stats(0.0, 0.0, 0)
    if exp.dtype == torch.bool:
        return _Stats(1.0, 1.0, mismatched)
    e64, a64 = exp[bad].to(torch.float64), act[bad].to(torch.float64)
    diff = (e64 - a64).abs()
    return _Stats(float(diff.max()), float((diff / e64.abs().clamp_min(1)).max()), mismatched)


def _work_arrays(exp: torch.Tensor, act: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """NumPy views (float32 and float64 as they are; float16/bfloat16 widened to float32,
    exactly)."""
    work = torch.float64 if exp.dtype == torch.float64 else torch.float32
    return np.atleast_1d(exp.to(work).numpy()), np.atleast_1d(
        act.to(work).numpy()
    )  # 0-d: ufuncs return scalars


def _float_stats(exp: torch.Tensor, act: torch.Tensor, rtol: float, atol: float) -> _Stats | None:
    """Real floats without NaN/Inf in one pass of the tensor's precision; None:
    use the general path."""
    if atol < _SMALLEST_SAFE_ATOL or rtol < 0:
        return None  # the float32 candidate margin is not proven there
    with np.errstate(all="ignore"):  # overflow and NaN are detected below, not warned about
        return _float_stats_unchecked(exp, act, rtol, atol)


def _float_stats_unchecked(
    exp: torch.Tensor, act: torch.Tensor, rtol: float, atol: float
) -> _Stats | None:
    e, x = _work_arrays(exp, act)
    d = np.subtract(e, x)
    np.abs(d, out=d)
    dmax = float(d.max())
    if not np.isfinite(dmax):  # NaN/Inf on a side (or a float32 overflow): the general path
        return None
    checksum = float(np.add.reduce(d, axis=None))
    ae = np.abs(e)
    if e.dtype == np.float64:  # same float64 operations as the general path: exact as they are
        mismatched = int(np.count_nonzero(d > atol + rtol * ae))
        np.maximum(ae, _FLOAT64_TINY, out=ae)
        np.divide(d, ae, out=d)
        return _Stats(dmax, float(d.max()), mismatched, checksum=checksum)
    mismatched = 0
    if dmax > atol * (1 - _MARGIN):  # else every element is within atol alone: none can fail
        tol = np.multiply(ae, np.float32(rtol * (1 - _MARGIN)))
        tol += np.float32(atol * (1 - _MARGIN))
        maybe_bad = d > tol
        if maybe_bad.any():
            # Past the upper margin an element fails for sure; only the thin band between the two
            # bounds is rechecked in float64 (a wholesale failure gathers no float64 copy).
            np.multiply(tol, np.float32((1 + _MARGIN) / (1 - _MARGIN)), out=tol)
            surely_bad = d > tol
            mismatched = int(np.count_nonzero(surely_bad))
            if mismatched != int(
                np.count_nonzero(maybe_bad)
            ):  # else the band is empty (surely_bad <= maybe_bad)
                np.logical_and(maybe_bad, np.logical_not(surely_bad, out=surely_bad), out=maybe_bad)
                e64, x64 = e[maybe_bad].astype(np.float64), x[maybe_bad].astype(np.float64)
                mismatched += int(np.count_nonzero(np.abs(e64 - x64) > atol + rtol * np.abs(e64)))
    if dmax == 0.0:
        return _Stats(0.0, 0.0, mismatched, checksum=checksum)
    max_abs = _max64(e, x, d >= dmax * (1 - _MARGIN), relative=False)
    q = np.divide(d, ae, out=ae)  # 0/0 -> NaN (skipped by fmax); x/0 -> inf (a candidate)
    qmax = float(np.fmax.reduce(q, axis=None))
    near_max = (
        q >= min(qmax, _FLOAT32_MAX) * (1 - _MARGIN) if qmax >= _SMALLEST_SAFE_ATOL else d > 0
    )
    return _Stats(max_abs, _max64(e, x, near_max, relative=True), mismatched, checksum=checksum)


def _max64(e: np.ndarray, x: np.ndarray, where: np.ndarray, *, relative: bool) -> float:
    """Exact float64 max of ``|e - x|`` (or of it over ``max(|e|, tiny)``) among the candidates."""
    e64, x64 = e[where].astype(np.float64), x[where].astype(np.float64)
    diff = np.abs(e64 - x64)
    if relative:
        diff /= np.maximum(np.abs(e64), _FLOAT64_TINY)
    return float(diff.max())


def _general_float_stats(
    exp: torch.Tensor, act: torch.Tensor, r: float, a: float, budget: torch.Tensor | None = None
) -> tuple[_Stats, np.ndarray]:
    """Float64 over the whole tensor: NaN/Inf positions, complex values, tiny tolerances, and the
    per-element ``budget`` of a half output (added to ``a + r * |expected|``)."""
    e64 = exp.to(torch.complex128 if exp.is_complex() else torch.float64)
    a64 = act.to(e64.dtype)
    finite_e, finite_a = torch.isfinite(e64), torch.isfinite(a64)
    # Non-finite values must agree exactly (same NaN positions, same signed infinities).
    nonfinite_bad = (finite_e != finite_a) | (
        ~finite_e & ~finite_a & ~((e64 == a64) | (torch.isnan(e64) & torch.isnan(a64)))
    )
    both = finite_e & finite_a
    diff = torch.zeros_like(e64.real if e64.is_complex() else e64)
    diff[both] = (e64[both] - a64[both]).abs()
    rel = torch.zeros_like(diff)
    rel[both] = diff[both] / e64[both].abs().clamp_min(_FLOAT64_TINY)
    tol = a + r * e64.abs() if budget is None else a + r * e64.abs() + budget
    bad = nonfinite_bad | (both & (diff > tol))
    stats = _Stats(float(diff.max()), float(rel.max()), int(bad.sum()), int(nonfinite_bad.sum()))
    return stats, diff[both].numpy().ravel()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
