"""``onnx_custom.verification.localization_report``: what a localization found,
one frozen record per level.

`ValueDiff` is one compared value, `NodeLocalization` one torch op call and the ONNX nodes its
translation produced, `Localization` a whole trial with its first diverging node, its summary
and its text/JSON forms. How they are computed (the streaming comparison of the two sides) lives
in `onnx_custom.verification.localize`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["INPUT_NOTE", "PARAMETER_NOTE", "Localization", "NodeLocalization", "ValueDiff"]

# Notes a ValueDiff carries for the values that are not op outputs.
INPUT_NOTE = "model input (the same values are fed to both sides)"
PARAMETER_NOTE = "model parameter vs the ONNX initializer"


@dataclasses.dataclass(frozen=True)
class ValueDiff:
    """One compared value: FX name, ONNX name, and how far apart they are."""

    name: str
    onnx_name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    mismatched: int
    total: int
    observed: bool = True  # False: the ONNX graph has no value for it (fused away, or a parameter)
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    def describe(self) -> str:
        if not self.observed:
            return f"{self.name}: not observable in ONNX{f' ({self.note})' if self.note else ''}"
        if self.note == INPUT_NOTE:
            return f"{self.name}: {INPUT_NOTE}"
        state = "ok" if self.passed else f"DIFF {self.mismatched}/{self.total}"
        extra = f"; {self.note}" if self.note else ""
        return (
            f"{self.name} -> {self.onnx_name} {list(self.shape)} {self.dtype}:"
            f" max_abs={self.max_abs_diff:.3g} max_rel={self.max_rel_diff:.3g} [{state}{extra}]"
        )


@dataclasses.dataclass(frozen=True)
class NodeLocalization:
    """One torch op call (an FX node) and the ONNX nodes its translation produced."""

    index: int
    fx_name: str
    torch_op: str
    onnx_nodes: tuple[str, ...]
    inputs: tuple[ValueDiff, ...]
    outputs: tuple[ValueDiff, ...]
    translation: str
    stack: str = ""

    @property
    def observed(self) -> bool:
        return any(o.observed for o in self.outputs)

    @property
    def diverges(self) -> bool:
        return any(o.observed and not o.passed for o in self.outputs)

    @property
    def origin(self) -> bool:
        """Output diverges while every observed input agrees: this node's translation is suspect."""
        return self.diverges and all(i.passed for i in self.inputs if i.observed)

    def describe(self) -> str:
        lines = [
            f"#{self.index} {self.fx_name} = {self.torch_op}"
            + (f"   ({self.stack})" if self.stack else "")
        ]
        lines.append(f"    ONNX node(s): {', '.join(self.onnx_nodes) or '(none found)'}")
        lines.append(f"    translation: {self.translation}")
        lines += [f"    input  {v.describe()}" for v in self.inputs]
        lines += [f"    output {v.describe()}" for v in self.outputs]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"diverges": self.diverges, "origin": self.origin}


@dataclasses.dataclass(frozen=True)
class Localization:
    """Per-node comparison of one trial; ``first`` is the first diverging node
    (an origin if any)."""

    method: str  # "names", "probe" or "source" (`onnx_custom.verification.file_localize`)
    exporter: str
    opset: int
    trial: int
    nodes: tuple[NodeLocalization, ...]
    note: str = ""

    @property
    def diverging(self) -> tuple[NodeLocalization, ...]:
        return tuple(n for n in self.nodes if n.diverges)

    @property
    def origins(self) -> tuple[NodeLocalization, ...]:
        return tuple(n for n in self.nodes if n.origin)

    @property
    def first(self) -> NodeLocalization | None:
        origins = self.origins
        if origins:
            return origins[0]
        diverging = self.diverging
        return diverging[0] if diverging else None

    def summary(self) -> str:
        first = self.first
        observed = sum(n.observed for n in self.nodes)
        if first is None and self.method == "source":
            unpaired = [n for n in self.nodes if not n.observed]
            text = (
                f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial"
                f" {self.trial}): none of the {observed} value(s) paired with eager's diverge"
            )
            if unpaired:
                text += (
                    f"; {len(unpaired)} line(s) of the file have no eager value to pair with"
                    f" (first: {unpaired[0].fx_name}, {unpaired[0].outputs[0].note}): the trace"
                    " computes there what eager did not on these inputs"
                )
            return text
        if first is None and self.method == "probe":
            return (
                f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial"
                f" {self.trial}): all {observed} observed intermediate node(s) of the re-export"
                " agree. If the file still mismatches, it was not made by this"
                " exporter/opset/registry (another variant or registry?), was edited after export,"
                " or the fault is in an autograd.Function translation (inlined by torch.export, so"
                " not re-exported)."
            )
        if first is None:
            return (
                f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial"
                f" {self.trial}): all {observed} observed intermediate node(s) agree. If the"
                " outputs still mismatch, the divergence is in a part this comparison cannot"
                " observe (nodes fused away, the translation of an autograd.Function, or edits"
                " made to the file after export)."
            )
        worst = max((o for o in first.outputs if o.observed), key=lambda o: o.max_abs_diff)
        text = (
            f"First diverging node: #{first.index} {first.fx_name} = {first.torch_op} -> ONNX"
            f" {', '.join(first.onnx_nodes) or '(none found)'}; output"
            f" max_abs={worst.max_abs_diff:.3g} max_rel={worst.max_rel_diff:.3g}; translation:"
            f" {first.translation}"
        )
        parameters = [
            i
            for i in first.inputs
            if i.observed and not i.passed and i.note.startswith(PARAMETER_NOTE)
        ]
        if parameters:
            text += (
                f". Its input {parameters[0].name} (a model parameter) already differs from the"
                f" file's initializer {parameters[0].onnx_name!r}: the file was not exported from"
                " these weights"
            )
        return text

    def __str__(self) -> str:
        observed = sum(n.observed for n in self.nodes)
        lines = [
            (
                f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial"
                f" {self.trial}): {observed}/{len(self.nodes)} torch node(s) observed in ONNX,"
                f" {len(self.diverging)} diverge, {len(self.origins)} origin(s)"
            ),
            self.summary(),
        ]
        if self.note:
            lines.append(f"note: {self.note}")
        shown = [n for n in self.nodes if n.diverges][:5]
        if shown:
            lines.append("Diverging nodes in topological order (origins first are the suspects):")
            lines += [("[ORIGIN] " if n.origin else "") + n.describe() for n in shown]
            if len(self.diverging) > len(shown):
                lines.append(
                    f"... and {len(self.diverging) - len(shown)} more diverging node(s) downstream"
                )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "method": self.method,
            "exporter": self.exporter,
            "opset": self.opset,
            "trial": self.trial,
            "note": self.note,
            "summary": self.summary(),
            "first": first.fx_name if first else None,
            "nodes": [n.to_dict() for n in self.nodes],
        }
