"""The torch side of a spec: the ``torch.library`` op, its fake kernel and its autograd formula.

The op is a ``torch.library.custom_op`` with the spec's schema (so opcheck, torch.export and
autograd treat it like any custom op); an op that a library already defines (a C++ extension) is
adopted instead, after checking that its schema is the spec's. The fake kernel comes from the
shape rules and never calls ``int()`` on a dim, so symbolic (dynamic) dims stay symbolic.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from onnx_custom.common.torch_chatter import drop_fake_tensor_logs_of_typed_errors
from onnx_custom.errors import InvalidArgumentError, OnnxCustomError
from onnx_custom.spec.shape_rules import (
    Arithmetic,
    BroadcastRule,
    LikeRule,
    RuleError,
    UnknownShape,
)
from onnx_custom.spec.spec import TORCH_DTYPES, OpSpec, SpecError

__all__ = [
    "BoundArgs",
    "TorchOp",
    "arguments_tuple",
    "bind_args",
    "existing_schema",
    "make_op",
    "op_arguments",
]


@dataclasses.dataclass(frozen=True)
class BoundArgs:
    """A call's arguments split the spec's way: tensor inputs in order, attributes by name."""

    tensors: tuple[Any, ...]
    attrs: dict[str, Any]


def bind_args(spec: OpSpec, args: Sequence[Any], kwargs: dict[str, Any]) -> BoundArgs:
    """Positional args in schema order (`OpSpec.arguments`), keywords by name, defaults filled."""
    names = [a.name for a in spec.arguments]
    if len(args) > len(names):
        raise TypeError(
            f"{spec.name} takes {len(names)} arguments ({', '.join(names)}) but {len(args)} were"
            " given"
        )
    values = dict(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key not in names or key in values:
            raise TypeError(
                f"{spec.name} got an unexpected or repeated argument {key!r}; its arguments are"
                f" {names}"
            )
        values[key] = value
    tensors: list[Any] = []
    for item in spec.inputs:
        if item.name not in values and not item.optional:
            raise TypeError(f"{spec.name} is missing the input {item.name!r}")
        tensors.append(values.get(item.name))
    attrs: dict[str, Any] = {}
    for attr in spec.attributes:
        if attr.name in values:
            attrs[attr.name] = values[attr.name]
        elif attr.has_default:
            attrs[attr.name] = (
                list(attr.default) if isinstance(attr.default, tuple) else attr.default
            )
        else:
            raise TypeError(f"{spec.name} is missing the attribute {attr.name!r} ({attr.type})")
    return BoundArgs(tuple(tensors), attrs)


@functools.cache
def _arguments_type(op_name: str, fields: tuple[str, ...]) -> Any:
    return collections.namedtuple(f"{op_name}_arguments", fields, rename=True)  # type: ignore[misc]


def arguments_tuple(spec: OpSpec, bound: BoundArgs) -> tuple[Any, ...]:
    """The call's arguments in schema order as a named tuple (``args.x``, ``args.alpha``)."""
    values = dict(zip((i.name for i in spec.inputs), bound.tensors, strict=True))
    values.update(bound.attrs)
    fields = tuple(a.name for a in spec.arguments)
    return _arguments_type(spec.op_name, fields)(*(values[f] for f in fields))  # type: ignore[no-any-return]


