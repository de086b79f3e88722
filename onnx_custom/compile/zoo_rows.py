"""The zoo's compile rows: ``torch.compile(model, backend=onnx_custom)`` vs eager, hard verdict.

`check_compiled` compiles a zoo model with a fresh backend, runs it and compares every output
with eager PyTorch through the verifier's `compare_arrays` (per-dtype tolerances; any mismatch
fails). With ``dynamic_shapes`` it compiles with ``dynamic=True`` and also runs at `OTHER_BATCHES`
other sizes of every declared batch dim (axis 0) under ``error_on_recompile``: a recompile or a
second graph fails the row. The zoo (`onnx_custom.zoo`) turns the result into a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from onnx_custom.compile.backend import compile_backend
from onnx_custom.verification.compare import OutputComparison, compare_arrays, flatten_outputs

__all__ = ["OTHER_BATCHES", "CompileCheck", "batch_sizes", "check_compiled"]

OTHER_BATCHES = 2
"""A dynamic compile row runs at this many batch sizes besides the example one."""

# Tried in order: small (torch specialises 0 and 1 itself; fake conv guards batch <= 15).
_CANDIDATES = (3, 5, 4, 6, 7)


@dataclasses.dataclass(frozen=True)
class CompileCheck:
    """What one compile row found: every comparison, the batch sizes run, where nodes ran."""

    comparisons: tuple[OutputComparison, ...]
    batches: tuple[int, ...]
    graphs: int
    ort_nodes: int
    nodes: int
    partitions: int
    fallbacks: tuple[str, ...]
    problem: str = ""  # a failure that is not a value mismatch (recompile, ...)

    @property
    def passed(self) -> bool:
        return (
            not self.problem and bool(self.comparisons) and all(c.passed for c in self.comparisons)
        )

    @property
    def worst(self) -> float:
        return max((c.max_abs_diff for c in self.comparisons), default=0.0)

    def describe(self) -> str:
        """The failing comparisons (or the problem), one per line."""
        lines = [self.problem] if self.problem else []
        for c in self.comparisons:
            if not c.passed:
                lines.append(
                    f"batch {self.batches[c.trial]}: {c.name} {c.dtype}{list(c.shape)} differs from"
                    f" eager: {c.mismatched}/{c.total} elements outside rtol={c.rtol:g}"
                    f" atol={c.atol:g} ({c.tolerance_source}), max abs diff {c.max_abs_diff:.3g}"
                )
        return "\n".join(lines)


def _batch_dims(dynamic_shapes: Sequence[Any]) -> list[Any]:
    """Per top-level input: its axis-0 ``Dim`` (or None when axis 0 is static)."""
    found = []
    for spec in dynamic_shapes:
        dim = (
            spec.get(0)
            if isinstance(spec, dict)
            else (spec[0] if isinstance(spec, (list, tuple)) and spec else None)
        )
        found.append(dim)
    return found


def _bound(dim: Any, name: str, default: int) -> int:
    """A ``Dim``'s min/max as an int; an unbounded one (sympy's oo, None) gives ``default``."""
    try:
        return int(getattr(dim, name))
    except (AttributeError, TypeError, ValueError, OverflowError):
        return default


def batch_sizes(example_batch: int, dims: Sequence[Any], count: int = OTHER_BATCHES) -> list[int]:
    """``count`` batch sizes other than ``example_batch`` inside every dim's min/max."""
    low = max([2] + [_bound(d, "min", 2) for d in dims if d is not None])
    high = min([64] + [_bound(d, "max", 64) for d in dims if d is not None])
    return [b for b in _CANDIDATES if b != example_batch and low <= b <= high][:count]


def _resized(
    args: Sequence[torch.Tensor], dims: Sequence[Any], batch: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """``args`` with every dynamic axis 0 set to ``batch``: fresh random floats,
    repeated rows otherwise."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for tensor, dim in zip(args, dims, strict=True):
        if dim is None:
            out.append(tensor)
        elif tensor.is_floating_point():
            out.append(
                torch.randn((batch, *tensor.shape[1:]), generator=generator, dtype=tensor.dtype)
            )
        else:  # indices and the like: keep valid values by cycling the example rows
            out.append(tensor[torch.arange(batch) % tensor.shape[0]])
    return tuple(out)


def _compare(expected: Any, got: Any, trial: int) -> list[OutputComparison]:
    exp, act = flatten_outputs(expected), flatten_outputs(got)
    if len(exp) != len(act):
        raise ValueError(f"compiled model returned {len(act)} outputs, eager {len(exp)}")
    return [
        compare_arrays(
            e,
            a.detach().cpu().numpy(),
            name=name,
            trial=trial,
            backend="torch.compile(onnx_custom)",
            keep_diffs=False,
        )
        for (name, e), (_, a) in zip(exp, act, strict=True)
    ]


def check_compiled(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    dynamic_shapes: Sequence[Any] | None = None,
    seed: int = 0,
    **options: Any,
) -> CompileCheck:
    """Compile ``model`` with ``compile_backend(**options)``, compare with eager
    (see module doc)."""
    torch._dynamo.reset()  # a fresh cache: earlier rows compiled the same forward code
    backend = compile_backend(**options)
    dims = _batch_dims(dynamic_shapes) if dynamic_shapes is not None else []
    first = args[0] if args and isinstance(args[0], torch.Tensor) and args[0].dim() else None
    runs: list[tuple[int, tuple[Any, ...]]] = [
        (int(first.shape[0]) if first is not None else 0, args)
    ]
    if dims:
        runs += [(b, _resized(args, dims, b, seed + b)) for b in batch_sizes(runs[0][0], dims)]
    compiled = torch.compile(model, backend=backend, dynamic=bool(dims))
    comparisons: list[OutputComparison] = []
    problem = ""
    try:
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=bool(dims)):
            for trial, (_, inputs) in enumerate(runs):
                comparisons += _compare(model(*inputs), compiled(*inputs), trial)
    except torch._dynamo.exc.RecompileError as exc:
        problem = (
            "recompiled at another batch size (dynamic=True must serve every size with one graph):"
            f" {str(exc).splitlines()[0]}"
        )
    finally:
        torch._dynamo.reset()
    records = backend.records
    if dims and not problem and len(records) != 1:
        problem = f"expected one compiled graph for every batch size, got {len(records)}"
    fallbacks = tuple(f"{f}" for r in records for f in r.fallbacks)
    return CompileCheck(
        tuple(comparisons),
        tuple(b for b, _ in runs),
        len(records),
        sum(r.ort_nodes for r in records),
        sum(r.nodes for r in records),
        sum(len(r.partitions) for r in records),
        fallbacks,
        problem,
    )
