"""Output shape rules of op specs: parsed once, evaluated on fake tensors and on ONNX shapes.

A rule is one of

* ``"like:x"``: the shape of input ``x``;
* ``"broadcast"``: numpy broadcasting of every tensor input;
* an expression over input shapes and attributes, e.g. ``"[x.0, w.0]"``,
  ``"x[:-1] + [weight.0]"`` or ``"[d * r for d, r in zip(x, repeats)]"``.

Expressions are parsed with :mod:`ast` and evaluated by walking a whitelist of node types (never
``eval``). An input name stands for its shape (a list of dims; ``x.0`` is ``x[0]``), an attribute
name for its value. Allowed: integer literals, lists (with ``*`` unpacking), indexing and
slicing, ``+ - * // %`` (``+`` of two lists concatenates), unary minus, ``len``, ``max``,
``min``, ``zip``, ``range`` and one-generator list comprehensions.

The same parsed rule runs with two arithmetics: on torch (Sym)Ints for fake kernels, where it never
calls ``int()`` on a symbolic dim (``max``/``min`` become ``torch.sym_max``/``sym_min``), and on
ONNX dims (``int``, a symbolic name ``str``, or ``None`` unknown) for kernel shape functions, where
anything not provably known becomes ``None``.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "ExpressionRule",
    "LikeRule",
    "ShapeRule",
    "UnknownShape",
    "broadcast_rule",
    "parse_shape_rule",
]

# `x.0` is not Python: rewrite it to `x[0]` before parsing (a name, a dot, digits).
_DOT_INDEX = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\.(\d+)\b")
_FUNCTIONS = ("len", "max", "min", "zip", "range")
_ALLOWED_SYNTAX = (
    "integer literals, input and attribute names, x.0 / x[i] / x[a:b], lists [..] with *unpacking, "
    "+ - * // %, unary -, len/max/min/zip/range, [expr for a, b in ...]"
)


class UnknownShape(Exception):
    """Raised while evaluating for ONNX when an input's rank is unknown: the output shape is too."""


class RuleError(ValueError):
    """A rule that cannot be parsed or evaluated; the spec layer turns it into a `SpecError`."""


@dataclasses.dataclass(frozen=True)
class LikeRule:
    """``like:<input>``: the output has the named input's shape."""

    input: str

    @property
    def names(self) -> frozenset[str]:
        return frozenset({self.input})

    def __str__(self) -> str:
        return f"like:{self.input}"


@dataclasses.dataclass(frozen=True)
class BroadcastRule:
    """``broadcast``: numpy broadcasting of every present tensor input."""

    names: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return "broadcast"


broadcast_rule = BroadcastRule()


@dataclasses.dataclass(frozen=True)
class ExpressionRule:
    """A parsed, whitelisted shape expression (see the module docstring)."""

    text: str
    tree: ast.Expression = dataclasses.field(compare=False, repr=False)
    names: frozenset[str] = dataclasses.field(compare=False)

    def __str__(self) -> str:
        return self.text

    def evaluate(self, env: Mapping[str, Any], arith: Arithmetic) -> list[Any]:
        """The output shape: ``env`` maps input names to shapes (lists) and attributes to values."""
        result = _Evaluator(env, arith, self.text).visit(self.tree.body)
        if not isinstance(result, list):
            raise RuleError(
                f"shape rule {self.text!r} gave {result!r}; expected a list of dims, e.g. [x.0,"
                " w.0]."
            )
        for dim in result:
            if isinstance(dim, list):
                raise RuleError(
                    f"shape rule {self.text!r} gave a nested list {result!r}; use + or * to splice"
                    " shapes."
                )
        return result


ShapeRule = LikeRule | BroadcastRule | ExpressionRule


def parse_shape_rule(text: str) -> ShapeRule:
    """Parse ``text`` (raises `RuleError` on syntax outside the whitelist)."""
    if not isinstance(text, str) or not text.strip():
        raise RuleError(f"a shape rule must be a non-empty string; received {text!r}.")
    stripped = text.strip()
    if stripped.startswith("like:"):
        name = stripped[len("like:") :].strip()
        if not name.isidentifier():
            raise RuleError(f"shape rule {text!r}: expected 'like:<input name>'.")
        return LikeRule(name)
    if stripped == "broadcast":
        return broadcast_rule
    source = _DOT_INDEX.sub(r"\1[\2]", stripped)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise RuleError(
            f"shape rule {text!r} is not a valid expression ({exc.msg}); expected 'like:x',"
            " 'broadcast' or an expression such as '[x.0, w.0]'."
        ) from None
    names = _check_syntax(tree, text)
    return ExpressionRule(stripped, tree, frozenset(names))


