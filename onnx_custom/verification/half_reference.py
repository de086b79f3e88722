"""A float32 reference for float16/bfloat16 outputs: what half precision may legitimately change.

Eager PyTorch and ONNX Runtime both round to half precision, but not at the same places (a graph
rounds after every node where a fused eager op rounds once), so a half output may differ by more
than torch.testing's per-element defaults where intermediate values were large (cancellation).
A tolerance of one ulp of the *output's largest value* hid plainly wrong elements: float16 with
max|y| = 1000 let an element expected 0.001 come back as 0.4, bfloat16 8x worse.

Instead each element gets its own budget from the same model run in float32 on the upcast inputs
and weights (the half values, exactly):

* ``value``: the float32 result ``r``; ``|eager - r|`` is what half precision cost eager there;
* ``spread``: how far ``r`` moves when the half inputs and weights are perturbed by up to half a
  unit in the last place (the size of one rounding), a few seeded draws, elementwise maximum. It
  measures the magnitudes feeding each element (``2a + b - 1`` near 0 moves by ``eps * |2a + b|``),
  which bound what rounding an intermediate value can cost there, whatever the graph's order.

`onnx_custom.verification.compare.compare_arrays` then allows ``|onnx - eager| <= atol + rtol *
|eager| + K * (spread + |eager - r|)`` per element. An element far from the float32 result where
nothing feeding it is large fails, however large other elements are.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from onnx_custom.verification.compare import ReferencePoint

__all__ = ["HALF_DTYPES", "PERTURBATIONS", "HalfReference", "ReferencePoint"]

HALF_DTYPES = (torch.float16, torch.bfloat16)
# Seeded draws of the perturbation: each measures one random direction, the maximum of a few is
# a steady estimate of the spread (see compare's BUDGET for the factor on top).
PERTURBATIONS = 3
_SEED = 20260


def _is_half(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in HALF_DTYPES


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return type(value)({k: _map_tensors(v, fn) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


class HalfReference:
    """The model once more in float32, made on first use and reused for every trial of a verify.

    ``outputs(args, flat_outputs)`` gives a `ReferencePoint` per half output (None for others), or
    a reason string when the model cannot run in float32 (then compare keeps its older bound).
    """

    def __init__(
        self, model: Callable[..., Any], flatten: Callable[[Any], list[tuple[str, Any]]]
    ) -> None:
        self._model = model
        self._flatten = flatten
        self._wide: Callable[..., Any] | None = None
        self._half_weights: list[tuple[torch.Tensor, float]] = []

    def _widened(self) -> Callable[..., Any]:
        if self._wide is None:
            original = self._model
            model = original
            if isinstance(original, torch.nn.Module):
                # Only half tensors are widened: float64 buffers keep their precision,
                # ints their type.
                wide = copy.deepcopy(original)._apply(
                    lambda t: t.float() if t.dtype in HALF_DTYPES else t
                )
                source = [*original.parameters(), *original.buffers()]
                widened = [*wide.parameters(), *wide.buffers()]
                self._half_weights = [
                    (w, _unit_roundoff(s.dtype))
                    for w, s in zip(widened, source, strict=True)
                    if s.dtype in HALF_DTYPES
                ]
                model = wide
            self._wide = model
        return self._wide

    def for_trial(
        self, args: tuple[Any, ...], eager: list[tuple[str, Any]], notes: list[str]
    ) -> list[Callable[[], ReferencePoint | None] | None] | None:
        """Per output, a function giving its `ReferencePoint` (None for outputs that are not
        half; None overall when none is). The float32 runs happen on the first call, for every
        output at once: compare calls it only when an element is outside torch.testing's
        default. A reason the model cannot give one goes into ``notes`` once (those outputs keep
        compare's coarser bound)."""
        if not any(_is_half(leaf) for _, leaf in eager):
            return None
        made: list[list[ReferencePoint | None]] = []

        def point(index: int) -> ReferencePoint | None:
            if not made:
                found = self.outputs(args, eager)
                if isinstance(found, str):
                    note = (
                        f"half-precision outputs compared without a float32 reference: {found};"
                        " atol is one ulp of max|expected| instead"
                    )
                    if note not in notes:
                        notes.append(note)
                    found = [None] * len(eager)
                made.append(found)
            return made[0][index]

        return [
            functools.partial(point, i) if _is_half(leaf) else None
            for i, (_, leaf) in enumerate(eager)
        ]

    def outputs(
        self, args: tuple[Any, ...], eager: list[tuple[str, Any]]
    ) -> list[ReferencePoint | None] | str:
        # the model may refuse float32 (a hard-coded dtype, an op registered for half only)
        try:
            return self._outputs(args, eager)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            return f"the model cannot run in float32 ({type(exc).__name__}: {first})"

    def _outputs(
        self, args: tuple[Any, ...], eager: list[tuple[str, Any]]
    ) -> list[ReferencePoint | None] | str:
        model = self._widened()
        generator = torch.Generator().manual_seed(_SEED)
        with torch.no_grad():
            base = self._run(model, _wide_args(args, None), eager)
            if isinstance(base, str):
                return base
            spread = [None if b is None else torch.zeros_like(b) for b in base]
            for _ in range(PERTURBATIONS):
                saved = [w.detach().clone() for w, _ in self._half_weights]
                try:
                    for w, u in self._half_weights:
                        w.data = _nudge(w.data, u, generator)
                    moved = self._run(model, _wide_args(args, generator), eager)
                finally:
                    for (w, _), original in zip(self._half_weights, saved, strict=True):
                        w.data = original
                if isinstance(moved, str):
                    return moved
                for s, b, m in zip(spread, base, moved, strict=True):
                    if s is not None and b is not None and m is not None:
                        # NaN after a nudge: the element is unstable there, its budget unbounded
                        torch.maximum(s, (m - b).abs().nan_to_num(nan=float("inf")), out=s)
        return [
            None if b is None or s is None else ReferencePoint(b, s)
            for b, s in zip(base, spread, strict=True)
        ]

    def _run(
        self, model: Callable[..., Any], wide_args: Any, eager: list[tuple[str, Any]]
    ) -> list[torch.Tensor | None] | str:
        flat = self._flatten(model(*wide_args))
        if len(flat) != len(eager):
            return f"the model in float32 returns {len(flat)} outputs, {len(eager)} in half"
        out: list[torch.Tensor | None] = []
        for (name, ref), (_, exp) in zip(flat, eager, strict=True):
            if not _is_half(exp):
                out.append(None)
            elif not isinstance(ref, torch.Tensor) or tuple(ref.shape) != tuple(exp.shape):
                return f"output {name} in float32 is not a tensor of shape {list(exp.shape)}"
            elif not ref.is_floating_point():
                return f"output {name} in float32 is {ref.dtype}, not a float"
            else:
                out.append(ref.detach().float())
        return out


def _nudge(t: torch.Tensor, u: float, generator: torch.Generator) -> torch.Tensor:
    """``t`` times ``1 + u * U(-1, 1)`` per element: a rounding's worth of relative noise."""
    noise = torch.rand(t.shape, generator=generator, dtype=torch.float32) * 2 - 1
    return t * (1 + u * noise)


def _wide_args(args: tuple[Any, ...], generator: torch.Generator | None) -> Any:
    """Fresh float32 copies of the half inputs (nudged when a generator is given) and fresh copies
    of the others: every run starts from the caller's values, even if the model writes into its
    inputs."""

    def widen(t: torch.Tensor) -> torch.Tensor:
        if t.dtype not in HALF_DTYPES:
            return t.detach().clone()
        wide = t.detach().float()
        return wide if generator is None else _nudge(wide, _unit_roundoff(t.dtype), generator)

    return _map_tensors(args, widen)
