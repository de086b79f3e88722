"""Bad input to the torch-style route: each is a typed `SymbolicError` naming the op, the argument,
what was expected, what was received and the fix — at registration when the op exists, else at
export, under both exporters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.onnx import symbolic_helper

import onnx_custom
from onnx_custom import Registry, SymbolicError


@torch.library.custom_op("tstyle_err::mixed", mutates_args=())
def mixed(
    x: torch.Tensor, y: torch.Tensor, alpha: float, axes: list[int], k: int, mode: str
) -> torch.Tensor:
    return x * alpha + y


@mixed.register_fake
def _(x, y, alpha, axes, k, mode):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


@torch.library.custom_op("tstyle_err::unary", mutates_args=())
def unary(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha


@unary.register_fake
def _(x, alpha):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


def _symbolic_with(codes: tuple[str, ...]) -> Any:
    @symbolic_helper.parse_args(*codes)
    def mixed_symbolic(g, a, b, scale, dims, count, how):  # type: ignore[no-untyped-def]  # names differ from the schema
        return g.op("Add", g.op("Mul", a, scale), b)

    return mixed_symbolic


# codes, then what the message must name: (the user's parameter, the schema argument, received,
# fixed codes)
CODE_MISMATCHES = [
    pytest.param(
        ("v", "i", "f", "is", "i", "s"),
        ("'b'", "y: Tensor", "a tensor", "'v', 'v', 'f', 'is', 'i', 's'"),
        id="i-for-Tensor",
    ),
    pytest.param(
        ("v", "v", "i", "is", "i", "s"),
        ("'scale'", "alpha: float", "a float", "use 'f'"),
        id="i-for-float",
    ),
    pytest.param(
        ("v", "v", "f", "f", "i", "s"),
        ("'dims'", "axes: List[int]", "a List[int]", "use 'is'"),
        id="f-for-int-list",
    ),
    pytest.param(
        ("v", "v", "f", "is", "s", "s"), ("'count'", "k: int", "a int", "use 'i'"), id="s-for-int"
    ),
    pytest.param(
        ("v", "v", "f", "is", "i", "is"),
        ("'how'", "mode: str", "a str", "use 's'"),
        id="is-for-str",
    ),
    pytest.param(
        ("v", "v", "f", "is", "i"),
        ("5 code(s)", "6 argument(s)", "mode: str", "@parse_args('v', 'v', 'f', 'is', 'i', 's')"),
        id="too-few-codes",
    ),
    pytest.param(
        ("v", "v", "f", "is", "i", "x"),
        ("['x']", "expected codes from", "'v', 'v', 'f', 'is', 'i', 's'"),
        id="unknown-code",
    ),
]


@pytest.mark.parametrize(("codes", "named"), CODE_MISMATCHES)
@pytest.mark.parametrize("route", ["symbolic", "register_custom_op_symbolic"])
def test_parse_args_codes_that_do_not_fit_the_op_raise_at_registration(
    codes: tuple[str, ...], named: tuple[str, ...], route: str
) -> None:
    registry = Registry()
    fn = _symbolic_with(codes)
    with pytest.raises(SymbolicError) as info:
        if route == "symbolic":
            onnx_custom.symbolic("tstyle_err::mixed", opset=9, registry=registry)(fn)
        else:
            onnx_custom.register_custom_op_symbolic("tstyle_err::mixed", fn, 9, registry=registry)
    message = str(info.value)
    assert "tstyle_err::mixed" in message and "mixed_symbolic" in message and "Fix" in message, (
        message
    )
    for text in named:
        assert text in message, (text, message)
    assert len(registry) == 0  # nothing half-registered


class Mixed(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle_err.mixed(x, y, 0.5, [1], 2, "sum")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_codes_checked_at_export_when_registered_before_the_op_existed(
    exporter: str, tmp_path: Path
) -> None:
    registry = Registry()
    name = f"tstyle_err::later_{exporter}"
    # The op is not defined yet at registration (a library loaded later): checked at export.
    onnx_custom.register_custom_op_symbolic(
        name, _symbolic_with(("v", "v", "i", "is", "i", "s")), 9, registry=registry
    )

    @torch.library.custom_op(name, mutates_args=())
    def later(
        x: torch.Tensor, y: torch.Tensor, alpha: float, axes: list[int], k: int, mode: str
    ) -> torch.Tensor:
        return x * alpha + y

    later.register_fake(lambda x, y, alpha, axes, k, mode: torch.empty_like(x))

    class Later(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return getattr(torch.ops.tstyle_err, f"later_{exporter}")(x, y, 0.5, [1], 2, "sum")

    path = tmp_path / "m.onnx"
    with pytest.raises(
        SymbolicError, match=rf"{name}.*code 'i'.*'scale'.*alpha: float.*Fix: use 'f'"
    ):
        onnx_custom.export(
            Later(),
            (torch.randn(2, 3), torch.randn(2, 3)),
            path,
            exporter=exporter,
            registry=registry,
        )
    assert not path.exists()


def test_a_function_that_cannot_take_the_arguments_positionally_is_refused() -> None:
    def too_few(g, a, b):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(
        SymbolicError, match=r"cannot take the op's 6 argument\(s\).*positionally.*Fix"
    ):
        onnx_custom.register_custom_op_symbolic(
            "tstyle_err::mixed", too_few, 9, registry=Registry()
        )


def _ok(g, x, alpha):  # type: ignore[no-untyped-def]
    return x


REGISTRATION_ERRORS = [
    pytest.param(
        (123, _ok, 9), r"symbolic_name must be a string.*received int.*Fix", id="name-not-str"
    ),
    pytest.param(("unary", _ok, 9), r"Ill-formed op name 'unary'", id="name-without-namespace"),
    pytest.param(
        ("tstyle_err::unary.default", _ok, 9),
        r"names an overload.*Fix: pass 'tstyle_err::unary'",
        id="overload-name",
    ),
    pytest.param(
        ("tstyle_err::unary", _ok, 0), r"opset_version.*positive int.*received 0.*Fix", id="opset-0"
    ),
    pytest.param(
        ("tstyle_err::unary", _ok, True), r"opset_version.*received True", id="opset-bool"
    ),
    pytest.param(("tstyle_err::unary", _ok, "11"), r"opset_version.*received '11'", id="opset-str"),
    pytest.param(
        ("tstyle_err::unary", "not a function", 9),
        r"symbolic_fn.*must be callable.*received str.*Fix",
        id="fn-not-callable",
    ),
]


@pytest.mark.parametrize(("call", "pattern"), REGISTRATION_ERRORS)
def test_register_custom_op_symbolic_bad_arguments(call: tuple[Any, ...], pattern: str) -> None:
    registry = Registry()
    with pytest.raises(SymbolicError, match=pattern):
        onnx_custom.register_custom_op_symbolic(*call, registry=registry)
    assert len(registry) == 0


def test_import_torch_symbolics_names_what_torch_has() -> None:
    with pytest.raises(
        SymbolicError, match=r"torch has no custom symbolic for \['tstyle_err::nothing'\].*Fix"
    ):
        onnx_custom.import_torch_symbolics("tstyle_err::nothing", registry=Registry())


def _aten_fallback(g, x, alpha):  # type: ignore[no-untyped-def]
    return g.at("mul", x, alpha)


def _float_for_int_suffix(g, x, alpha):  # type: ignore[no-untyped-def]
    return g.op("Unsqueeze", x, axes_i=[alpha])


def _subgraph_attribute(g, x, alpha):  # type: ignore[no-untyped-def]
    return g.op("If", x, then_branch_g=None, else_branch_g=object())


ADAPTER_ERRORS = [
    pytest.param(
        _aten_fallback, r"tstyle_err::unary.*g.at/g.aten_op\('mul'\).*ATen fallback.*Fix", id="g.at"
    ),
    pytest.param(
        _float_for_int_suffix,
        r"tstyle_err::unary.*axes_i=.*suffix _i means int\(s\); received list \[0.5\].*Fix",
        id="float-for-_i",
    ),
    pytest.param(
        _subgraph_attribute,
        r"tstyle_err::unary.*_g \(a subgraph\) is not supported.*Fix",
        id="subgraph-attribute",
    ),
]


class Unary(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle_err.unary(x, 0.5)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(("fn", "pattern"), ADAPTER_ERRORS)
def test_torch_graph_api_misuse_is_a_symbolic_error_under_both_exporters(
    fn: Any, pattern: str, exporter: str, tmp_path: Path
) -> None:
    registry = Registry()
    onnx_custom.register_custom_op_symbolic("tstyle_err::unary", fn, 9, registry=registry)
    path = tmp_path / "m.onnx"
    with pytest.raises(SymbolicError, match=pattern):
        onnx_custom.export(
            Unary(),
            (torch.randn(2, 3),),
            path,
            exporter=exporter,
            opset=13 if exporter == "torchscript" else 18,
            registry=registry,
        )
    assert not path.exists()


def test_torchscript_ir_under_dynamo_says_what_to_use_instead(tmp_path: Path) -> None:
    def uses_node(g, x, alpha):  # type: ignore[no-untyped-def]
        # node() itself answers kind()/mustBeNone() (what torch's helpers ask); reading the IR fails
        list(x.node().inputs())
        return x

    registry = Registry()
    onnx_custom.register_custom_op_symbolic("tstyle_err::unary", uses_node, 9, registry=registry)
    with pytest.raises(
        SymbolicError,
        match=r"value.node\(\), TorchScript IR.*Fix: read shapes and types with value.type\(\)",
    ):
        onnx_custom.export(
            Unary(), (torch.randn(2, 3),), tmp_path / "m.onnx", exporter="dynamo", registry=registry
        )
    # ... while TorchScript hands over torch's own values, so the same function works there.
    onnx_custom.export(
        Unary(),
        (torch.randn(2, 3),),
        tmp_path / "ts.onnx",
        exporter="torchscript",
        opset=13,
        registry=registry,
    )


def test_registering_the_same_parse_args_function_again_is_idempotent_a_different_one_raises() -> (
    None
):
    """A re-imported module re-runs its decorators with new function objects (torch's parse_args
    wrapper included): the same definition is accepted, different codes are a different one."""
    registry = Registry()
    good = ("v", "v", "f", "is", "i", "s")
    onnx_custom.symbolic("tstyle_err::mixed", opset=9, registry=registry)(_symbolic_with(good))
    onnx_custom.symbolic("tstyle_err::mixed", opset=9, registry=registry)(_symbolic_with(good))
    assert len(registry) == 1
    with pytest.raises(
        SymbolicError,
        match=r"A different translation for tstyle_err::mixed at opset 9.*Fix: pass replace=True",
    ):
        onnx_custom.symbolic("tstyle_err::mixed", opset=9, registry=registry)(
            _symbolic_with(("v", "v", "f", "is", "b", "s"))
        )
