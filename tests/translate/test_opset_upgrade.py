"""Symbolic functions written for opset 9/11 the way mmcv, mmdeploy and the tutorials write
them -- ``axes_i=``, ``split_i=``, ``min_f=``, ``pads_i=``, ``k_i=`` -- export at every opset
where those attributes became inputs, with both exporters (dynamo always builds at opset 18), and
verify in ONNX Runtime against eager ops written independently in torch.

Without the upgrade in ``g.op``, TorchScript at opset >= 13 wrote nodes ORT refuses to load, and
dynamo could not use these functions at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import torch.nn.functional as F
from _one_op import One
from torch.onnx import symbolic_helper

import onnx_custom
from onnx_custom.errors import HalfPrecisionError, SymbolicError
from onnx_custom.translate.attributes import AttrKind, AttrValue
from onnx_custom.translate.opset_upgrade import attributes_moved_to_inputs, split_outputs_attribute

registry = onnx_custom.default_registry().copy()


def _op(
    name: str, eager: Callable[..., Any], fake: Callable[..., Any], symbolic: Callable[..., Any]
) -> Any:
    """A one-input custom op ``oup::name`` with its opset-11 style symbolic registered."""
    op = torch.library.custom_op(f"oup::{name}", mutates_args=())(eager)
    op.register_fake(fake)
    onnx_custom.register_custom_op_symbolic(f"oup::{name}", symbolic, 11, registry=registry)
    return op


# -- the ops: eager in plain torch, symbolic in the opset-11 attribute style ----------------------


def _norm_last(x: torch.Tensor) -> torch.Tensor:
    return (x / x.abs().sum(-1, keepdim=True).clamp(min=1e-3)).unsqueeze(0).squeeze(0)


@symbolic_helper.parse_args("v")
def _norm_last_symbolic(g, x):  # type: ignore[no-untyped-def]
    total = g.op("ReduceSum", g.op("Abs", x), axes_i=[-1], keepdims_i=1)  # axes: input from 13
    total = g.op("Clip", total, min_f=1e-3)  # min/max: inputs from 11 (attributes until 6..10)
    y = g.op("Unsqueeze", g.op("Div", x, total), axes_i=[0])  # axes: input from 13
    return g.op("Squeeze", y, axes_i=[0])


def _centered(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(dim=(-2, -1), keepdim=True)


@symbolic_helper.parse_args("v")
def _centered_symbolic(g, x):  # type: ignore[no-untyped-def]
    return g.op(
        "Sub", x, g.op("ReduceMean", x, axes_i=[-2, -1], keepdims_i=1)
    )  # axes: input from 18


def _halves(x: torch.Tensor) -> torch.Tensor:
    a, b = x.split([2, x.shape[-1] - 2], dim=-1)
    return torch.cat([b, a * 2], dim=-1)


@symbolic_helper.parse_args("v")
def _halves_symbolic(g, x):  # type: ignore[no-untyped-def]
    # split_i as written for a fixed last dim of 6 (the export shape's):
    # the eager op splits 2 | rest
    a, b = g.op("Split", x, split_i=[2, 4], axis_i=-1, outputs=2)  # split: input from 13
    return g.op("Concat", b, g.op("Mul", a, g.op("Constant", value_t=torch.tensor(2.0))), axis_i=-1)


def _even_halves(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=1)
    return a * b


@symbolic_helper.parse_args("v")
def _even_halves_symbolic(g, x):  # type: ignore[no-untyped-def]
    a, b = g.op("Split", x, axis_i=1, outputs=2)  # no sizes: num_outputs from opset 18
    return g.op("Mul", a, b)


def _padded(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, (1, 2), value=0.5)


@symbolic_helper.parse_args("v")
def _padded_symbolic(g, x):  # type: ignore[no-untyped-def]
    # pads/value: inputs 'pads'/'constant_value' from 11 (attributes until 2..10); rank 2 here
    return g.op("Pad", x, pads_i=[0, 1, 0, 2], value_f=0.5, mode_s="constant")


def _top2(x: torch.Tensor) -> torch.Tensor:
    return x.topk(2, dim=-1).values.clone()


@symbolic_helper.parse_args("v")
def _top2_symbolic(g, x):  # type: ignore[no-untyped-def]
    values, _ = g.op("TopK", x, k_i=2, axis_i=-1, outputs=2)  # k: 1-D input 'K' from 10
    return values


def _inner(x: torch.Tensor) -> torch.Tensor:
    return x[:, 1:3].clone()


@symbolic_helper.parse_args("v")
def _inner_symbolic(g, x):  # type: ignore[no-untyped-def]
    return g.op(
        "Slice", x, starts_i=[1], ends_i=[3], axes_i=[1]
    )  # starts/ends/axes: inputs from 10


norm_last = _op("norm_last", _norm_last, lambda x: torch.empty_like(x), _norm_last_symbolic)
centered = _op("centered", _centered, lambda x: torch.empty_like(x), _centered_symbolic)
halves = _op("halves", _halves, lambda x: torch.empty_like(x), _halves_symbolic)
even_halves = _op(
    "even_halves",
    _even_halves,
    lambda x: x.new_empty(x.shape[0], x.shape[1] // 2),
    _even_halves_symbolic,
)
padded = _op("padded", _padded, lambda x: x.new_empty(x.shape[0], x.shape[1] + 3), _padded_symbolic)
top2 = _op("top2", _top2, lambda x: x.new_empty(*x.shape[:-1], 2), _top2_symbolic)
inner = _op("inner", _inner, lambda x: x.new_empty(x.shape[0], 2), _inner_symbolic)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    op: Any
    shape: tuple[int, ...]
    moved: tuple[str, ...]  # node types whose attributes became inputs at opset >= 13 or 18
    dtype: torch.dtype = torch.float32


CASES = [
    Case("norm_last-x[3,5]", norm_last, (3, 5), ("ReduceSum", "Unsqueeze", "Squeeze")),
    Case(
        "norm_last-float16-x[3,5]",
        norm_last,
        (3, 5),
        ("ReduceSum", "Unsqueeze", "Squeeze"),
        torch.float16,
    ),
    Case("centered-x[2,4,3]", centered, (2, 4, 3), ("ReduceMean",)),
    Case("halves-x[4,6]", halves, (4, 6), ("Split",)),
    Case("even_halves-x[3,8]", even_halves, (3, 8), ("Split",)),
    Case("padded-x[3,4]", padded, (3, 4), ("Pad",)),
    Case("padded-float16-x[3,4]", padded, (3, 4), ("Pad",), torch.float16),
    Case(
        "norm_last-bfloat16-x[3,5]",
        norm_last,
        (3, 5),
        ("ReduceSum", "Unsqueeze", "Squeeze"),
        torch.bfloat16,
    ),
    Case("padded-bfloat16-x[3,4]", padded, (3, 4), ("Pad",), torch.bfloat16),
    Case("top2-x[4,7]", top2, (4, 7), ("TopK",)),
    Case("inner-x[5,6]", inner, (5, 6), ("Slice",)),
]
# 11: the attributes kept; 13: axes/split moved; 18: the reductions' axes moved, Split's num_outputs
OPSETS = [
    ("torchscript", 11),
    ("torchscript", 13),
    ("torchscript", 18),
    ("dynamo", 13),
    ("dynamo", 18),
]


@pytest.mark.parametrize(("exporter", "opset"), OPSETS, ids=[f"{e}-opset{o}" for e, o in OPSETS])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_opset11_symbolic_exports_and_verifies_at_later_opsets(
    case: Case, exporter: str, opset: int, tmp_path: Path
) -> None:
    if exporter == "dynamo" and opset == 13 and case.op is centered:
        pytest.skip(
            "ReduceMean changed at opset 18: dynamo, which builds at 18, refuses to lower it to 13"
            " (tested below)"
        )
    torch.manual_seed(0)
    x = torch.randn(case.shape).to(case.dtype)
    path = tmp_path / "model.onnx"
    if case.dtype == torch.bfloat16 and opset < 13:  # ONNX has bfloat16 from opset 13 on
        with pytest.raises(
            HalfPrecisionError, match=r"(?s)bfloat16 needs opset 13\+.*Fix: export at opset 13"
        ):
            onnx_custom.export(
                One(case.op), (x,), path, exporter=exporter, opset=opset, registry=registry
            )
        return
    onnx_custom.export(
        One(case.op),
        (x,),
        path,
        exporter=exporter,
        opset=opset,
        registry=registry,
        dynamic_shapes={"x": {0: "batch"}},
    )
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)  # the nodes are valid at the file's opset
    report = onnx_custom.verify(One(case.op), (x,), path, trials=2)
    assert report.passed
    assert [
        t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"
    ]  # other batch sizes too


def test_dynamo_below_the_reductions_change_still_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(
        onnx_custom.errors.OnnxCustomError,
        match=r"ReduceMean \(changed at opset 18\).*exporter='torchscript'",
    ):
        onnx_custom.export(
            One(centered),
            (torch.randn(2, 4, 3),),
            tmp_path / "m.onnx",
            exporter="dynamo",
            opset=13,
            registry=registry,
        )


# -- the moves themselves, read off onnx.defs -----------------------------------------------------

AXES = AttrValue("axes", AttrKind.INTS, (0,))
KEEP = AttrValue("keepdims", AttrKind.INT, 1)
MOVES = [
    ("Unsqueeze", 11, [AXES], [], ["axes"]),
    ("Unsqueeze", 13, [AXES], [(1, torch.int64)], []),
    ("ReduceMean", 17, [AXES, KEEP], [], ["axes", "keepdims"]),
    ("ReduceMean", 18, [AXES, KEEP], [(1, torch.int64)], ["keepdims"]),
    ("Clip", 11, [AttrValue("max", AttrKind.FLOAT, 6.0)], [(2, None)], []),  # typed like input 0
    (
        "Pad",
        11,
        [AttrValue("value", AttrKind.FLOAT, 0.5), AttrValue("mode", AttrKind.STRING, "constant")],
        [(2, None)],
        ["mode"],
    ),
    ("TopK", 11, [AttrValue("k", AttrKind.INT, 3)], [(1, torch.int64)], []),
    (
        "Slice",
        13,
        [AttrValue("starts", AttrKind.INTS, (1,))],
        [(1, torch.int64)],
        [],
    ),  # Tind: int64 preferred
    (
        "Dropout",
        13,
        [AttrValue("ratio", AttrKind.FLOAT, 0.1)],
        [(1, torch.float32)],
        [],
    ),  # T1, not input 0's T
    (
        "Relu",
        18,
        [AttrValue("axes", AttrKind.INTS, (0,))],
        [],
        ["axes"],
    ),  # never had it: left for the check to refuse
]


@pytest.mark.parametrize(
    ("op_type", "opset", "attrs", "moved", "kept"),
    MOVES,
    ids=[f"{m[0]}-opset{m[1]}" for m in MOVES],
)
def test_attributes_that_became_inputs(
    op_type: str,
    opset: int,
    attrs: list[AttrValue],
    moved: list[tuple[int, torch.dtype | None]],
    kept: list[str],
) -> None:
    left, moves = attributes_moved_to_inputs(op_type, opset, attrs)
    assert [(m.index, m.dtype) for m in moves] == moved
    assert [a.name for a in left] == kept


def test_topk_k_moves_as_a_one_element_list() -> None:
    _, (move,) = attributes_moved_to_inputs("TopK", 11, [AttrValue("k", AttrKind.INT, 3)])
    assert move.value == [3]


@pytest.mark.parametrize(
    ("opset", "inputs", "wanted"),
    [(17, 1, None), (18, 1, 2), (18, 2, None)],
    ids=["opset17", "opset18", "opset18-split-input"],
)
def test_split_gets_num_outputs_only_when_nothing_says_the_sizes(
    opset: int, inputs: int, wanted: int | None
) -> None:
    extra = split_outputs_attribute("Split", opset, inputs, [], 2)
    assert (extra.value if extra else None) == wanted


@symbolic_helper.parse_args("v")
def _both_symbolic(g, x):  # type: ignore[no-untyped-def]
    axes = g.op("Constant", value_t=torch.tensor([0]))
    return g.op("Squeeze", g.op("Unsqueeze", x, axes, axes_i=[0]), axes)


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


both = _op("both", _copy, lambda x: torch.empty_like(x), _both_symbolic)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_axes_given_as_input_and_attribute_is_an_error_naming_the_fix(
    exporter: str, tmp_path: Path
) -> None:
    with pytest.raises(
        SymbolicError,
        match=(
            r"Unsqueeze \(opset 1[38]\) takes 'axes' as input 1; received it both .* Fix: pass it"
            r" once"
        ),
    ):
        onnx_custom.export(
            One(both),
            (torch.randn(3),),
            tmp_path / "m.onnx",
            exporter=exporter,
            opset=13 if exporter == "torchscript" else 18,
            registry=registry,
        )
