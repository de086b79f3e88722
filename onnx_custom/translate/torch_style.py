"""Symbolic functions written for torch's API (``torch.onnx.register_custom_op_symbolic``), run
unchanged by our exporter-neutral builder under BOTH exporters.

A torch-style symbolic takes every op argument positionally, in schema order and under any
parameter names (``def roi_align(g, input, rois, output_size, scale, ...)``), often decorated
with torch's ``@symbolic_helper.parse_args("v", "v", "is", "f", ...)``, and builds nodes with
torch's ``g.op("Foo", x, alpha_f=0.5, axes_i=[1], outputs=2)`` and
``g.op("Constant", value_t=tensor)``. `torch_style_translation` wraps such a function into one
of our translations: `TorchStyleGraph` speaks torch's ``GraphContext`` API on top of our
`GraphBuilder` (`onnx_custom.translate.graph_context`), so the nodes are checked and typed
exactly as ours are, and under the dynamo exporter (where torch itself cannot run these
functions) tensor values are `TorchStyleValue`s that answer ``x.type().sizes()`` / ``dim()`` /
``scalarType()`` as TorchScript values do, so torch's own helpers
(``symbolic_helper._get_tensor_sizes``, ``_unsqueeze_helper``, ``_slice_helper``, ...) work on
them.

Non-tensor arguments arrive as Python values (what ``parse_args`` or ``_get_const`` would make of
them); an absent ``Tensor?`` as None. A ``Tensor[]`` argument is a `TorchStyleList`: a Python
list of its values that also answers as torch's packed ``prim::ListConstruct`` value, so torch's
own idiom ``symbolic_helper._unpack_list(tensors)`` (its ``cat``/``stack`` symbolics, the
tutorials') works as well as iterating it.

The two jobs live apart: `onnx_custom.translate.parse_args` checks and converts the arguments
(``@parse_args`` codes against the op's schema), `onnx_custom.translate.graph_context` emulates
torch's ``GraphContext`` and its values; this module joins them into a translation.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from onnx_custom.errors import SymbolicError
from onnx_custom.translate.graph_context import TorchStyleGraph, TorchStyleList, TorchStyleValue
from onnx_custom.translate.parse_args import (
    binds_torch_style,
    check_codes,
    convert_argument,
    is_tensor_type,
    name_of,
    parameter_names,
    parse_args_codes,
    signature_text,
)
from onnx_custom.translate.scalar_types import scalar_type_index

__all__ = [
    "TORCH_STYLE_MARK",
    "TorchStyleGraph",
    "TorchStyleList",
    "TorchStyleValue",
    "binds_torch_style",
    "check_codes",
    "parse_args_codes",
    "torch_style_translation",
]

Builder = Any  # our `onnx_custom.translate.builder.GraphBuilder`

TORCH_STYLE_MARK = "__onnx_custom_torch_style__"  # on a wrapper: the user's function


def torch_style_translation(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Our translation ``(g, *inputs, **attributes)`` running the torch-style symbolic ``fn``."""
    if getattr(fn, TORCH_STYLE_MARK, None) is not None:
        return fn
    codes = parse_args_codes(fn)

    def translate(g: Builder, *inputs: Any, **attrs: Any) -> Any:
        arguments = g.arguments
        if arguments is None:  # no schema known: inputs, then the other arguments
            arguments = tuple((f"input{i}", "Tensor") for i in range(len(inputs))) + tuple(
                (k, "Any") for k in attrs
            )
        pending = iter(inputs)
        # a dtype argument as torch.onnx hands it over: its ScalarType index, not a torch.dtype
        values = [
            next(pending, None) if is_tensor_type(t) else scalar_type_index(attrs.get(n))
            for n, t in arguments
        ]
        if codes is not None:
            check_codes(g.target, fn, codes, arguments)
            names = parameter_names(fn, len(values))
            values = [
                convert_argument(g.target, fn, i, names[i], code, value, t)
                for i, (code, value, (_, t)) in enumerate(
                    zip(codes, values, arguments, strict=False)
                )
            ]
        if not binds_torch_style(fn, len(values)):
            raise SymbolicError(
                f"{g.target}: the torch-style symbolic {name_of(fn)}{signature_text(fn)}"
                f" cannot take the op's {len(values)} argument(s)"
                f" [{', '.join(f'{n}: {t}' for n, t in arguments)}] positionally after g, as torch"
                " calls it. Fix: give it one parameter per argument (any names), or defaults for"
                " trailing ones."
            )
        adapter = TorchStyleGraph(g)
        wrapped = (adapter.wrap(v, t) for v, (_, t) in zip(values, arguments, strict=False))
        return adapter.unwrap(fn(adapter, *wrapped))

    functools.update_wrapper(translate, fn)
    setattr(translate, TORCH_STYLE_MARK, fn)
    translate.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("g", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("inputs", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("attributes", inspect.Parameter.VAR_KEYWORD),
        ]
    )
    return translate
