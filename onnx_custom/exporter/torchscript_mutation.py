"""Refuse custom ops that write into their arguments in TorchScript exports.

TorchScript's ONNX passes drop a custom op that returns nothing and only writes into an argument
(``mutates_args=("out",)``, mmcv's out-buffer style): its dead-code pass runs before any symbolic,
so no translation, ours or torch's, ever sees the op, and the file silently reads the buffer as it
was before the op. The only place the op is still visible is the traced graph that torch's
optimizer receives, so that is where we look, for every export inside ``registered()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from onnx_custom.common.torch_onnx import torchscript_exporter
from onnx_custom.translate.torch_errors import check_functional

ts_utils = torchscript_exporter("utils")

__all__ = ["check_graph_functional", "mutations_refused"]

# torch's own passes turn these namespaces' in-place ops into functional nodes (or they are
# torch's bookkeeping): only other namespaces hold ops torch knows nothing about
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "onnx", "quantized"})


# Kinds that never own blocks and fill traced graphs: asking a node for its blocks is slow in
# torch's bindings (an iterator object per call), asking for its kind is cheap.
# Blocks come from control flow (prim::If, prim::Loop, closures): every other kind is still asked.
_LEAF_KINDS = frozenset(
    {
        "prim::Constant",
        "prim::ListConstruct",
        "prim::ListUnpack",
        "prim::TupleConstruct",
        "prim::TupleUnpack",
        "prim::GetAttr",
        "prim::NumToTensor",
        "prim::device",
        "prim::dtype",
    }
)


def check_graph_functional(graph: Any) -> None:
    """Raise `SymbolicError` for the first custom-namespace node whose schema writes into an
    argument (nested blocks included)."""
    for node in graph.nodes():
        kind = node.kind()
        if kind not in _LEAF_KINDS and not kind.startswith("aten::"):
            for block in node.blocks():
                check_graph_functional(block)
        if kind.partition("::")[0] in _TORCH_NAMESPACES:
            continue
        text = node.schema()
        if text != "(no schema)":
            check_functional(kind, torch._C.parse_schema(text))


@contextlib.contextmanager
def mutations_refused() -> Iterator[None]:
    """Check each traced graph before torch's optimizer (and its dead-code pass) sees it."""
    original = ts_utils._optimize_graph

    def optimize(graph: Any, *args: Any, **kwargs: Any) -> Any:
        check_graph_functional(graph)
        return original(graph, *args, **kwargs)

    ts_utils._optimize_graph = optimize
    try:
        yield
    finally:
        ts_utils._optimize_graph = original