def _check_syntax(tree: ast.Expression, text: str) -> set[str]:
    """Refuse every node outside the whitelist; return the free names (inputs/attributes)."""
    bound: set[str] = set()
    free: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension):
            if node.ifs or node.is_async:
                raise RuleError(f"shape rule {text!r}: comprehension filters are not supported.")
            for target in ast.walk(node.target):
                if isinstance(target, ast.Name):
                    bound.add(target.id)
                elif not isinstance(target, (ast.Tuple, ast.Store)):
                    raise RuleError(f"shape rule {text!r}: comprehension targets must be names.")
        elif isinstance(node, ast.ListComp):
            if len(node.generators) != 1:
                raise RuleError(f"shape rule {text!r}: use one 'for' per comprehension.")
        elif isinstance(node, ast.Call):
            if (
                not isinstance(node.func, ast.Name)
                or node.func.id not in _FUNCTIONS
                or node.keywords
            ):
                called = ast.unparse(node.func)
                raise RuleError(
                    f"shape rule {text!r}: calling {called!r} is not allowed; allowed functions:"
                    f" {', '.join(_FUNCTIONS)}."
                )
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise RuleError(
                    f"shape rule {text!r}: literal {node.value!r} is not an integer; only integer"
                    " literals are allowed."
                )
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, tuple(_BINARY)):
                raise RuleError(
                    f"shape rule {text!r}: operator {type(node.op).__name__} is not allowed (use +"
                    " - * // %)."
                )
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                raise RuleError(
                    f"shape rule {text!r}: operator {type(node.op).__name__} is not allowed."
                )
        elif not isinstance(node, _NODES):
            raise RuleError(
                f"shape rule {text!r}: {type(node).__name__} syntax is not allowed; allowed:"
                f" {_ALLOWED_SYNTAX}."
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
            is_function = node.id in _FUNCTIONS and _is_called(tree, node)
            if not is_function:
                free.add(node.id)
    return free


def _is_called(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


_NODES = (
    ast.Expression,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.List,
    ast.Tuple,
    ast.Starred,
    ast.Subscript,
    ast.Slice,
    ast.BinOp,
    ast.UnaryOp,
    ast.USub,
    ast.UAdd,
    ast.Call,
    ast.ListComp,
    ast.comprehension,
    ast.Constant,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.FloorDiv,
    ast.Mod,
)


# -- arithmetic on dims ---------------------------------------------------------------------


class Arithmetic:
    """Dim arithmetic for torch (Sym)Ints: Python operators work on SymInts without ``int()``."""

    def binary(self, op: type[ast.operator], a: Any, b: Any) -> Any:
        return _BINARY[op](a, b)

    def neg(self, a: Any) -> Any:
        return -a

    def max(self, values: Sequence[Any]) -> Any:
        import torch

        return _fold(torch.sym_max, values)

    def min(self, values: Sequence[Any]) -> Any:
        import torch

        return _fold(torch.sym_min, values)


def _fold(fn: Callable[[Any, Any], Any], values: Sequence[Any]) -> Any:
    if not values:
        raise RuleError("max()/min() of an empty list")
    out = values[0]
    for value in values[1:]:
        out = fn(out, value)
    return out


class OnnxArithmetic(Arithmetic):
    """Dims are ``int``, a symbolic name (``str``) or ``None``: exact on ints, identities kept
    (``n * 1``, ``n + 0``, ``n // 1``), anything else on a symbolic dim is unknown (``None``)."""

    def binary(self, op: type[ast.operator], a: Any, b: Any) -> Any:
        if isinstance(a, int) and isinstance(b, int):
            return _BINARY[op](a, b)
        if op is ast.Add:
            return a if b == 0 else b if a == 0 else None
        if op is ast.Sub:
            return a if b == 0 else None
        if op is ast.Mult:
            return a if b == 1 else b if a == 1 else 0 if 0 in (a, b) else None
        if op is ast.FloorDiv:
            return a if b == 1 else None
        return None

    def neg(self, a: Any) -> Any:
        return -a if isinstance(a, int) else None

    def max(self, values: Sequence[Any]) -> Any:
        return self._extreme(values, max)

    def min(self, values: Sequence[Any]) -> Any:
        return self._extreme(values, min)

    @staticmethod
    def _extreme(values: Sequence[Any], fn: Callable[..., Any]) -> Any:
        if not values:
            raise RuleError("max()/min() of an empty list")
        if all(isinstance(v, int) for v in values):
            return fn(values)
        return values[0] if all(v == values[0] for v in values) else None


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class _Evaluator:
    """Walks a whitelisted expression (see `_check_syntax`) with an environment."""

    def __init__(self, env: Mapping[str, Any], arith: Arithmetic, text: str) -> None:
        self.scopes: list[Mapping[str, Any]] = [env]
        self.arith = arith
        self.text = text

    def fail(self, message: str) -> RuleError:
        return RuleError(f"shape rule {self.text!r}: {message}")

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:  # _check_syntax refused it already; defensive
            raise self.fail(f"{type(node).__name__} is not allowed")
        return method(node)

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        for scope in reversed(self.scopes):
            if node.id in scope:
                value = scope[node.id]
                if value is None:
                    raise UnknownShape(node.id)
                return list(value) if isinstance(value, tuple) else value
        raise self.fail(f"{node.id!r} is neither an input nor an attribute of the op")

    def visit_List(self, node: ast.List) -> list[Any]:
        out: list[Any] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                out.extend(self._sequence(self.visit(element.value), "*unpacking"))
            else:
                out.append(self.visit(element))
        return out

    visit_Tuple = visit_List

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        value = self._sequence(self.visit(node.value), "indexing")
        if isinstance(node.slice, ast.Slice):
            bounds = [
                None if part is None else self._int(self.visit(part))
                for part in (node.slice.lower, node.slice.upper, node.slice.step)
            ]
            return value[slice(*bounds)]
        index = self._int(self.visit(node.slice))
        if not -len(value) <= index < len(value):
            raise self.fail(f"index {index} is out of range for {value!r} (rank {len(value)})")
        return value[index]

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(left, list) or isinstance(right, list):
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            raise self.fail(
                f"{type(node.op).__name__} of {left!r} and {right!r}; only + joins two lists"
            )
        return self.arith.binary(type(node.op), left, right)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(value, list):
            raise self.fail(f"unary {type(node.op).__name__} of a list {value!r}")
        return self.arith.neg(value) if isinstance(node.op, ast.USub) else value

    def visit_Call(self, node: ast.Call) -> Any:
        name = node.func.id  # type: ignore[attr-defined]
        args = [self.visit(a) for a in node.args]
        if name == "len":
            return len(self._sequence(self._one(args, name), "len()"))
        if name in ("max", "min"):
            values = self._sequence(args[0], f"{name}()") if len(args) == 1 else args
            return self.arith.max(values) if name == "max" else self.arith.min(values)
        if name == "zip":
            return [list(t) for t in zip(*(self._sequence(a, "zip()") for a in args), strict=False)]
        return list(range(*(self._int(a) for a in args)))  # range

    def visit_ListComp(self, node: ast.ListComp) -> list[Any]:
        generator = node.generators[0]
        out: list[Any] = []
        for item in self._sequence(self.visit(generator.iter), "a comprehension"):
            scope: dict[str, Any] = {}
            self._bind(generator.target, item, scope)
            self.scopes.append(scope)
            try:
                out.append(self.visit(node.elt))
            finally:
                self.scopes.pop()
        return out

    def _bind(self, target: ast.AST, value: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
            return
        items = self._sequence(value, "unpacking")
        elts = target.elts  # type: ignore[attr-defined]
        if len(items) != len(elts):
            raise self.fail(f"cannot unpack {items!r} into {len(elts)} names")
        for sub, item in zip(elts, items, strict=True):
            self._bind(sub, item, scope)

    def _one(self, args: list[Any], name: str) -> Any:
        if len(args) != 1:
            raise self.fail(f"{name}() takes one argument, got {len(args)}")
        return args[0]

    def _sequence(self, value: Any, what: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise self.fail(
                f"{what} needs a list (an input's shape or a list attribute), got {value!r}"
            )
        return list(value)

    def _int(self, value: Any) -> int:
        if type(value) is not int:
            raise self.fail(f"indices and range() bounds must be plain ints, got {value!r}")
        return value
