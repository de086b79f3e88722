"""``onnx_custom.localize``: when PyTorch and ONNX disagree, find the first node that diverges.

The PyTorch side is the ``torch.export`` program of the model, run node by node with an
``torch.fx.Interpreter`` that keeps every intermediate value. The ONNX side depends on how the
file names its values:

- ``"names"``: the dynamo exporter names ONNX values after FX nodes (``relu``, ``my_add``,
  ``getitem_1``), so the intermediates of the given ONNX model are exposed as extra graph
  outputs and compared by name.
- ``"probe"``: the TorchScript exporter names values ``/Mul_output_0``; there is no reliable
  mapping back. Instead the FX program is re-exported with the same exporter, opset and
  registry, with every intermediate as a graph output (output *i* is FX node *i*), and compared
  by position. This localizes faulty translations, not edits made to the file afterwards.

Nodes are reported in topological order; a node is an *origin* when its output diverges while
all its observed inputs still agree (the translation of that node is the suspect).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import operator
import os
import re
import warnings
from typing import Any

import numpy as np
import onnx
import torch

from onnx_custom._exporters import DEFAULT_OPSET, EXPORTERS, export_model
from onnx_custom.compare import compare_arrays
from onnx_custom.errors import OnnxCustomError
from onnx_custom.registry import Registry, default_registry
from onnx_custom.runner import load_model, make_session, run_onnx

__all__ = ["Localization", "NodeLocalization", "ValueDiff", "localize"]

_FED = "model input/parameter"
_FX_NODE = re.compile(r"^%(?P<name>[\w.]+) :")


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
        if self.total == 0 and self.note == _FED:
            return f"{self.name}: {_FED} (same values on both sides)"
        state = "ok" if self.passed else f"DIFF {self.mismatched}/{self.total}"
        extra = f"; {self.note}" if self.note else ""
        return (
            f"{self.name} -> {self.onnx_name} {list(self.shape)} {self.dtype}: max_abs={self.max_abs_diff:.3g} "
            f"max_rel={self.max_rel_diff:.3g} [{state}{extra}]"
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
        lines = [f"#{self.index} {self.fx_name} = {self.torch_op}" + (f"   ({self.stack})" if self.stack else "")]
        lines.append(f"    ONNX node(s): {', '.join(self.onnx_nodes) or '(none found)'}")
        lines.append(f"    translation: {self.translation}")
        lines += [f"    input  {v.describe()}" for v in self.inputs]
        lines += [f"    output {v.describe()}" for v in self.outputs]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"diverges": self.diverges, "origin": self.origin}


@dataclasses.dataclass(frozen=True)
class Localization:
    """Per-node comparison of one trial; ``first`` is the first diverging node (an origin if any)."""

    method: str  # "names" or "probe"
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
        if first is None and self.method == "probe":
            return (
                f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial {self.trial}): "
                f"all {observed} observed intermediate node(s) of the re-export agree. If the file "
                "still mismatches, it was not made by this exporter/opset/registry (another variant "
                "or registry?), was edited after export, or the fault is in an autograd.Function "
                "translation (inlined by torch.export, so not re-exported)."
            )
        if first is None:
            return (
                f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial {self.trial}): "
                f"all {observed} observed intermediate node(s) agree. If the outputs still mismatch, "
                "the divergence is in a part this comparison cannot observe (nodes fused away, the "
                "translation of an autograd.Function, or edits made to the file after export)."
            )
        worst = max((o for o in first.outputs if o.observed), key=lambda o: o.max_abs_diff)
        return (
            f"First diverging node: #{first.index} {first.fx_name} = {first.torch_op} -> ONNX "
            f"{', '.join(first.onnx_nodes) or '(none found)'}; output max_abs={worst.max_abs_diff:.3g} "
            f"max_rel={worst.max_rel_diff:.3g}; translation: {first.translation}"
        )

    def __str__(self) -> str:
        observed = sum(n.observed for n in self.nodes)
        lines = [
            f"Localization ({self.method}, {self.exporter}, opset {self.opset}, trial {self.trial}): "
            f"{observed}/{len(self.nodes)} torch node(s) observed in ONNX, "
            f"{len(self.diverging)} diverge, {len(self.origins)} origin(s)",
            self.summary(),
        ]
        if self.note:
            lines.append(f"note: {self.note}")
        shown = [n for n in self.nodes if n.diverges][:5]
        if shown:
            lines.append("Diverging nodes in topological order (origins first are the suspects):")
            lines += [("[ORIGIN] " if n.origin else "") + n.describe() for n in shown]
            if len(self.diverging) > len(shown):
                lines.append(f"... and {len(self.diverging) - len(shown)} more diverging node(s) downstream")
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


# -- the PyTorch side ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TorchTrace:
    module: torch.fx.GraphModule
    values: dict[str, Any]
    flat_args: tuple[Any, ...]
    exported: torch.export.ExportedProgram


def _trace_torch(model: torch.nn.Module, args: tuple[Any, ...]) -> _TorchTrace:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(model, args, strict=False)
    except Exception as exc:
        raise OnnxCustomError(
            f"Localization needs a torch.export program of the model, but torch.export failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Fix: make the "
            "model exportable (register_fake for custom ops) or verify without localize."
        ) from exc
    module = exported.module()
    flat_args = tuple(torch.utils._pytree.tree_leaves(args))
    interpreter = torch.fx.Interpreter(module, garbage_collect_values=False)
    with torch.no_grad():
        interpreter.run(*flat_args)
    return _TorchTrace(module, {n.name: v for n, v in interpreter.env.items()}, flat_args, exported)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _fx_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []

    def collect(n: torch.fx.Node) -> torch.fx.Node:
        found.append(n)
        return n

    torch.fx.node.map_arg((node.args, node.kwargs), collect)
    return list(dict.fromkeys(found))


def _fed(name: str, expected: torch.Tensor) -> ValueDiff:
    """A model input/parameter/buffer: both sides get the same values."""
    return ValueDiff(name, name, tuple(expected.shape), str(expected.dtype).removeprefix("torch."), 0.0, 0.0, 0, 0, note=_FED)


def _expected(trace: _TorchTrace, node: torch.fx.Node) -> torch.Tensor:
    value = trace.values[node.name]
    if not isinstance(value, torch.Tensor):  # callers pass tensor-valued nodes only
        raise OnnxCustomError(f"FX node {node.name} holds a {type(value).__name__}, not a tensor.")
    return value


def _torch_op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.name()  # "aten::mul.Tensor"; the .default overload is left out
    return getattr(target, "__name__", str(target))


def _op_nodes(trace: _TorchTrace) -> list[tuple[torch.fx.Node, list[torch.fx.Node]]]:
    """(op node, its tensor-valued output nodes) in topological order; getitems fold into parents."""
    result = []
    for node in trace.module.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        value = trace.values.get(node.name)
        if _is_tensor(value):
            outputs = [node]
        elif isinstance(value, (tuple, list)):
            outputs = [u for u in node.users if u.target is operator.getitem and _is_tensor(trace.values.get(u.name))]
            outputs.sort(key=lambda u: u.args[1])
        else:
            continue
        if outputs:
            result.append((node, outputs))
    return result


def _source_of(node: torch.fx.Node) -> str:
    stack = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in stack.strip().splitlines() if line.strip()]
    files = [line for line in lines if line.startswith("File ")]
    if not files:
        return ""
    match = re.match(r'File "(?P<file>[^"]+)", line (?P<line>\d+)', files[-1])
    code = lines[-1] if not lines[-1].startswith("File ") else ""
    where = f"{match['file'].rsplit('/', 1)[-1]}:{match['line']}" if match else files[-1]
    return f"{where}: {code}" if code else where


def _translation_of(node: torch.fx.Node, registry: Registry, opset: int, exporter: str) -> str:
    from onnx_custom.names import QualifiedName, Target

    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return "(not an op)"
    ns, _, rest = target.name().partition("::")
    op = rest.split(".")[0]
    entry = None
    with contextlib.suppress(Exception):
        entry = registry.lookup(Target(QualifiedName(ns, op, target._overloadname)), opset, exporter=exporter)
    if entry is not None:
        return entry.describe()
    builtin = "torchlib (torch.onnx built-in)" if exporter == "dynamo" else "torch.onnx TorchScript symbolic (built-in)"
    return f"{ns}::{op} -> {builtin}"


# -- the ONNX side ---------------------------------------------------------------------------


def _compare(name: str, onnx_name: str, expected: torch.Tensor, actual: np.ndarray | None, rtol: float | None, atol: float | None) -> ValueDiff:
    shape, dtype = tuple(expected.shape), str(expected.dtype).removeprefix("torch.")
    if actual is None:
        return ValueDiff(name, onnx_name, shape, dtype, 0.0, 0.0, 0, 0, observed=False)
    note = ""
    actual = np.asarray(actual)
    expected_np = torch.empty((), dtype=expected.dtype).numpy().dtype if expected.dtype != torch.bfloat16 else None
    if expected_np is not None and actual.dtype != expected_np and tuple(actual.shape) == shape:
        # Intermediates may legitimately differ in dtype (e.g. int32 vs int64 indices): compare values.
        note = f"ONNX dtype {actual.dtype}"
        actual = actual.astype(expected_np)
    c = compare_arrays(expected, actual, name=name, trial=0, rtol=rtol, atol=atol)
    if c.tolerance_source.count("; ONNX "):
        note = c.tolerance_source.split("; ", 1)[1]
    return ValueDiff(name, onnx_name, shape, dtype, c.max_abs_diff, c.max_rel_diff, c.mismatched, c.total, note=note)


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output if out}


def _ancestors(names: list[str], producers: dict[str, onnx.NodeProto]) -> set[int]:
    seen: set[int] = set()
    stack = [producers[n] for n in names if n in producers]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(producers[i] for i in node.input if i in producers)
    return seen


def _label(node: onnx.NodeProto) -> str:
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return f"{op}({node.name})" if node.name else op


def _cone(graph: onnx.GraphProto, outputs: list[str], inputs: list[str]) -> tuple[str, ...]:
    """ONNX nodes between a torch node's input values and its output values (Constants dropped)."""
    producers = _producers(graph)
    inside = _ancestors(outputs, producers) - _ancestors(inputs, producers)
    return tuple(_label(n) for n in graph.node if id(n) in inside and n.op_type != "Constant")


