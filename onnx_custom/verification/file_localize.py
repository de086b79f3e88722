"""Localizing from the file itself: its intermediate values against the eager model's, paired by
the module and the Python line that made them.

A TorchScript export records, per ONNX node, the model code's line that called the op
(`onnx_custom.exporter.trace_provenance`) and, in the node's name, the module scope
(``/encoder/layers.0/Add_1``). Eager runs the model once under a ``TorchFunctionMode`` that
records the same pair for every torch call; the last value each (scope, line) produced on both
sides is compared. No re-export and no ``torch.export`` are needed, so this works where the
trace itself is what went wrong (a data-dependent Python branch the trace fixed: the file has
values from lines eager did not run, and what follows them diverges), and the TracerWarnings
raised in the functions that produced the first diverging value are named with it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch.overrides import TorchFunctionMode

from onnx_custom.exporter.trace_provenance import (
    SOURCE_KEY,
    TracerWarningRecord,
    read,
    source_frames,
)
from onnx_custom.verification.compare import compare_arrays
from onnx_custom.verification.localization_report import Localization, NodeLocalization, ValueDiff
from onnx_custom.verification.runner import _to_ort_value, input_names, tensor_inputs
from onnx_custom.verification.segmented import SegmentedRun

__all__ = ["has_sources", "localize_file"]

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OURS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_KEEP = 4  # values kept per (scope, line) on the eager side: the last call's outputs
_FOLDED = 4  # eager calls after a value an exporter may fold into its node (Conv + BatchNorm)


def has_sources(proto: onnx.ModelProto) -> bool:
    """Does the file carry its nodes' source lines (a TorchScript export by onnx_custom, or by
    ``torch.onnx.export(..., verbose=True)``, which keeps them in the doc strings)?"""
    return any(_source(n) for n in proto.graph.node)


def _source(node: onnx.NodeProto) -> str:
    """The node's model-code frames, innermost first, joined by ``;`` (empty if unknown)."""
    for prop in node.metadata_props:
        if prop.key == SOURCE_KEY:
            return prop.value
    return ";".join(source_frames(node.doc_string)) if node.doc_string else ""


@dataclasses.dataclass
class _Group:
    """The ONNX nodes one (scope, line) produced, in the file's order."""

    key: tuple[str, str]
    frames: list[str]
    nodes: list[int] = dataclasses.field(default_factory=list)
    values: list[str] = dataclasses.field(default_factory=list)


def _module_path(scope: str) -> str:
    """A TorchScript node scope as eager's ``named_modules`` name: ``encoder/layers.0/layer/
    layer.0`` (a container's child carries the container's name) -> ``encoder.layers.0.layer.0``."""
    parts: list[str] = []
    previous = ""
    for component in (c for c in scope.split("/") if c):
        own = component[len(previous) + 1 :] if component.startswith(previous + ".") else component
        parts.append(own)
        previous = component
    return ".".join(parts)


def _scope(node: onnx.NodeProto) -> str:
    return _module_path(node.name.rsplit("/", 1)[0]) if "/" in node.name else ""


def _groups(proto: onnx.ModelProto) -> tuple[list[_Group], dict[str, int]]:
    """The file's (scope, line) groups in order of their first node, and value -> group index."""
    groups: dict[tuple[str, str], _Group] = {}
    producer: dict[str, int] = {}
    order: list[_Group] = []
    for i, node in enumerate(proto.graph.node):
        source = _source(node)
        if not source or node.op_type == "Constant":
            continue
        frames = source.split(";")
        key = (_scope(node), frames[0])
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(key, frames)
            order.append(group)
        group.nodes.append(i)
        group.values += [o for o in node.output if o]
    index = {id(g): i for i, g in enumerate(order)}
    for g in order:
        for value in g.values:
            producer[value] = index[id(g)]
    return order, producer


