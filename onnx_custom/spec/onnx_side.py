"""The ONNX side of a spec: the custom-node translation, the kernel declaration, the OpSchema.

The kernel declaration (`onnx_custom.runtime.KernelSpec`) carries the spec's inputs, outputs,
attributes, dtypes and a shape function made from the same shape rules as the fake kernel; the
ONNX ``OpSchema`` is made from it by `onnx_custom.runtime.schemas.make_schema`, so the type
constraints are the spec's dtype lists.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from onnx_custom.errors import KernelError
from onnx_custom.runtime.abi import NAME_TO_ELEM, elem_to_numpy
from onnx_custom.runtime.kernel_spec import KernelSpec, make_spec
from onnx_custom.runtime.registry import KernelRegistry
from onnx_custom.runtime.types import TensorInfo, broadcast_shapes
from onnx_custom.spec.fields import TensorValue
from onnx_custom.spec.shape_rules import (
    BroadcastRule,
    LikeRule,
    OnnxArithmetic,
    RuleError,
    UnknownShape,
)
from onnx_custom.spec.spec import EAGER, NO_DEFAULT, OpSpec, SpecError
from onnx_custom.translate import attributes

__all__ = [
    "check_function_body",
    "check_kernel_spec",
    "custom_node_translation",
    "eager_kernel",
    "kernel_spec",
    "make_shape_fn",
    "onnx_value",
    "register_onnx_schema",
    "with_node_constants",
]

_LIST_ATTRS: dict[str, Callable[[Any], Any]] = {
    "int[]": attributes.ints,
    "float[]": attributes.floats,
    "str[]": attributes.strings,
}
_SCALAR_ATTRS: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "bool": int,
    "float": float,
    "str": str,
    "tensor": lambda v: v.numpy(),
}


def _typed_attribute(attr: Any, value: Any) -> Any:
    convert = _LIST_ATTRS.get(attr.type) or _SCALAR_ATTRS[attr.type]
    return convert(value)


def onnx_value(value: Any) -> Any:
    """A node constant as translations and kernels take it (a tensor constant as numpy)."""
    return value.numpy() if isinstance(value, TensorValue) else value


def custom_node_translation(spec: OpSpec) -> Callable[..., Any]:
    """``fn(g, *inputs, **attributes)`` emitting the spec's node: tensor arguments become node
    inputs (a variadic list spread out), every other argument a typed attribute of its name, and
    the node's constant attributes are written as declared."""
    node, n_outputs = spec.node_type, len(spec.outputs)
    assert node is not None
    constants = {a.name: _typed_attribute(a, a.default) for a in spec.node_attributes}

    def translate(g: Any, *inputs: Any, **attrs: Any) -> Any:
        values: list[Any] = []
        for item, value in zip(spec.inputs, inputs, strict=True):
            if item.variadic:
                values.extend(value or ())
            else:
                values.append(value)
        typed: dict[str, Any] = {}
        for attr in spec.attributes:
            value = attrs.get(attr.name)
            if value is None:
                value = attr.default
            typed[attr.name] = _typed_attribute(attr, value)
        return g.op(node, *values, outputs=n_outputs, **typed, **constants)

    translate.__name__ = "custom_node"
    translate.__qualname__ = f"custom_node[{spec.name} -> {node}]"
    translate.__doc__ = (  # the torch schema, as translations document it
        f"{spec.op_name}{spec.schema}"
    )
    return translate


