"""Translation registry validations: signatures against the torch schema, different
code under one key, and what a translation returns -- each a typed error naming the op."""

from __future__ import annotations

import textwrap
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom import Registry, SymbolicEntry, SymbolicError
from onnx_custom.translate.names import normalize_target

EXPORTERS = [("torchscript", 17), ("dynamo", 18)]


@pytest.fixture(scope="module")
def scale_op() -> Iterator[Any]:
    """``regtest::scale(Tensor x, Tensor? bias, float alpha, int[] dims=[0]) -> Tensor``."""
    lib = torch.library.Library("regtest", "FRAGMENT")
    lib.define("scale(Tensor x, Tensor? bias, float alpha, int[] dims=[0]) -> Tensor")
    lib.impl(
        "scale",
        lambda x, bias, alpha, dims=(0,): x * alpha + (0 if bias is None else bias),
        "CompositeExplicitAutograd",
    )
    torch.library.register_fake(
        "regtest::scale", lambda x, bias, alpha, dims=(0,): torch.empty_like(x), lib=lib
    )
    yield torch.ops.regtest.scale.default
    lib._destroy()


def _good(g: Any, x: Any, bias: Any, *, alpha: float, dims: list[int]) -> Any:
    return g.op("Mul", x, g.constant(alpha, like=x))


def _takes_kwargs(g: Any, x: Any, bias: Any, **attrs: Any) -> Any:
    return g.op("Mul", x, g.constant(attrs["alpha"], like=x))


def _misspelt(g: Any, x: Any, bias: Any, *, alpha: float, dim: list[int]) -> Any:
    return x


def _missing_tensor(g: Any, x: Any, *, alpha: float, dims: list[int]) -> Any:
    return x


def _extra_required(g: Any, x: Any, bias: Any, scale: Any, *, alpha: float, dims: list[int]) -> Any:
    return x


@pytest.mark.parametrize("fn", [_good, _takes_kwargs], ids=["keywords", "kwargs"])
def test_matching_signature_registers(scale_op: Any, fn: Any) -> None:
    Registry().symbolic("regtest::scale", opset=9)(fn)


@pytest.mark.parametrize(
    ("fn", "problem"),
    [
        (
            _misspelt,
            "it does not accept the schema argument(s) ['dims'] as keywords; it requires ['dim']",
        ),
        (_missing_tensor, "it takes 1 tensor input(s) after g, the schema has 2 (x, bias)"),
        (_extra_required, "it requires ['scale'], which the schema does not have"),
    ],
    ids=["misspelt-keyword", "missing-tensor", "extra-required"],
)
def test_mismatched_signature_refused_at_registration(scale_op: Any, fn: Any, problem: str) -> None:
    with pytest.raises(SymbolicError) as info:
        Registry().symbolic("regtest::scale", opset=9)(fn)
    message = str(info.value)
    assert "regtest::scale" in message and fn.__name__ in message  # the op and the translation
    assert problem in message  # what was wrong
    assert (
        "[x: Tensor, bias: Optional[Tensor], alpha: float, dims: List[int]]" in message
    )  # the schema's names
    assert "def " + fn.__name__ + "(g, x, bias, *, alpha, dims)" in message  # what was expected
    assert "Fix:" in message


def test_op_defined_after_registration_is_checked_at_lookup() -> None:
    registry = Registry()
    registry.symbolic("regtest::later", opset=9)(_misspelt)  # no such op yet: nothing to check
    lib = torch.library.Library("regtest", "FRAGMENT")
    try:
        lib.define("later(Tensor x, Tensor? bias, float alpha, int[] dims) -> Tensor")
        with pytest.raises(
            SymbolicError,
            match=r"regtest::later .*\['dims'\] as keywords.*schema's arguments are \[x: Tensor",
        ):
            registry.lookup("regtest::later", 13)
    finally:
        lib._destroy()


def test_signature_error_surfaces_from_export_before_torch_fails() -> None:
    """A translation registered before its op exists fails the export with our message."""

    class Later(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.regtest.later2(x, None, 2.0, [0])

    registry = onnx_custom.default_registry().copy()
    registry.symbolic("regtest::later2", opset=9)(_misspelt)
    lib = torch.library.Library("regtest", "FRAGMENT")
    try:
        lib.define("later2(Tensor x, Tensor? bias, float alpha, int[] dims) -> Tensor")
        lib.impl("later2", lambda x, bias, alpha, dims: x * alpha, "CompositeExplicitAutograd")
        torch.library.register_fake(
            "regtest::later2", lambda x, bias, alpha, dims: torch.empty_like(x), lib=lib
        )
        for exporter, opset in EXPORTERS:
            with pytest.raises(
                SymbolicError, match=r"\['dims'\] as keywords.*alpha: float, dims: List\[int\]"
            ):
                onnx_custom.export(
                    Later(), (torch.randn(3),), exporter=exporter, opset=opset, registry=registry
                )
    finally:
        lib._destroy()


# -- a second registration with different code ----------------------------------------------------


def test_two_different_lambdas_for_one_key_raise() -> None:
    registry = Registry()
    registry.symbolic("mylib::foo", opset=9)(lambda g, x: g.op("Relu", x))
    with pytest.raises(
        SymbolicError, match=r"different translation for mylib::foo at opset 9.*replace=True"
    ):
        registry.symbolic("mylib::foo", opset=9)(lambda g, x: g.op("Sigmoid", x))
    registry.symbolic("mylib::foo", opset=9, replace=True)(lambda g, x: g.op("Sigmoid", x))
    assert "Sigmoid" in registry.lookup("mylib::foo", 9).fn.__code__.co_consts


def _module_from(source: str, name: str = "user_symbolics") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(textwrap.dedent(source), f"{name}.py", "exec"), module.__dict__)  # a fresh import
    return module