def _user_frame() -> str:
    """``file:line`` of the innermost frame of the model's code (not torch's, not ours)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = (
            os.path.abspath(frame.f_code.co_filename) if frame.f_code.co_filename[0] != "<" else ""
        )
        if not name or not (name.startswith(_TORCH_DIR) or name.startswith(_OURS_DIR)):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class _Recorder(TorchFunctionMode):
    """Eager's outputs per (module scope, model-code line): the last `_KEEP` of each."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[str] = [""]
        self.values: dict[tuple[str, str], list[tuple[int, str, torch.Tensor]]] = {}
        self.calls = 0
        self.by_call: dict[int, list[tuple[int, str, torch.Tensor]]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        tensors = [
            t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)
        ]
        if tensors:
            kept = self.values.setdefault((self.scopes[-1], _user_frame()), [])
            name = getattr(func, "__name__", str(func))
            self.calls += 1
            made = [(self.calls, name, t.detach().clone()) for t in tensors]
            kept += made
            self.by_call[self.calls] = made
            for dropped, _, _ in kept[:-_KEEP]:
                self.by_call.pop(dropped, None)
            del kept[:-_KEEP]
        return result

    def after(self, call: int, within: int) -> list[tuple[int, str, torch.Tensor]]:
        """The kept outputs of the ``within`` calls after ``call``, in call order."""
        return [v for c in range(call + 1, call + within + 1) for v in self.by_call.get(c, ())]


def _eager_values(model: torch.nn.Module, args: tuple[Any, ...]) -> _Recorder:
    """Run eager once, recording each torch call's outputs under (module scope, code line); the
    scope is spelled as TorchScript names nodes: attribute names joined by ``/``."""
    recorder = _Recorder()
    names = {id(m): n for n, m in model.named_modules()}

    def enter(module: torch.nn.Module, _args: Any) -> None:
        recorder.scopes.append(names.get(id(module), recorder.scopes[-1]))

    def leave(module: torch.nn.Module, _args: Any, _out: Any) -> None:
        recorder.scopes.pop()

    handles = []
    for module in model.modules():
        if module is not model:
            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
    try:
        with torch.no_grad(), recorder:
            model(*args)
    finally:
        for handle in handles:
            handle.remove()
    return recorder


def _diff(
    name: str, tensor: torch.Tensor, value: np.ndarray, rtol: Any, atol: Any, trial: int
) -> ValueDiff:
    c = compare_arrays(tensor, value, name=name, trial=trial, rtol=rtol, atol=atol)
    dtype = str(tensor.dtype).replace("torch.", "")
    return ValueDiff(
        name, name, tuple(value.shape), dtype, c.max_abs_diff, c.max_rel_diff, c.mismatched, c.total
    )


def _compare_last(
    recorder: _Recorder,
    eager: list[tuple[int, str, torch.Tensor]],
    name: str,
    value: np.ndarray,
    rtol: float | None,
    atol: float | None,
    trial: int,
) -> tuple[str, ValueDiff] | None:
    """The file's ``value`` against eager's last output of the same shape (None: no such). When
    they differ but an output of the next few eager calls matches (the exporter folded that op,
    a BatchNorm into its Conv, into this node), that pairing is the one reported."""
    for call, op, tensor in reversed(eager):
        if tuple(tensor.shape) != tuple(value.shape):
            continue
        diff = _diff(name, tensor, value, rtol, atol, trial)
        if diff.passed:
            return op, diff
        for _, later_op, later in recorder.after(call, _FOLDED):
            if tuple(later.shape) == tuple(value.shape):
                folded = _diff(name, later, value, rtol, atol, trial)
                if folded.passed:
                    note = f"{op} followed by {later_op}, folded into this node by the exporter"
                    return op, dataclasses.replace(folded, note=note)
        return op, diff
    return None


