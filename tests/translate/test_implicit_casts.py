"""Symbolics written for ``register_custom_op_symbolic`` leave mixed dtypes to the TorchScript
exporter's scalar type analysis: ``g.op("Mul", x, g.op("Constant", value_t=torch.tensor(2.0)))``
on a float16 ``x`` (mmcv's style), an int64 ``x`` times a float constant. ``g.op`` now applies
torch's promotion itself, so such symbolics export with both exporters and in half precision,
where it used to refuse them. The rule is checked against torch's own ``result_type`` and, end
to end, against the eager ops in ONNX Runtime at other batch sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _one_op import One

import onnx_custom
from onnx_custom.translate.implicit_casts import implicit_dtype, promoted_inputs

TENSOR_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.uint8,
]
# a 0-d Constant counts as a Python scalar of its category
SCALARS = [
    (torch.float32, 2.5),
    (torch.float64, 2.5),
    (torch.int64, 2),
    (torch.int32, 2),
    (torch.bool, True),
]


@pytest.mark.parametrize("tensor", TENSOR_DTYPES, ids=str)
@pytest.mark.parametrize(("constant", "python_value"), SCALARS, ids=[f"0d-{d}" for d, _ in SCALARS])
def test_a_0d_constant_promotes_like_a_python_scalar(
    tensor: torch.dtype, constant: torch.dtype, python_value: Any
) -> None:
    expected = torch.result_type(torch.ones(2, dtype=tensor), python_value)
    assert implicit_dtype([(tensor, False), (constant, True)]) == expected
    assert implicit_dtype([(constant, True), (tensor, False)]) == expected  # order does not matter


@pytest.mark.parametrize("a", TENSOR_DTYPES, ids=str)
@pytest.mark.parametrize("b", [torch.float16, torch.float32, torch.int64, torch.bool], ids=str)
def test_dimensioned_operands_promote_as_tensors(a: torch.dtype, b: torch.dtype) -> None:
    expected = torch.result_type(torch.ones(2, dtype=a), torch.ones(2, dtype=b))
    assert implicit_dtype([(a, False), (b, False)]) == expected


PLANS = [
    ("Mul", [torch.float16, torch.float32], [False, True], (torch.float16, [1])),
    ("Mul", [torch.int64, torch.float32], [False, True], (torch.float32, [0])),
    ("Add", [torch.float16, torch.float32], [False, False], (torch.float32, [0])),
    (
        "Where",
        [torch.bool, torch.float16, torch.float64],
        [False, False, True],
        (torch.float16, [2]),
    ),
    (
        "Where",
        [torch.bool, torch.float32, torch.float32],
        [False, False, False],
        None,
    ),  # the bool condition stays
    ("Mul", [torch.float16, None], [False, True], None),  # a dtype unknown: the type check decides
    (
        "Concat",
        [torch.float16, torch.float32],
        [False, False],
        None,
    ),  # not promoted by torch either
    ("Greater", [torch.int32, torch.int64], [False, False], (torch.int64, [0])),
]


@pytest.mark.parametrize(
    ("op", "dtypes", "scalars", "expected"), PLANS, ids=[f"{p[0]}-{i}" for i, p in enumerate(PLANS)]
)
def test_which_inputs_are_converted(
    op: str, dtypes: list[torch.dtype | None], scalars: list[bool], expected: Any
) -> None:
    assert promoted_inputs(op, dtypes, scalars) == expected


# -- end to end: symbolics in torch's style, both exporters, ORT at other batch sizes -------------

registry = onnx_custom.default_registry().copy()


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    eager: Callable[[torch.Tensor], torch.Tensor]
    symbolic: Callable[..., Any]
    dtype: torch.dtype


def _times_two_point_five(g, x):  # type: ignore[no-untyped-def]
    return g.op("Mul", x, g.op("Constant", value_t=torch.tensor(2.5)))


def _plus_last_dim(g, x):  # type: ignore[no-untyped-def]
    # a computed int64 0-d value (not a constant): cast like a tensor operand, as torch does
    size = g.op("Gather", g.op("Shape", x), g.op("Constant", value_t=torch.tensor(1)), axis_i=0)
    return g.op("Add", x, size)


def _relu_where(g, x):  # type: ignore[no-untyped-def]
    zero = g.op("Constant", value_t=torch.tensor(0))
    return g.op(
        "Where",
        g.op("Greater", x, zero),
        x,
        g.op("Constant", value_t=torch.tensor(0.0, dtype=torch.float64)),
    )


def _halved_count(g, x):  # type: ignore[no-untyped-def]
    return g.op(
        "Div", x, g.op("Constant", value_t=torch.tensor(2.0))
    )  # int64 x: computed in float32


CASES = [
    *(
        Case(f"mul-0d-float-{str(d)[6:]}-x[3,4]", lambda x: x * 2.5, _times_two_point_five, d)
        for d in (torch.float16, torch.bfloat16, torch.float32)
    ),
    *(
        Case(f"add-size-{str(d)[6:]}-x[3,4]", lambda x: x + x.shape[1], _plus_last_dim, d)
        for d in (torch.float16, torch.float32, torch.int64)
    ),
    *(
        Case(f"where-0d-{str(d)[6:]}-x[3,4]", lambda x: torch.where(x > 0, x, 0.0), _relu_where, d)
        for d in (torch.float16, torch.bfloat16)
    ),
    Case("div-int64-by-0d-float-x[3,4]", lambda x: x / 2.0, _halved_count, torch.int64),
]


def _op_for(case: Case) -> Any:
    name = "icast::" + case.id.split("-x[")[0].replace("-", "_")
    op = torch.library.custom_op(name, mutates_args=(), schema="(Tensor x) -> Tensor")(
        lambda x: case.eager(x).clone()
    )
    op.register_fake(lambda x: case.eager(torch.empty_like(x)))
    onnx_custom.register_custom_op_symbolic(name, case.symbolic, 11, registry=registry)
    return op


OPS = {case.id: _op_for(case) for case in CASES}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_torch_style_symbolic_with_mixed_dtypes_exports_and_verifies(
    case: Case, exporter: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    x = (torch.randn(3, 4) * 4).to(case.dtype)
    path = tmp_path / "m.onnx"
    model = One(OPS[case.id])
    onnx_custom.export(
        model,
        (x,),
        path,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        registry=registry,
        dynamic_shapes={"x": {0: "batch"}},
    )
    report = onnx_custom.verify(model, (x,), path, trials=2)
    assert report.passed
    assert [
        t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"
    ]  # other batch sizes too
