"""Typed errors of the kernel host: kernel failures, Ctrl-C, declaration mismatches,
bad declarations.

Every case asserts the error type and that the message names what was expected, what was
received and the fix.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import AttributeProto, TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail

import onnx_custom
import onnx_custom.runtime as rt
from onnx_custom.errors import KernelError, SymbolicError
from onnx_custom.runtime import KernelRegistry, KernelRunError, TensorInfo
from onnx_custom.runtime.validate import NodeDeclarationError

kernels = KernelRegistry()


class PlannedFailure(RuntimeError):
    """A kernel's own exception type."""


@kernels.kernel(
    "err::Fail", inputs=["x"], outputs=["y"], attrs={"mode": ("string", "ok")}, shape_fn="like:x"
)
def fail(x: np.ndarray, *, mode: str) -> Any:
    if mode == "value":
        raise ValueError(f"bad value {x.shape}")
    if mode == "custom":
        raise PlannedFailure("planned")
    if mode == "interrupt":
        raise KeyboardInterrupt
    if mode == "dtype":
        return x.astype(np.float64)
    if mode == "shape":
        return np.zeros(x.shape[0] + 1, x.dtype)
    return x * 2


@kernels.kernel(
    "err::Decl",
    inputs=["a", "b?", "c?"],
    outputs=["y", "z?"],
    attrs={
        "alpha": "float",
        "count": ("int", 1),
        "names": ("strings", ["n"]),
        "tag": ("string", "t"),
    },
    dtypes={"a": ("float32", "float64")},
)
def decl(
    a: np.ndarray, b: Any, c: Any, *, alpha: float, count: int, names: list[str], tag: str
) -> Any:
    return a * alpha, a


@kernels.kernel("err::Var", inputs=["first", "rest*"], outputs=["y"], shape_fn="like:first")
def var(first: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    return first + sum(rest)


def one(
    op: str,
    inputs: list[str],
    outputs: list[str],
    in_types: dict[str, int] | None = None,
    name: str = "the_node",
    **attrs: Any,
) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, outputs, domain="err", name=name, **attrs)
    types = in_types or {}
    graph_inputs = [
        helper.make_tensor_value_info(i, types.get(i, TensorProto.FLOAT), [3])
        for i in dict.fromkeys(i for i in inputs if i)
    ]
    graph = helper.make_graph(
        [node],
        "g",
        graph_inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("err", 1)],
        ir_version=10,
    )


# ---- kernel failures at run time --------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "cause", "match"),
    [
        (
            "value",
            "ValueError",
            r"(?s)err::Fail failed .*node 'the_node'.*ValueError: bad value \(3,\).*"
            r"Traceback.*in fail.*fix: the error comes from the kernel's own code",
        ),
        ("custom", "PlannedFailure", r"(?s)PlannedFailure: planned.*fix:"),
        ("dtype", None, r"output 0: expected dtype float32, received float64; fix: cast"),
        ("shape", None, r"output 0: expected shape \(3,\).*received \(4,\); fix:"),
    ],
)
@pytest.mark.parametrize("api", ["run", "run_with_ort_values", "run_with_iobinding"])
def test_kernel_failures_raise_kernel_run_error(
    mode: str, cause: str | None, match: str, api: str
) -> None:
    sess = rt.InferenceSession(one("Fail", ["x"], ["y"], mode=mode), kernels=kernels)
    x = np.arange(3, dtype=np.float32)
    with pytest.raises(KernelRunError, match=match) as info:
        if api == "run":
            sess.run(None, {"x": x})
        elif api == "run_with_ort_values":
            sess.run_with_ort_values(None, {"x": ort.OrtValue.ortvalue_from_numpy(x)})
        else:
            binding = sess.io_binding()
            binding.bind_cpu_input("x", x)
            binding.bind_output("y")
            sess.run_with_iobinding(binding)
    err = info.value
    assert isinstance(err, KernelError) and isinstance(
        err, Fail
    )  # code written for plain ORT still works
    assert (err.kernel, err.node, err.cause_type) == ("err::Fail", "the_node", cause)
    if cause:
        assert type(err.__cause__).__name__ == cause and err.cause is err.__cause__
        assert "in fail" in err.traceback and cause in err.traceback
    np.testing.assert_array_equal(
        rt.InferenceSession(one("Fail", ["x"], ["y"]), kernels=kernels).run(None, {"x": x})[0],
        2 * x,
    )


