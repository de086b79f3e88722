"""Bad declarations get typed errors naming the op, the key, what was expected and the fix --
when the spec is made or registered, never later at export."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom import SymbolicError, VerificationError
from onnx_custom.runtime import KernelRegistry, default_kernel_registry
from onnx_custom.spec import (
    Attribute,
    Input,
    OpSpec,
    Output,
    SpecError,
    register_spec,
    registered_specs,
    spec_scope,
)
from onnx_custom.testing import check_op
from onnx_custom.translate.names import normalize_target
from onnx_custom.translate.registry import SymbolicEntry, default_registry

F32 = ["float32"]


def scale_add(x: torch.Tensor, y: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return alpha * x + y


def scale_add_np(x: np.ndarray, y: np.ndarray, *, alpha: float) -> np.ndarray:
    return (x.dtype.type(alpha) * x + y).astype(x.dtype)


def _base(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": "vtest::scale_add",
        "op_type": "ScaleAdd",
        "inputs": [Input("x", F32), Input("y", F32)],
        "outputs": [Output("out", shape="like:x")],
        "attributes": [Attribute("alpha", "float", 2.0)],
        "impl": scale_add,
        "kernel": scale_add_np,
    }
    fields.update(changes)
    return fields


@pytest.fixture(autouse=True)
def _scoped() -> Iterator[None]:
    with spec_scope():
        yield


def _assert_names(error: SpecError, *parts: str) -> None:
    message = str(error)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


# -- made: OpSpec(...) refuses malformed declarations ---------------------------------------------

MADE = [
    (
        "duplicate-inputs",
        {"inputs": [Input("x", F32), Input("x", F32)]},
        ("inputs", 1, "name"),
        ["duplicate name 'x'", "fix: rename one"],
    ),
    (
        "input-attribute-clash",
        {"attributes": [Attribute("x", "float", 2.0)]},
        ("attributes", 0, "name"),
        ["duplicate name 'x'", "unique across inputs, attributes and outputs"],
    ),
    (
        "duplicate-outputs",
        {"outputs": [Output("o", shape="like:x"), Output("o", shape="like:x")]},
        ("outputs", 1, "name"),
        ["duplicate name 'o'"],
    ),
    (
        "tensor-attribute",
        {"attributes": [Attribute("w", "Tensor")]},
        ("attributes", 0, "type"),
        ["type 'Tensor'", "expected one of int, float, bool, str", "fix: make it an input"],
    ),
    (
        "bool-list-attribute",
        {"attributes": [Attribute("flags", "bool[]")]},
        ("attributes", 0, "type"),
        ["'bool[]'", "fix: use int[]"],
    ),
    (
        "optional-attribute",
        {"attributes": [Attribute("k", "int?")]},
        ("attributes", 0, "type"),
        ["'int?'", "fix: give it a default value"],
    ),
    (
        "complex-attribute",
        {"attributes": [Attribute("c", "complex")]},
        ("attributes", 0, "type"),
        ["'complex'", "fix: use two float attributes"],
    ),
    (
        "str-list-default",
        {"attributes": [Attribute("names", "str[]", ["a"])]},
        ("attributes", 0, "default"),
        ["cannot express a default for str[]", "fix: drop the default"],
    ),
    (
        "infinite-default",
        {"attributes": [Attribute("alpha", "float", float("inf"))]},
        ("attributes", 0, "default"),
        ["is not finite", "fix: use a finite default"],
    ),
    (
        "int-default-is-float",
        {"attributes": [Attribute("k", "int", 2.5)]},
        ("attributes", 0, "default"),
        ["has default 2.5", "expected a int", "fix: change the default"],
    ),
    (
        "bool-default-is-int",
        {"attributes": [Attribute("flag", "bool", 1)]},
        ("attributes", 0, "default"),
        ["expected a bool"],
    ),
    (
        "list-default-not-list",
        {"attributes": [Attribute("dims", "int[]", 3)]},
        ("attributes", 0, "default"),
        ["expected a list of ints"],
    ),
    (
        "default-before-required",
        {"attributes": [Attribute("alpha", "float", 2.0), Attribute("k", "int")]},
        ("attributes", 1, "default"),
        ["'k' has no default but follows 'alpha'", "fix: give 'k' a default"],
    ),
    (
        "standard-op-collision",
        {"op_type": "Add", "domain": ""},
        ("domain",),
        [
            "collides with the standard ONNX op 'Add'",
            "expected a custom domain",
            "fix: drop domain:",
        ],
    ),
    ("default-domain", {"domain": "ai.onnx"}, ("domain",), ["default ONNX domain", "fix:"]),
    (
        "ort-domain",
        {"domain": "com.microsoft"},
        ("domain",),
        ["belongs to ONNX Runtime", "expected your own domain"],
    ),
    (
        "bad-op-type",
        {"op_type": "Scale-Add"},
        ("op_type",),
        ["is not an ONNX node type", "expected an identifier"],
    ),
    (
        "shape-unknown-input",
        {"outputs": [Output("out", shape="[z.0, x.1]")]},
        ("outputs", 0, "shape"),
        ["names ['z']", "neither inputs ['x', 'y']", "fix: use those names"],
    ),
    (
        "like-unknown-input",
        {"outputs": [Output("out", shape="like:w")]},
        ("outputs", 0, "shape"),
        ["names ['w']"],
    ),
    (
        "shape-syntax",
        {"outputs": [Output("out", shape="[x.0 / 2]")]},
        ("outputs", 0, "shape"),
        ["operator Div is not allowed"],
    ),
    (
        "shape-float-attribute",
        {"outputs": [Output("out", shape="[x.0 * alpha]")]},
        ("outputs", 0, "shape"),
        ["non-integer attribute(s) ['alpha']"],
    ),
    (
        "unknown-dtype",
        {"inputs": [Input("x", ["flaot32"]), Input("y", F32)]},
        ("inputs", 0, "dtype"),
        ["unknown dtype(s) ['flaot32']", "expected names from float32", "fix: spell them"],
    ),
    (
        "repeated-dtype",
        {"inputs": [Input("x", ["float32", "float32"]), Input("y", F32)]},
        ("inputs", 0, "dtype"),
        ["repeats a dtype"],
    ),
    (
        "variadic-not-last",
        {"inputs": [Input("xs*", F32), Input("y", F32)]},
        ("inputs", 0, "name"),
        ["variadic input 'xs' must be the last input", "fix: move it last"],
    ),
    (
        "optional-variadic",
        {"inputs": [Input("x", F32), Input("ys", F32, optional=True, variadic=True)]},
        ("inputs", 1, "name"),
        ["both optional and variadic"],
    ),
    (
        "output-like-unknown",
        {"outputs": [Output("out", "like:q", shape="like:x")]},
        ("outputs", 0, "dtype"),
        ["dtype 'like:q'", "expected a dtype list or 'like:<input>'"],
    ),
    (
        "ambiguous-output-dtype",
        {"outputs": [Output("out", ["float32", "float16"], shape="like:x")]},
        ("outputs", 0, "dtype"),
        ["dtype is ambiguous", "fix: write dtype: 'like:<input>'"],
    ),
    (
        "unqualified-name",
        {"name": "scale_add"},
        ("name",),
        ["Ill-formed op name 'scale_add'", "'<your_namespace>::scale_add'"],
    ),
    (
        "overload-name",
        {"name": "vtest::scale_add.out"},
        ("name",),
        ["has an overload", "fix: drop '.out'"],
    ),
    (
        "reserved-input-g",
        {"inputs": [Input("g", F32), Input("y", F32)], "outputs": [Output("out", shape="like:g")]},
        ("inputs", 0, "name"),
        ["'g' is reserved for the translation's graph builder", "fix: rename it"],
    ),
    (
        "reserved-attribute-out",
        {"attributes": [Attribute("out", "int", 1)]},
        ("attributes", 0, "name"),
        ["'out' is reserved for kernels' preallocated outputs"],
    ),
    (
        "reserved-attribute-outputs",
        {"attributes": [Attribute("outputs", "int", 1)]},
        ("attributes", 0, "name"),
        ["'outputs' is reserved for g.op's output count"],
    ),
    (
        "reserved-attribute-output-types",
        {"attributes": [Attribute("output_types", "int", 1)]},
        ("attributes", 0, "name"),
        ["'output_types' is reserved for g.op's declared output types"],
    ),
    (
        "keyword-name",
        {"attributes": [Attribute("lambda", "float", 1.0)]},
        ("attributes", 0, "name"),
        ["'lambda' is not a Python identifier"],
    ),
    (
        "bad-reference",
        {"impl": "my_ops.scale_add"},
        ("impl",),
        [
            "'package.module:function' or a callable",
            "received 'my_ops.scale_add'",
            "fix: write e.g.",
        ],
    ),
    (
        "setup-without-backward",
        {"setup_context": scale_add},
        ("setup_context",),
        ["setup_context is given without backward", "fix: add backward"],
    ),
    (
        "kernel-without-node",
        {"op_type": None, "translations": {9: scale_add}},
        ("kernel",),
        ["kernel is given but op_type is not", "fix: add op_type"],
    ),
    (
        "nothing-to-emit",
        {"op_type": None, "kernel": None},
        ("op_type",),
        ["neither op_type", "nor translations", "fix: declare at least one"],
    ),
    (
        "no-inputs",
        {"inputs": [], "outputs": [Output("out")]},
        ("inputs",),
        ["declares no tensor input"],
    ),
    ("no-outputs", {"outputs": []}, ("outputs",), ["declares no output"]),
    (
        "bad-translation-opset",
        {"translations": {0: scale_add}},
        ("translations", 0),
        ["opset 0 must be a positive int"],
    ),
    (
        "native-other-node",
        {"native": "other::Node"},
        ("native",),
        ["native is 'other::Node'", "expected true or this spec's node 'vtest::ScaleAdd'"],
    ),
    ("inputs-not-list", {"inputs": "x"}, ("inputs",), ["inputs must be a list"]),
]


@pytest.mark.parametrize(
    ("changes", "key", "parts"), [m[1:] for m in MADE], ids=[m[0] for m in MADE]
)
def test_malformed_spec_is_refused_when_made(
    changes: dict[str, Any], key: tuple[Any, ...], parts: list[str]
) -> None:
    with pytest.raises(SpecError) as info:
        OpSpec(**_base(**changes))
    assert isinstance(info.value, SymbolicError)  # catchable as the family's error too
    assert info.value.key == key
    _assert_names(info.value, "vtest::scale_add" if "name" not in changes else "", *parts)


def test_a_valid_spec_derives_its_schema() -> None:
    spec = OpSpec(
        **_base(
            inputs=[Input("x", F32), Input("bias?", F32), Input("rest*", F32)],
            attributes=[
                Attribute("k", "int"),
                Attribute("flag", "bool", True),
                Attribute("mode", "str", 'say "hi"'),
                Attribute("dims", "listInt", [1, -2]),
            ],
        )
    )
    assert (
        spec.schema
        == '(Tensor x, Tensor? bias, Tensor[] rest, int k, bool flag=True, str mode="say \\"hi\\"",'
        " int[] dims=[1, -2]) -> Tensor"
    )
    assert spec.attribute("dims").type == "int[]"  # the op-plugin alias, normalized
    assert spec.inputs[1].optional and spec.inputs[2].variadic
    assert spec.domain == "vtest" and spec.node_type == "vtest::ScaleAdd"


# -- registered: referenced code must match the declaration ---------------------------------------


def impl_swapped(y: torch.Tensor, x: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return alpha * x + y


def impl_no_alpha(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def impl_extra(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return x + y + z


def kernel_misnamed(a: np.ndarray, b: np.ndarray, *, alpha: float) -> np.ndarray:
    return a + b


def translation_missing_y(g: Any, x: Any, *, alpha: float) -> Any:
    return x


def backward_one_grad(ctx: Any) -> Any:
    return None


def setup_two(ctx: Any, inputs: Any) -> None:
    return None


def _kernel_decl(dtypes: list[str], attrs: dict[str, Any] | None = None) -> KernelRegistry:
    kernels = KernelRegistry()
    kernels.kernel(
        "vtest::ScaleAdd",
        inputs=["x", "y"],
        outputs=["out"],
        attrs=attrs or {"alpha": ("float", 2.0)},
        dtypes=dtypes,
    )(scale_add_np)
    return kernels


REGISTERED = [
    (
        "impl-swapped",
        {"impl": impl_swapped},
        ("impl",),
        [
            "impl",
            "impl_swapped",
            "takes parameter 'y' where input 'x' (position 0) is expected",
            "expected `def impl_swapped(x, y, *, alpha)`",
            "received `(y: ",
            "fix: rename or reorder",
        ],
    ),
    (
        "impl-missing-attribute",
        {"impl": impl_no_alpha},
        ("impl",),
        ["does not accept attribute 'alpha' as a keyword"],
    ),
    (
        "impl-extra-parameter",
        {"impl": impl_extra},
        ("impl",),
        ["requires parameter 'z', which is neither an input nor an attribute", "fix:"],
    ),
    (
        "kernel-misnamed",
        {"kernel": kernel_misnamed},
        ("kernel",),
        ["kernel", "takes parameter 'a' where input 'x' (position 0) is expected"],
    ),
    (
        "translation-mismatch",
        {"translations": {9: translation_missing_y}},
        ("translations", 9),
        [
            "has no parameter for input 'y'",
            "expected `def translation_missing_y(g, x, y, *, alpha)`",
        ],
    ),
    (
        "backward-arity",
        {"backward": backward_one_grad},
        ("backward",),
        [
            "cannot be called with 2 positional arguments",
            "(ctx, grad_out)",
            "fix: take one gradient per output",
        ],
    ),
    (
        "setup-context-arity",
        {"backward": lambda ctx, g: (g, g), "setup_context": setup_two},
        ("setup_context",),
        ["(ctx, inputs, output)"],
    ),
    (
        "kernel-dtypes-narrower-than-eager",
        {
            "inputs": [Input("x", ["float32", "bfloat16"]), Input("y", ["float32", "bfloat16"])],
            "kernel": _kernel_decl(["float32", "float64"]),
        },
        ("kernel",),
        [
            "accepts float32, float64 for input 'x'",
            "but the spec (and so the eager op) also accepts bfloat16",
            "fix: remove bfloat16 from the spec's dtype list for 'x', or widen the kernel's dtypes",
        ],
    ),
    (
        "kernel-attribute-type",
        {"kernel": _kernel_decl(F32, {"alpha": ("int", 2)})},
        ("kernel",),
        ["declares attributes {'alpha': 'int'}, the spec {'alpha': 'float'}"],
    ),
    (
        "module-not-importable",
        {"impl": "no_such_module_xyz:scale_add"},
        ("impl",),
        ["module 'no_such_module_xyz' is not importable", "fix: put its folder on sys.path"],
    ),
    (
        "attribute-missing",
        {"impl": "math:sqrtt"},
        ("impl",),
        ["'math' has no attribute 'sqrtt'", "Did you mean 'sqrt'"],
    ),
    (
        "shape-meta-mismatch",
        {"outputs": [Output("out")], "shape": impl_no_alpha},
        ("shape",),
        ["shape", "does not accept attribute 'alpha'"],
    ),
]


@pytest.mark.parametrize(
    ("changes", "key", "parts"), [r[1:] for r in REGISTERED], ids=[r[0] for r in REGISTERED]
)
def test_mismatched_code_is_refused_at_registration(
    changes: dict[str, Any], key: tuple[Any, ...], parts: list[str]
) -> None:
    spec = OpSpec(**_base(**changes))
    with pytest.raises(SpecError) as info:
        register_spec(spec)
    assert info.value.key == key
    _assert_names(info.value, "op vtest::scale_add", *parts)
    assert "vtest::scale_add" not in registered_specs()
    assert (
        torch._C._jit_get_schemas_for_operator("vtest::scale_add") == []
    )  # nothing half-registered


def test_importing_a_broken_module_names_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_ops.py").write_text("raise RuntimeError('half-written module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as info:
        register_spec(OpSpec(**_base(impl="broken_ops:scale_add")))
    _assert_names(
        info.value,
        "importing 'broken_ops' raised RuntimeError: half-written module",
        "fix: the module must import cleanly",
    )
    sys.modules.pop("broken_ops", None)


def test_same_name_different_content_is_refused_identical_is_harmless() -> None:
    first = register_spec(OpSpec(**_base()))
    assert register_spec(OpSpec(**_base())).owned is False  # identical: a no-op
    with pytest.raises(SpecError) as info:
        register_spec(OpSpec(**_base(attributes=[Attribute("alpha", "float", 3.0)])))
    _assert_names(
        info.value,
        "op vtest::scale_add is already registered from a different spec",
        "attributes:",
        "default=2.0",
        "default=3.0",
        "fix: unregister the first",
    )
    first.unregister()
    register_spec(OpSpec(**_base(attributes=[Attribute("alpha", "float", 3.0)])))  # now it may


def test_defining_an_op_torch_already_has() -> None:
    lib = torch.library.Library("vtest", "FRAGMENT")
    try:
        lib.define("scale_add(Tensor x, Tensor y, float alpha=2.0) -> Tensor")
        with pytest.raises(SpecError) as info:
            register_spec(OpSpec(**_base()))
        _assert_names(
            info.value, "torch already has this op", "fix: drop impl to adopt the existing op"
        )
        with pytest.raises(SpecError) as info:
            register_spec(OpSpec(**_base(impl=None, attributes=[Attribute("alpha", "float", 3.0)])))
        _assert_names(
            info.value,
            "the existing torch op's schema is",
            "alpha=2.",
            "but the spec declares",
            "fix: make the spec's inputs",
        )
    finally:
        lib._destroy()


def test_adopting_an_existing_op_adds_fake_translation_and_kernel() -> None:
    lib = torch.library.Library("vtest", "FRAGMENT")
    try:
        lib.define("scale_add(Tensor x, Tensor y, float alpha=2.0) -> Tensor")
        lib.impl("scale_add", lambda x, y, alpha=2.0: alpha * x + y, "CompositeExplicitAutograd")
        check_op(
            OpSpec(**_base(impl=None)), [(torch.randn(2, 3), torch.randn(2, 3), 0.5)], dtypes=False
        )
    finally:
        lib._destroy()


def test_no_op_and_no_impl() -> None:
    with pytest.raises(SpecError) as info:
        register_spec(OpSpec(**_base(impl=None)))
    _assert_names(info.value, "torch has no such op and the spec has no impl", "fix: add impl")


def test_output_without_shape_rule() -> None:
    with pytest.raises(SpecError) as info:
        register_spec(OpSpec(**_base(outputs=[Output("out")])))
    _assert_names(info.value, "output(s) ['out'] have no shape rule", "fix: add shape: 'like:x'")


def test_node_served_by_another_kernel() -> None:
    with pytest.raises(SpecError) as info:
        register_spec(
            OpSpec(**_base(domain="onnx_custom", op_type="my_add"))
        )  # a built-in kernel's node
    _assert_names(
        info.value,
        "a kernel for onnx_custom::my_add is already registered",
        "fix: pick another op_type/domain",
    )


def test_translation_clash_rolls_back_the_torch_op() -> None:
    @onnx_custom.symbolic("vtest::scale_add", opset=9)
    def user_translation(g: Any, x: Any, y: Any, *, alpha: float) -> Any:
        return x

    try:
        with pytest.raises(SpecError) as info:
            register_spec(OpSpec(**_base(translations={9: scale_add_translation})))
        _assert_names(
            info.value,
            "A different translation for vtest::scale_add at opset 9",
            "user_translation",
            "Fix: pass replace=True",
        )
        assert torch._C._jit_get_schemas_for_operator("vtest::scale_add") == []  # undone
        assert "vtest::ScaleAdd" not in default_kernel_registry()
    finally:
        default_registry().remove("vtest::scale_add", opset=9)


def scale_add_translation(g: Any, x: Any, y: Any, *, alpha: float) -> Any:
    return g.op("Add", g.op("Mul", x, g.constant(alpha, like=x)), y)


def test_register_spec_needs_a_spec() -> None:
    with pytest.raises(
        SpecError, match="register_spec expects an onnx_custom.OpSpec; received dict; fix:"
    ):
        register_spec(_base())  # type: ignore[arg-type]


# -- the generated eager op enforces the declaration ----------------------------------------------


def impl_returns(result: Callable[[torch.Tensor, torch.Tensor], Any]) -> Any:
    def impl(x: torch.Tensor, y: torch.Tensor, *, alpha: float) -> Any:
        return result(x, y)

    return impl


EAGER = [
    (
        "wrong-input-dtype",
        None,
        (torch.ones(2, dtype=torch.float64), torch.ones(2)),
        TypeError,
        ["input 'x' has dtype torch.float64", "the spec declares float32", "fix: cast the input"],
    ),
    (
        "wrong-output-dtype",
        impl_returns(lambda x, y: (x + y).double()),
        (torch.ones(2), torch.ones(2)),
        TypeError,
        [
            "output 'out' as torch.float64",
            "the spec says torch.float32",
            "fix: cast it or correct the spec",
        ],
    ),
    (
        "wrong-output-shape",
        impl_returns(lambda x, y: torch.cat([x, y])),
        (torch.ones(2), torch.ones(2)),
        ValueError,
        ["shape [4]", "'like:x' gives [2]", "fix:"],
    ),
    (
        "wrong-output-count",
        impl_returns(lambda x, y: (x, y)),
        (torch.ones(2), torch.ones(2)),
        TypeError,
        [
            "returned tuple with 2 item(s)",
            "declares 1 tensor output(s) ['out']",
            "fix: return one tensor per output",
        ],
    ),
]


@pytest.mark.parametrize(
    ("impl", "args", "error", "parts"), [e[1:] for e in EAGER], ids=[e[0] for e in EAGER]
)
def test_eager_op_enforces_the_declaration(
    impl: Any, args: tuple[torch.Tensor, ...], error: type[Exception], parts: list[str]
) -> None:
    with register_spec(OpSpec(**_base(**({"impl": impl} if impl else {})))) as handle:
        with pytest.raises(error) as info:
            handle.op(*args)
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


# -- check_op: bad input, and a planted wrong kernel ----------------------------------------------


def test_check_op_refuses_samples_that_do_not_fit() -> None:
    spec = OpSpec(**_base())
    with pytest.raises(
        SpecError,
        match=(
            r"sample 0 does not fit the schema \(Tensor x, Tensor y, float alpha=2.0\) ->"
            r" Tensor.*fix:"
        ),
    ):
        check_op(spec, [(torch.ones(2),)])
    with pytest.raises(
        SpecError,
        match=(
            r"exporters must be a non-empty subset of \('torchscript', 'dynamo'\); received"
            r" \['onnx'\]"
        ),
    ):
        check_op(spec, [(torch.ones(2), torch.ones(2))], exporters=["onnx"])
    with pytest.raises(SpecError, match="sample_inputs must be a non-empty list"):
        check_op(spec, [])


def scale_sub_np(x: np.ndarray, y: np.ndarray, *, alpha: float) -> np.ndarray:
    return (x.dtype.type(alpha) * x - y).astype(x.dtype)  # planted bug: - instead of +


def test_check_op_fails_a_wrong_kernel() -> None:
    spec = OpSpec(**_base(kernel=scale_sub_np))
    with pytest.raises(VerificationError) as info:
        check_op(spec, [(torch.randn(2, 3), torch.randn(2, 3), 0.5)], dtypes=False)
    report = info.value.report
    failed = [c.name for c in report.failures()]  # type: ignore[attr-defined]
    assert len(failed) == 2 and all("custom node vtest::ScaleAdd" in n for n in failed)
    assert all(c.passed for c in report.cases if c.name.startswith("opcheck"))  # type: ignore[attr-defined]
    assert "vtest::scale_add" not in registered_specs()


def test_a_kernel_declared_elsewhere_is_checked_then_served() -> None:
    """kernel: a KernelRegistry (e.g. a family module's) whose declaration agrees with the spec."""
    spec = OpSpec(**_base(kernel=_kernel_decl(["float32", "float64"])))
    report = check_op(spec, [(torch.randn(2, 3), torch.randn(2, 3), 0.5)], dtypes=False)
    assert [c.passed for c in report.cases if "custom node" in c.name] == [True, True]


def _body(inputs: list[str], outputs: list[str], attributes: list[str]) -> Any:
    import onnx

    nodes = [onnx.helper.make_node("Identity", [inputs[0]], [o]) for o in outputs]
    return onnx.helper.make_function(
        "vtest",
        "ScaleAdd",
        inputs,
        outputs,
        nodes,
        [onnx.helper.make_opsetid("", 17)],
        attributes=attributes,
    )


FUNCTION_BODIES = [
    (
        "not-a-body",
        lambda: 42,
        ["could not be built (KernelError", "fix: give an onnx.FunctionProto"],
    ),
    ("raising-builder", lambda: 1 / 0, ["could not be built (ZeroDivisionError"]),
    (
        "wrong-inputs",
        lambda: _body(["x"], ["out"], ["alpha"]),
        ["takes 1 input(s) ['x'], the spec declares 2"],
    ),
    (
        "wrong-outputs",
        lambda: _body(["x", "y"], ["a", "b"], ["alpha"]),
        ["has 2 output(s) ['a', 'b'], the spec declares 1"],
    ),
    (
        "unknown-attribute",
        lambda: _body(["x", "y"], ["out"], ["beta"]),
        [
            "reads attribute(s) ['beta'] that the spec does not declare (it has ['alpha'])",
            "fix: declare them in attr_desc",
        ],
    ),
]


@pytest.mark.parametrize(
    ("function", "parts"), [f[1:] for f in FUNCTION_BODIES], ids=[f[0] for f in FUNCTION_BODIES]
)
def test_function_body_checked_at_registration(function: Any, parts: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        register_spec(OpSpec(**_base(function=function)))
    assert info.value.key == ("function",)
    _assert_names(info.value, "op vtest::scale_add: the function body", *parts)
    assert torch._C._jit_get_schemas_for_operator("vtest::scale_add") == []


def test_scoped_spec_leaves_a_translation_it_did_not_add() -> None:
    """The user registered the same translation first:
    leaving the spec's scope must not remove it."""
    default_registry().add(
        SymbolicEntry(normalize_target("vtest::scale_add"), 9, scale_add_translation)
    )
    try:
        with spec_scope():
            register_spec(OpSpec(**_base(translations={9: scale_add_translation})))
        assert [e.fn for e in default_registry().entries_for("vtest::scale_add")] == [
            scale_add_translation
        ]
    finally:
        default_registry().remove("vtest::scale_add", opset=9)
