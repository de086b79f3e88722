"""Function bodies: ship ONNX ``FunctionProto`` fallbacks for custom nodes inside the model.

A runtime without our kernels inlines the body; ONNX Runtime with our kernels registered runs
the kernel instead (a registered kernel wins over a model-local function).

ONNX Runtime inlines a body against the *model's* ``opset_import``, so a body is built at the
model's default-domain opset: a `TranslationBody` is built there directly (below opset 15,
which has no ``CastLike``, specialised to the dtypes the model feeds the node); a fixed
``FunctionProto`` is checked to mean the same at the model's opset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import torch
from onnx import helper

from onnx_custom.errors import HalfPrecisionError, KernelError, SymbolicError
from onnx_custom.function_bodies.builder import TranslationBody, _torch_dtype
from onnx_custom.runtime.half_precision import DEFAULT_MODE, HALF_TYPES, check_mode, widen_function
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.runtime.registry import KernelRegistry, default_kernel_registry
from onnx_custom.runtime.session import ModelSource, custom_nodes, parse_model

__all__ = ["embed_functions", "function_proto"]

_DEFAULT_DOMAINS = ("", "ai.onnx")
_GENERIC_FROM_OPSET = 15  # CastLike: bodies need no dtype from here on
_BODY_OPSET = 18  # function_proto() without a model


def _to_proto(obj: Any) -> onnx.FunctionProto | None:
    if obj is None or isinstance(obj, onnx.FunctionProto):
        return obj
    if hasattr(obj, "to_function_proto"):  # onnxscript OnnxFunction
        return _to_proto(obj.to_function_proto())
    if callable(obj):
        return _to_proto(obj())
    raise KernelError(
        "function= must be an onnx.FunctionProto, an onnxscript function, a zero-argument "
        "callable returning one, or a TranslationBody / 'module:function' translation; received "
        f"{type(obj).__name__}."
    )


def function_proto(
    spec: KernelSpec,
    *,
    opset: int | None = None,
    dtypes: Mapping[str, torch.dtype] | None = None,
    nodes: Sequence[onnx.NodeProto] = (),
) -> onnx.FunctionProto | None:
    """``spec``'s function body renamed to its ``domain``/``op_type`` (None if it has none).

    A translation body is built at ``opset`` (default 18) for inputs of ``dtypes`` (input name ->
    torch dtype; needed below opset 15 when the body casts), checked against ``nodes``.
    """
    body = TranslationBody(spec.function) if isinstance(spec.function, str) else spec.function
    proto: onnx.FunctionProto | None
    if isinstance(body, TranslationBody):
        at = _BODY_OPSET if opset is None else opset
        try:
            proto = body.build(spec, at, dtypes, nodes)
        except SymbolicError as exc:
            raise KernelError(
                f"cannot build the function body of {spec.name} at opset {at}: {exc}"
            ) from exc
    else:
        proto = _to_proto(body)
    if proto is None:
        return None
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    out.domain, out.name = spec.domain, spec.op_type
    return out


def _default_opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise KernelError(
            "the model imports no default ONNX opset (opset_import has no '' domain); fix:"
            " re-export it."
        )
    return versions[0]


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every graph value ONNX shape inference (or the file) knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # custom nodes it cannot see are fine; anything else: use what the file has
        inferred = model
    graph = inferred.graph
    types = {t.name: t.data_type for t in graph.initializer}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    for node in graph.node:  # Constant outputs, which inference leaves out of value_info
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types


def _input_dtypes(
    spec: KernelSpec, nodes: list[onnx.NodeProto], types: dict[str, int]
) -> dict[str, torch.dtype]:
    """Input name -> dtype fed by every node of ``spec``'s op type; KernelError when they differ."""
    found: dict[str, torch.dtype] = {}
    for node in nodes:
        for param, name in zip(spec.inputs, node.input, strict=False):
            dtype = _torch_dtype(types[name]) if name in types else None
            if dtype is None:
                continue
            if found.setdefault(param.name, dtype) != dtype:
                raise KernelError(
                    f"{spec.name} nodes feed input {param.name!r} both {found[param.name]} and "
                    f"{dtype}; below opset {_GENERIC_FROM_OPSET} (no CastLike) one function body "
                    f"cannot serve both; fix: export at opset >= {_GENERIC_FROM_OPSET}."
                )
    return found


def _check_fixed_body(spec: KernelSpec, body: onnx.FunctionProto, model_opset: int) -> None:
    """A fixed body imported at another opset must mean the same at the model's
    (ORT inlines it there)."""
    body_opset = next(
        (o.version for o in body.opset_import if o.domain in _DEFAULT_DOMAINS), model_opset
    )
    if body_opset == model_opset:
        return
    for node in body.node:
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        try:
            same = (
                onnx.defs.get_schema(node.op_type, body_opset).since_version
                == onnx.defs.get_schema(node.op_type, model_opset).since_version
            )
        except onnx.defs.SchemaError:
            same = False
        if not same:
            raise KernelError(
                f"the function body of {spec.name} is written for opset {body_opset}, but its"
                f" {node.op_type} differs at the model's opset {model_opset} (ONNX Runtime inlines"
                f" the body at the model's opset); fix: export at opset {body_opset}, or declare"
                " the body as a TranslationBody so it is built at the model's opset."
            )


