"""``x.clamp(0, 1.5)`` on a float tensor, for the dynamo exporter.

torch's type-promotion pass turns one int and one float scalar bound into tensors and then finds
no ``aten.clamp`` overload taking them ("Cannot find a compatible OpOverload for aten.clamp"),
so ``torch.onnx.export(dynamo=True)`` fails on a line detection code writes often
(``bboxes.clamp(min=0, max=max_ratio)``). For a floating-point input an int bound is the same
bound as a float, so we write it as one before the exporter runs; the result is unchanged.
"""

from __future__ import annotations

import numbers

import torch

__all__ = ["float_clamp_bounds"]

_CLAMPS = ("clamp", "clamp_", "clip", "clip_")


def _is_float_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def float_clamp_bounds(program: torch.export.ExportedProgram) -> int:
    """Write the int scalar bounds of clamps of float tensors as floats; returns how many nodes
    changed (the graph is edited in place)."""
    changed = 0
    aten = torch.ops.aten
    targets = {getattr(aten, name).default for name in _CLAMPS}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in targets or len(node.args) < 2:
            continue
        source = node.args[0]
        if not _is_float_tensor(getattr(source, "meta", {}).get("val")):
            continue
        bounds = list(node.args[1:])
        if not any(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in bounds):
            continue
        node.args = (
            source,
            *(
                float(b) if isinstance(b, numbers.Integral) and not isinstance(b, bool) else b
                for b in bounds
            ),
        )
        changed += 1
    if changed:
        program.graph_module.recompile()
    return changed
