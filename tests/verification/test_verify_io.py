"""verify()'s inputs and outputs: matched by name, pruned inputs reported, bfloat16/float16 and 0-d
tensors end to end, declared types checked, weights that differ from the model's flagged."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
import onnx_custom.symbolics.bev_pool
from onnx_custom.ops.bev_pool import bev_pool_v2, prepare_bev_ranks, synthetic_frustum
from onnx_custom.verification.declared import DeclaredTypes, evaluate_dim
from onnx_custom.verification.runner import bind_inputs, make_session, run_onnx
from onnx_custom.verification.verifier import InitializerMismatchWarning, verify

EXPORTERS = ("torchscript", "dynamo")


# ----------------------------------------------------------------------------- matching by name


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return x * pair[0] - pair[1].sum(0)


PAIR_ARGS = (torch.randn(2, 3), (torch.randn(2, 3), torch.randn(4, 3)))


def _reversed_inputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    flipped = onnx.ModelProto()
    flipped.CopyFrom(proto)
    inputs = list(flipped.graph.input)[::-1]
    del flipped.graph.input[:]
    flipped.graph.input.extend(inputs)
    return flipped


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_nested_inputs_are_matched_by_name_in_any_order(exporter: str) -> None:
    names = {"input_names": ["x", "pair_0", "pair_1"]} if exporter == "torchscript" else {}
    proto = onnx_custom.export(Pair(), PAIR_ARGS, exporter=exporter, **names)  # type: ignore[arg-type]
    assert [i.name for i in proto.graph.input] == ["x", "pair_0", "pair_1"]
    flipped = _reversed_inputs(proto)  # by position, pair_1 [4, 3] would feed x [2, 3]
    binding = bind_inputs(flipped, PAIR_ARGS, Pair())
    assert binding.matched_by == "name" and binding.positions == (2, 1, 0) and binding.pruned == ()
    report = verify(Pair(), PAIR_ARGS, flipped, trials=2)
    assert (
        report.passed
        and report.input_matching == "inputs matched by name"
        and "Inputs:" not in str(report)
    )


def test_old_files_named_input_i_fall_back_to_position() -> None:
    proto = onnx_custom.export(
        Pair(), PAIR_ARGS, exporter="torchscript", input_names=["input_0", "input_1", "input_2"]
    )
    report = verify(Pair(), PAIR_ARGS, proto)
    assert report.passed and report.input_matching.startswith("inputs matched by position")
    assert "Inputs: inputs matched by position" in str(report)


class BevRanksAsInputs(torch.nn.Module):
    """bev_pool_v2 with the ranks and intervals passed in: 7 tensor arguments."""

    SHAPE = (1, 1, 16, 16, 8)

    def forward(
        self,
        depth: torch.Tensor,
        feat: torch.Tensor,
        ranks_depth: torch.Tensor,
        ranks_feat: torch.Tensor,
        ranks_bev: torch.Tensor,
        starts: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        return bev_pool_v2(
            depth, feat, ranks_depth, ranks_feat, ranks_bev, list(self.SHAPE), starts, lengths
        )


def _bev_args() -> tuple[torch.Tensor, ...]:
    cameras, depth_bins, feat_hw = 2, 4, (4, 6)
    coor = synthetic_frustum(1, cameras, depth_bins, feat_hw, depth_range=(1.0, 6.0))
    ranks = prepare_bev_ranks(coor, (-6.4, -6.4, -5.0), (0.8, 0.8, 10.0), (16, 16, 1))
    ranks_bev, ranks_depth, ranks_feat, starts, lengths = ranks
    assert ranks_bev.numel() > 10  # the synthetic rig lands points in the grid
    g = torch.Generator().manual_seed(0)
    depth = torch.randn(1, cameras, depth_bins, *feat_hw, generator=g).softmax(2)
    feat = torch.randn(1, cameras, *feat_hw, 8, generator=g)
    return depth, feat, ranks_depth, ranks_feat, ranks_bev, starts, lengths


@pytest.mark.parametrize(
    ("exporter", "pruned"),
    # TorchScript drops inputs the graph does not use (the default translation ignores the
    # intervals); dynamo keeps every input.
    [("torchscript", ("starts", "lengths")), ("dynamo", ())],
)
def test_inputs_the_exporter_pruned_are_reported_not_an_error(
    exporter: str, pruned: tuple[str, ...]
) -> None:
    args = _bev_args()
    proto = onnx_custom.export(
        BevRanksAsInputs(), args, exporter=exporter, opset=17 if exporter == "torchscript" else 18
    )
    assert len(proto.graph.input) == 7 - len(pruned)
    report = verify(BevRanksAsInputs(), args, proto, trials=2)
    assert report.passed, str(report)
    assert report.pruned_inputs == pruned
    if pruned:
        assert (
            "not inputs of the file (pruned by the exporter, unused by the graph): starts, lengths"
            in str(report)
        )
        assert report.to_dict()["pruned_inputs"] == ["starts", "lengths"]


def test_arguments_that_do_not_fit_forward_or_the_file_are_typed_errors() -> None:
    proto = onnx_custom.export(Pair(), PAIR_ARGS, exporter="dynamo")
    with pytest.raises(
        onnx_custom.VerificationError,
        match=r"takes 3 input\(s\).*hold 4 tensor\(s\).*do not fit Pair.forward",
    ):
        verify(Pair(), (*PAIR_ARGS, torch.randn(1)), proto)
    renamed = onnx.ModelProto()
    renamed.CopyFrom(proto)
    renamed.graph.input[
        0
    ].type.tensor_type.elem_type = TensorProto.INT64  # no int64 tensor to feed it
    renamed.graph.input[0].name = "unknown"
    with pytest.raises(
        onnx_custom.VerificationError,
        match=r"no remaining tensor fits input 'unknown' \(int64\[2, 3\]\)",
    ):
        bind_inputs(renamed, PAIR_ARGS, Pair())


# ----------------------------------------------------------------------------- dtypes and 0-d


class HalfPrecision(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, s: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x.float() * 2 + s.float()
        return y.to(x.dtype), y.sum(-1).to(x.dtype), y.sum(-1)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bfloat16_and_float16_flow_in_and_out_of_onnx_runtime(
    exporter: str, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(0)
    args = (
        torch.randn(2, 3, generator=g).to(dtype),
        torch.tensor(1.5).to(dtype),
    )  # a 0-d input too
    proto = onnx_custom.export(HalfPrecision(), args, exporter=exporter)
    assert proto.graph.input[0].type.tensor_type.elem_type == (
        TensorProto.BFLOAT16 if dtype == torch.bfloat16 else TensorProto.FLOAT16
    )
    report = verify(HalfPrecision(), args, proto, trials=3)
    assert report.passed, str(report)
    name = str(dtype).removeprefix("torch.")
    assert [c.dtype for c in report.comparisons[:3]] == [name, name, "float32"]
    # torch.testing's default, with atol raised to one ulp at the output's magnitude when larger
    assert report.comparisons[0].tolerance_source.startswith(f"torch.testing default for {name}")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_noncontiguous_inputs_are_fed_by_value(exporter: str) -> None:
    base = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    args = (base.t(), (base.t()[:, ::1] + 1, torch.randn(8, 6)[::2, ::2]))  # transposed, strided
    assert not args[0].is_contiguous() and not args[1][1].is_contiguous()
    proto = onnx_custom.export(
        Pair(),
        args,
        exporter=exporter,
        **({"input_names": ["x", "pair_0", "pair_1"]} if exporter == "torchscript" else {}),
    )  # type: ignore[arg-type]
    assert verify(Pair(), args, proto, trials=2).passed


class ScalarOut(torch.nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.float() * s.float()  # ORT's CPU kernels have no bfloat16 Mul/ReduceSum: cast around
        return y.sum().to(x.dtype), y.to(x.dtype)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_0d_inputs_and_outputs_stay_0d(exporter: str, dtype: torch.dtype) -> None:
    args = (torch.randn(2, 3).to(dtype), torch.tensor(0.5, dtype=dtype))
    proto = onnx_custom.export(ScalarOut(), args, exporter=exporter)
    session = make_session(proto)
    total, _ = run_onnx(session, proto, args, bind_inputs(proto, args, ScalarOut()))
    assert total.shape == () and total.dtype.name == str(dtype).removeprefix("torch.")  # never [1]
    np.testing.assert_allclose(
        total.astype(np.float32),
        ScalarOut()(*args)[0].float().numpy(),
        rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
    )
    report = verify(ScalarOut(), args, proto, trials=2)
    assert report.passed and report.comparisons[0].shape == ()


# ----------------------------------------------------------------------------- declared types


def _declared_file() -> onnx.ModelProto:
    outputs = {
        "same": ("x", TensorProto.FLOAT, ["batch", 3]),
        "static": ("x", TensorProto.FLOAT, [2, 3]),
        "double": ("x", TensorProto.FLOAT, ["2*batch", 3]),
        "free_a": ("x", TensorProto.FLOAT, ["k", 3]),
        "free_b": ("x", TensorProto.FLOAT, ["k", 3]),
        "as_int": ("x", TensorProto.INT64, ["batch", 3]),
        "rank": ("x", TensorProto.FLOAT, ["batch"]),
        "untyped": ("x", TensorProto.FLOAT, None),
    }
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [name]) for name in outputs],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info(name, t, dims) for name, (_, t, dims) in outputs.items()],
    )
    return helper.make_model(graph)


DECLARED_CASES = [
    ("same", (5, 3), np.float32, ""),
    ("same", (4, 3), np.float32, "dim 0 is 'batch' = 5 from the inputs but 4 at run time"),
    ("static", (5, 3), np.float32, "dim 0 is static 2 in the file but 5 at run time"),
    ("double", (10, 3), np.float32, ""),
    ("double", (5, 3), np.float32, "dim 0 is '2*batch' = 10 from the inputs but 5 at run time"),
    ("as_int", (5, 3), np.float32, "element type int64 vs float"),
    ("rank", (5, 3), np.float32, "rank 1 vs 2"),
    ("untyped", (7, 7, 7), np.float32, ""),
]


@pytest.mark.parametrize(
    ("name", "shape", "dtype", "problem"),
    DECLARED_CASES,
    ids=[f"{n}-{list(s)}" for n, s, _, _ in DECLARED_CASES],
)
def test_declared_types_against_runtime_values(
    name: str, shape: tuple[int, ...], dtype: Any, problem: str
) -> None:
    declared = DeclaredTypes(_declared_file())
    found = declared.check(3, {name: np.zeros(shape, dtype)}, {"x": (5, 3)})
    assert [m.problem for m in found] == ([problem] if problem else [])
    if problem:
        assert (
            found[0].trial == 3 and found[0].value == name and "Identity node" in found[0].producer
        )
        assert str(list(shape)) in found[0].actual and found[0].describe().startswith(
            f"trial 3: {name!r}"
        )


def test_free_dim_names_must_agree_within_a_run() -> None:
    declared = DeclaredTypes(_declared_file())
    values = {"free_a": np.zeros((4, 3), np.float32), "free_b": np.zeros((6, 3), np.float32)}
    (mismatch,) = declared.check(0, values, {"x": (5, 3)})
    assert (
        mismatch.value == "free_b"
        and mismatch.problem == "dim 0 is 'k', which is 4 at free_a[0], but 6 here"
    )
    assert (
        declared.check(0, {"free_a": values["free_a"], "free_b": values["free_a"]}, {"x": (5, 3)})
        == []
    )


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("s77", 5),
        ("2*s77", 10),
        ("s77 + 1", 6),
        ("(s77 - 1)//2", 2),
        ("s77 % 3", 2),
        ("Max(1, s77)", 5),
        ("-s77", -5),
        ("s77*s12", 15),
        ("floor(s77/2)", None),
        ("unknown", None),
        ("s77 +", None),
        ("s77 // 0", None),
    ],
)
def test_evaluate_dim(expression: str, value: int | None) -> None:
    assert evaluate_dim(expression, {"s77": 5, "s12": 3}) == value


# ----------------------------------------------------------------------------- weights


class Weighted(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(4, generator=g))
        self.register_buffer("scale", torch.rand(4, generator=g) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w.t() + self.b) * self.scale  # type: ignore[operator]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_weights_that_differ_from_the_models_are_flagged(exporter: str) -> None:
    x = torch.randn(2, 3)
    proto = onnx_custom.export(Weighted(0), (x,), exporter=exporter)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InitializerMismatchWarning)
        same = verify(Weighted(0), (x,), proto)
    assert same.passed and same.initializer_mismatches == []
    with pytest.warns(InitializerMismatchWarning, match="the file was exported from other weights"):
        other = verify(Weighted(1), (x,), proto, raise_on_mismatch=False)
    assert not other.passed
    found = {m.parameter: m for m in other.initializer_mismatches}
    init_names = {i.name for i in proto.graph.initializer}
    assert set(found) <= {"w", "b", "scale"} and len(found) >= 2
    for name, mismatch in found.items():
        assert (
            mismatch.matched_by == ("name" if name in init_names else "shape+order")
            and mismatch.max_abs_diff > 0.01
        )
    assert "w" in found  # folded into a transposed constant: matched by shape and order
    assert "WARNING: the file's weights differ from the model's" in str(other)
    assert other.to_dict()["initializer_mismatches"][0]["parameter"] in found