def test_keyboard_interrupt_inside_a_kernel_is_keyboard_interrupt() -> None:
    sess = rt.InferenceSession(one("Fail", ["x"], ["y"], mode="interrupt"), kernels=kernels)
    with pytest.raises(KeyboardInterrupt):
        sess.run(None, {"x": np.zeros(3, np.float32)})


def test_ctrl_c_during_a_kernel_is_keyboard_interrupt(tmp_path: Path) -> None:
    """A real SIGINT arriving while a (main-thread) kernel runs surfaces as KeyboardInterrupt."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(
        textwrap.dedent("""
        import os, signal, time, numpy as np
        # Python's own Ctrl-C handler, whatever the parent left: a background job of a
        # non-interactive shell starts with SIGINT ignored, and Python then installs none.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from onnx import helper, TensorProto
        import onnx_custom.runtime as rt
        from onnx_custom.runtime import KernelRegistry
        reg = KernelRegistry()

        @reg.kernel("t::Slow", inputs=["x"], outputs=["y"], shape_fn="like:x")
        def slow(x):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            time.sleep(30)  # interrupted: the handler raises here
            return x

        node = helper.make_node("Slow", ["x"], ["y"], domain="t")
        g = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("t", 1)]
        m = helper.make_model(g, opset_imports=opsets, ir_version=10)
        sess = rt.InferenceSession(m, kernels=reg)
        start = time.monotonic()
        try:
            sess.run(None, {"x": np.zeros(2, np.float32)})
        except KeyboardInterrupt:
            print("KeyboardInterrupt after", round(time.monotonic() - start), "s")
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "KeyboardInterrupt after 0 s" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_kernel_refused_at_session_creation_is_typed() -> None:
    """An input dtype the model does not state (made inside the graph) is caught when ORT creates
    the kernel; the error names the node, the declaration and the fix."""
    reg = KernelRegistry()
    reg.kernel("err::FloatOnly", inputs=["x"], outputs=["y"], dtypes="float32", shape_fn="like:x")(
        _noop
    )
    nodes = [
        helper.make_node("Cast", ["x"], ["t"], to=TensorProto.INT64),
        helper.make_node("FloatOnly", ["t"], ["y"], domain="err", name="picky"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("err", 1)],
        ir_version=10,
    )
    with pytest.raises(
        KernelRunError,
        match=r"err::FloatOnly failed while ONNX Runtime created the kernel of "
        r"node 'picky': .*input 0 \('x'\) has dtype int64; expected one of "
        r"float32; fix: cast the input",
    ) as info:
        rt.InferenceSession(model, kernels=reg)
    assert (info.value.node, info.value.cause_type) == ("picky", "KernelError")


@pytest.mark.parametrize(
    ("case", "match"),
    [
        (
            "input-dtype",
            r"node 'mm' \(err::Picky\) gives input 't' of dtype int64, outside the kernel's"
            r" declared "
            r"input dtypes \(x: float32; mask: .*\); fix: cast the input",
        ),
        (
            "output-dtype",
            r"node 'mm' \(err::Picky\) output 'y': the model states int64 but the kernel produces "
            r"float .*fix: correct the model's type",
        ),
    ],
)
def test_ort_type_errors_on_our_nodes_name_the_declaration(case: str, match: str) -> None:
    """Dtypes ORT learns inside the graph (not stated by the model) are checked by ORT itself."""
    reg = KernelRegistry()
    reg.kernel("err::Picky", inputs=["x", "mask"], outputs=["y"], dtypes={"x": "float32"})(
        lambda x, mask: x
    )
    made_inside = case == "input-dtype"  # int64 made by a Cast: the model states no dtype for it
    nodes = [helper.make_node("Cast", ["x"], ["t"], to=TensorProto.INT64)] if made_inside else []
    nodes.append(
        helper.make_node(
            "Picky", ["t" if made_inside else "x", "m"], ["y"], domain="err", name="mm"
        )
    )
    y_type = (
        TensorProto.FLOAT if made_inside else TensorProto.INT64
    )  # the latter contradicts the kernel
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("m", TensorProto.BOOL, [3]),
        ],
        [helper.make_tensor_value_info("y", y_type, [3])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("err", 1)],
        ir_version=10,
    )
    with pytest.raises(KernelError, match=match):
        rt.InferenceSession(model, kernels=reg)


