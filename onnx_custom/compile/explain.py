"""``explain_compile(model, *args)``: which ops ran in ONNX Runtime, which in PyTorch, and why."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from onnx_custom.compile.backend import GraphRecord, OnnxCustomBackend
from onnx_custom.compile.options import CompileOptions
from onnx_custom.errors import InvalidArgumentError

__all__ = ["CompileExplanation", "explain_compile"]


@dataclasses.dataclass(frozen=True)
class CompileExplanation:
    """The backend's `GraphRecord`s for one compile-and-run (``str()`` prints the summary)."""

    graphs: tuple[GraphRecord, ...]
    output: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def fallbacks(self) -> list[Any]:
        return [f for g in self.graphs for f in g.fallbacks]

    @property
    def partitions(self) -> int:
        return sum(len(g.partitions) for g in self.graphs)

    def __str__(self) -> str:
        lines = [
            f"{len(self.graphs)} graph(s), {self.partitions} ONNX Runtime partition(s),"
            f" {len(self.fallbacks)} op(s) in PyTorch"
        ]
        for graph in self.graphs:
            lines.append(f"{graph.name}: {graph.ort_nodes}/{graph.nodes} nodes in ONNX Runtime")
            for part in graph.partitions:
                ours = (
                    f"; onnx-custom translations: {', '.join(part.custom_ops)}"
                    if part.custom_ops
                    else ""
                )
                lines.append(
                    f"  ORT   {part.name}: {part.nodes} nodes (translate"
                    f" {part.translate_seconds * 1e3:.0f} ms, session"
                    f" {part.session_seconds * 1e3:.0f} ms){ours}"
                )
            lines.extend(f"  eager {f}" for f in graph.fallbacks)
        return "\n".join(lines)


def explain_compile(
    model: Any, *args: Any, backward: bool = False, **options: Any
) -> CompileExplanation:
    """Compile ``model`` with the onnx_custom backend (``options`` as for ``compile_backend``),
    run it once on ``args`` (and its backward on the sum of the outputs when ``backward``), and
    report what ran where. The model's own compiled state is untouched (a fresh backend)."""
    if not callable(model):
        raise InvalidArgumentError(
            f"explain_compile expects a module or function; received {type(model).__name__}. Fix:"
            " pass the model itself."
        )
    backend = OnnxCustomBackend(CompileOptions.create(**options))
    compiled = torch.compile(model, backend=backend)
    with torch.set_grad_enabled(backward):  # forward only: the inference graph, as under no_grad
        output = compiled(*args)
    if backward:
        leaves = [o for o in _tensors(output) if o.requires_grad]
        if not leaves:
            raise InvalidArgumentError(
                "explain_compile(backward=True): no output requires grad. Fix: pass inputs or a"
                " model with parameters that require grad."
            )
        sum(o.float().sum() for o in leaves).backward()  # type: ignore[union-attr]
    return CompileExplanation(tuple(backend.records), output)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
