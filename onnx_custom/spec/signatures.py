"""Resolving a spec's code references and checking their parameters against the declaration.

Every piece of math a spec names follows one calling convention: tensor inputs positional in
declaration order, attributes as keywords named as declared. The checks below hold each function
to it when the spec is registered, so a mismatch is reported then, naming the op, the function
and the parameter, instead of deep inside an exporter or ONNX Runtime.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from onnx_custom.spec.fields import TensorValue
from onnx_custom.spec.spec import OpSpec, SpecError

__all__ = [
    "check_backward",
    "check_check_signature",
    "check_math_signature",
    "expected_signature",
    "in_schema_order",
    "inputs_first",
    "resolve",
    "with_taken_constants",
]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

# role -> (leading parameters before the inputs, how a variadic input arrives, extra keywords,
# whether the node's constant attributes are passed too)
_ROLES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], bool]] = {
    "impl": ((), "list", (), False),
    "shape": ((), "list", (), False),
    "translation": (("g",), "list", (), True),
    "kernel": ((), "spread", ("out",), True),
}


def resolve(spec: OpSpec, key: tuple[Any, ...], ref: Any, what: str) -> Any:
    """The object ``ref`` names (``"pkg.module:attr.path"``); objects pass through."""
    if not isinstance(ref, str):
        return ref
    module_name, _, path = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise SpecError(
                f"op {spec.name}: {what} {ref!r}: module {module_name!r} is not importable (no"
                f" module named {exc.name!r}); fix: put its folder on sys.path / PYTHONPATH or"
                " install it.",
                op=spec.name,
                key=key,
            ) from None
        raise _import_failed(spec, key, ref, what, exc) from exc
    except Exception as exc:
        raise _import_failed(spec, key, ref, what, exc) from exc
    for part in path.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise SpecError(
                f"op {spec.name}: {what} {ref!r}: {getattr(obj, '__name__', module_name)!r} has no "
                f"attribute {part!r}.{hint} Fix: name a function defined there.",
                op=spec.name,
                key=key,
            )
        obj = getattr(obj, part)
    return obj


def _import_failed(
    spec: OpSpec, key: tuple[Any, ...], ref: str, what: str, exc: BaseException
) -> SpecError:
    return SpecError(
        f"op {spec.name}: {what} {ref!r}: importing {ref.partition(':')[0]!r} raised "
        f"{type(exc).__name__}: {exc}; fix: the module must import cleanly.",
        op=spec.name,
        key=key,
    )


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without metadata: nothing to check
        return None


def _label(fn: Any, ref: Any) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{ref!r}" if isinstance(ref, str) else f"{getattr(fn, '__module__', '?')}.{name}"


def expected_signature(spec: OpSpec, role: str) -> str:
    """The parameter list a function in ``role`` should have, e.g. ``(x, y, *, alpha)``."""
    if role == "check":
        return f"({', '.join(a.name for a in spec.arguments)})"
    lead, variadic, _, node = _ROLES[role]
    params = list(lead)
    for item in spec.inputs:
        if item.variadic and variadic == "spread":
            params.append(f"*{item.name}")
        else:
            params.append(f"{item.name}=None" if item.optional else item.name)
    attrs = [a.name for a in _attributes(spec, node)]
    if attrs:
        params += ([] if any(p.startswith("*") for p in params) else ["*"]) + attrs
    return f"({', '.join(params)})"


def _attributes(spec: OpSpec, node: bool) -> tuple[Any, ...]:
    """The keyword arguments a role receives: the attributes, and the node's constants for
    functions that build or run the node."""
    return (*spec.attributes, *spec.node_attributes) if node else tuple(spec.attributes)


def check_check_signature(spec: OpSpec, fn: Any, ref: Any) -> None:
    """A validator takes the op's arguments in schema order (or ``*args``)."""
    if not callable(fn):
        raise SpecError(
            f"op {spec.name}: check {ref!r} is a {type(fn).__name__}; expected a function.",
            op=spec.name,
            key=("check",),
        )
    signature = _signature(fn)
    if signature is None:
        return
    names = [a.name for a in spec.arguments]
    try:
        signature.bind(*names)
    except TypeError as exc:
        raise SpecError(
            f"op {spec.name}: check {_label(fn, ref)} cannot take the op's {len(names)} arguments"
            f" ({exc}); expected `def"
            f" {getattr(fn, '__name__', 'check')}{expected_signature(spec, 'check')}` (the op's"
            " arguments in schema order, as the torch op takes them) or a function decorated with"
            f" @onnx_custom.spec.op_arguments(spec); received `{signature}`; fix: take the"
            " arguments in that order.",
            op=spec.name,
            key=("check",),
        ) from None


def in_schema_order(spec: OpSpec, fn: Any) -> bool:
    """True when ``fn`` takes the op's arguments as the torch op does (schema order, attributes
    between the inputs they follow), the other form eager math may have (``impl``, ``shape``)
    when the schema interleaves them."""
    names = [a.name for a in spec.arguments]
    if names == [*(i.name for i in spec.inputs), *(a.name for a in spec.attributes)]:
        return False  # the two forms coincide
    signature = _signature(fn)
    if signature is None:
        return False
    positional = [p.name for p in signature.parameters.values() if p.kind in _POSITIONAL]
    return positional == names


