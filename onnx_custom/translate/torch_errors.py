"""Torch's exporter errors turned into ours: one `SymbolicError` naming the op, the translation
and the attribute, with the fix, instead of torch's wrappers.

- A translation that raises: our adapters wrap it at the call (`translation_error`), naming the
  translation and the line that raised; the original exception stays chained.
- The dynamo exporter wraps everything in a ~1.3 KB ``ConversionError`` ("submit a PR to
  PyTorch"); serialization problems arrive as a chain of ``SerdeError``s.
- The TorchScript exporter appends graph dumps ("Invoked with: %2 : Tensor = ...", "[Caused by
  the value ...") and "(Occurred when translating X)".
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Sequence
from typing import Any

from onnx_custom.errors import OnnxCustomError, SymbolicError, UnsupportedOpError

__all__ = [
    "chain",
    "check_functional",
    "mutated_arguments",
    "translation_error",
    "unwrap_dynamo_error",
    "unwrap_torchscript_error",
    "useful_line",
]

_OCCURRED = re.compile(r"\(Occurred when translating (?P<op>[\w:.]+)\)")
_CONTAINING = re.compile(r"The containing node has kind '(?P<op>[\w:]+)'")
# torch's own symbolic refusing its arguments: the op it names, not the node that made the value
_REFUSED = re.compile(r"Unsupported: ONNX export of operator (?P<op>\w+)")
_NODE = re.compile(r"Error when translating node %(?P<node>[\w.]+) : .*?target=(?P<target>[\w.:]+)")
_ATTRIBUTE = re.compile(r"serialize_attribute_into with: Attr\('(?P<name>[^']+)'")
_SERDE_NODE = re.compile(
    r"serialize_node_into with: Node\(name='(?P<name>[^']*)', domain='(?P<domain>[^']*)',"
    r" op_type='(?P<op>[^']+)'"
)


def mutated_arguments(schema: Any) -> list[str]:
    """Names of the arguments a torch op schema writes into (``Tensor(a!) out``)."""
    return [
        a.name for a in getattr(schema, "arguments", ()) if getattr(a.alias_info, "is_write", False)
    ]


def check_functional(op: str, schema: Any) -> None:
    """A custom op that writes into its arguments cannot become ONNX nodes: nodes make new values,
    and the graph would go on reading the buffer as it was before the op (TorchScript exports
    that silently, dynamo fails inside ``auto_functionalized``). Raise with the fix instead."""
    written = mutated_arguments(schema)
    if written:
        raise SymbolicError(
            f"{op} writes into its argument(s) {written} (schema: {schema}); ONNX nodes are "
            "functional, so an exported graph would read those buffers as they were before the op. "
            "Fix: export a functional version of the op, one that returns the result "
            "(torch.library.custom_op(..., mutates_args=()) returning a tensor), and call it from "
            "the model; the mutating op can stay for eager code."
        )


def useful_line(text: str, limit: int = 300) -> str:
    """The first meaningful line of a torch error, without graph dumps and suffixes."""
    text = _OCCURRED.sub("", text)
    text = text.split("[Caused by the value")[0]
    text = text.split("The following argument types are supported")[0]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "").rstrip(" .:")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes/contexts, outermost first (cycles cut)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _raised_at(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {last.filename}:{last.lineno} (in {last.name})"


def _binding_failed(exc: BaseException) -> bool:
    """A TypeError raised while *calling* the translation (its parameters do not fit),
    not inside it."""
    from onnx_custom.translate.registry import SymbolicEntry

    if not isinstance(exc, TypeError) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code is SymbolicEntry.call.__code__


def translation_error(
    entry: Any,
    exc: BaseException,
    inputs: int,
    attrs: Sequence[str],
    schema_args: Sequence[str] | None = None,
) -> SymbolicError:
    """A `SymbolicError` for an exception a translation raised (or its call signature caused)."""
    where = f"The translation of {entry.target} ({entry.source}, opset>={entry.opset})"
    if _binding_failed(exc):
        call = ", ".join(
            ["g", *(f"<input {i}>" for i in range(inputs)), *(f"{a}=..." for a in attrs)]
        )
        listed = (
            f" The op's arguments are [{', '.join(schema_args)}]."
            if schema_args is not None
            else ""
        )
        return SymbolicError(
            f"{where} cannot be called as the exporter calls it, fn({call}): {exc}.{listed}"
            " Expected tensor inputs positional after g and the other arguments by keyword under"
            " their schema names. Fix: rename the translation's parameters to match (or accept"
            " **kwargs)."
        )
    return SymbolicError(
        f"{where} raised {type(exc).__name__}: {useful_line(str(exc)) or '(no message)'}"
        f"{_raised_at(exc)}; expected it to build nodes with g.op(...) and return them. Fix the "
        "translation there (the original traceback is chained above)."
    )


def unwrap_dynamo_error(exc: BaseException) -> OnnxCustomError | None:
    """Ours for torch's ``ConversionError``/``SerdeError`` chains (None when it is neither)."""
    links = chain(exc)
    root = links[-1]
    attribute = next((m for link in links if (m := _ATTRIBUTE.search(str(link)))), None)
    if attribute is not None:
        node = next((m for link in links if (m := _SERDE_NODE.search(str(link)))), None)
        op = (
            f"{node['domain'] + '::' if node and node['domain'] else ''}{node['op']}"
            if node
            else "a node"
        )
        return SymbolicError(
            f"The dynamo exporter could not write attribute {attribute['name']!r} of {op}: "
            f"{type(root).__name__}: {useful_line(str(root))}. Expected a value ONNX can hold (an "
            "int64, a float32, UTF-8 text, a numeric tensor); fix the value the translation passes "
            "to g.op."
        )
    node = next((m for link in links if (m := _NODE.search(str(link)))), None)
    if node is None:
        return None
    target = node["target"].removeprefix("torch.ops.")
    namespace, _, rest = target.partition(".")
    op = f"{namespace}::{rest}"
    return SymbolicError(
        f"The dynamo exporter could not translate {op} (graph node %{node['node']}): "
        f"{type(root).__name__}: {useful_line(str(root))}. Expected a translation torch's exporter "
        f"can run for it. Fix: register one with @onnx_custom.symbolic({op.rsplit('.', 1)[0]!r}), "
        "or export with exporter='torchscript'."
    )