@functools.lru_cache(maxsize=64)
def _functions(path: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, name) of every function in a source file (empty if unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple(
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def _enclosing(path: str, line: int) -> tuple[int, int] | None:
    spans = [(a, b) for a, b, _ in _functions(path) if a <= line <= b]
    return max(spans) if spans else None  # the innermost: the latest start


def warnings_behind(
    frames: Sequence[str], found: Sequence[TracerWarningRecord]
) -> list[TracerWarningRecord]:
    """The TracerWarnings raised in a function on ``frames`` (``file:line``), at or before its
    line: the Python decisions the trace fixed in the code that produced the value."""
    chosen: list[TracerWarningRecord] = []
    for frame in frames:
        path, _, line_text = frame.rpartition(":")
        if not line_text.isdigit():
            continue
        span = _enclosing(path, int(line_text))
        for w in found:
            same_file = os.path.abspath(w.file) == os.path.abspath(path) or w.file == path
            if not same_file or w in chosen:
                continue
            if span is None or span[0] <= w.line <= int(line_text):
                chosen.append(w)
    return chosen


def localize_file(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    proto: onnx.ModelProto,
    *,
    trial: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    kernels: Any = None,
    opset: int = 0,
) -> Localization:
    """Pair the file's values with eager's by (module scope, model-code line) and compare them."""
    groups, producer = _groups(proto)
    recorder = _eager_values(model, args)
    flat = tuple(torch.utils._pytree.tree_leaves(args))
    feeds = {
        n: _to_ort_value(t)
        for n, t in zip(input_names(proto, flat), tensor_inputs(flat), strict=True)
    }
    wanted = [g.values[-1] for g in groups if g.key in recorder.values and g.values]
    run = SegmentedRun(_with_shapes(proto), feeds, wanted, kernels=kernels)
    found = read(proto)
    diffs: dict[int, ValueDiff] = {}
    nodes: list[NodeLocalization] = []
    for gi, group in enumerate(groups):
        eager = recorder.values.get(group.key)
        value = run.take(group.values[-1]) if eager and group.values else None
        compared = (
            _compare_last(recorder, eager, group.values[-1], value, rtol, atol, trial)
            if eager and value is not None
            else None
        )
        label = f"{group.key[0] or '(top)'} @ {_short(group.key[1])}"
        if compared is None:
            op = "(not run by eager on these inputs)" if not eager else "(no value of its shape)"
            output = _unpaired(label, group, op)
        else:
            op, output = compared
            output = diffs[gi] = dataclasses.replace(output, name=label)
        nodes.append(_node(proto, gi, group, producer, diffs, label, op, output, found))
    result = Localization("source", "torchscript", opset, trial, tuple(nodes))
    return dataclasses.replace(result, note=_note(result, found))


def _with_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with ONNX's inferred value shapes: TorchScript files state few, and a segmented
    run counts a value of unknown size as big, so it cut one segment (one session) per value."""
    if proto.ByteSize() > onnx.checker.MAXIMUM_PROTOBUF // 2:
        return proto  # a copy of a big model costs more than the sessions it saves
    try:
        return onnx.shape_inference.infer_shapes(proto)
    except Exception:  # shape inference refuses some files; the run still works without it
        return proto


def _unpaired(label: str, group: _Group, why: str) -> ValueDiff:
    name = group.values[-1] if group.values else ""
    return ValueDiff(label, name, (), "", 0.0, 0.0, 0, 0, observed=False, note=why)


def _node(
    proto: onnx.ModelProto,
    gi: int,
    group: _Group,
    producer: dict[str, int],
    diffs: dict[int, ValueDiff],
    label: str,
    op: str,
    output: ValueDiff,
    found: Sequence[TracerWarningRecord],
) -> NodeLocalization:
    """One (scope, line) group as a node of the localization: its inputs are the paired values
    of the groups whose nodes feed it."""
    graph_nodes = proto.graph.node
    feeding = sorted(
        {
            producer[i]
            for n in group.nodes
            for i in graph_nodes[n].input
            if i in producer and producer[i] != gi
        }
    )
    warned = warnings_behind(group.frames, found)
    stack = _short(group.key[1]) + "".join(
        f"; TracerWarning at {w.where}: {w.message}" for w in warned
    )
    return NodeLocalization(
        gi,
        label,
        op,
        tuple(_label(graph_nodes[n]) for n in group.nodes),
        tuple(diffs[f] for f in feeding if f in diffs),
        (output,),
        "the file's nodes from this line (TorchScript trace)",
        stack,
    )


def _note(result: Localization, found: Sequence[TracerWarningRecord]) -> str:
    notes = [
        "the file's values were paired with eager's by module scope and model-code line (the"
        " source lines the TorchScript export recorded); no re-export"
    ]
    skipped = [
        n for n in result.nodes if not n.observed and "not run by eager" in n.outputs[0].note
    ]
    if skipped:
        notes.append(
            f"{len(skipped)} line(s) the file computes were not run by eager on these inputs"
            f" (first: {skipped[0].fx_name}): the trace took another branch there"
        )
    first = result.first
    behind = [
        w for w in found if first is not None and f"TracerWarning at {w.where}" in first.stack
    ]
    if behind:
        notes.append(
            "TracerWarnings raised in the code that produced the first diverging value: "
            + "; ".join(w.describe() for w in behind)
        )
    elif found:
        notes.append("the export raised TracerWarnings: " + "; ".join(w.describe() for w in found))
    return "; ".join(notes)


def _short(frame: str) -> str:
    path, _, line = frame.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else frame


def _label(node: onnx.NodeProto) -> str:
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return f"{op}({node.name})" if node.name else op
