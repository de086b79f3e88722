"""Shape rules: one parsed expression, two arithmetics (torch SymInts and ONNX dims), no eval."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from onnx_custom.spec.shape_rules import (
    Arithmetic,
    BroadcastRule,
    ExpressionRule,
    LikeRule,
    OnnxArithmetic,
    RuleError,
    UnknownShape,
    parse_shape_rule,
)

ENV: dict[str, Any] = {"x": [2, 5, 4], "w": [3, 4], "repeats": [2, 1, 3], "k": 2}

# (rule, expected on ENV) -- expected values worked out by hand, not by the evaluator.
CASES = [
    ("[x.0, w.0]", [2, 3]),
    ("x[:-1] + [w.0]", [2, 5, 3]),
    ("[*x[:-1], w.0]", [2, 5, 3]),
    ("[d * r for d, r in zip(x, repeats)]", [4, 5, 12]),
    ("[x.0 * k, x.1 // 2, x.2 % 3, -x.0 + 10]", [4, 2, 1, 8]),
    ("[max(x.0, w.0), min(x)]", [3, 2]),
    ("[len(x)] + x[1:]", [3, 5, 4]),
    ("[x[-1]] + [i * 0 + 1 for i in range(k)]", [4, 1, 1]),
    ("x", [2, 5, 4]),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_expression_on_ints(text: str, expected: list[int]) -> None:
    rule = parse_shape_rule(text)
    assert isinstance(rule, ExpressionRule)
    assert rule.evaluate(ENV, Arithmetic()) == expected
    assert rule.evaluate(ENV, OnnxArithmetic()) == expected  # known dims: both agree


def test_expression_on_symints_stays_symbolic() -> None:
    env = ShapeEnv()
    batch = env.create_unbacked_symint()  # a dim no int() could ever resolve
    rule = parse_shape_rule("[x.0 * 2, w.0, max(x.0, 1)]")
    out = rule.evaluate({"x": [batch, 4], "w": [3, 4]}, Arithmetic())  # type: ignore[union-attr]
    assert isinstance(out[0], torch.SymInt) and str(out[0]) == f"2*{batch}"
    assert out[1] == 3
    assert isinstance(out[2], torch.SymInt)


ONNX_CASES = [
    ("x[:-1] + [w.0]", {"x": ["batch", "seq", 4], "w": [3, 4]}, ["batch", "seq", 3]),
    ("[x.0 * 1, x.0 + 0, x.0 // 1]", {"x": ["batch"]}, ["batch", "batch", "batch"]),
    ("[x.0 * 2, x.0 + 1, x.0 - 1, -x.0]", {"x": ["batch"]}, [None, None, None, None]),
    ("[x.0 * 0, max(x.0, x.0), max(x.0, 3)]", {"x": ["batch"]}, [0, "batch", None]),
    ("[d * r for d, r in zip(x, repeats)]", {"x": ["n", 3], "repeats": [1, 2]}, ["n", 6]),
    ("[x.0, x.1]", {"x": [None, 3]}, [None, 3]),
]


@pytest.mark.parametrize(("text", "env", "expected"), ONNX_CASES, ids=[c[0] for c in ONNX_CASES])
def test_expression_on_onnx_dims_keeps_only_provable_names(
    text: str, env: dict[str, Any], expected: list[Any]
) -> None:
    assert parse_shape_rule(text).evaluate(env, OnnxArithmetic()) == expected  # type: ignore[union-attr]


def test_unknown_rank_raises_unknown_shape() -> None:
    with pytest.raises(UnknownShape):
        parse_shape_rule("[x.0]").evaluate({"x": None}, OnnxArithmetic())  # type: ignore[union-attr]


def test_like_and_broadcast() -> None:
    assert parse_shape_rule("like:x") == LikeRule("x")
    assert parse_shape_rule(" like: weight ").names == frozenset({"weight"})  # type: ignore[union-attr]
    assert isinstance(parse_shape_rule("broadcast"), BroadcastRule)


def test_names_exclude_comprehension_variables_and_functions() -> None:
    rule = parse_shape_rule("[d * r for d, r in zip(x, repeats)] + [len(w)]")
    assert rule.names == frozenset({"x", "repeats", "w"})


REFUSED = [
    (
        "__import__('os').system('true')",
        "is not allowed; allowed functions: len, max, min, zip, range",
    ),
    ("x.shape", "Attribute syntax is not allowed"),
    ("(lambda: 1)()", "calling 'lambda: 1' is not allowed"),
    ("[(lambda: 1)]", "Lambda syntax is not allowed"),
    ("[x.0] if k else [w.0]", "IfExp syntax is not allowed"),
    ("[x.0 / 2]", "operator Div is not allowed"),
    ("[1.5]", "literal 1.5 is not an integer"),
    ("['a']", "literal 'a' is not an integer"),
    ("[i for i in x if i]", "comprehension filters are not supported"),
    ("[x.0 ** 2]", "operator Pow is not allowed"),
    ("[x.0 == 2]", "Compare syntax is not allowed"),
    ("{x.0: 1}", "Dict syntax is not allowed"),
    ("[x.0 for a in x for b in w]", "use one 'for' per comprehension"),
    ("print(x)", "calling 'print' is not allowed"),
    ("[x.0", "is not a valid expression"),
    ("like:", "expected 'like:<input name>'"),
    ("", "must be a non-empty string"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[r[0] or "empty" for r in REFUSED])
def test_syntax_outside_the_whitelist_is_refused(text: str, message: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_shape_rule(text)
    assert message in str(info.value)


EVAL_ERRORS = [
    ("[x.7]", "index 7 is out of range"),
    ("x + 1", "only + joins two lists"),
    ("[x]", "nested list"),
    ("x.0", "expected a list of dims"),
    ("[len(k)]", "len() needs a list"),
    ("[nope.0]", "'nope' is neither an input nor an attribute"),
]


@pytest.mark.parametrize(("text", "message"), EVAL_ERRORS, ids=[e[0] for e in EVAL_ERRORS])
def test_evaluation_errors_name_the_rule(text: str, message: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_shape_rule(text).evaluate(ENV, Arithmetic())  # type: ignore[union-attr]
    assert message in str(info.value) and repr(text) in str(info.value)
