"""`onnx_custom.compile.zoo_rows`: the batch sizes a dynamic compile row runs at respect every
``Dim``'s range, and `check_compiled` reports where nodes ran."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from onnx_custom.compile.zoo_rows import OTHER_BATCHES, batch_sizes, check_compiled

Dim = torch.export.Dim


@pytest.mark.parametrize(
    ("example", "dims", "expected"),
    [
        (2, [Dim("b")], [3, 5]),  # unbounded: the first candidates
        (3, [Dim("b")], [5, 4]),  # never the example size
        (2, [Dim("b", min=1, max=4)], [3, 4]),
        (3, [Dim("b", min=1, max=4)], [4]),  # only one other size fits
        (2, [None, Dim("b", min=5, max=64)], [5, 6]),  # a static input does not bound it
        (4, [Dim("b", max=3), Dim("c", min=1, max=64)], [3]),  # the tightest range wins
    ],
    ids=["unbounded-b2", "unbounded-b3", "max4-b2", "max4-b3", "min5", "two-dims"],
)
def test_batch_sizes(example: int, dims: list[Any], expected: list[int]) -> None:
    assert batch_sizes(example, dims) == expected
    assert len(expected) <= OTHER_BATCHES


def test_check_compiled_on_a_plain_mlp_runs_everything_in_ort() -> None:
    mlp = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).eval()
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    check = check_compiled(mlp, (x,), dynamic_shapes=({0: Dim("batch")},))
    assert check.passed, check.describe()
    assert check.batches == (2, 3, 5) and check.graphs == 1 and check.partitions == 1
    assert check.ort_nodes == check.nodes > 0 and not check.fallbacks
    assert len(check.comparisons) == 3 and {c.tolerance_source for c in check.comparisons} == {
        "torch.testing default for float32"
    }