def op_arguments(spec: OpSpec) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """Decorator: ``fn(args)`` reading the op's arguments from one named tuple (``args.depth``)
    becomes a function taking them as the torch op does (schema order, keywords, defaults), e.g.
    a validator for `OpSpec.check` that does not restate the signature."""

    def decorate(fn: Callable[[Any], Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(arguments_tuple(spec, bind_args(spec, args, kwargs)))

        del call.__wrapped__  # its signature is the op's, not fn's
        params = [
            inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for a in spec.arguments
        ]
        call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return call

    return decorate


def _present(spec: OpSpec, tensors: Sequence[Any]) -> list[tuple[str, torch.Tensor]]:
    out: list[tuple[str, torch.Tensor]] = []
    for item, value in zip(spec.inputs, tensors, strict=True):
        if value is None:
            continue
        for element in value if item.variadic else [value]:
            out.append((item.name, element))
    return out


def check_input_dtypes(spec: OpSpec, tensors: Sequence[Any]) -> None:
    """The eager and fake kernels accept exactly the declared dtypes (the kernels' too)."""
    for name, tensor in _present(spec, tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"{spec.name}: input {name!r} must be a torch.Tensor, got {type(tensor).__name__}"
            )
        allowed = spec.input(name).dtypes
        if str(tensor.dtype).removeprefix("torch.") not in allowed:
            raise TypeError(
                f"{spec.name}: input {name!r} has dtype {tensor.dtype}; the spec declares"
                f" {', '.join(allowed)}; fix: cast the input, or add the dtype to the spec (and"
                " make sure the eager math and every kernel support it)"
            )


def output_dtype(spec: OpSpec, index: int, tensors: Sequence[Any]) -> torch.dtype:
    kind, value = spec.dtype_source(index)
    if kind == "fixed":
        return TORCH_DTYPES[value]
    source = tensors[[i.name for i in spec.inputs].index(value)]
    if isinstance(source, (list, tuple)):
        source = source[0] if source else None
    if source is None:
        raise TypeError(
            f"{spec.name}: output {spec.outputs[index].name!r} takes its dtype from input"
            f" {value!r}, which is absent"
        )
    return source.dtype


def output_shape(spec: OpSpec, index: int, bound: BoundArgs) -> list[Any]:
    """Shape of output ``index`` from its rule, on real or fake tensors (SymInts stay symbolic)."""
    rule = spec.shape_rule(index)
    present = _present(spec, bound.tensors)
    if isinstance(rule, BroadcastRule):
        return list(torch.broadcast_shapes(*(t.shape for _, t in present)))
    env: dict[str, Any] = {}
    for item, value in zip(spec.inputs, bound.tensors, strict=True):
        if value is None:
            env[item.name] = None
        else:
            env[item.name] = [list(v.shape) for v in value] if item.variadic else list(value.shape)
    if isinstance(rule, LikeRule):
        shape = env[rule.input]
        if shape is None:
            raise TypeError(
                f"{spec.name}: output {spec.outputs[index].name!r} is shaped like input"
                f" {rule.input!r}, which is absent"
            )
        return shape[0] if spec.input(rule.input).variadic else shape
    assert rule is not None
    env.update(bound.attrs)
    try:
        return rule.evaluate(env, Arithmetic())
    except UnknownShape as exc:
        raise TypeError(
            f"{spec.name}: the shape rule of output {spec.outputs[index].name!r} uses the absent"
            f" optional input {exc.args[0]!r}"
        ) from None
    except RuleError as exc:
        raise ValueError(f"{spec.name}: output {spec.outputs[index].name!r}: {exc}") from None


# Input signatures (shapes, dtypes, attributes) per op whose eager outputs are compared with the
# meta function's: enough to catch a wrong rule, bounded so a long run pays nothing more.
_META_CHECKS = 16


def _first_tensor(spec: OpSpec, tensors: Sequence[Any]) -> torch.Tensor:
    return _present(spec, tensors)[0][1]


def check_inputs_present(spec: OpSpec, tensors: Sequence[Any]) -> None:
    """Every required input is given and every given one is a tensor (torch passes ``None`` for a
    ``Tensor`` argument straight to the Python kernel, where it became an AttributeError)."""
    for item, value in zip(spec.inputs, tensors, strict=True):
        if value is None and item.optional:
            continue
        for element in value if item.variadic and isinstance(value, (list, tuple)) else [value]:
            if not isinstance(element, torch.Tensor):
                what = "None" if element is None else f"a {type(element).__name__}"
                raise InvalidArgumentError(
                    f"{spec.name}: input {item.name!r} must be a torch.Tensor; received {what}. "
                    f"Fix: pass a tensor for {item.name!r}"
                    + (" (or leave it out: it is optional)." if item.optional else ".")
                )


def _run_check(spec: OpSpec, check: Callable[..., Any] | None, bound: BoundArgs) -> None:
    """Inputs present, the spec's validator, then the declared dtypes (the validator's messages
    come first). The validator's plain ValueError/TypeError becomes an `InvalidArgumentError`
    (still both) with the same message, so every spec op's bad input is typed alike."""
    check_inputs_present(spec, bound.tensors)
    if check is not None:
        try:
            check(*arguments_tuple(spec, bound))
        except OnnxCustomError:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(str(exc)) from exc
    check_input_dtypes(spec, bound.tensors)


# our fake kernels raise typed errors; torch logs TypeErrors
drop_fake_tensor_logs_of_typed_errors()


def make_fake(
    spec: OpSpec, meta: Callable[..., Any] | None, check: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """The fake (meta) kernel: the Python meta function, or empty outputs shaped by the rules."""

    def fake(*args: Any, **kwargs: Any) -> Any:
        bound = bind_args(spec, args, kwargs)
        _run_check(spec, check, bound)
        like = _first_tensor(spec, bound.tensors)
        if meta is not None:
            return _on_device_of(spec, like, meta_outputs(spec, meta, bound))
        outs = [
            like.new_empty(output_shape(spec, i, bound), dtype=output_dtype(spec, i, bound.tensors))
            for i in range(len(spec.outputs))
        ]
        return outs[0] if len(outs) == 1 else tuple(outs)

    fake.__qualname__ = fake.__name__ = f"fake[{spec.name}]"
    return fake


def meta_outputs(spec: OpSpec, meta: Callable[..., Any], bound: BoundArgs) -> list[torch.Tensor]:
    """What the spec's meta function returns for ``bound``, as a list with one tensor per
    declared output of the declared dtype; a `SpecError` with the fix otherwise (a meta function
    returning None would otherwise give the dynamo exporter an op with no outputs)."""
    result = meta(*bound.tensors, **bound.attrs)
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    where = f"op {spec.name}: the meta function (shape) {getattr(meta, '__qualname__', meta)!r}"
    names = [o.name for o in spec.outputs]
    if len(outs) != len(names) or not all(isinstance(o, torch.Tensor) for o in outs):
        got = (
            "None"
            if result is None
            else (
                f"{type(result).__name__} with {len(outs)} item(s)"
                f" ({', '.join(type(o).__name__ for o in outs)})"
            )
        )
        raise SpecError(
            f"{where} returned {got}; expected {len(names)} tensor(s) {names}, shaped like the "
            "impl's outputs; fix: return e.g. torch.empty(..., device='meta') or x.new_empty(...) "
            "per output (a missing `return`?).",
            op=spec.name,
            key=("shape",),
        )
    for index, out in enumerate(outs):
        want = output_dtype(spec, index, bound.tensors)
        if out.dtype != want:
            raise SpecError(
                f"{where} returned output {names[index]!r} as {out.dtype}; expected {want} (the"
                f" spec's dtype for it: {spec.outputs[index].dtype or 'like the first input'});"
                " fix: pass dtype= to torch.empty, or correct the spec.",
                op=spec.name,
                key=("shape",),
            )
    return outs


def _on_device_of(spec: OpSpec, like: torch.Tensor, outs: list[torch.Tensor]) -> Any:
    """Meta functions written as the op-adaptation articles write them return
    ``torch.empty(..., device="meta")`` (or tensors on some device): the fake kernel's outputs
    must be on the inputs' (fake) device, or opcheck, torch.export and inductor reject them.
    ``new_empty`` keeps symbolic dims symbolic."""
    moved = [
        (
            o
            if o.device == like.device and type(o) is type(like)
            else like.new_empty(o.shape, dtype=o.dtype)
        )
        for o in outs
    ]
    return moved[0] if len(spec.outputs) == 1 else tuple(moved)


def _check_against_meta(
    spec: OpSpec, meta: Callable[..., Any], bound: BoundArgs, outs: Sequence[torch.Tensor]
) -> None:
    """The eager outputs have the shapes the meta function claims (the dynamo exporter writes
    the meta function's shapes into the file): a wrong rank or size is a `SpecError` here, at
    the first eager call (TorchScript export, verify, check_op), not a silently wrong file."""
    fakes = BoundArgs(
        tuple(
            (
                None
                if t is None
                else [v.to("meta") for v in t]
                if isinstance(t, (list, tuple))
                else t.to("meta")
            )
            for t in bound.tensors
        ),
        bound.attrs,
    )
    try:
        claimed = meta_outputs(spec, meta, fakes)
    except SpecError:
        raise
    except Exception:  # e.g. a data-dependent size (torch.library.get_ctx()) needs fake mode:
        return  # nothing to compare here; the fake kernel reports its own problems
    for declared, out, claim in zip(spec.outputs, outs, claimed, strict=True):
        if list(out.shape) != list(claim.shape):
            raise SpecError(
                f"op {spec.name}: the meta function (shape) {getattr(meta, '__qualname__', meta)!r}"
                f" says output {declared.name!r} has shape {list(claim.shape)} (rank"
                f" {claim.dim()}), but the impl returned shape {list(out.shape)} (rank {out.dim()})"
                " for inputs"
                f" {[list(t.shape) for t in bound.tensors if isinstance(t, torch.Tensor)]};"
                " expected the same; fix: correct the meta function (it must compute the impl's"
                " output shapes).",
                op=spec.name,
                key=("shape",),
            )


def make_eager(
    spec: OpSpec,
    impl: Callable[..., Any],
    check: Callable[..., Any] | None = None,
    meta: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """The eager kernel: the declared math, with the declared dtypes, output count and shapes
    enforced; outputs are returned contiguous (as the fake kernel makes them)."""
    check_shapes = spec.shape is None and all(o.shape is not None for o in spec.outputs)
    checked: set[Any] = set()  # input signatures whose shapes the meta function was held to

    def eager(*args: Any, **kwargs: Any) -> Any:
        bound = bind_args(spec, args, kwargs)
        _run_check(spec, check, bound)
        result = impl(*bound.tensors, **bound.attrs)
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(outs) != len(spec.outputs) or not all(isinstance(o, torch.Tensor) for o in outs):
            raise TypeError(
                f"{spec.name}: impl returned {type(result).__name__} with {len(outs)} item(s); the"
                f" spec declares {len(spec.outputs)} tensor output(s)"
                f" {[o.name for o in spec.outputs]}; fix: return one tensor per output"
            )
        for index, (out, declared) in enumerate(zip(outs, spec.outputs, strict=True)):
            want = output_dtype(spec, index, bound.tensors)
            if out.dtype != want:
                raise TypeError(
                    f"{spec.name}: impl returned output {declared.name!r} as {out.dtype}; the spec"
                    f" says {want} ({declared.dtype or 'like the first input'}); fix: cast it or"
                    " correct the spec"
                )
            if check_shapes:
                shape = output_shape(spec, index, bound)
                if list(out.shape) != shape:
                    raise ValueError(
                        f"{spec.name}: impl returned output {declared.name!r} with shape"
                        f" {list(out.shape)}; its shape rule {declared.shape!r} gives {shape}; fix:"
                        " the math or the rule"
                    )
        if meta is not None and len(checked) < _META_CHECKS:
            key = (
                *((tuple(t.shape), t.dtype) for _, t in _present(spec, bound.tensors)),
                repr(bound.attrs),
            )
            if key not in checked:
                _check_against_meta(spec, meta, bound, outs)
                checked.add(key)
        # Outputs are contiguous, like the fake kernel's: their layout never depends on the math.
        outs = [o.contiguous() for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    eager.__qualname__ = eager.__name__ = f"eager[{spec.name}]"
    return eager


def make_no_device_kernel(spec: OpSpec) -> Callable[..., Any]:
    """The CompositeExplicitAutograd kernel of an op whose eager math serves only ``spec.devices``:
    it never computes, it names what is wrong. torch sends it the calls no device kernel takes: a
    call holding no tensor at all (``op(None)``, whose dispatch key set is empty) and tensors on
    another device."""

    def no_device(*args: Any, **kwargs: Any) -> Any:
        bound = bind_args(spec, args, kwargs)
        check_inputs_present(spec, bound.tensors)
        devices = sorted({t.device.type for _, t in _present(spec, bound.tensors)})
        raise InvalidArgumentError(
            f"{spec.name}: its kernels serve devices {list(spec.devices)}; received tensors on"
            f" {devices or 'no device'}. Fix: move the inputs to one of {list(spec.devices)}."
        )

    no_device.__qualname__ = no_device.__name__ = f"no_device[{spec.name}]"
    return no_device


def named_inputs(
    spec: OpSpec, setup_context: Callable[..., Any] | None
) -> Callable[..., Any] | None:
    """``setup_context(ctx, inputs, output)`` where ``inputs`` is a named tuple (``inputs.x``,
    ``inputs.alpha``): still the tuple torch passes, without repeating the signature to unpack it.
    """
    if setup_context is None:
        return None
    fields = tuple(a.name for a in spec.arguments)

    def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> Any:
        return setup_context(ctx, _arguments_type(spec.op_name, fields)(*inputs), output)

    setup.__qualname__ = getattr(setup_context, "__qualname__", "setup_context")
    return setup


def gradients_by_name(
    spec: OpSpec, backward: Callable[..., Any] | None
) -> Callable[..., Any] | None:
    """``backward(ctx, *grads)`` may return ``{input name: gradient}``: the tuple torch expects
    (one entry per argument, in schema order, None for the rest) is made from it."""
    if backward is None:
        return None
    names = [a.name for a in spec.arguments]
    inputs = {i.name for i in spec.inputs}

    def run(ctx: Any, *grads: Any) -> Any:
        result = backward(ctx, *grads)
        if not isinstance(result, Mapping):
            return result
        unknown = sorted(set(result) - inputs)
        if unknown:
            raise TypeError(
                f"{spec.name}: backward returned gradients for {unknown}, which are not inputs;"
                f" expected names from {sorted(inputs)}"
            )
        return tuple(result.get(name) for name in names)

    run.__qualname__ = getattr(backward, "__qualname__", "backward")
    return run


def existing_schema(name: str) -> Any:
    """The default overload's schema of op ``name`` if torch knows it, else None."""
    schemas = torch._C._jit_get_schemas_for_operator(name)
    return next((s for s in schemas if s.overload_name == ""), None)


def _describe_args(schema: Any) -> list[tuple[str, str, Any]]:
    return [
        (a.name, str(a.type), a.default_value if a.has_default_value() else "<required>")
        for a in schema.arguments
    ]


@dataclasses.dataclass
class TorchOp:
    """What `make_op` registered with torch; ``undo()`` takes all of it back."""

    overload: Any
    defined: bool  # False when an existing op was adopted
    libraries: list[Any]
    callable: Any = None  # what users call: the CustomOpDef, or torch.ops.<ns>.<op>

    def undo(self) -> None:
        from torch._library import custom_ops

        for lib in reversed(self.libraries):
            lib._destroy()  # torch's own teardown (custom_op uses it when an op is redefined)
        if self.defined:
            name = self.overload._schema.name
            if custom_ops.OPDEF_TO_LIB.get(name) in self.libraries:
                del custom_ops.OPDEF_TO_LIB[name]


def _has_fake(name: str) -> bool:
    from torch._library import simple_registry

    return bool(
        simple_registry.singleton.find(name).fake_impl.kernel is not None
    ) or torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")


def _register_fake_for_caller(lib: Any, op_name: str, fake: Callable[..., Any]) -> None:
    """Register ``fake`` as coming from the first module outside ``onnx_custom.spec`` on the
    stack: a C++ library's ``m.set_python_module(...)`` names the module that registers its
    fake kernels (the one calling `define_op`), and torch checks that it is the registering one."""
    frame, depth = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        ("onnx_custom.spec.", "functools")
    ):
        frame, depth = frame.f_back, depth + 1
    lib._register_fake(op_name, fake, _stacklevel=depth + 1)


def make_op(
    spec: OpSpec,
    impl: Callable[..., Any] | None,
    meta: Callable[..., Any] | None,
    backward: Callable[..., Any] | None,
    setup_context: Callable[..., Any] | None,
    check: Callable[..., Any] | None = None,
) -> TorchOp:
    """Define (or adopt) the torch op and register its fake kernel and autograd formula."""
    from torch._library import custom_ops

    existing = existing_schema(spec.name)
    needs_fake = meta is not None or all(o.shape is not None for o in spec.outputs)
    backward = gradients_by_name(spec, backward)
    if existing is None and impl is None:
        raise SpecError(
            f"op {spec.name}: torch has no such op and the spec has no impl; fix: add impl (the"
            " eager math), or load the library that defines the op before registering the spec.",
            op=spec.name,
            key=("impl",),
        )
    if existing is not None and impl is not None:
        raise SpecError(
            f"op {spec.name}: torch already has this op ({existing}), so the spec cannot define it"
            " with impl; fix: drop impl to adopt the existing op, or rename the spec's op.",
            op=spec.name,
            key=("impl",),
        )
    if existing is None and not needs_fake:
        missing = [o.name for o in spec.outputs if o.shape is None]
        raise SpecError(
            f"op {spec.name}: output(s) {missing} have no shape rule, and the fake kernel (which"
            " the dynamo exporter needs) is made from them; fix: add shape: 'like:x' (or an"
            " expression) to each output, or a meta function as the op's shape.",
            op=spec.name,
            key=("outputs",),
        )
    if existing is not None:
        declared = torch._C.parse_schema(f"{spec.name}{spec.schema}")
        if _describe_args(declared) != _describe_args(existing) or len(declared.returns) != len(
            existing.returns
        ):
            raise SpecError(
                f"op {spec.name}: the existing torch op's schema is {existing}, but the spec"
                f" declares {declared}; fix: make the spec's inputs, attributes (types, defaults)"
                " and outputs match it.",
                op=spec.name,
                key=("inputs",),
            )
        lib = torch.library.Library(spec.namespace, "FRAGMENT")
        packet = getattr(getattr(torch.ops, spec.namespace), spec.op_name)
        op = TorchOp(packet.default, False, [lib], packet)
        try:
            if needs_fake and not _has_fake(spec.name):  # the library's own fake kernel wins
                _register_fake_for_caller(lib, spec.op_name, make_fake(spec, meta, check))
            if backward is not None:
                torch.library.register_autograd(
                    spec.name, backward, setup_context=named_inputs(spec, setup_context), lib=lib
                )
        except Exception:
            op.undo()
            raise
        return op
    assert impl is not None
    opdef = torch.library.custom_op(
        spec.name, mutates_args=(), schema=spec.schema, device_types=tuple(spec.devices) or None
    )(make_eager(spec, impl, check, meta))
    op = TorchOp(opdef._opoverload, True, [custom_ops.OPDEF_TO_LIB[spec.name]], opdef)
    try:
        if spec.devices:
            # With device kernels only, a call holding no tensor (``op(None)``) has an empty
            # dispatch key set, and torch raised NotImplementedError before any check ran. A
            # CompositeExplicitAutograd kernel serves that key (device kernels still win on their
            # devices). Not the Undefined key: torch then takes the op for CompositeImplicit and
            # fake tensors / torch.export run that kernel instead of the fake one.
            op.libraries[0].impl(
                spec.op_name, make_no_device_kernel(spec), "CompositeExplicitAutograd"
            )
        opdef.register_fake(make_fake(spec, meta, check))
        if backward is not None:
            opdef.register_autograd(backward, setup_context=named_inputs(spec, setup_context))
    except Exception:
        op.undo()
        raise
    return op
