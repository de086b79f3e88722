"""``onnx_custom.verification.localize``: when PyTorch and ONNX disagree,
find the first node that diverges.

The PyTorch side is the ``torch.export`` program of the model, run node by node with a
``torch.fx.Interpreter``. The ONNX side depends on how the file names its values:

- ``"names"``: the dynamo exporter names ONNX values after FX nodes (``relu``, ``my_add``,
  ``getitem_1``), so the intermediates of the given ONNX model are read and compared by name.
- ``"probe"``: the TorchScript exporter names values ``/Mul_output_0``; there is no reliable
  mapping back. Instead the FX program is re-exported with the same exporter, opset and
  registry, with every intermediate as a graph output (output *i* is FX node *i*), and compared
  by position. This localizes faulty translations, not edits made to the file afterwards.
- ``"source"`` (`onnx_custom.verification.file_localize`): a TorchScript file onnx_custom
  exported records each node's model-code line; its own values are paired with eager's by
  module and line, no ``torch.export`` and no re-export. Used first when the export raised
  TracerWarnings (the trace itself may be wrong: a Python decision fixed from the example), and
  when the probe cannot be made (``torch.export`` refuses the model, or its re-export fails).

Both sides stream: the ONNX graph runs segment by segment (`onnx_custom.verification.segmented`),
the FX program frees each value after its last use, and each value is compared once, when both sides
have it; so memory stays near one forward pass and time is linear in the nodes. Parameters and
buffers are compared with the file's initializers of the same name (a file exported from other
weights is named as such); model inputs are fed to both sides.

The result records (`Localization`, `NodeLocalization`, `ValueDiff`) live in
`onnx_custom.verification.localization_report`; this module computes them.

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
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from onnx_custom.errors import OnnxCustomError
from onnx_custom.exporter import program_cache, trace_provenance
from onnx_custom.exporter.export_flag import onnx_exporting
from onnx_custom.exporter.pipeline import DEFAULT_OPSET, EXPORTERS, export_model
from onnx_custom.translate.registry import Registry, default_registry
from onnx_custom.verification.compare import compare_arrays
from onnx_custom.verification.file_localize import has_sources, localize_file
from onnx_custom.verification.localization_report import (
    INPUT_NOTE,
    PARAMETER_NOTE,
    Localization,
    NodeLocalization,
    ValueDiff,
)
from onnx_custom.verification.runner import (
    _to_ort_value,
    input_names,
    load_model,
    make_session,
    run_onnx,
    tensor_inputs,
)
from onnx_custom.verification.segmented import SegmentedRun

__all__ = [
    "Localization",
    "NodeLocalization",
    "ValueDiff",
    "localize",
]  # the records re-exported from .localization

_FX_NODE = re.compile(r"^%(?P<name>[\w.]+) :")


# -- the PyTorch side ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TorchProgram:
    module: torch.fx.GraphModule
    flat_args: tuple[Any, ...]
    exported: torch.export.ExportedProgram
    reused: bool = False  # the exporter's own program (`program_cache`), not traced here


def _trace_torch(
    model: torch.nn.Module, args: tuple[Any, ...], *, reuse: bool = True
) -> _TorchProgram:
    """The model's torch.export program: the one the dynamo exporter traced for the file when it
    is still valid (`onnx_custom.exporter.program_cache`), else a fresh trace."""
    flat_args = tuple(torch.utils._pytree.tree_leaves(args))
    remembered = program_cache.recall(model, args) if reuse else None
    if remembered is not None:
        return _TorchProgram(_module_of(remembered), flat_args, remembered, reused=True)
    try:
        with warnings.catch_warnings(), onnx_exporting():  # the branch the file was exported from
            warnings.simplefilter("ignore")
            exported = torch.export.export(model, args, strict=False)
    except Exception as exc:
        raise OnnxCustomError(
            "Localization needs a torch.export program of the model, but torch.export failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Fix: make the "
            "model exportable (register_fake for custom ops) or verify without localize."
        ) from exc
    return _TorchProgram(exported.module(), flat_args, exported)


_modules: weakref.WeakKeyDictionary[torch.export.ExportedProgram, torch.fx.GraphModule] = (
    weakref.WeakKeyDictionary()
)


def _module_of(exported: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """``exported.module()`` once per remembered program (it regenerates code each call; running
    the module through an Interpreter leaves it unchanged)."""
    module = _modules.get(exported)
    if module is None:
        module = _modules[exported] = exported.module()
    return module


def _outputs_agree(program_outputs: Any, expected: Sequence[torch.Tensor]) -> bool:
    """Does the program compute what eager computed? (A reused program whose model's code
    changed after export would not.)"""
    mine = [
        t for t in torch.utils._pytree.tree_leaves(program_outputs) if isinstance(t, torch.Tensor)
    ]
    if len(mine) != len(expected):
        return False
    return all(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.allclose(a.double(), b.detach().double(), rtol=1e-4, atol=1e-5, equal_nan=True)
        for a, b in zip(mine, expected, strict=True)
    )


def _fx_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []

    def collect(n: torch.fx.Node) -> torch.fx.Node:
        found.append(n)
        return n

    torch.fx.node.map_arg((node.args, node.kwargs), collect)
    return list(dict.fromkeys(found))


def _traced_tensor(node: torch.fx.Node) -> bool:
    """Did tracing record a tensor for this node? (Decides the outputs before anything runs.)"""
    return isinstance(node.meta.get("val"), torch.Tensor)


def _torch_op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.name()  # "aten::mul.Tensor"; the .default overload is left out
    return getattr(target, "__name__", str(target))


def _op_nodes(
    module: torch.fx.GraphModule, is_tensor: Callable[[torch.fx.Node], bool]
) -> list[tuple[torch.fx.Node, list[torch.fx.Node]]]:
    """(op node, its tensor-valued output nodes) in topological order;
    getitems fold into parents."""
    result = []
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if is_tensor(node):
            outputs = [node]
        else:
            outputs = [u for u in node.users if u.target is operator.getitem and is_tensor(u)]
            outputs.sort(key=lambda u: u.args[1])
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


def _translation_describer(
    registry: Registry, opset: int, exporter: str
) -> Callable[[torch.fx.Node], str]:
    """node -> the translation it used, memoized per op for one localization (a registry lookup
    scans its entries, and a model repeats a few ops many times; the registry is mutable,
    so nothing is kept across calls)."""
    memo: dict[object, str] = {}

    def describe(node: torch.fx.Node) -> str:
        target = node.target
        if target not in memo:
            memo[target] = _translation_of(node, registry, opset, exporter)
        return memo[target]

    return describe


def _translation_of(node: torch.fx.Node, registry: Registry, opset: int, exporter: str) -> str:
    from onnx_custom.translate.names import QualifiedName, Target

    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return "(not an op)"
    ns, _, rest = target.name().partition("::")
    op = rest.split(".")[0]
    entry = None
    with contextlib.suppress(Exception):
        entry = registry.lookup(
            Target(QualifiedName(ns, op, target._overloadname)), opset, exporter=exporter
        )
    if entry is not None:
        return entry.describe()
    builtin = (
        "torchlib (torch.onnx built-in)"
        if exporter == "dynamo"
        else "torch.onnx TorchScript symbolic (built-in)"
    )
    return f"{ns}::{op} -> {builtin}"


# -- comparing, one value at a time ------------------------------------------------------------


def _compare(
    name: str,
    onnx_name: str,
    expected: torch.Tensor,
    actual: np.ndarray | None,
    rtol: float | None,
    atol: float | None,
    note: str = "",
) -> ValueDiff:
    shape, dtype = tuple(expected.shape), str(expected.dtype).removeprefix("torch.")
    if actual is None:
        return ValueDiff(name, onnx_name, shape, dtype, 0.0, 0.0, 0, 0, observed=False, note=note)
    notes = [note] if note else []
    actual = np.asarray(actual)
    expected_np = (
        torch.empty((), dtype=expected.dtype).numpy().dtype
        if expected.dtype != torch.bfloat16
        else None
    )
    if expected_np is not None and actual.dtype != expected_np and tuple(actual.shape) == shape:
        # Intermediates may legitimately differ in dtype (e.g. int32 vs int64 indices):
        # compare values.
        notes.append(f"ONNX dtype {actual.dtype}")
        actual = actual.astype(expected_np)
    c = compare_arrays(expected, actual, name=name, trial=0, rtol=rtol, atol=atol, keep_diffs=False)
    _, separator, mismatch = c.tolerance_source.partition("; ONNX ")
    if separator:  # a shape/dtype mismatch replaces the dtype note
        notes = [*([note] if note else []), f"ONNX {mismatch}"]
    return ValueDiff(
        name,
        onnx_name,
        shape,
        dtype,
        c.max_abs_diff,
        c.max_rel_diff,
        c.mismatched,
        c.total,
        note="; ".join(notes),
    )


def _compare_parameter(
    node: torch.fx.Node,
    value: torch.Tensor,
    initializers: dict[str, onnx.TensorProto],
    rtol: float | None,
    atol: float | None,
) -> ValueDiff:
    """A parameter/buffer against the ONNX initializer of the same name, for real."""
    target = str(node.target)
    if target not in initializers:
        note = (
            f"{PARAMETER_NOTE}; the ONNX file has no initializer {target!r} to compare it with"
            " (folded or renamed by the exporter)"
        )
        return _compare(node.name, "", value, None, rtol, atol, note=note)
    array = onnx.numpy_helper.to_array(initializers[target])
    return _compare(node.name, target, value, array, rtol, atol, note=PARAMETER_NOTE)


class _StreamingComparison(torch.fx.Interpreter):
    """Runs the FX program node by node and compares every tensor value once, when it is made.

    Values are freed after their last use (the interpreter's own garbage collection) and ONNX
    values are taken from a `SegmentedRun` one at a time, so neither side holds all intermediates.
    ``onnx_name(node)`` names the ONNX value to compare with (None: not observable);
    ``keep``: FX names whose ONNX arrays the caller wants back (``kept``). Parameters are compared
    with the initializers of the model that runs, and listed in ``differing_parameters`` when the
    user's file (``file_initializers``, default: the same) holds other values.
    """

    def __init__(
        self,
        program: _TorchProgram,
        onnx_values: SegmentedRun,
        onnx_name: Callable[[torch.fx.Node], str | None],
        initializers: dict[str, onnx.TensorProto],
        rtol: float | None,
        atol: float | None,
        *,
        keep: Collection[str] = (),
        file_initializers: dict[str, onnx.TensorProto] | None = None,
    ) -> None:
        super().__init__(program.module, garbage_collect_values=True)
        self._program, self._onnx_values, self._onnx_name = program, onnx_values, onnx_name
        self._initializers, self._rtol, self._atol, self._keep = initializers, rtol, atol, set(keep)
        self._file_initializers = initializers if file_initializers is None else file_initializers
        self.diffs: dict[str, ValueDiff] = {}
        self.kept: dict[str, np.ndarray] = {}
        self.differing_parameters: list[ValueDiff] = []  # against the user's file
        self.outputs: Any = None  # what the program returned

    def compare_all(self) -> _StreamingComparison:
        with torch.no_grad():
            self.outputs = self.run(*self._program.flat_args)
        return self

    def is_tensor(self, node: torch.fx.Node) -> bool:
        return node.name in self.diffs

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if isinstance(value, torch.Tensor):
            self.diffs[n.name] = self._diff(n, value)
        return value

    def _diff(self, node: torch.fx.Node, value: torch.Tensor) -> ValueDiff:
        if node.op == "placeholder":
            return ValueDiff(
                node.name,
                node.name,
                tuple(value.shape),
                str(value.dtype).removeprefix("torch."),
                0.0,
                0.0,
                0,
                0,
                note=INPUT_NOTE,
            )
        if node.op == "get_attr":
            diff = _compare_parameter(node, value, self._initializers, self._rtol, self._atol)
            in_file = (
                diff
                if self._file_initializers is self._initializers
                else _compare_parameter(
                    node, value, self._file_initializers, self._rtol, self._atol
                )
            )
            if in_file.observed and not in_file.passed:
                self.differing_parameters.append(in_file)
            return diff
        onnx_name = self._onnx_name(node)
        actual = self._onnx_values.take(onnx_name) if onnx_name else None
        if actual is not None and node.name in self._keep:
            self.kept[node.name] = actual
        return _compare(node.name, onnx_name or "", value, actual, self._rtol, self._atol)


def _onnx_feeds(proto: onnx.ModelProto, flat_args: tuple[Any, ...]) -> dict[str, Any]:
    """The graph inputs as OrtValues (bfloat16-safe), fed by position like ``run_onnx``."""
    return {
        n: _to_ort_value(t)
        for n, t in zip(input_names(proto, flat_args), tensor_inputs(flat_args), strict=True)
    }


# -- the ONNX side ---------------------------------------------------------------------------


def _label(node: onnx.NodeProto) -> str:
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return f"{op}({node.name})" if node.name else op


class _Cones:
    """ONNX nodes per torch op: walking up from its output values, stopping at its input values.

    Torch ops are visited in topological order and every ONNX node is claimed by the first op
    whose walk reaches it, so all walks together visit each node and edge once: O(nodes + edges).
    """

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._nodes = list(graph.node)
        self._index = {id(n): i for i, n in enumerate(self._nodes)}
        self._producer = {
            out: i for i, node in enumerate(self._nodes) for out in node.output if out
        }
        self._claimed: set[int] = set()

    def mark(self, nodes: list[onnx.NodeProto]) -> tuple[str, ...]:
        """Nodes known to belong to one torch op (the dynamo exporter's metadata): claim them."""
        self._claimed.update(self._index[id(n)] for n in nodes)
        return tuple(_label(n) for n in nodes if n.op_type != "Constant")

    def claim(self, outputs: list[str], inputs: list[str]) -> tuple[str, ...]:
        stop = set(inputs)
        found: list[int] = []
        stack = [self._producer[o] for o in outputs if o in self._producer and o not in stop]
        while stack:
            i = stack.pop()
            if i in self._claimed:
                continue
            self._claimed.add(i)
            found.append(i)
            stack.extend(
                self._producer[n]
                for n in self._nodes[i].input
                if n in self._producer and n not in stop
            )
        return tuple(
            _label(self._nodes[i]) for i in sorted(found) if self._nodes[i].op_type != "Constant"
        )


def _nodes_by_fx_name(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.fx_node":
                match = _FX_NODE.match(prop.value)
                if match:
                    found.setdefault(match["name"], []).append(node)
    return found


def _run(
    proto: onnx.ModelProto, flat_args: tuple[Any, ...], kernels: Any = None
) -> dict[str, np.ndarray]:
    session = make_session(proto, kernels)
    values = run_onnx(session, proto, flat_args)
    return {o.name: v for o, v in zip(proto.graph.output, values, strict=True)}


def _graph_value_names(graph: onnx.GraphProto) -> set[str]:
    return {out for node in graph.node for out in node.output if out} | {
        i.name for i in graph.input
    }


def _initializers(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {i.name: i for i in proto.graph.initializer}


def _parameter_warning(differing: list[ValueDiff]) -> str:
    """One line naming model parameters whose same-named ONNX initializer holds other values."""
    if not differing:
        return ""
    shown = ", ".join(f"{d.onnx_name} (max_abs={d.max_abs_diff:.3g})" for d in differing[:3])
    more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
    return (
        f"WARNING: the file's initializers differ from the model's parameters: {shown}{more}; was"
        " the file exported from this model's weights (same seed, same checkpoint)?"
    )


def _localize_by_names(
    program: _TorchProgram,
    proto: onnx.ModelProto,
    registry: Registry,
    opset: int,
    rtol: float | None,
    atol: float | None,
    trial: int,
    kernels: Any = None,
) -> tuple[Localization, Any]:
    graph = proto.graph
    available = _graph_value_names(graph)
    initializers = _initializers(proto)
    produced = {out for node in graph.node for out in node.output if out} - set(initializers)
    wanted = [
        n.name for n in program.module.graph.nodes if n.op == "call_function" and n.name in produced
    ]
    onnx_values = SegmentedRun(
        proto, _onnx_feeds(proto, program.flat_args), wanted, kernels=kernels
    )
    observed = set(wanted)
    result = _StreamingComparison(
        program,
        onnx_values,
        lambda n: n.name if n.name in observed else None,
        initializers,
        rtol,
        atol,
    ).compare_all()
    by_fx = _nodes_by_fx_name(graph)
    cones = _Cones(graph)
    ops = _op_nodes(program.module, result.is_tensor)
    annotated = {node.name: cones.mark(by_fx[node.name]) for node, _ in ops if node.name in by_fx}
    nodes = []
    translation = _translation_describer(registry, opset, "dynamo")
    for index, (node, outs) in enumerate(ops):
        inputs = tuple(result.diffs[i.name] for i in _fx_inputs(node) if result.is_tensor(i))
        outputs = tuple(result.diffs[o.name] for o in outs)
        onnx_nodes = annotated.get(node.name) or cones.claim(
            [o.name for o in outs if o.name in available], [i.name for i in _fx_inputs(node)]
        )
        nodes.append(
            NodeLocalization(
                index,
                node.name,
                _torch_op_name(node),
                onnx_nodes,
                inputs,
                outputs,
                translation(node),
                _source_of(node),
            )
        )
    return (
        Localization(
            "names",
            "dynamo",
            opset,
            trial,
            tuple(nodes),
            note=_parameter_warning(result.differing_parameters),
        ),
        result.outputs,
    )


def _probe_module(program: _TorchProgram, outs: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """A copy of the FX program that returns every listed intermediate (plain, flat I/O)."""
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in program.module.graph.nodes:
        if node.op == "output":
            continue
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            continue  # torch.export's guard check; nothing to export
        mapping[node] = graph.node_copy(node, lambda n: mapping[n])
    graph.output(tuple(mapping[o] for o in outs))
    return torch.fx.GraphModule(program.module, graph)


def _final_nodes(program: _TorchProgram) -> list[torch.fx.Node]:
    output_node = next(n for n in program.module.graph.nodes if n.op == "output")
    return [
        n for n in torch.utils._pytree.tree_leaves(output_node.args) if isinstance(n, torch.fx.Node)
    ]


def _file_vs_probe(
    program: _TorchProgram,
    file: onnx.ModelProto,
    probe_finals: dict[str, np.ndarray],
    kernels: Any = None,
    file_outputs: Sequence[np.ndarray] | None = None,
) -> str:
    """Does the given file compute what the re-export computes? (If not, the probe proves little.)
    ``file_outputs``: the file's outputs on these inputs when the caller (verify) has them."""
    finals = _final_nodes(program)
    if len(finals) != len(file.graph.output) or any(n.name not in probe_finals for n in finals):
        return ""
    if file_outputs is not None and len(file_outputs) == len(finals):
        from_file = [np.asarray(v) for v in file_outputs]
    else:
        try:
            from_file = list(_run(file, program.flat_args, kernels).values())
        except Exception as exc:
            return f"the given file could not be run for comparison ({type(exc).__name__})"
    for node, value in zip(finals, from_file, strict=True):
        probe = probe_finals[node.name]
        if probe.shape != value.shape or not np.allclose(
            probe, value, rtol=1e-4, atol=1e-5, equal_nan=True
        ):
            return (
                f"WARNING: the given file's output for {node.name} differs from this re-export's:"
                " the file was made with another registry/variant/opset or edited, so these"
                " per-node results describe the re-export, not the file"
            )
    return "the given file's outputs equal the re-export's"


def _localize_by_probe(
    program: _TorchProgram,
    exporter: str,
    registry: Registry,
    opset: int,
    rtol: float | None,
    atol: float | None,
    trial: int,
    file: onnx.ModelProto | None = None,
    kernels: Any = None,
    file_outputs: Sequence[np.ndarray] | None = None,
) -> tuple[Localization, Any]:
    outs = [o for _, node_outs in _op_nodes(program.module, _traced_tensor) for o in node_outs]
    if not outs:
        return (
            Localization(
                "probe", exporter, opset, trial, (), note="the program has no intermediate tensors"
            ),
            None,
        )
    probe = _probe_module(program, outs)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            proto = export_model(
                probe, program.flat_args, exporter=exporter, opset=opset, registry=registry
            )
        except Exception as exc:
            raise OnnxCustomError(
                "Localization re-exports the program with every intermediate as an output, and"
                f" that export ({exporter}, opset {opset}) failed: {type(exc).__name__}: {exc}"
            ) from exc
    if len(proto.graph.output) != len(outs):
        raise OnnxCustomError(
            f"The probe export has {len(proto.graph.output)} outputs, expected {len(outs)}."
        )
    by_name = {o.name: proto.graph.output[i].name for i, o in enumerate(outs)}
    onnx_values = SegmentedRun(
        proto, _onnx_feeds(proto, program.flat_args), by_name.values(), kernels=kernels
    )
    finals = {n.name for n in _final_nodes(program)}
    file_initializers = _initializers(file) if file is not None else None
    result = _StreamingComparison(
        program,
        onnx_values,
        lambda n: by_name.get(n.name),
        _initializers(proto),
        rtol,
        atol,
        keep=finals,
        file_initializers=file_initializers,
    ).compare_all()
    graph_inputs = [i.name for i in proto.graph.input]
    cones = _Cones(proto.graph)
    nodes = []
    translation = _translation_describer(registry, opset, exporter)
    for index, (node, node_outs) in enumerate(_op_nodes(program.module, result.is_tensor)):
        fx_inputs = [i for i in _fx_inputs(node) if result.is_tensor(i)]
        inputs = tuple(result.diffs[i.name] for i in fx_inputs)
        outputs = tuple(result.diffs[o.name] for o in node_outs)
        input_values = [by_name[i.name] for i in fx_inputs if i.name in by_name] + graph_inputs
        onnx_nodes = cones.claim(
            [by_name[o.name] for o in node_outs if o.name in by_name], input_values
        )
        nodes.append(
            NodeLocalization(
                index,
                node.name,
                _torch_op_name(node),
                onnx_nodes,
                inputs,
                outputs,
                translation(node),
                _source_of(node),
            )
        )
    notes = [
        f"the {exporter} exporter's value names do not map to torch ops, so the program was"
        " re-exported with every intermediate as an output (same exporter, opset and registry)"
    ]
    if file is not None:
        notes += [
            _file_vs_probe(program, file, result.kept, kernels, file_outputs),
            _parameter_warning(result.differing_parameters),
        ]
    return (
        Localization(
            "probe", exporter, opset, trial, tuple(nodes), note="; ".join(n for n in notes if n)
        ),
        result.outputs,
    )


def _named_after(program: _TorchProgram, proto: onnx.ModelProto) -> bool:
    """Does the file name its values after the program's FX nodes (a dynamo export of it)?"""
    fx_names = {o.name for _, outs in _op_nodes(program.module, _traced_tensor) for o in outs}
    return bool(fx_names) and len(fx_names & _graph_value_names(proto.graph)) >= max(
        1, len(fx_names) // 4
    )


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
    eager_outputs: Sequence[torch.Tensor] | None = None,
    file_outputs: Sequence[np.ndarray] | None = None,
) -> Localization:
    """Compare every intermediate value of ``model(*args)`` with the ONNX side, node by node.

    With an ``onnx_model`` whose value names follow FX node names (the dynamo exporter), its own
    intermediates are compared. Otherwise (TorchScript files, or no file) the program is
    re-exported with ``exporter`` (default: ``"torchscript"`` when a file was given, else
    ``"dynamo"``) at ``opset`` (default: the file's) with ``registry`` and compared by position.
    A TorchScript file with its nodes' source lines (our exports) is localized from the file
    itself (method ``"source"``) when its export raised TracerWarnings, or when ``torch.export``
    or the re-export fails.

    The torch side is the program the dynamo exporter traced when the file was exported in this
    process from this very model and inputs (`onnx_custom.exporter.program_cache`), else a fresh
    ``torch.export``. ``eager_outputs`` / ``file_outputs``: ``model(*args)``'s flattened outputs and
    the file's ONNX Runtime outputs on ``args`` when the caller already has them (verify does): the
    first checks that a reused program still computes what eager does (else it is traced again),
    the second spares the probe method a run of the file.
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            "localize needs a torch.nn.Module (torch.export traces it), got"
            f" {type(model).__name__}."
        )
    if exporter is not None and exporter not in EXPORTERS:
        raise OnnxCustomError(f"exporter must be one of {EXPORTERS}, got {exporter!r}.")
    proto = load_model(onnx_model) if onnx_model is not None else None
    reg = registry if registry is not None else default_registry()
    opset = opset if opset is not None else _default_opset(proto)

    def run(program: _TorchProgram) -> tuple[Localization, Any]:
        if proto is not None and exporter in (None, "dynamo") and _named_after(program, proto):
            return _localize_by_names(program, proto, reg, opset, rtol, atol, trial, kernels)
        chosen = exporter or ("torchscript" if proto is not None else "dynamo")
        return _localize_by_probe(
            program, chosen, reg, opset, rtol, atol, trial, proto, kernels, file_outputs
        )

    from_file = proto is not None and exporter in (None, "torchscript") and has_sources(proto)

    def the_file_itself() -> Localization:
        assert proto is not None
        return localize_file(
            model, args, proto, trial=trial, rtol=rtol, atol=atol, kernels=kernels, opset=opset
        )

    if from_file and trace_provenance.read(proto):  # type: ignore[arg-type]
        # the trace fixed Python decisions made from data: what went wrong may be in the trace
        # itself, which neither a torch.export program nor its re-export shows; the file does
        return the_file_itself()
    try:
        program = _trace_torch(model, args)
        result, outputs = run(program)
    except OnnxCustomError:
        if not from_file:
            raise
        return the_file_itself()  # torch.export or the re-export failed: the file still runs
    if program.reused:
        if eager_outputs is None:
            with torch.no_grad():
                eager_outputs = [
                    t
                    for t in torch.utils._pytree.tree_leaves(model(*args))
                    if isinstance(t, torch.Tensor)
                ]
        if not _outputs_agree(
            outputs, eager_outputs
        ):  # the model changed since export: trace it now
            result, _ = run(_trace_torch(model, args, reuse=False))
    return result
