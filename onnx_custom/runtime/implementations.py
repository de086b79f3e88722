"""Which implementation runs each non-standard node type of a model in a session: a Python
kernel, a native kernel (``libonnx_custom_ops.so`` or a user's library), the model's ONNX
function body (inlined by ONNX Runtime), or an op ONNX Runtime has built in (``com.microsoft``
contrib ops and the other domains it owns).

The precedence is ONNX Runtime's: a registered kernel (native or Python) serves its node type
even when the file also holds a function body; a node type nothing registered serves runs its
body. `onnx_custom.runtime.InferenceSession` records the result as ``.implementations``, and
`onnx_custom.verify` reports it per backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.runtime.kernel_spec import KernelSpec

__all__ = ["STANDARD_DOMAINS", "Implementation", "node_implementations"]

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})  # ONNX's own operator sets


@dataclasses.dataclass(frozen=True)
class Implementation:
    """What ran ``node_type`` (``domain::OpType``, ``count`` nodes): ``kind`` is one of
    ``"python"``, ``"native"``, ``"function"``, ``"builtin"``; ``source`` names it (the Python
    function, the library file, the function, the contrib domain)."""

    node_type: str
    kind: str
    source: str
    count: int = 1

    def describe(self) -> str:
        what = {
            "python": f"Python kernel {self.source}",
            "native": f"native kernel in {self.source}",
            "function": f"ONNX function body {self.source} (inlined by ONNX Runtime)",
            "builtin": f"ONNX Runtime built-in op ({self.source})",
        }[self.kind]
        return f"{self.node_type} ({self.count} node{'s' if self.count != 1 else ''}): {what}"


def _function_name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', None) or getattr(fn, '__name__', repr(fn))}"


def node_implementations(
    model: onnx.ModelProto,
    python: Sequence[KernelSpec] = (),
    native: Mapping[str, Any] | None = None,
) -> list[Implementation]:
    """One `Implementation` per non-standard node type of ``model`` (main graph, subgraphs and
    function bodies), in first-use order. ``python``: the Python kernels registered in the
    session; ``native``: ``{domain: NativeLibrary}`` of the domains a native library serves."""
    native = native or {}
    kernels = {(s.domain, s.op_type): s for s in python}
    local = {(f.domain, f.name) for f in model.functions}
    counts: dict[tuple[str, str], int] = {}
    for node in iter_nodes(model):
        if node.domain not in STANDARD_DOMAINS:
            counts[(node.domain, node.op_type)] = counts.get((node.domain, node.op_type), 0) + 1
    found = []
    for (domain, op_type), count in counts.items():
        name = f"{domain}::{op_type}"
        if domain in native:
            found.append(Implementation(name, "native", native[domain].path.name, count))
        elif (domain, op_type) in kernels:
            found.append(
                Implementation(name, "python", _function_name(kernels[(domain, op_type)].fn), count)
            )
        elif (domain, op_type) in local:
            found.append(Implementation(name, "function", name, count))
        else:
            found.append(Implementation(name, "builtin", f"domain {domain!r}", count))
    return found
