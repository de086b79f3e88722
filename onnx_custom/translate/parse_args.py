"""Torch's ``@symbolic_helper.parse_args(...)`` on a torch-style symbolic, checked against the op's
schema: the codes must fit the argument types (checked at registration and at export), and each
argument is handed over as torch's ``_parse_arg`` would make it for its code."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from onnx_custom.errors import SymbolicError

__all__ = [
    "binds_torch_style",
    "check_codes",
    "code_for",
    "convert_argument",
    "is_tensor_type",
    "name_of",
    "parameter_names",
    "parse_args_codes",
    "signature_text",
]

_CODES = {
    "v": "a value, unconverted",
    "i": "an int",
    "f": "a float",
    "b": "a bool",
    "s": "a str",
    "t": "a torch.Tensor",
    "is": "a list of ints",
    "fs": "a list of floats",
    "none": "unused",
}


def is_tensor_type(type_text: str) -> bool:
    return type_text.startswith("Tensor") or type_text in (
        "Optional[Tensor]",
        "List[Tensor]",
        "List[Optional[Tensor]]",
    )


def code_for(type_text: str) -> str:
    """The parse_args code that fits a schema argument type."""
    inner = type_text[len("Optional[") : -1] if type_text.startswith("Optional[") else type_text
    if is_tensor_type(inner):
        return "v"
    return {
        "int": "i",
        "SymInt": "i",
        "float": "f",
        "bool": "b",
        "str": "s",
        "List[int]": "is",
        "List[SymInt]": "is",
        "List[float]": "fs",
    }.get(inner, "v")


def parse_args_codes(fn: Any) -> tuple[str, ...] | None:
    """The codes of torch's ``@parse_args(...)`` on ``fn`` (or a function it wraps), else None."""
    seen = 0
    while fn is not None and seen < 10:
        codes = getattr(fn, "_arg_descriptors", None)
        if isinstance(codes, tuple) and all(isinstance(c, str) for c in codes):
            return codes
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


def name_of(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def parameter_names(fn: Any, count: int) -> list[str]:
    """The user's own names for the op's arguments (after g), for error messages."""
    try:
        params = list(inspect.signature(inspect.unwrap(fn)).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"<argument {i}>" for i in range(count)]


def binds_torch_style(fn: Any, count: int) -> bool:
    """Whether ``fn(g, a0, ..., a{count-1})`` binds (torch's calling convention)."""
    try:
        inspect.signature(fn).bind(None, *range(count))
    except TypeError:
        return False
    except ValueError:  # no signature (a C callable): let the call decide
        return True
    return True


def check_codes(
    target: str, fn: Any, codes: Sequence[str], arguments: Sequence[tuple[str, str]]
) -> None:
    """`SymbolicError` when ``parse_args`` codes cannot fit the op's schema arguments."""
    names = parameter_names(fn, len(arguments))
    unknown = [c for c in codes if c not in _CODES]
    if unknown:
        raise SymbolicError(
            f"{target}: the torch-style symbolic {name_of(fn)} uses @parse_args code(s) {unknown};"
            f" expected codes from {sorted(_CODES)}. Fix: use the code for each argument's type"
            f" ({_codes_hint(arguments)})."
        )
    if len(codes) < len(arguments):
        raise SymbolicError(
            f"{target}: the torch-style symbolic {name_of(fn)} is decorated"
            f" @parse_args{tuple(codes)!r} ({len(codes)} code(s)) but the op passes"
            f" {len(arguments)} argument(s) [{', '.join(f'{n}: {t}' for n, t in arguments)}]."
            f" Expected one code per argument. Fix: @parse_args({_codes_hint(arguments)})."
        )
    for index, (code, (name, type_text), param) in enumerate(
        zip(codes, arguments, names, strict=False)
    ):
        problem = _static_mismatch(code, type_text)
        if problem:
            raise SymbolicError(
                f"{target}: the torch-style symbolic {name_of(fn)} declares @parse_args code "
                f"{code!r} ({_CODES[code]}) for argument {index} ({param!r}; schema: {name}: "
                f"{type_text}), but the op passes {problem}. Fix: use {code_for(type_text)!r} "
                f"for it: @parse_args({_codes_hint(arguments)})."
            )


def _codes_hint(arguments: Sequence[tuple[str, str]]) -> str:
    return ", ".join(repr(code_for(t)) for _, t in arguments)


def _static_mismatch(code: str, type_text: str) -> str:
    """What the op passes when ``code`` cannot hold it ('' when it fits)."""
    inner = type_text[len("Optional[") : -1] if type_text.startswith("Optional[") else type_text
    if code in ("v", "none"):
        return ""
    if is_tensor_type(inner):
        return f"a tensor ({type_text}), which stays a graph value"
    fits = {
        "i": ("int", "SymInt", "bool"),
        "b": ("bool", "int"),
        "f": ("float", "int", "SymInt"),
        "s": ("str",),
        "is": ("List[int]", "List[SymInt]"),
        "fs": ("List[float]", "List[int]"),
        "t": ("int", "float", "bool", "List[int]", "List[float]", "Scalar", "number"),
    }[code]
    return "" if inner in fits or inner in ("Any",) else f"a {type_text}"


def convert_argument(
    target: str, fn: Any, index: int, param: str, code: str, value: Any, type_text: str
) -> Any:
    """``value`` as torch's ``_parse_arg`` would hand it over for ``code``; SymbolicError else."""
    if value is None or code in ("v", "none"):
        return value

    def refuse(expected: str) -> SymbolicError:
        return SymbolicError(
            f"{target}: the torch-style symbolic {name_of(fn)} declares @parse_args code {code!r}"
            f" for argument {index} ({param!r}; schema type {type_text}) and expects {expected},"
            f" but the op passes {type(value).__name__} {value!r:.60}. Fix: use"
            f" {code_for(type_text)!r} for it (or convert inside the function)."
        )

    if code in ("i", "b"):
        if isinstance(value, (bool, numbers.Integral)):
            return bool(value) if code == "b" else int(value)
        raise refuse("an int" if code == "i" else "a bool")
    if code == "f":
        if isinstance(value, numbers.Real):
            return float(value)
        raise refuse("a float")
    if code == "s":
        if isinstance(value, str):
            return value
        raise refuse("a str")
    if code in ("is", "fs"):
        if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Real) for v in value):
            if code == "is" and any(not isinstance(v, numbers.Integral) for v in value):
                raise refuse("a list of ints")
            return [int(v) if code == "is" else float(v) for v in value]
        raise refuse("a list of ints" if code == "is" else "a list of floats")
    if code == "t":
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (numbers.Number, list, tuple)):
            return torch.tensor(value)
        raise refuse("a constant convertible to a tensor")
    return value


def signature_text(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