# ---- declaration mismatches, checked before ORT sees the model ------------------------------
F, I64, STR = TensorProto.FLOAT, TensorProto.INT64, AttributeProto.STRING
DECL_CASES = [
    (
        "too-many-inputs",
        dict(op="Decl", inputs=["a", "b", "c", "d"], outputs=["y"], alpha=1.0),
        r"has 4 input\(s\) \['a', 'b', 'c', 'd'\] but the kernel declares 1 to 3: \[a, b\?, c\?\]",
    ),
    (
        "no-inputs",
        dict(op="Decl", inputs=[], outputs=["y"], alpha=1.0),
        r"has 0 input\(s\) \[\] but the kernel declares 1 to 3",
    ),
    (
        "empty-required-input",
        dict(op="Var", inputs=["", "r"], outputs=["y"]),
        r"leaves required input 0 \('first'\) empty",
    ),
    (
        "variadic-missing",
        dict(op="Var", inputs=["a"], outputs=["y"]),
        r"has 1 input\(s\) \['a'\] but the kernel declares 2 or more: \[first, rest\*\]",
    ),
    (
        "too-many-outputs",
        dict(op="Decl", inputs=["a"], outputs=["y", "z", "w"], alpha=1.0),
        r"has 3 output\(s\) \['y', 'z', 'w'\] but the kernel declares 1 to 2: \[y, z\?\]",
    ),
    (
        "no-outputs",
        dict(op="Fail", inputs=["x"], outputs=[]),
        r"has 0 output\(s\) \[\] but the kernel declares 1: \[y\]",
    ),
    (
        "int-for-float",
        dict(op="Decl", inputs=["a"], outputs=["y"], alpha=2),
        (
            r"sets attribute 'alpha' as int but the kernel declares float; fix: set it as a float,"
            r" e.g. alpha=1.0"
        ),
    ),
    (
        "float-for-int",
        dict(op="Decl", inputs=["a"], outputs=["y"], alpha=1.0, count=2.5),
        (
            r"sets attribute 'count' as float but the kernel declares int; fix: set it as a int,"
            r" e.g. count=1"
        ),
    ),
    (
        "string-for-strings",
        dict(op="Decl", inputs=["a"], outputs=["y"], alpha=1.0, names="n"),
        r"sets attribute 'names' as string but the kernel declares strings",
    ),
    (
        "ints-for-string",
        dict(op="Decl", inputs=["a"], outputs=["y"], alpha=1.0, tag=[1, 2]),
        r"sets attribute 'tag' as ints but the kernel declares string",
    ),
    (
        "missing-required-attr",
        dict(op="Decl", inputs=["a"], outputs=["y"]),
        (
            r"lacks required attribute 'alpha' \(float\); fix: set it on the node \(alpha=1.0\) or"
            r" declare a default"
        ),
    ),
    (
        "misspelt-attr",
        dict(op="Decl", inputs=["a"], outputs=["y"], alpha=1.0, cout=3),
        r"sets attribute 'cout', which the kernel does not declare \(declared: alpha \(float\),"
        r" count \(int\).*"
        r"fix: rename it",
    ),
    (
        "input-dtype",
        dict(op="Decl", inputs=["a"], outputs=["y"], alpha=1.0, in_types={"a": I64}),
        (
            r"gives input 0 \('a'\) 'a' of dtype int64; expected one of float32, float64; fix: cast"
            r" the input"
        ),
    ),
    (
        "variadic-dtype-ok-first-bad",
        dict(
            op="Decl",
            inputs=["a", "b"],
            outputs=["y"],
            alpha=1.0,
            in_types={"a": TensorProto.INT32},
        ),
        r"input 0 \('a'\) 'a' of dtype int32; expected one of float32, float64",
    ),
]


@pytest.mark.parametrize(("case", "spec", "match"), DECL_CASES, ids=[c[0] for c in DECL_CASES])
def test_declaration_mismatches_are_typed_before_ort(
    case: str, spec: dict[str, Any], match: str
) -> None:
    spec = dict(spec)
    model = one(
        spec.pop("op"), spec.pop("inputs"), spec.pop("outputs"), spec.pop("in_types", None), **spec
    )
    for entry in (
        lambda: rt.InferenceSession(model, kernels=kernels),
        lambda: rt.session_options(model, kernels=kernels),
    ):
        with pytest.raises(NodeDeclarationError, match=match) as info:
            entry()
        text = str(info.value)
        assert "node 'the_node' (err::" in text and "fix:" in text
        assert isinstance(info.value, KernelError) and len(info.value.problems) == 1


def test_invalid_utf8_string_attribute_is_typed() -> None:
    model = one("Fail", ["x"], ["y"])
    model.graph.node[0].attribute.append(AttributeProto(name="mode", type=STR, s=b"\xff\xfe"))
    with pytest.raises(
        NodeDeclarationError,
        match=r"attribute 'mode' to bytes that are not valid UTF-8; fix: store UTF-8",
    ):
        rt.InferenceSession(model, kernels=kernels)