# The tracer's message for a Tensor?[] argument (torch.onnx.ops.symbolic's inputs).
_OPTIONAL_TENSOR_LIST = "unsupported input list type: Tensor?"


# The tracer's assert for an int[] argument holding a traced size (x.shape[0] under a dynamic dim).
_TRACED_INT_LIST = "iter->isIntList() INTERNAL ASSERT FAILED"


def unwrap_torchscript_error(exc: BaseException) -> OnnxCustomError | None:
    """Ours for a TorchScript exporter error that names the op it was translating (its message
    then carries a graph dump), else None."""
    text = str(exc)
    if _TRACED_INT_LIST in text:
        return UnsupportedOpError(
            "The TorchScript exporter's tracer cannot record an int[] argument holding a size "
            "read from a tensor (such as [y.shape[0], 4]; the tracer traces every shape read, "
            "dynamic dims or not) passed to a custom op: torch stops at an internal assert "
            "(iter->isIntList()); expected plain ints there. Fix: export with exporter='dynamo' "
            "(its translation receives a dynamic size as a graph value), or pass the sizes as a "
            "tensor argument."
        )
    if _OPTIONAL_TENSOR_LIST in text:
        return UnsupportedOpError(
            "The TorchScript exporter's tracer cannot record an op taking a list of optional"
            " tensors (Tensor?[]): torch.onnx.ops.symbolic / symbolic_multi_out, or a custom op"
            " with such an argument. Fix: export with exporter='dynamo' (the default), or declare"
            " the op with @onnx_custom.symbolic, which serves both exporters."
        )
    match = _OCCURRED.search(text) or _REFUSED.search(text) or _CONTAINING.search(text)
    if match is None:
        return None
    op = match["op"] if match.re is not _REFUSED else f"aten::{match['op']}"
    register = (
        f"@onnx_custom.symbolic({op!r})"
        if "::" in op
        else f"@onnx_custom.symbolic('<namespace>::{op}')"
    )
    return SymbolicError(
        f"The TorchScript exporter could not translate {op}: {type(exc).__name__}: "
        f"{useful_line(text)}. Expected a symbolic that handles these arguments. Fix: register "
        f"a translation with {register}, or export with exporter='dynamo'."
    )
