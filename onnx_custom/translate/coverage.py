"""Which ops of a model have no translation, found in one pass (not one failure per export)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import torch

from onnx_custom.common.torch_onnx import dynamo_exporter, torchscript_exporter
from onnx_custom.translate.names import QualifiedName, Target
from onnx_custom.translate.registry import Registry, resolve_registry

__all__ = [
    "MissingOp",
    "format_missing",
    "missing_fix",
    "missing_ops_dynamo",
    "missing_ops_torchscript",
]


@dataclasses.dataclass(frozen=True)
class MissingOp:
    """An op with no translation at the requested opset (``available``: opsets that have one)."""

    name: str
    count: int
    available: tuple[int, ...] = ()

    def describe(self) -> str:
        where = (
            f"translations exist from opset {list(self.available)}"
            if self.available
            else "no translation registered"
        )
        return f"{self.name} (x{self.count}): {where}"


def missing_fix(missing: list[MissingOp], opset: int) -> str:
    """The fix for ops without a translation, naming the first one as the user would write it."""
    name = missing[0].name.removesuffix(".default") if missing else "<ns>::<op>"
    custom = next((m.name for m in missing if not m.name.startswith("aten::")), None)
    node = ""
    if custom is not None:  # a user op can also stay opaque: a custom node their own code runs
        ns, _, op = custom.removesuffix(".default").partition("::")
        node = (
            " For code ONNX cannot express (numpy, C++), the translation can emit a custom node, "
            f"g.op('{ns}::{op.split('.')[0]}', ...), run by your kernel: @onnx_custom.kernel "
            "(Python) or a spec's native: (C++), see the docs' kernel and op-spec how-tos."
        )
    other = ", or pick an opset listed above" if any(m.available for m in missing) else ""
    return (
        f"Fix: register a translation, e.g. @onnx_custom.symbolic('{name}',"
        f" opset={opset}){other}.{node}"
    )


def format_missing(missing: list[MissingOp], exporter: str, opset: int) -> str:
    lines = [
        f"{len(missing)} op(s) cannot be exported with the {exporter} exporter at opset {opset}:"
    ]
    lines += [f"  - {m.describe()}" for m in missing]
    lines.append(missing_fix(missing, opset))
    return "\n".join(lines)


@functools.lru_cache(maxsize=8)
def _torchlib_supported(opset: int) -> frozenset[Any]:
    _decomp = dynamo_exporter("_decomp")
    _registration = dynamo_exporter("_registration")

    registry = _registration.ONNXRegistry.from_torchlib(opset)
    supported = set(_decomp.get_onnx_implemented_overloads(registry))
    decomposable = set(_decomp.create_onnx_friendly_decomposition_table(supported))
    return frozenset(supported | decomposable)


# Assertion nodes the exporter erases before translating (torch's remove_assertion_nodes).
_ERASED = {
    "_assert_async",
    "_assert_scalar",
    "_assert_tensor_metadata",
    "sym_constrain_range_for_size",
}


def _lowered_by_exporter(op: torch._ops.OpOverload) -> bool:
    """The exporter decomposes CompositeImplicitAutograd ops
    (``aten::to.dtype``) and drops asserts."""
    if op.namespace == "aten" and op._opname in _ERASED:
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _count(names: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _target_of(op: torch._ops.OpOverload) -> Target:
    ns, _, rest = op.name().partition("::")
    name, _, overload = rest.partition(".")
    return Target(QualifiedName(ns, name, overload or "default"))


def _functional_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten::copy_.default`` -> ``aten::copy.default``: what torch's functionalization turns an
    in-place ATen op into before the exporter translates anything (None: no such twin)."""
    if op.namespace != "aten" or not op._opname.endswith("_") or not op._schema.is_mutable:
        return None
    packet = getattr(torch.ops.aten, op._opname[:-1], None)
    if packet is None or op._overloadname not in packet.overloads():
        return None
    twin = getattr(packet, op._overloadname)
    return twin if isinstance(twin, torch._ops.OpOverload) else None


def missing_ops_dynamo(
    exported_program: torch.export.ExportedProgram, opset: int, registry: Registry | None = None
) -> list[MissingOp]:
    """Ops of an ExportedProgram that neither torchlib nor ``registry`` translates at ``opset``.

    ``torch.export`` keeps ATen's in-place ops (``y[:, 0] = v`` is ``copy_``, ``torch.tensor(n)``
    of a dynamic size ends in ``detach_``); the exporter's decomposition functionalizes them
    first, so such an op is covered when its functional twin is."""
    reg = resolve_registry(registry)
    supported = _torchlib_supported(opset)

    def covered(op: torch._ops.OpOverload) -> bool:
        if any(e.opset <= opset for e in reg.entries_for(_target_of(op))):
            return True
        return op in supported or _lowered_by_exporter(op)

    names = []
    for node in exported_program.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if covered(node.target):
            continue
        twin = _functional_twin(node.target)
        if twin is not None and covered(twin):
            continue
        names.append(str(_target_of(node.target)))
    return [
        MissingOp(name, count, tuple(reg.opsets_for(Target(QualifiedName.parse(name)))))
        for name, count in _count(names).items()
    ]


# Scalar conversions the TorchScript exporter erases before translating (torch's
# _jit_pass_erase_number_types replaces them by their input): no symbolic needed.
_TS_ERASED = {
    "aten::Int",
    "aten::Float",
    "aten::Bool",
    "aten::IntImplicit",
    "aten::FloatImplicit",
    "aten::ScalarImplicit",
}


def _ts_has_symbolic(kind: str, opset: int) -> bool:
    registration = torchscript_exporter("registration")

    if kind.endswith("_"):
        kind = kind[:-1]
    return registration.registry.is_registered_op(kind, opset)


def missing_ops_torchscript(
    model: torch.nn.Module, args: tuple[Any, ...], opset: int, registry: Registry | None = None
) -> list[MissingOp]:
    """Ops in the traced TorchScript graph with no torch symbolic and no ``registry`` entry."""
    reg = resolve_registry(registry)
    with torch.no_grad():
        graph, *_ = torch.jit._get_trace_graph(model, args)

    def ours(target: Target) -> bool | None:
        # Our registry decides for the ops it knows (torch's dispatch would round opsets up).
        entries = reg.entries_for(target)
        return any(e.opset <= opset for e in entries) if entries else None

    names = []
    for node in graph.nodes():
        kind = node.kind()
        ns = kind.split("::")[0]
        if kind == "prim::PythonOp":
            cls = getattr(node.pyobj(), "__self__", None)
            covered = ours(Target(None, function=cls)) if isinstance(cls, type) else None
            if covered or (covered is None and cls is not None and hasattr(cls, "symbolic")):
                continue
            names.append(f"prim::PythonOp[{node.pyname()}]")
            continue
        if ns in ("prim", "onnx") or kind in _TS_ERASED:
            continue
        try:
            covered = ours(Target(QualifiedName.parse(kind.rstrip("_"))))
        except Exception:
            covered = None
        if covered or (covered is None and _ts_has_symbolic(kind, opset)):
            continue
        names.append(kind)
    result = []
    for name, count in _count(names).items():
        available: tuple[int, ...] = ()
        with contextlib.suppress(Exception):
            available = tuple(reg.opsets_for(Target(QualifiedName.parse(name))))
        result.append(MissingOp(name, count, available))
    return result