def with_node_constants(spec: OpSpec, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A standard translation that also receives the node's constant attributes (``alpha=2.0``
    for ``onnx_custom::my_add``) as keywords: one function serves as translation and function body.
    """
    if not spec.node_attributes:
        return fn
    constants = {a.name: onnx_value(a.default) for a in spec.node_attributes}

    def translate(g: Any, *inputs: Any, **attrs: Any) -> Any:
        return fn(g, *inputs, **attrs, **constants)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(translate, name, getattr(fn, name, None))
    return translate


# -- kernel declaration -----------------------------------------------------------------------


def _onnx_env(
    spec: OpSpec, infos: Sequence[TensorInfo | None], attrs: dict[str, Any]
) -> dict[str, Any]:
    env: dict[str, Any] = {}
    cursor = 0
    for item in spec.inputs:
        if item.variadic:
            env[item.name] = [
                None if i is None or i.shape is None else list(i.shape) for i in infos[cursor:]
            ]
            if any(s is None for s in env[item.name]):
                env[item.name] = None
            continue
        info = infos[cursor] if cursor < len(infos) else None
        env[item.name] = None if info is None or info.shape is None else list(info.shape)
        cursor += 1
    env.update(attrs)
    return env


def _input_info(spec: OpSpec, name: str, infos: Sequence[TensorInfo | None]) -> TensorInfo | None:
    index = [i.name for i in spec.inputs].index(name)
    return infos[index] if index < len(infos) else None


def make_shape_fn(
    spec: OpSpec, meta: Callable[..., Any] | None, check: Callable[..., Any] | None = None
) -> Callable[..., list[TensorInfo]]:
    """``shape_fn(inputs, attrs)`` for the kernel: dtypes from the dtype rules, shapes from the
    shape rules over ONNX dims (symbolic names kept where provable, unknown dims None). When the
    inputs break a shape rule, the op's validator ``check`` (run on meta tensors) gets to say why
    first: its message names the fix, the rule's only the failing index."""
    int_attrs = {a.name for a in spec.attributes if a.type in ("int", "bool", "int[]")}

    def dtype_of(index: int, infos: Sequence[TensorInfo | None]) -> np.dtype[Any]:
        kind, value = spec.dtype_source(index)
        if kind == "fixed":
            return elem_to_numpy(NAME_TO_ELEM[value])
        info = _input_info(spec, value, infos)
        if info is None:
            raise KernelError(
                f"kernel {spec.node_type}: output {spec.outputs[index].name!r} takes its dtype from"
                f" input {value!r}, which is absent"
            )
        return info.dtype

    def shape_of(
        index: int, infos: Sequence[TensorInfo | None], attrs: dict[str, Any]
    ) -> tuple[Any, ...] | None:
        rule = spec.shape_rule(index)
        if rule is None:
            return None
        if isinstance(rule, BroadcastRule):
            return broadcast_shapes(*(i.shape for i in infos if i is not None))
        if isinstance(rule, LikeRule):
            info = _input_info(spec, rule.input, infos)
            return None if info is None else info.shape
        env = _onnx_env(spec, infos, {k: v for k, v in attrs.items() if k in int_attrs})
        try:
            return tuple(rule.evaluate(env, OnnxArithmetic()))
        except UnknownShape:
            return None
        except RuleError as exc:
            if check is not None:
                _check_on_meta(spec, check, infos, attrs)
            raise KernelError(
                f"kernel {spec.node_type}: output {spec.outputs[index].name!r}: {exc}"
            ) from None

    def shape_fn(infos: list[TensorInfo | None], attrs: dict[str, Any]) -> list[TensorInfo]:
        if meta is not None:
            return _meta_shapes(spec, meta, infos, attrs, dtype_of)
        return [
            TensorInfo(dtype_of(i, infos), shape_of(i, infos, attrs))
            for i in range(len(spec.outputs))
        ]

    shape_fn.__qualname__ = f"shape_fn[{spec.name}]"
    return shape_fn


def _builtin_rule(spec: OpSpec) -> str | None:
    """ "like0"/"broadcast" when every output follows that rule with input 0's dtype: the kernel
    host then evaluates it natively, without calling back into Python."""
    first = spec.inputs[0]
    if spec.shape is not None or first.optional or first.variadic:
        return None
    rules = {str(spec.shape_rule(i)) for i in range(len(spec.outputs))}
    dtypes = {spec.dtype_source(i) for i in range(len(spec.outputs))}
    if dtypes != {("like", first.name)} or len(rules) != 1:
        return None
    rule = rules.pop()
    return "like0" if rule == f"like:{first.name}" else "broadcast" if rule == "broadcast" else None