def _call_types(
    spec: KernelSpec, nodes: list[onnx.NodeProto], types: dict[str, int]
) -> tuple[int, ...]:
    """The element type the calls feed each body input (0: absent or unknown). At float16/bfloat16
    the body is specialised for those types, so every call must agree on them."""
    width = max(len(node.input) for node in nodes)
    merged: list[set[int]] = [set() for _ in range(width)]
    for node in nodes:
        for index, name in enumerate(node.input):
            if name and types.get(name):
                merged[index].add(types[name])
    if any(len(found) > 1 for found in merged) and any(
        t in HALF_TYPES for found in merged for t in found
    ):
        raise HalfPrecisionError(
            f"{spec.name} nodes feed their inputs different types ({[sorted(f) for f in merged]}), "
            "and at float16/bfloat16 its function body is specialised for one (ONNX Runtime's CPU "
            "provider lacks some half-precision kernels); fix: export the model in one dtype, or "
            "embed no function bodies (functions=False)."
        )
    return tuple(min(found) if found else 0 for found in merged)


def _sometimes_absent(body: onnx.FunctionProto, nodes: list[onnx.NodeProto]) -> list[str]:
    """Body inputs that at least one call leaves out."""
    return [
        name
        for index, name in enumerate(body.input)
        if any(index >= len(n.input) or not n.input[index] for n in nodes)
    ]


def embed_functions(
    model: ModelSource, kernels: KernelRegistry | None = None, *, half_precision: str = DEFAULT_MODE
) -> onnx.ModelProto:
    """Copy of ``model`` with a ``FunctionProto`` for each custom op whose kernel has a body.

    A body called with float16/bfloat16 inputs is passed through
    `onnx_custom.runtime.half_precision.widen_function` with ``half_precision`` (default
    ``"float32-compute"``): nodes ONNX Runtime's CPU provider lacks at that dtype compute in
    float32.
    """
    check_mode(half_precision)
    proto = parse_model(model)
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    reg = default_kernel_registry() if kernels is None else kernels
    present = {(f.domain, f.name) for f in out.functions}
    imports = {o.domain: o.version for o in out.opset_import}
    model_opset = _default_opset(out)
    by_key: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    for node in custom_nodes(out):
        by_key.setdefault((node.domain, node.op_type), []).append(node)
    types: dict[str, int] | None = None
    for key, nodes in by_key.items():
        spec = reg.lookup(*key)
        if key in present or spec is None or spec.function is None:
            continue
        dtypes = None
        generic = model_opset >= _GENERIC_FROM_OPSET
        if isinstance(spec.function, (str, TranslationBody)) and not (
            generic and half_precision == "off"
        ):
            types = _value_types(out) if types is None else types
            # Specialised below opset 15 (no CastLike), and for float16/bfloat16 calls, so that
            # a translation can pick its compute dtype (e.g. float32 inside a Loop, which
            # widen_function leaves as it is).
            half = half_precision != "off" and any(
                t in HALF_TYPES for t in _call_types(spec, nodes, types)
            )
            if not generic or half:
                dtypes = _input_dtypes(spec, nodes, types)
        body = function_proto(spec, opset=model_opset, dtypes=dtypes, nodes=nodes)
        if body is None:
            continue
        _check_fixed_body(spec, body, model_opset)
        if half_precision != "off":
            types = _value_types(out) if types is None else types
            widen_function(
                body,
                _call_types(spec, nodes, types),
                nodes[0],
                half_precision,
                maybe_absent=_sometimes_absent(body, nodes),
            )
        for op in body.opset_import:
            if op.domain in imports and op.domain != spec.domain:
                op.version = imports[op.domain]
            elif op.domain not in imports:
                out.opset_import.append(helper.make_opsetid(op.domain, op.version))
                imports[op.domain] = op.version
        out.functions.append(body)
        present.add(key)
        for node in nodes:
            # Absent trailing optional inputs as explicit "": onnx.reference (and other runtimes)
            # bind a call's inputs to the body's by count; ONNX Runtime accepts both forms.
            node.input.extend([""] * (len(body.input) - len(node.input)))
    if out.functions:
        # Functions need IR 8; attribute defaults inside them (attribute_proto) need IR 9.
        needed = 9 if any(f.attribute_proto for f in out.functions) else 8
        out.ir_version = max(out.ir_version, needed)
    return out
