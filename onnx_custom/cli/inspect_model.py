"""``onnx-custom inspect model.onnx``: what an ONNX file needs to run.

Domains and opset imports, IR version, producer, inputs/outputs, and for every custom node type
whether a runtime kernel (``onnx_custom.runtime``), an ONNX schema, or an embedded function body
exists for it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import onnx

from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.verification.preflight import has_kernel, has_schema, kernel_registry_or_none
from onnx_custom.verification.runner import load_model

__all__ = ["COLUMNS", "CustomNodeInfo", "ModelSummary", "inspect_model"]

_STANDARD = ("", "ai.onnx", "ai.onnx.ml")


@dataclasses.dataclass(frozen=True)
class CustomNodeInfo:
    """One custom node type (``domain::OpType``) and what can run it."""

    node_type: str
    count: int
    has_kernel: bool
    has_schema: bool
    has_function: bool

    @property
    def runnable(self) -> bool:
        return self.has_kernel or self.has_schema or self.has_function


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """``str(summary)`` is the listing ``onnx-custom inspect`` prints."""

    source: str
    ir_version: int
    producer: str
    opset_imports: tuple[tuple[str, int], ...]
    domains: tuple[tuple[str, int], ...]  # (domain, node count); "" is the default domain
    node_count: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    custom_nodes: tuple[CustomNodeInfo, ...]
    functions: tuple[str, ...]
    undeclared_domains: tuple[str, ...]
    kernels_checked: bool

    @property
    def ok(self) -> bool:
        return all(c.runnable for c in self.custom_nodes) and not self.undeclared_domains

    def __str__(self) -> str:
        opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in self.opset_imports)
        domains = ", ".join(f"{d or 'ai.onnx'} ({n} node(s))" for d, n in self.domains)
        lines = [
            (
                f"{self.source}: IR version {self.ir_version}, producer {self.producer or '?'},"
                f" {self.node_count} node(s)"
            ),
            f"  opset imports: {opsets or '(none)'}",
            f"  domains used: {domains or '(none)'}",
            f"  inputs:  {', '.join(self.inputs) or '(none)'}",
            f"  outputs: {', '.join(self.outputs) or '(none)'}",
        ]
        if self.functions:
            lines.append(f"  functions: {', '.join(self.functions)}")
        if self.undeclared_domains:
            lines.append(
                f"  ! domains used but not in opset_import: {', '.join(self.undeclared_domains)}"
                " (runtimes reject this)"
            )
        if self.custom_nodes:
            lines.append(
                "  custom nodes"
                + (
                    ""
                    if self.kernels_checked
                    else " (kernel host unavailable: kernels not checked)"
                )
                + ":"
            )
            lines.append(
                f"    {'node type':<36} {'count':>5}  {'kernel':<6} {'schema':<6} {'function':<8}"
            )
            for c in self.custom_nodes:
                yn = lambda b: "yes" if b else "no"  # noqa: E731
                mark = (
                    ""
                    if c.runnable
                    else (
                        "   <- nothing can run this node (its kernel's module not imported? add"
                        " --import MODULE)"
                    )
                )
                lines.append(
                    f"    {c.node_type:<36} {c.count:>5}  {yn(c.has_kernel):<6}"
                    f" {yn(c.has_schema):<6} {yn(c.has_function):<8}{mark}"
                )
            lines.extend(f"    {column}" for column in COLUMNS)
        else:
            lines.append("  custom nodes: none (runs in any ONNX runtime)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def _type_text(info: onnx.ValueInfoProto) -> str:
    t = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        return f"{info.name}: {info.type.WhichOneof('value') or '?'}"
    dtype = onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "?"
    dims = (
        [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in t.shape.dim]
        if t.HasField("shape")
        else None
    )
    return f"{info.name}: {dtype}{'' if dims is None else '[' + ','.join(dims) + ']'}"


def _kernel_declares_shapes(kernels: Any, node_type: str) -> bool:
    """A kernel with ``shape_fn`` registers an ONNX schema (types and shapes) with every session
    that uses it: the node has a schema although ``onnx.defs`` does not list it yet."""
    if kernels is None:
        return False
    domain, _, op_type = node_type.rpartition("::")
    try:
        spec = kernels.lookup(domain, op_type)
    except Exception:
        return False
    return spec is not None and getattr(spec, "shape_fn", None) is not None


COLUMNS = (
    (
        "kernel: a Python kernel is registered for it (onnx_custom.runtime; --import your kernels'"
        " module)"
    ),
    (
        "schema: its output types and shapes are known to ONNX (an onnx.defs schema, or the"
        " kernel's shape_fn)"
    ),
    (
        "function: the file embeds a function body for it, which any ONNX runtime runs with nothing"
        " registered"
    ),
)


def inspect_model(model: onnx.ModelProto | str | os.PathLike[str] | bytes) -> ModelSummary:
    """Summarize an ONNX model (a proto, bytes or a path;
    clear errors for missing/corrupt files)."""
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "<model>"
    proto = load_model(model)
    nodes = list(iter_nodes(proto, functions=False))
    domain_counts: dict[str, int] = {}
    custom_counts: dict[str, int] = {}
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        domain_counts[domain] = domain_counts.get(domain, 0) + 1
        if node.domain not in _STANDARD:
            key = f"{node.domain}::{node.op_type}"
            custom_counts[key] = custom_counts.get(key, 0) + 1
    functions = {f"{f.domain}::{f.name}" for f in proto.functions}
    kernels = kernel_registry_or_none()
    custom = tuple(
        CustomNodeInfo(
            node_type=key,
            count=count,
            has_kernel=kernels is not None and has_kernel(kernels, key),
            has_schema=has_schema(key) or _kernel_declares_shapes(kernels, key),
            has_function=key in functions,
        )
        for key, count in sorted(custom_counts.items())
    )
    declared = {("" if o.domain == "ai.onnx" else o.domain) for o in proto.opset_import}
    initializers = {i.name for i in proto.graph.initializer}
    return ModelSummary(
        source=source,
        ir_version=int(proto.ir_version),
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
        opset_imports=tuple((o.domain, int(o.version)) for o in proto.opset_import),
        domains=tuple(sorted(domain_counts.items())),
        node_count=len(nodes),
        inputs=tuple(_type_text(i) for i in proto.graph.input if i.name not in initializers),
        outputs=tuple(_type_text(o) for o in proto.graph.output),
        custom_nodes=custom,
        functions=tuple(sorted(functions)),
        undeclared_domains=tuple(sorted(set(domain_counts) - declared - {"ai.onnx"})),
        kernels_checked=kernels is not None,
    )
