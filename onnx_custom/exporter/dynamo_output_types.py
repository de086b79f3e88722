"""Output types inside the dynamo exporter: the FX node's fake tensors, named the user's way.

torch calls a translation with the op's inputs only; the FX node being translated (and its
``meta["val"]``, the fake outputs torch.export computed) sits in the calling frame of torch's
``_handle_call_function_node_with_lowering``. We read it from there, checking that its target is
the op we translate; if it is ever not found we run the op's fake kernel on the inputs' ONNX
types instead (`onnx_custom.exporter.output_meta.run_fake`),
so nothing depends on the frame being there.

Symbolic dims are torch's symbols (``s77``); `names` maps them to the user's dim names: set by
onnx_custom.export from its `DynamicSpec`, or, in the user's own ``torch.onnx.export(...,
dynamic_shapes=...)``, made with torch's own renaming from that call's ``dynamic_shapes``.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch

from onnx_custom.common.torch_onnx import dynamo_exporter
from onnx_custom.exporter.output_meta import DimNames, Outputs, TensorDesc, run_fake

__all__ = ["dim_names", "fx_node", "fx_outputs", "symbol_names", "value_outputs"]

_names: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "onnx_custom_dynamo_names", default=None
)
_UNBACKED = re.compile(r"^u\d+$")  # data-dependent sizes (nonzero, ...): no name, no hint
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@contextlib.contextmanager
def symbol_names(mapping: Mapping[str, str]) -> Iterator[None]:
    """onnx_custom.api's torch symbol -> dim name mapping, for the translations it runs."""
    token = _names.set(dict(mapping))
    try:
        yield
    finally:
        _names.reset(token)


def _frames(depth: int = 12) -> Iterator[Any]:
    frame = sys._getframe(2)
    while frame is not None and depth > 0:
        yield frame
        frame = frame.f_back  # type: ignore[assignment]
        depth -= 1


def _fx_node(overload: Any) -> tuple[torch.fx.Node | None, Any]:
    for frame in _frames():
        node = frame.f_locals.get("node")
        if isinstance(node, torch.fx.Node) and node.target is overload:
            return node, frame.f_locals.get("model")
    return None, None


def fx_node(overload: Any) -> torch.fx.Node | None:
    """The FX node of ``overload`` that torch's dynamo exporter is translating, when found."""
    return _fx_node(overload)[0]


def _users_mapping(model: Any) -> dict[str, str]:
    """In the user's own torch.onnx.export: torch's renaming of its graph inputs' dims."""
    spec = None
    for frame in _frames(40):
        if frame.f_code.co_name == "export_compat" and "torch" in frame.f_code.co_filename:
            spec = frame.f_locals.get("dynamic_shapes")
            break
    if not spec or model is None:
        return {}
    try:
        _dynamic_shapes = dynamo_exporter("_dynamic_shapes")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {
                str(k): str(v)
                for k, v in _dynamic_shapes.create_rename_mapping(model.graph.inputs, spec).items()
            }
    except Exception:  # torch internals moved: keep torch's own symbol names
        return {}


def dim_names(model: Any = None) -> dict[str, str]:
    mapping = _names.get()
    return dict(mapping) if mapping is not None else _users_mapping(model)


def _naming(exprs: Sequence[sympy.Expr], mapping: Mapping[str, str]) -> DimNames:
    names = DimNames()
    for expr in exprs:
        for sym in expr.free_symbols:
            text = str(sym)
            if text in mapping:
                names.names[sym] = mapping[text]  # type: ignore[index]
            elif not _UNBACKED.match(text):
                names.names[sym] = text  # type: ignore[index]  # no name given: torch's symbol
    return names


def _desc(value: Any) -> tuple[TensorDesc, list[int | str | None]]:
    if not isinstance(value, torch.Tensor):
        return TensorDesc(None, None), []
    shape: list[int | sympy.Expr | None] = []
    typing: list[int | str | None] = []
    for d in value.shape:
        if isinstance(d, int):
            shape.append(d)
            typing.append(d)
        else:
            shape.append(d.node.expr)
            typing.append(str(d.node))  # how torch writes this dim into the file
    return TensorDesc(value.dtype, tuple(shape)), typing


def fx_outputs(overload: Any) -> tuple[Outputs, list[list[int | str | None]], DimNames] | None:
    """From the FX node torch is translating: per return a desc (a list for ``Tensor[]``), the
    file's spelling of each output's dims, and the naming of its symbols. None when not found."""
    node, model = _fx_node(overload)
    if node is None or "val" not in node.meta:
        return None
    val = node.meta["val"]
    returns = list(val) if isinstance(val, tuple) else [val]
    outputs: Outputs = []
    typings: list[list[int | str | None]] = []
    for ret in returns:
        if isinstance(ret, (list, tuple)):
            pairs = [_desc(v) for v in ret]
            outputs.append([p[0] for p in pairs])
            typings.extend(p[1] for p in pairs)
        else:
            desc, typing = _desc(ret)
            outputs.append(desc)
            typings.append(typing)
    exprs = [
        d
        for r in outputs
        for t in (r if isinstance(r, list) else [r])
        for d in t.shape or ()
        if isinstance(d, sympy.Expr)
    ]
    return outputs, typings, _naming(exprs, dim_names(model))


def _parse(dim: Any) -> int | sympy.Expr | None:
    if dim is None or isinstance(dim, int):
        return dim
    text = getattr(dim, "value", dim)
    if not isinstance(text, str):
        return None
    try:
        return sympy.sympify(text, locals={tok: sympy.Symbol(tok) for tok in _TOKEN.findall(text)})
    except Exception:  # an expression sympy cannot read: unknown
        return None


def value_outputs(
    fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any], dtype_of: Any
) -> tuple[Outputs, list[list[int | str | None]], DimNames] | None:
    """Fallback: the fake kernel run on the ONNX inputs' types (``ir.Value`` dtype/shape)."""

    def describe(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [describe(v) for v in value]
        if (
            hasattr(value, "shape")
            and hasattr(value, "dtype")
            and not isinstance(value, torch.Tensor)
        ):
            shape = None if value.shape is None else tuple(_parse(d) for d in value.shape)
            return TensorDesc(dtype_of(value), shape)
        return value

    desc_args = [describe(a) for a in args]
    roots = {
        s
        for a in desc_args
        for d in _descs(a)
        for x in d.shape or ()
        if isinstance(x, sympy.Expr)
        for s in x.free_symbols
    }
    names = _naming([sympy.Add(*roots)] if roots else [], dim_names())
    outputs = run_fake(fn, desc_args, {k: describe(v) for k, v in kwargs.items()}, names)
    if outputs is None:
        return None
    typings = [
        [d if isinstance(d, int) or d is None else str(d) for d in t.shape or ()]
        for r in outputs
        for t in (r if isinstance(r, list) else [r])
    ]
    return outputs, typings, names


def _descs(value: Any) -> list[TensorDesc]:
    if isinstance(value, TensorDesc):
        return [value]
    if isinstance(value, list):
        return [d for v in value for d in _descs(v)]
    return []