def _check_on_meta(
    spec: OpSpec,
    check: Callable[..., Any],
    infos: Sequence[TensorInfo | None],
    attrs: dict[str, Any],
) -> None:
    """Run the op's validator on meta tensors of these (concrete) shapes; its error propagates."""
    import torch

    from onnx_custom.spec.torch_op import bind_args

    if not all(
        i is None or (i.shape is not None and all(isinstance(d, int) for d in i.shape))
        for i in infos
    ):
        return
    tensors = [
        (
            None
            if i is None
            else torch.empty(
                tuple(int(d) for d in i.shape or ()),  # type: ignore[arg-type]
                dtype=_torch_dtype(i.dtype),
                device="meta",
            )
        )
        for i in infos
    ]
    bound = bind_args(spec, tensors, {k: _from_onnx_attr(spec, k, v) for k, v in attrs.items()})
    check(*bound.tensors, **bound.attrs)


def _meta_shapes(
    spec: OpSpec,
    meta: Callable[..., Any],
    infos: Sequence[TensorInfo | None],
    attrs: dict[str, Any],
    dtype_of: Callable[..., Any],
) -> list[TensorInfo]:
    """Run the meta function on meta tensors when every dim is known; else shapes are unknown."""
    import torch

    from onnx_custom.spec.torch_op import bind_args

    known = all(
        i is None or (i.shape is not None and all(isinstance(d, int) for d in i.shape))
        for i in infos
    )
    shapes: list[Any] = [None] * len(spec.outputs)
    if known:
        tensors: list[Any] = []
        for info in infos:
            shape = () if info is None or info.shape is None else tuple(int(d) for d in info.shape)  # type: ignore[arg-type]
            tensors.append(
                None
                if info is None
                else torch.empty(shape, dtype=_torch_dtype(info.dtype), device="meta")
            )
        bound = bind_args(spec, tensors, {k: _from_onnx_attr(spec, k, v) for k, v in attrs.items()})
        try:
            result = meta(*bound.tensors, **bound.attrs)
            outs = list(result) if isinstance(result, (tuple, list)) else [result]
            shapes = [tuple(o.shape) for o in outs]
        except Exception:  # data-dependent meta functions: leave the shapes unknown
            pass
    return [
        TensorInfo(dtype_of(i, infos), shapes[i] if i < len(shapes) else None)
        for i in range(len(spec.outputs))
    ]


def _torch_dtype(dtype: np.dtype[Any]) -> Any:
    from onnx_custom.spec.spec import TORCH_DTYPES

    return TORCH_DTYPES["bfloat16" if dtype.name == "bfloat16" else str(dtype)]


def _from_onnx_attr(spec: OpSpec, name: str, value: Any) -> Any:
    """ONNX carries bool attributes as INT; hand the math the type the spec declares."""
    attr = next((a for a in spec.attributes if a.name == name), None)
    return bool(value) if attr is not None and attr.type == "bool" and value is not None else value


def _kernel_wrapper(spec: OpSpec, fn: Callable[..., Any]) -> Callable[..., Any]:
    bools = [a.name for a in (*spec.attributes, *spec.node_attributes) if a.type == "bool"]
    if not bools:
        return fn

    def kernel(*arrays: Any, **attrs: Any) -> Any:
        for name in bools:
            if name in attrs:
                attrs[name] = bool(attrs[name])
        return fn(*arrays, **attrs)

    kernel.__qualname__ = getattr(fn, "__qualname__", "kernel")
    kernel.__doc__ = fn.__doc__
    return kernel