def _nodes_by_fx_name(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.fx_node":
                match = _FX_NODE.match(prop.value)
                if match:
                    found.setdefault(match["name"], []).append(node)
    return found


def _with_outputs(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    extended = onnx.ModelProto()
    extended.CopyFrom(proto)
    graph = extended.graph
    typed = {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
    existing = {o.name for o in graph.output}
    for name in names:
        if name in existing:
            continue
        info = onnx.ValueInfoProto()
        if name in typed:
            info.CopyFrom(typed[name])
        else:
            info.name = name  # ORT accepts untyped graph outputs
        graph.output.append(info)
    return extended


def _run(proto: onnx.ModelProto, flat_args: tuple[Any, ...], kernels: Any = None) -> dict[str, np.ndarray]:
    session = make_session(proto, kernels)
    values = run_onnx(session, proto, flat_args)
    return {o.name: v for o, v in zip(proto.graph.output, values, strict=True)}


def _graph_value_names(graph: onnx.GraphProto) -> set[str]:
    return {out for node in graph.node for out in node.output if out} | {i.name for i in graph.input}


def _placeholder_names(module: torch.fx.GraphModule) -> set[str]:
    return {n.name for n in module.graph.nodes if n.op in ("placeholder", "get_attr")}


def _localize_by_names(trace: _TorchTrace, proto: onnx.ModelProto, registry: Registry, opset: int, rtol: float | None, atol: float | None, trial: int, kernels: Any = None) -> Localization:
    ops = _op_nodes(trace)
    graph = proto.graph
    available = _graph_value_names(graph)
    initializers = {i.name for i in graph.initializer}
    wanted = [o.name for _, outs in ops for o in outs if o.name in available and o.name not in initializers]
    values = _run(_with_outputs(proto, wanted), trace.flat_args, kernels)
    by_fx = _nodes_by_fx_name(graph)
    placeholders = _placeholder_names(trace.module)

    def diff(fx: torch.fx.Node) -> ValueDiff:
        expected = _expected(trace, fx)
        if fx.name in placeholders:
            return _fed(fx.name, expected)
        return _compare(fx.name, fx.name, expected, values.get(fx.name), rtol, atol)

    nodes = []
    for index, (node, outs) in enumerate(ops):
        inputs = tuple(diff(i) for i in _fx_inputs(node) if _is_tensor(trace.values.get(i.name)))
        outputs = tuple(diff(o) for o in outs)
        onnx_nodes = tuple(_label(n) for n in by_fx.get(node.name, []) if n.op_type != "Constant")
        if not onnx_nodes:
            onnx_nodes = _cone(graph, [o.name for o in outs if o.name in available], [i.name for i in _fx_inputs(node)])
        nodes.append(NodeLocalization(index, node.name, _torch_op_name(node), onnx_nodes, inputs, outputs, _translation_of(node, registry, opset, "dynamo"), _source_of(node)))
    return Localization("names", "dynamo", opset, trial, tuple(nodes))


def _probe_module(trace: _TorchTrace, outs: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """A copy of the FX program that returns every listed intermediate (plain, flat I/O)."""
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in trace.module.graph.nodes:
        if node.op == "output":
            continue
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            continue  # torch.export's guard check; nothing to export
        mapping[node] = graph.node_copy(node, lambda n: mapping[n])
    graph.output(tuple(mapping[o] for o in outs))
    return torch.fx.GraphModule(trace.module, graph)


def _file_vs_probe(trace: _TorchTrace, file: onnx.ModelProto, arrays: dict[str, np.ndarray], by_name: dict[str, str], kernels: Any = None) -> str:
    """Does the given file compute what the re-export computes? (If not, the probe proves little.)"""
    output_node = next(n for n in trace.module.graph.nodes if n.op == "output")
    finals = [n for n in torch.utils._pytree.tree_leaves(output_node.args) if isinstance(n, torch.fx.Node)]
    if len(finals) != len(file.graph.output) or any(n.name not in by_name for n in finals):
        return ""
    try:
        from_file = list(_run(file, trace.flat_args, kernels).values())
    except Exception as exc:
        return f"the given file could not be run for comparison ({type(exc).__name__})"
    for node, value in zip(finals, from_file, strict=True):
        probe = arrays[by_name[node.name]]
        if probe.shape != value.shape or not np.allclose(probe, value, rtol=1e-4, atol=1e-5, equal_nan=True):
            return (
                f"WARNING: the given file's output for {node.name} differs from this re-export's: the file "
                "was made with another registry/variant/opset or edited, so these per-node results "
                "describe the re-export, not the file"
            )
    return "the given file's outputs equal the re-export's"


def _localize_by_probe(trace: _TorchTrace, exporter: str, registry: Registry, opset: int, rtol: float | None, atol: float | None, trial: int, file: onnx.ModelProto | None = None, kernels: Any = None) -> Localization:
    ops = _op_nodes(trace)
    outs = [o for _, node_outs in ops for o in node_outs]
    if not outs:
        return Localization("probe", exporter, opset, trial, (), note="the program has no intermediate tensors")
    probe = _probe_module(trace, outs)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            proto = export_model(probe, trace.flat_args, exporter=exporter, opset=opset, registry=registry)
        except Exception as exc:
            raise OnnxCustomError(
                f"Localization re-exports the program with every intermediate as an output, and that "
                f"export ({exporter}, opset {opset}) failed: {type(exc).__name__}: {exc}"
            ) from exc
    if len(proto.graph.output) != len(outs):
        raise OnnxCustomError(f"The probe export has {len(proto.graph.output)} outputs, expected {len(outs)}.")
    arrays = _run(proto, trace.flat_args, kernels)
    by_name = {o.name: proto.graph.output[i].name for i, o in enumerate(outs)}
    placeholders = _placeholder_names(trace.module)

    def diff(fx: torch.fx.Node) -> ValueDiff:
        expected = _expected(trace, fx)
        if fx.name in placeholders:
            return _fed(fx.name, expected)
        onnx_name = by_name.get(fx.name)
        return _compare(fx.name, onnx_name or "", expected, arrays.get(onnx_name) if onnx_name else None, rtol, atol)

    graph_inputs = [i.name for i in proto.graph.input]
    nodes = []
    for index, (node, node_outs) in enumerate(ops):
        fx_inputs = [i for i in _fx_inputs(node) if _is_tensor(trace.values.get(i.name))]
        inputs = tuple(diff(i) for i in fx_inputs)
        outputs = tuple(diff(o) for o in node_outs)
        input_values = [by_name[i.name] for i in fx_inputs if i.name in by_name] + graph_inputs
        onnx_nodes = _cone(proto.graph, [by_name[o.name] for o in node_outs], input_values)
        nodes.append(NodeLocalization(index, node.name, _torch_op_name(node), onnx_nodes, inputs, outputs, _translation_of(node, registry, opset, exporter), _source_of(node)))
    note = (
        f"the {exporter} exporter's value names do not map to torch ops, so the program was re-exported "
        "with every intermediate as an output (same exporter, opset and registry)"
    )
    if file is not None:
        agreement = _file_vs_probe(trace, file, arrays, by_name, kernels)
        note += f"; {agreement}" if agreement else ""
    return Localization("probe", exporter, opset, trial, tuple(nodes), note=note)


def _default_opset(proto: onnx.ModelProto | None) -> int:
    if proto is not None:
        for entry in proto.opset_import:
            if entry.domain in ("", "ai.onnx"):
                return int(entry.version)
    return DEFAULT_OPSET


def localize(
    model: torch.nn.Module,
    args: tuple[Any, ...] | torch.Tensor,
    onnx_model: onnx.ModelProto | str | os.PathLike[str] | bytes | None = None,
    *,
    exporter: str | None = None,
    opset: int | None = None,
    registry: Registry | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    trial: int = 0,
    kernels: Any = None,
) -> Localization:
    """Compare every intermediate value of ``model(*args)`` with the ONNX side, node by node.

    With an ``onnx_model`` whose value names follow FX node names (the dynamo exporter), its own
    intermediates are compared. Otherwise (TorchScript files, or no file) the program is
    re-exported with ``exporter`` (default: ``"torchscript"`` when a file was given, else
    ``"dynamo"``) at ``opset`` (default: the file's) with ``registry`` and compared by position.
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"localize needs a torch.nn.Module (torch.export traces it), got {type(model).__name__}.")
    if exporter is not None and exporter not in EXPORTERS:
        raise OnnxCustomError(f"exporter must be one of {EXPORTERS}, got {exporter!r}.")
    proto = load_model(onnx_model) if onnx_model is not None else None
    reg = registry if registry is not None else default_registry()
    opset = opset if opset is not None else _default_opset(proto)
    trace = _trace_torch(model, args)
    if proto is not None and exporter in (None, "dynamo"):
        fx_names = {o.name for _, outs in _op_nodes(trace) for o in outs}
        if fx_names and len(fx_names & _graph_value_names(proto.graph)) >= max(1, len(fx_names) // 4):
            return _localize_by_names(trace, proto, reg, opset, rtol, atol, trial, kernels)
    chosen = exporter or ("torchscript" if proto is not None else "dynamo")
    return _localize_by_probe(trace, chosen, reg, opset, rtol, atol, trial, proto, kernels)