def test_reimporting_a_module_is_harmless() -> None:
    source = """
        def relu(g, x):
            return g.op("Relu", x)
    """
    registry = Registry()
    registry.symbolic("mylib::foo", opset=9)(_module_from(source).relu)
    registry.symbolic("mylib::foo", opset=9)(_module_from(source).relu)  # the same definition again
    assert len(registry) == 1


def test_edited_function_under_the_same_name_raises() -> None:
    registry = Registry()
    registry.symbolic("mylib::foo", opset=9)(
        _module_from("def f(g, x):\n    return g.op('Relu', x)\n").f
    )
    with pytest.raises(SymbolicError, match="different translation"):
        registry.symbolic("mylib::foo", opset=9)(
            _module_from("def f(g, x):\n    return g.op('Abs', x)\n").f
        )


def test_same_code_different_closure_values_raise() -> None:
    def make(node: str) -> Any:
        return lambda g, x: g.op(node, x)

    registry = Registry()
    registry.symbolic("mylib::foo", opset=9)(make("Relu"))
    registry.symbolic("mylib::foo", opset=9)(make("Relu"))  # equal closure: the same definition
    with pytest.raises(SymbolicError, match="different translation"):
        registry.symbolic("mylib::foo", opset=9)(make("Abs"))


# -- what a translation returns -------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe_op() -> Iterator[Any]:
    lib = torch.library.Library("regtest", "FRAGMENT")
    lib.define("probe(Tensor x) -> Tensor")
    lib.impl("probe", lambda x: x + 1, "CompositeExplicitAutograd")
    torch.library.register_fake("regtest::probe", lambda x: torch.empty_like(x), lib=lib)
    yield torch.ops.regtest.probe.default
    lib._destroy()


class Probe(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.regtest.probe(x)


BAD_RESULTS = [
    (None, "returned None", "missing `return`"),
    (2.0, "returned a Python float (2.0)", "g.constant(2.0, like=<an input>)"),
    (
        torch.ones(2),
        "returned an eager torch.Tensor (shape [2], torch.float32)",
        "g.constant(tensor)",
    ),
    (np.ones(2), "returned a numpy ndarray", "g.constant(array)"),
]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
@pytest.mark.parametrize(
    ("bad", "what", "fix"), BAD_RESULTS, ids=["None", "float", "eager-tensor", "ndarray"]
)
def test_bad_results_raise_symbolic_error_naming_the_op(
    probe_op: Any, exporter: str, opset: int, bad: Any, what: str, fix: str
) -> None:
    """With a real builder inside a real export: the inner entry's result is checked by
    ``SymbolicEntry.call``, the helper the exporter adapters call."""
    inner = SymbolicEntry(normalize_target("regtest::probe"), 1, lambda g, x: bad)
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("regtest::probe", opset=1)(lambda g, x: inner.call(g, [x], {}, outputs=1)[0])
    with pytest.raises(SymbolicError) as info:
        onnx_custom.export(
            Probe(), (torch.randn(2),), exporter=exporter, opset=opset, registry=registry
        )
    message = str(info.value)
    assert "The translation of regtest::probe" in message and what in message and fix in message


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_wrong_output_count_and_bad_item_in_tuple(probe_op: Any, exporter: str, opset: int) -> None:
    registry = onnx_custom.default_registry().copy()
    two = SymbolicEntry(normalize_target("regtest::probe"), 1, lambda g, x: (x, x))
    half = SymbolicEntry(normalize_target("regtest::probe"), 1, lambda g, x: (x, None))
    seen: dict[str, str] = {}

    def translate(g: Any, x: Any) -> Any:
        for label, entry in (("count", two), ("item", half)):
            try:
                entry.call(g, [x], {}, outputs=1 if label == "count" else 2)
            except SymbolicError as exc:
                seen[label] = str(exc)
        return g.op("Identity", x)

    registry.symbolic("regtest::probe", opset=1)(translate)
    onnx_custom.export(
        Probe(), (torch.randn(2),), exporter=exporter, opset=opset, registry=registry
    )
    assert "returned 2 output(s) but the torch op has 1" in seen["count"]
    assert "returned None as output 1" in seen["item"]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_good_results_pass_through_call(probe_op: Any, exporter: str, opset: int) -> None:
    inner = SymbolicEntry(
        normalize_target("regtest::probe"), 1, lambda g, x: g.op("Add", x, g.constant(1.0, like=x))
    )
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("regtest::probe", opset=1)(lambda g, x: inner.call(g, [x], {}, outputs=1)[0])
    x = torch.randn(2)
    proto = onnx_custom.export(Probe(), (x,), exporter=exporter, opset=opset, registry=registry)
    assert onnx_custom.verify(Probe(), (x,), proto).passed
