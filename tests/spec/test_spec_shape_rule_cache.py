"""Shape rules are parsed once, when the spec is made: eager and fake calls never re-parse them
(re-parsing with ``ast`` on every call was a noticeable share of a bev_pool_v2 forward), the
results are the ones the rule gives, and a bad rule still fails at spec load, typed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import onnx_custom.spec.spec as spec_module
from onnx_custom.ops.custom_linear import CUSTOM_LINEAR, custom_linear
from onnx_custom.ops.multi_out3 import MULTI_OUT3, multi_out3
from onnx_custom.spec import Input, OpSpec, Output, SpecError, load_specs, spec_scope
from onnx_custom.spec.shape_rules import ExpressionRule, LikeRule, parse_shape_rule


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def no_parsing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any parse after this point fails the test (the spec module's name is what it calls)."""

    def refuse(text: str) -> Any:
        raise AssertionError(f"shape rule {text!r} parsed again after the spec was made")

    monkeypatch.setattr(spec_module, "parse_shape_rule", refuse)
    yield


def test_rules_are_parsed_once_and_equal_a_fresh_parse() -> None:
    rules = [MULTI_OUT3.shape_rule(i) for i in range(len(MULTI_OUT3.outputs))]
    assert [MULTI_OUT3.shape_rule(i) for i in range(len(MULTI_OUT3.outputs))] == rules
    assert all(
        a is b for a, b in zip(rules, (MULTI_OUT3.shape_rule(i) for i in range(3)), strict=True)
    )
    assert isinstance(rules[0], LikeRule) and isinstance(rules[1], ExpressionRule)
    assert rules == [parse_shape_rule(o.shape) for o in MULTI_OUT3.outputs]  # type: ignore[arg-type]


# Inputs the way users hand them over: permuted, sliced, expanded, zero-size; expected shapes
# from plain torch (an independent implementation of the same math).
MULTI_CASES = [
    ("2x3x4", lambda: torch.randn(2, 3, 4, generator=_gen()), [2, 1, 3]),
    ("permuted-4x3x2", lambda: torch.randn(2, 3, 4, generator=_gen()).permute(2, 1, 0), [1, 2, 1]),
    ("sliced-3x2", lambda: torch.randn(6, 5, generator=_gen())[::2, 1:3], [3, 2]),
    ("expanded-4x3", lambda: torch.randn(1, 3, generator=_gen()).expand(4, 3), [1, 2]),
    ("zero-size-0x3", lambda: torch.randn(0, 3, generator=_gen()), [2, 1]),
]


@pytest.mark.parametrize(
    ("make", "repeats"), [c[1:] for c in MULTI_CASES], ids=[c[0] for c in MULTI_CASES]
)
def test_eager_and_fake_calls_do_not_reparse(
    no_parsing: None, make: Any, repeats: list[int]
) -> None:
    x = make()
    scaled, tiled, summed = multi_out3(x, repeats, 0.5)
    torch.testing.assert_close(scaled, x * 0.5)
    torch.testing.assert_close(tiled, x.tile(repeats))
    torch.testing.assert_close(summed, x.sum(-1))
    with FakeTensorMode() as mode:
        fakes = multi_out3(mode.from_tensor(x), repeats, 0.5)
    assert [tuple(f.shape) for f in fakes] == [
        tuple(x.shape),
        tuple(x.tile(repeats).shape),
        tuple(x.shape[:-1]),
    ]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str
)
def test_expression_rule_op_unchanged(no_parsing: None, dtype: torch.dtype) -> None:
    x = torch.randn(2, 5, 4, generator=_gen()).to(dtype)
    weight = torch.randn(3, 4, generator=_gen(1)).to(dtype)
    y = custom_linear(x, weight)
    assert y.shape == torch.nn.functional.linear(x, weight).shape == (2, 5, 3)
    assert CUSTOM_LINEAR.shape_rule(0) == parse_shape_rule("x[:-1] + [weight.0]")


def test_export_with_a_dynamic_dim_uses_the_cached_rule(no_parsing: None) -> None:
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return multi_out3(x, [2, 1], 1.5)

    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(
        Model(), (torch.randn(3, 4),), dynamic_shapes={"x": {0: batch}}, strict=False
    )
    scaled, tiled, summed = (n.meta["val"].shape for n in program.graph.output_node().args[0])  # type: ignore[union-attr]
    assert isinstance(scaled[0], torch.SymInt) and (scaled[1], tiled[1]) == (4, 4)
    assert str(tiled[0]) == f"2*{scaled[0]}" and str(summed[0]) == str(scaled[0])  # still symbolic


def test_replace_reparses_the_new_rules() -> None:
    spec = OpSpec(
        "vcache::f",
        inputs=[Input("x", ("float32",))],
        outputs=[Output("y", shape="like:x")],
        impl=lambda x: x,
        op_type="F",
    )
    changed = dataclasses.replace(spec, outputs=[Output("y", shape="[x.0]")])
    assert isinstance(spec.shape_rule(0), LikeRule)
    assert changed.shape_rule(0) == parse_shape_rule("[x.0]")


BAD_RULES = [
    ("[x.0 / 2]", "operator Div is not allowed"),
    ("[x.0 +]", "is not a valid expression"),
    ("[z.0]", "names ['z']"),
    ("__import__('os')", "calling '__import__' is not allowed"),
]


@pytest.mark.parametrize(("rule", "message"), BAD_RULES, ids=[r for r, _ in BAD_RULES])
def test_bad_rule_still_fails_at_spec_load(rule: str, message: str) -> None:
    with pytest.raises(SpecError, match="shape") as info:
        OpSpec(
            "vcache::g",
            inputs=[Input("x", ("float32",))],
            outputs=[Output("y", shape=rule)],
            impl=lambda x: x,
            op_type="F",
        )
    assert message in str(info.value)


def test_bad_rule_in_yaml_fails_at_load(tmp_path: Any) -> None:
    path = tmp_path / "ops.yaml"
    path.write_text(
        "- op_name: vcache::h\n"
        "  op_type: H\n"
        "  input_desc: [{name: x, dtype: [float32]}]\n"
        "  output_desc: [{name: y, shape: '[x.0 / 2]'}]\n"
    )
    with spec_scope(), pytest.raises(SpecError, match="operator Div is not allowed") as info:
        load_specs(path)
    assert "ops.yaml" in str(info.value)