def test_all_problems_listed_at_once() -> None:
    model = one("Decl", ["a", "b", "c", "d"], ["y"], cout=1)
    with pytest.raises(NodeDeclarationError) as info:
        rt.InferenceSession(model, kernels=kernels)
    assert len(info.value.problems) == 3  # arity, unknown attribute, missing alpha
    assert str(info.value).startswith("3 custom node problem(s)")


# ---- bad declarations, refused at registration ------------------------------------------------
def _noop(x: Any, **kw: Any) -> Any:
    return x


def _out_kernel(x: Any, *, out: Any) -> None:
    out[0][...] = x


BAD_DECLARATIONS = [
    (
        "like-unknown-input",
        dict(shape_fn="like:nope"),
        r"shape_fn='like:nope'; expected a callable, 'broadcast', 'like0' or 'like:<input name>'"
        r" with one "
        r"of the declared inputs \('like:x'\); fix: name a declared input",
    ),
    ("rule-typo", dict(shape_fn="broadcst"), r"shape_fn='broadcst'; expected .*'like:x'.*fix:"),
    (
        "rule-wrong-type",
        dict(shape_fn=3),
        r"shape_fn must be a callable, one of .* or None; received int",
    ),
    (
        "out-without-shape",
        dict(fn=_out_kernel),
        (
            r"writes into preallocated outputs \(out=\) but declares no shape_fn.*fix: pass"
            r" shape_fn=\"like:x\""
        ),
    ),
    (
        "huge-int-default",
        dict(attrs={"k": ("int", 2**70)}),
        (
            r"default of attribute 'k' is 1180591620717411303424, outside ONNX's int64 range.*fix:"
            r" use a value"
        ),
    ),
    (
        "huge-ints-default",
        dict(attrs={"k": ("ints", [1, -(2**64)])}),
        r"default of attribute 'k' is -18446744073709551616, outside ONNX's int64 range",
    ),
    (
        "wrong-default-type",
        dict(attrs={"k": ("int", "3")}),
        r"default of attribute 'k' must be a int; received '3'; fix: pass a int default",
    ),
    (
        "tensor-type",
        dict(tensor_type="jax"),
        r"tensor_type must be 'numpy' or 'torch'; received 'jax'; fix:",
    ),
    (
        "rule-without-inputs",
        dict(inputs=[], shape_fn="broadcast"),
        (
            r"shape_fn='broadcast' expects a declared input to copy from; received inputs=\[\];"
            r" fix: pass a callable"
        ),
    ),
]


@pytest.mark.parametrize(
    ("case", "kw", "match"), BAD_DECLARATIONS, ids=[c[0] for c in BAD_DECLARATIONS]
)
def test_bad_declarations_are_symbolic_errors(case: str, kw: dict[str, Any], match: str) -> None:
    kw = dict(kw)
    fn = kw.pop("fn", _noop)
    inputs = kw.pop("inputs", ["x"])
    with pytest.raises(SymbolicError, match=match):
        KernelRegistry().kernel("err::Bad", inputs=inputs, outputs=["y"], **kw)(fn)


def test_huge_int_default_never_reaches_onnx_schema_registration() -> None:
    reg = KernelRegistry()
    with pytest.raises(SymbolicError, match="int64 range"):
        reg.kernel("err::Big", inputs=["x"], outputs=["y"], attrs={"k": ("int", -(2**63) - 1)})(
            _noop
        )
    reg.kernel("err::Big", inputs=["x"], outputs=["y"], attrs={"k": ("int", 2**63 - 1)})(_noop)
    assert rt.register_schemas(reg) == ["err::Big"]


def test_shape_fn_returning_garbage_is_typed() -> None:
    reg = KernelRegistry()
    reg.kernel("err::Garbage", inputs=["x"], outputs=["y"], shape_fn=lambda ins, a: [(3,)])(_noop)
    with pytest.raises(
        KernelError,
        match=r"shape_fn must return TensorInfo objects .*received tuple; fix: return TensorInfo",
    ):
        reg["err::Garbage"].infer([TensorInfo(np.dtype(np.float32), (3,))], {})


def test_torch_tensor_fed_to_run_names_the_fix(tmp_path: Path) -> None:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9
    )
    session = onnx_custom.InferenceSession(model)
    with pytest.raises(onnx_custom.InvalidArgumentError) as info:
        session.run(None, {"x": torch.randn(3, 4)})
    message = str(info.value)
    assert (
        "torch.Tensor" in message and "expected a numpy array" in message and ".numpy()" in message
    )