def inputs_first(spec: OpSpec, fn: Any) -> Any:
    """``fn`` callable the machinery's way (``fn(*inputs, **attributes)``), whichever of the two
    forms it has (see `in_schema_order`)."""
    if fn is None or not in_schema_order(spec, fn):
        return fn
    order = [a.name for a in spec.arguments]
    names = [i.name for i in spec.inputs]

    def call(*inputs: Any, **attrs: Any) -> Any:
        values = {**dict(zip(names, inputs, strict=True)), **attrs}
        return fn(*(values[name] for name in order))

    call.__qualname__ = getattr(fn, "__qualname__", "fn")
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


def check_math_signature(spec: OpSpec, fn: Any, role: str, key: tuple[Any, ...], ref: Any) -> None:
    """``fn`` must take the spec's inputs positionally (same names, same order) and its
    attributes as keywords (``**kwargs`` accepted); eager math (``impl``, ``shape``) may instead
    take every argument in the torch schema's order. `SpecError` naming the parameter otherwise."""
    if not callable(fn):
        raise SpecError(
            f"op {spec.name}: {key[0]} {ref!r} is a {type(fn).__name__}; expected a function.",
            op=spec.name,
            key=key,
        )
    signature = _signature(fn)
    if signature is None:
        return
    if role in ("impl", "shape") and in_schema_order(spec, fn):
        return
    lead, variadic, extra, node = _ROLES[role]
    label = _label(fn, ref)
    want = expected_signature(spec, role)

    def fail(problem: str) -> SpecError:
        return SpecError(
            f"op {spec.name}: {key[0]} {label} {problem}; expected `def"
            f" {getattr(fn, '__name__', 'fn')}{want}` (inputs positional in declaration order,"
            f" attributes as keywords); received `{signature}`; fix: rename or reorder its"
            " parameters to match the spec.",
            op=spec.name,
            key=key,
        )

    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    var_positional = next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
    accepts_any_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    wanted = [*lead, *(i.name for i in spec.inputs if not (i.variadic and variadic == "spread"))]
    spread = next((i.name for i in spec.inputs if i.variadic and variadic == "spread"), None)
    for index, name in enumerate(wanted):
        if index >= len(positional):
            if var_positional is None:
                raise fail(f"has no parameter for input {name!r}")
            break
        got = positional[index].name
        if index >= len(lead) and got != name:
            raise fail(
                f"takes parameter {got!r} where input {name!r} (position {index - len(lead)}) is"
                " expected"
            )
    if spread is not None and var_positional is None:
        raise fail(f"has no *{spread} parameter for the variadic input {spread!r}")
    attributes = _attributes(spec, node)
    declared = set(wanted[len(lead) :]) | {a.name for a in attributes} | set(extra)
    if role == "impl":  # eager math may take the node's constants too (`with_taken_constants`)
        declared |= {a.name for a in spec.node_attributes}
    declared |= {p.name for p in positional[: len(lead)]}  # `g` may have any name
    for attr in attributes:
        param = signature.parameters.get(attr.name)
        if param is None and not accepts_any_keyword:
            raise fail(f"does not accept attribute {attr.name!r} as a keyword")
        if param is not None and param.kind == param.POSITIONAL_ONLY:
            raise fail(f"takes attribute {attr.name!r} positional-only")
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in declared:
            continue
        if param.default is param.empty:
            raise fail(
                f"requires parameter {param.name!r}, which is neither an input nor an attribute of"
                " the spec"
            )


def check_backward(spec: OpSpec, backward: Any, setup_context: Any) -> None:
    """``backward(ctx, *grads)`` takes one gradient per output;
    ``setup_context(ctx, inputs, output)``."""
    n = len(spec.outputs)
    for fn, key, count, shape in (
        (
            backward,
            ("backward",),
            1 + n,
            f"(ctx, {', '.join('grad_' + o.name for o in spec.outputs)})",
        ),
        (setup_context, ("setup_context",), 3, "(ctx, inputs, output)"),
    ):
        if fn is None:
            continue
        if not callable(fn):
            raise SpecError(
                f"op {spec.name}: {key[0]} is a {type(fn).__name__}; expected a function {shape}.",
                op=spec.name,
                key=key,
            )
        signature = _signature(fn)
        if signature is None:
            continue
        try:
            signature.bind(*range(count))
        except TypeError as exc:
            raise SpecError(
                f"op {spec.name}: {key[0]} {_label(fn, fn)} cannot be called with {count}"
                f" positional arguments ({exc}); expected `def"
                f" {getattr(fn, '__name__', key[0])}{shape}` for an op with {n} output(s); received"
                f" `{signature}`; fix: take one gradient per output.",
                op=spec.name,
                key=key,
            ) from None


def with_taken_constants(spec: OpSpec, fn: Any) -> Any:
    """Eager math that names some of the node's constant attributes (``node_attributes``, the
    YAML ``node_attr_desc``) as parameters receives them as keywords, so a constant declared
    once reaches the eager op, the kernel, the translations and the function body alike.
    Functions that don't name them are called as before."""
    signature = None if fn is None else _signature(fn)
    if signature is None or not spec.node_attributes:
        return fn
    taken = {
        a.name: a.default.torch() if isinstance(a.default, TensorValue) else a.default
        for a in spec.node_attributes
        if a.name in signature.parameters
    }
    if not taken:
        return fn

    def call(*inputs: Any, **attrs: Any) -> Any:
        return fn(*inputs, **attrs, **taken)

    call.__qualname__ = getattr(fn, "__qualname__", "impl")
    call.__doc__ = getattr(fn, "__doc__", None)
    return call
