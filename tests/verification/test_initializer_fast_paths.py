"""compare_initializers reads initializers without copies and compares in one pass when it can
: the verdicts must be those of the slow path -- NaN positions, signed zeros, every
viewable dtype, bfloat16 and external data falling back to onnx's own reader."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from onnx_custom.verification.initializers import compare_initializers


class Scale(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _file(values: np.ndarray, *, name: str = "weight", bf16: bool = False) -> onnx.ModelProto:
    if bf16:
        bits = (
            torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16).view(torch.int16).numpy()
        )
        init = helper.make_tensor(
            name, onnx.TensorProto.BFLOAT16, values.shape, bits.tobytes(), raw=True
        )
    else:
        init = numpy_helper.from_array(values, name)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", name], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", init.data_type, list(values.shape))],
        [helper.make_tensor_value_info("y", init.data_type, list(values.shape))],
        initializer=[init],
    )
    return helper.make_model(graph)


def _mismatches(model: torch.nn.Module, proto: onnx.ModelProto) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [m.parameter for m in compare_initializers(model, proto)]


NAN_W = np.array([[1.0, np.nan], [-0.0, 3.0]], np.float32)

# (id, model weight, file weight, mismatched?) -- verdicts of np.array_equal(equal_nan=True)
# and the 1e-5-relative closeness rule, written out by hand.
CASES = [
    (
        "equal-f32-2x3",
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        False,
    ),
    ("same-nan-positions", NAN_W, NAN_W.copy(), False),
    ("nan-moved", NAN_W, np.array([[np.nan, 1.0], [0.0, 3.0]], np.float32), True),
    ("signed-zero", np.array([0.0, -0.0], np.float32), np.array([-0.0, 0.0], np.float32), False),
    ("close-f32", np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0 + 1e-6], np.float32), False),
    ("differs-f32", np.array([1.0, 2.0], np.float32), np.array([1.0, 2.5], np.float32), True),
    ("equal-f64", np.linspace(0, 1, 5), np.linspace(0, 1, 5), False),
    ("equal-f16", np.array([0.5, -1.25], np.float16), np.array([0.5, -1.25], np.float16), False),
    ("differs-f16", np.array([0.5, -1.25], np.float16), np.array([0.5, 1.25], np.float16), True),
    ("equal-i64", np.array([3, -4], np.int64), np.array([3, -4], np.int64), False),
    ("differs-i64", np.array([3, -4], np.int64), np.array([3, 4], np.int64), True),
    ("zero-size-0x3", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), False),
    ("0d", np.array(2.0, np.float32), np.array(2.0, np.float32), False),
]


@pytest.mark.parametrize(
    ("weight", "stored", "mismatched"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_verdicts_match_the_slow_path(
    weight: np.ndarray, stored: np.ndarray, mismatched: bool
) -> None:
    model = Scale(torch.from_numpy(weight.copy()))
    assert _mismatches(model, _file(stored)) == (["weight"] if mismatched else [])


@pytest.mark.parametrize(
    ("stored", "mismatched"),
    [(np.array([1.0, 2.0]), False), (np.array([1.0, 3.0]), True)],
    ids=["equal", "differs"],
)
def test_bfloat16_initializers_use_onnx_reader(stored: np.ndarray, mismatched: bool) -> None:
    model = Scale(torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    assert _mismatches(model, _file(stored, bf16=True)) == (["weight"] if mismatched else [])


def test_loaded_external_data_is_compared(tmp_path: Path) -> None:
    stored = np.arange(4096, dtype=np.float32)
    proto = _file(stored)
    path = tmp_path / "m.onnx"
    onnx.save_model(
        proto,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    loaded = onnx.load(path)  # data read back into raw_data
    assert _mismatches(Scale(torch.from_numpy(stored.copy())), loaded) == []
    other = stored.copy()
    other[7] += 1
    assert _mismatches(Scale(torch.from_numpy(other)), loaded) == ["weight"]
    unloaded = onnx.load(path, load_external_data=False)  # nothing to compare: no verdict
    assert _mismatches(Scale(torch.from_numpy(other)), unloaded) == []
