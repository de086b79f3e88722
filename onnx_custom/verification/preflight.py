"""``onnx_custom.check`` (this module is ``preflight`` so it never shadows the function): pre-flight
coverage of a model, without exporting a file.

Lists, all at once, every op with no translation for the chosen exporter/opset (with the opsets
where one exists), and every custom node type the chosen translations emit that has neither a
runtime kernel nor an ONNX schema.

The custom node types are found by *running* the translations: a dry export into a throwaway
ModelProto (nothing is written), recording every node the translations add. When that export
succeeds, nothing is missing, whatever the trace-based op listing guessed; when it fails on
untranslated ops, the nodes recorded so far and the translations' ``emits=`` declarations (still
accepted, no longer needed) stand in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from typing import Any

import onnx
import torch

from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.common.torch_chatter import quiet_torch
from onnx_custom.errors import (
    InvalidArgumentError,
    OnnxCustomError,
    SymbolicError,
    UnsupportedOpError,
)
from onnx_custom.translate.coverage import (
    MissingOp,
    missing_fix,
    missing_ops_dynamo,
    missing_ops_torchscript,
)
from onnx_custom.translate.names import QualifiedName, Target
from onnx_custom.translate.registry import Registry, SymbolicEntry, default_registry
from onnx_custom.verification.runner import STANDARD_DOMAINS

__all__ = ["CoverageReport", "MissingKernel", "check", "has_kernel", "kernel_registry_or_none"]


@dataclasses.dataclass(frozen=True)
class MissingKernel:
    """A custom node type a translation would emit, with no kernel and no schema to run it."""

    node_type: str
    emitted_by: tuple[str, ...]

    def describe(self) -> str:
        return (
            f"{self.node_type}: no runtime kernel and no ONNX schema (emitted by"
            f" {'; '.join(self.emitted_by)})"
        )


@dataclasses.dataclass(frozen=True)
class CoverageReport:
    """What `check` found; ``str(report)`` is the human listing, ``ok`` means export should work."""

    exporter: str
    opset: int
    ops: tuple[str, ...]
    translations: tuple[str, ...]
    missing: tuple[MissingOp, ...]
    emitted: tuple[str, ...]
    missing_kernels: tuple[MissingKernel, ...]
    kernels_checked: bool
    problems: tuple[str, ...] = ()
    translations_ran: bool = False  # the dry export ran the translations (else emits= was used)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.missing_kernels or self.problems)

    @property
    def missing_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.missing) + tuple(
            k.node_type for k in self.missing_kernels
        )

    def __str__(self) -> str:
        head = (
            f"Coverage for the {self.exporter} exporter at opset {self.opset}: {len(self.ops)}"
            " distinct op(s)"
        )
        lines = [f"{head} — {'OK' if self.ok else 'PROBLEMS FOUND'}"]
        for problem in self.problems:
            lines.append(f"  ! {problem}")
        if self.missing:
            lines.append(f"{len(self.missing)} op(s) without a translation:")
            lines += [f"  - {m.describe()}" for m in self.missing]
            lines.append(f"  {missing_fix(list(self.missing), self.opset)}")
        if self.translations:
            lines.append("Our translations used:")
            lines += [f"  - {t}" for t in self.translations]
        if self.emitted:
            lines.append(f"Custom node types emitted: {', '.join(self.emitted)}")
        if not self.kernels_checked and self.emitted:
            lines.append(
                "  (the kernel host onnx_custom.runtime is unavailable: no custom kernel can run)"
            )
        if self.missing_kernels:
            lines.append(
                f"{len(self.missing_kernels)} custom node type(s) that ONNX Runtime cannot run:"
            )
            lines += [f"  - {k.describe()}" for k in self.missing_kernels]
            lines.append(
                "  Fix: register a kernel with @onnx_custom.kernel('<domain>::<Op>', ...), or"
                " prefer a translation variant that emits standard ops."
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exporter": self.exporter,
            "opset": self.opset,
            "ok": self.ok,
            "ops": list(self.ops),
            "translations": list(self.translations),
            "missing": [dataclasses.asdict(m) for m in self.missing],
            "emitted": list(self.emitted),
            "missing_kernels": [dataclasses.asdict(k) for k in self.missing_kernels],
            "kernels_checked": self.kernels_checked,
            "problems": list(self.problems),
            "translations_ran": self.translations_ran,
        }


def kernel_registry_or_none() -> Any:
    """The default kernel registry, or None while the kernel host is unavailable."""
    try:
        from onnx_custom.runtime import default_kernel_registry
    except ImportError:
        return None
    try:
        return default_kernel_registry()
    except Exception:  # a half-built host must not break a pre-flight check
        return None


def has_kernel(kernels: Any, node_type: str) -> bool:
    """Whether ``kernels`` (a KernelRegistry) has a kernel for ``"domain::OpType"``."""
    domain, _, op_type = node_type.rpartition("::")
    for attempt in (
        lambda: kernels.lookup(domain, op_type),
        lambda: kernels.get(node_type),
        lambda: node_type in kernels or None,
    ):
        try:
            if attempt():
                return True
        except Exception:
            continue
    return False


def has_schema(node_type: str) -> bool:
    domain, _, op_type = node_type.rpartition("::")
    try:
        return bool(onnx.defs.has(op_type, domain))
    except Exception:
        return False


def _entry(registry: Registry, target: Any, opset: int, exporter: str) -> SymbolicEntry | None:
    try:
        if not registry.entries_for(target):
            return None
        return registry.lookup(target, opset, exporter=exporter)
    except (UnsupportedOpError, SymbolicError):
        return None


def _export_program(
    model: torch.nn.Module, args: tuple[Any, ...], registry: Registry
) -> torch.export.ExportedProgram:
    from onnx_custom.exporter.pipeline import trace_program

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return trace_program(model, args, registry)
    except OnnxCustomError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise OnnxCustomError(
            f"torch.export could not trace the model: {type(exc).__name__}: {first}"
        ) from exc


_Ops = tuple[
    list[str], list[SymbolicEntry], list[MissingOp], Any
]  # ..., what the dry export exports


def _dynamo_ops(
    model: torch.nn.Module, args: tuple[Any, ...], opset: int, registry: Registry
) -> _Ops:
    program = _export_program(model, args, registry)
    ops: dict[str, None] = {}
    used: dict[tuple[str, int, str], SymbolicEntry] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        ns, _, rest = node.target.name().partition("::")
        op = rest.split(".")[0]
        target = Target(QualifiedName(ns, op, node.target._overloadname))
        ops[str(target)] = None
        entry = _entry(registry, target, opset, "dynamo")
        if entry is not None:
            used[entry.key] = entry
    return (
        list(ops),
        list(used.values()),
        missing_ops_dynamo(program, opset, registry),
        program,
    )  # traced once


def _torchscript_ops(
    model: torch.nn.Module, args: tuple[Any, ...], opset: int, registry: Registry
) -> _Ops:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph, *_ = torch.jit._get_trace_graph(model, args)
    ops: dict[str, None] = {}
    used: dict[tuple[str, int, str], SymbolicEntry] = {}
    for node in graph.nodes():
        kind = node.kind()
        if kind == "prim::PythonOp":
            cls = getattr(node.pyobj(), "__self__", None)
            ops[f"prim::PythonOp[{node.pyname()}]"] = None
            entry = _entry(registry, cls, opset, "torchscript") if isinstance(cls, type) else None
        elif kind.split("::")[0] in ("prim", "onnx"):
            continue
        else:
            ops[kind] = None
            entry = _entry(registry, kind, opset, "torchscript")
        if entry is not None:
            used[entry.key] = entry
    return (
        list(ops),
        list(used.values()),
        missing_ops_torchscript(model, args, opset, registry),
        model,
    )


@dataclasses.dataclass(frozen=True)
class _DryExport:
    """What exporting into a throwaway ModelProto showed."""

    emitted: dict[str, list[str]]  # custom node type -> the torch ops whose translation emitted it
    succeeded: bool
    missing: tuple[str, ...] = ()  # ops the exporter refused (UnsupportedOpError)
    problem: str = ""


def _dry_export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...],
    exporter: str,
    opset: int,
    registry: Registry,
) -> _DryExport:
    from onnx_custom.exporter.pipeline import export_model
    from onnx_custom.translate.builder import record_nodes

    emitted: dict[str, list[str]] = {}

    def add(node_type: str, by: str) -> None:
        if by not in emitted.setdefault(node_type, []):
            emitted[node_type].append(by)

    outcome: dict[str, Any] = {"succeeded": False}
    with (
        record_nodes() as log,
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        try:
            proto = export_model(model, args, exporter=exporter, opset=opset, registry=registry)
        except UnsupportedOpError as exc:
            outcome["missing"] = tuple(exc.missing)
        except Exception as exc:  # tracing or translating a user model can fail in many ways
            text = str(exc).strip()
            outcome["problem"] = (
                f"Exporting failed: {type(exc).__name__}: {text.splitlines()[0] if text else ''}"
            )
        else:
            outcome["succeeded"] = True
    for record in log:
        if record.domain not in STANDARD_DOMAINS:
            add(f"{record.domain}::{record.op_type}", f"translation of {record.target}")
    if outcome["succeeded"]:
        for node in iter_nodes(proto, functions=False):
            if node.domain not in STANDARD_DOMAINS:
                add(f"{node.domain}::{node.op_type}", "the exported graph")
    return _DryExport(emitted, **outcome)


def check(
    model: torch.nn.Module,
    args: tuple[Any, ...] | torch.Tensor,
    *,
    exporter: str = "dynamo",
    opset: int = 18,
    registry: Registry | None = None,
    raise_if_missing: bool = False,
    kernels: Any = None,
) -> CoverageReport:
    """Pre-flight: can ``model`` be exported with ``exporter`` at ``opset`` and run in ORT?

    Traces the model (``torch.export`` or ``torch.jit`` trace, like the exporter would) to list
    its ops, then exports it into a throwaway ModelProto (no file written) to run the
    translations and collect the custom node types they emit; each needs a kernel in
    ``kernels`` (default: the default kernel registry) or an ONNX schema.
    ``raise_if_missing=True`` raises `UnsupportedOpError` (``missing``: every name) with the
    same text as ``str(report)`` when anything is missing.
    """
    from onnx_custom.exporter.arguments import (
        check_args,
        check_exporter,
        check_model,
        check_opset,
        check_registry,
    )

    check_exporter(exporter)
    check_model(model, exporter)
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(
            "check() traces an nn.Module; received a torch.export.ExportedProgram. Fix: pass the "
            "original nn.Module, or program.module()."
        )
    check_opset(exporter, opset)
    check_registry(registry)
    args = check_args(args)
    reg = registry if registry is not None else default_registry()
    problems: list[str] = []
    ops: list[str] = []
    entries: list[SymbolicEntry] = []
    missing: list[MissingOp] = []
    source: Any = model
    if exporter == "torchscript":
        from onnx_custom.exporter.torchscript import TS_MAX_OPSET, TS_MIN_OPSET

        if not TS_MIN_OPSET <= opset <= TS_MAX_OPSET:
            problems.append(
                f"The TorchScript exporter supports opsets {TS_MIN_OPSET}..{TS_MAX_OPSET}, got"
                f" {opset}."
            )
    try:
        collect = _dynamo_ops if exporter == "dynamo" else _torchscript_ops
        with (
            quiet_torch()
        ):  # torch's exporter chatter ("torchvision is not installed ...") is not ours to print
            ops, entries, missing, source = collect(model, args, opset, reg)
    except OnnxCustomError as exc:
        problems.append(str(exc))
    except Exception as exc:  # tracing a user model can fail in many ways; report, don't crash
        problems.append(f"Tracing the model failed: {type(exc).__name__}: {exc}")
    emitted: dict[str, list[str]] = {}
    ran = False
    if not problems:
        with quiet_torch():
            dry = _dry_export(source, args, exporter, opset, reg)
        ran, emitted = dry.succeeded, dry.emitted
        if dry.succeeded:
            missing = []  # the exporter took every op: a trace-level guess of a gap was wrong
        elif dry.missing and not missing:
            missing = [MissingOp(name, 1) for name in dry.missing]
        elif dry.problem:
            problems.append(dry.problem)
    if not ran:  # the translations could not all run: their declarations stand in
        for entry in entries:
            for node_type in entry.emits:
                if entry.describe() not in emitted.setdefault(node_type, []):
                    emitted[node_type].append(entry.describe())
    kernels = kernels if kernels is not None else kernel_registry_or_none()
    # Without the kernel host nothing can run a custom node: every schema-less one is missing.
    missing_kernels = tuple(
        MissingKernel(node_type, tuple(by))
        for node_type, by in emitted.items()
        if not has_schema(node_type) and (kernels is None or not has_kernel(kernels, node_type))
    )
    report = CoverageReport(
        exporter=exporter,
        opset=opset,
        ops=tuple(ops),
        translations=tuple(e.describe() for e in entries),
        missing=tuple(missing),
        emitted=tuple(emitted),
        missing_kernels=missing_kernels,
        kernels_checked=kernels is not None,
        problems=tuple(problems),
        translations_ran=ran,
    )
    if raise_if_missing and not report.ok:
        raise UnsupportedOpError(str(report), report.missing_names)
    return report