def _kernel_attrs(spec: OpSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in (*spec.attributes, *spec.node_attributes):
        default: Any = attr.onnx_default
        if default is NO_DEFAULT:
            out[attr.name] = attr.onnx_type
            continue
        default = list(default) if isinstance(default, tuple) else onnx_value(default)
        out[attr.name] = (attr.onnx_type, int(default) if attr.type == "bool" else default)
    return out


def eager_kernel(spec: OpSpec) -> Callable[..., Any]:
    """``kernel="eager"``: the node runs the torch op itself (same validation, same math) on
    torch views of ONNX Runtime's buffers, without autograd bookkeeping."""
    import torch

    names = [i.name for i in spec.inputs]
    variadic = bool(spec.inputs) and spec.inputs[-1].variadic

    def kernel(*tensors: Any, **attrs: Any) -> Any:
        if variadic:
            tensors = (*tensors[: len(names) - 1], list(tensors[len(names) - 1 :]))
        op = getattr(getattr(torch.ops, spec.namespace), spec.op_name).default
        with torch.inference_mode():  # keywords: attributes may sit between inputs in the schema
            return op(
                **dict(zip(names, tensors, strict=False)),
                **{a.name: attrs[a.name] for a in spec.attributes},
            )

    kernel.__qualname__ = kernel.__name__ = f"eager[{spec.name}]"
    kernel.__doc__ = f"{spec.node_type}: runs the eager op {spec.name} (torch tensors)."
    return kernel


def kernel_spec(
    spec: OpSpec,
    fn: Callable[..., Any] | None,
    meta: Callable[..., Any] | None,
    function: Any,
    check: Callable[..., Any] | None = None,
) -> KernelSpec:
    """The kernel declaration of the spec's node (``fn`` None:
    a declaration for the schema only)."""
    node = spec.node_type
    assert node is not None
    tensor_type = "numpy"
    if fn is None:

        def fn(*_: Any, **__: Any) -> Any:
            raise KernelError(
                f"{node} has no Python kernel (spec {spec.name}); run it with the native library or"
                " a function body."
            )

    elif fn == EAGER:
        fn, tensor_type = eager_kernel(spec), "torch"
    params = inspect.signature(fn).parameters if callable(fn) else {}
    out_mode = "out" in params
    inputs = [f"{i.name}{'?' if i.optional else '*' if i.variadic else ''}" for i in spec.inputs]
    dtypes = {i.name: list(i.dtypes) for i in spec.inputs}
    dtypes.update({o.name: list(spec.output_dtypes(n)) for n, o in enumerate(spec.outputs)})
    made = make_spec(
        node,
        _kernel_wrapper(spec, fn),
        inputs=inputs,
        outputs=[o.name for o in spec.outputs],
        attrs=_kernel_attrs(spec),
        dtypes=dtypes,
        shape_fn=_builtin_rule(spec) or make_shape_fn(spec, meta, check),
        function=function,
        tensor_type=tensor_type,
        out=out_mode,
    )
    if spec.doc:
        made = dataclasses.replace(made, doc=spec.doc)
    return made


def check_kernel_spec(spec: OpSpec, kernel: KernelSpec | KernelRegistry) -> KernelSpec:
    """A kernel declared elsewhere must serve the spec's node with the spec's signature and at
    least the spec's dtypes (the eager op must never accept what the kernel refuses)."""
    node = spec.node_type
    if isinstance(kernel, KernelRegistry):
        found = kernel.get(node or "")
        if found is None:
            raise SpecError(
                f"op {spec.name}: the kernel registry given as kernel has no kernel for {node}; it"
                f" has {kernel.names()}; fix: register one or name the right registry.",
                op=spec.name,
                key=("kernel",),
            )
        kernel = found

    def fail(problem: str, fix: str) -> SpecError:
        return SpecError(
            f"op {spec.name}: kernel {kernel.name} {problem}; fix: {fix}.",
            op=spec.name,
            key=("kernel",),
        )

    if kernel.name != node:
        raise fail(
            f"serves {kernel.name}, but the spec emits {node}",
            "point kernel at the kernel of the spec's node, or change op_type/domain",
        )
    want_inputs = [
        (i.name, "variadic" if i.variadic else "optional" if i.optional else "required")
        for i in spec.inputs
    ]
    got_inputs = [(p.name, p.kind) for p in kernel.inputs]
    if want_inputs != got_inputs:
        raise fail(
            f"declares inputs {got_inputs}, the spec {want_inputs}",
            "declare the same inputs, in the same order",
        )
    if len(kernel.outputs) != len(spec.outputs):
        raise fail(
            f"declares {len(kernel.outputs)} output(s), the spec {len(spec.outputs)}",
            "declare one output per spec output",
        )
    want_attrs = {a.name: a.onnx_type for a in (*spec.attributes, *spec.node_attributes)}
    got_attrs = {a.name: a.type for a in kernel.attrs}
    if want_attrs != got_attrs:
        raise fail(
            f"declares attributes {got_attrs}, the spec {want_attrs}",
            "declare the same attributes with the same types",
        )
    for item, param in zip(spec.inputs, kernel.inputs, strict=True):
        extra = [d for d in item.dtypes if d not in param.dtypes]
        if extra:
            raise fail(
                f"accepts {', '.join(param.dtypes)} for input {item.name!r}, but the spec (and so"
                f" the eager op) also accepts {', '.join(extra)}",
                f"remove {', '.join(extra)} from the spec's dtype list for {item.name!r}, or widen"
                " the kernel's dtypes",
            )
    return kernel


def check_function_body(spec: OpSpec, declaration: KernelSpec) -> None:
    """The function body must build, and take the node's inputs, outputs and attributes."""
    from onnx_custom.function_bodies.embed import function_proto

    def fail(problem: str, fix: str) -> SpecError:
        return SpecError(
            f"op {spec.name}: the function body {problem}; fix: {fix}.",
            op=spec.name,
            key=("function",),
        )

    try:
        body = function_proto(declaration)
    except Exception as exc:  # a builder that raises, or an object that is no function body
        raise fail(
            f"could not be built ({type(exc).__name__}: {exc})",
            "give an onnx.FunctionProto, an onnxscript function or a zero-argument builder"
            " returning one",
        ) from None
    assert body is not None
    if not any(i.variadic or i.optional for i in spec.inputs) and len(body.input) != len(
        spec.inputs
    ):
        raise fail(
            f"takes {len(body.input)} input(s) {list(body.input)}, the spec declares"
            f" {len(spec.inputs)}",
            "give the body one input per spec input, in order",
        )
    if len(body.output) != len(spec.outputs):
        raise fail(
            f"has {len(body.output)} output(s) {list(body.output)}, the spec declares"
            f" {len(spec.outputs)}",
            "give the body one output per spec output",
        )
    declared = {a.name for a in (*spec.attributes, *spec.node_attributes)}
    unknown = sorted((set(body.attribute) | {a.name for a in body.attribute_proto}) - declared)
    if unknown:
        raise fail(
            f"reads attribute(s) {unknown} that the spec does not declare (it has"
            f" {sorted(declared)})",
            "declare them in attr_desc or rename them in the body",
        )


# -- ONNX OpSchema ----------------------------------------------------------------------------

_schema_lock = threading.Lock()


def register_onnx_schema(kernel: KernelSpec) -> Callable[[], None] | None:
    """Register the node's OpSchema with onnx (checker, shape inference); returns its undo, or
    None when a schema for the node already exists (someone else's: left alone)."""
    from onnx_custom.runtime.schemas import make_schema

    with _schema_lock:
        if onnx.defs.has(kernel.op_type, kernel.domain):
            return None
        onnx.defs.register_schema(make_schema(kernel))

    def undo() -> None:
        with _schema_lock:
            if onnx.defs.has(kernel.op_type, kernel.domain):
                onnx.defs.deregister_schema(kernel.op_type, 1, kernel.domain)

    return undo
