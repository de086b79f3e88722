"""A real model over protobuf's 2 GiB limit (a 24000 x 24000 float32 weight, 2.3 GB) exports with
both exporters (``verify=True``: verified before it is written), reloads, runs, and verifies from
the file. Slow (4-10 minutes and about 16 GB of RAM per exporter, measured): run one at a time,
``python -m pytest tests/exporter/test_external_data_big.py -m slow``."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # (defines onnx_custom::my_add)
from onnx_custom.common.external_data import referenced_data_files

N = 24000  # N * N * 4 bytes = 2.3 GB > 2 GiB


class Big(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # W[i, j] = ((i % 4) + (j % 8)) * 2**-16: every partial sum of x @ W (x = ones) is a whole
        # number of 2**-16 below 2**24 of them, so float32 computes it exactly in any order (torch,
        # ORT and verify agree to the bit); the output has a closed form (no 2 GB reference run),
        # and a transposed, shifted or zeroed weight would change it.
        rows, cols = (torch.arange(N) % 4).float(), (torch.arange(N) % 8).float()
        self.weight = torch.nn.Parameter(
            (rows[:, None] + cols[None, :]) * 2.0**-16, requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x @ self.weight, x)  # 2 * (x @ W) + x


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_model_over_2_gib_exports_reloads_and_runs(tmp_path: Path, exporter: str) -> None:
    x = torch.ones(1, N)
    path = tmp_path / "big.onnx"
    model = Big()
    # verify=True runs before f is written, on the in-memory proto (which cannot be serialized)
    onnx_custom.export(model, (x,), path, exporter=exporter, verify=True)
    gc.collect()
    (data,) = referenced_data_files(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", data]
    assert (tmp_path / data).stat().st_size > 2**31
    assert path.stat().st_size < 1 << 20
    # out_j = 2 * sum_i W[i, j] + 1 = 2 * 2**-16 * (N / 4 * (0 + 1 + 2 + 3) + N * (j % 8)) + 1
    expected = (2 * 2.0**-16 * (N / 4 * 6 + N * (np.arange(N) % 8)) + 1).reshape(1, N)
    session = onnx_custom.InferenceSession(path)
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=0, atol=0)  # exact (see Big)
    del session
    gc.collect()
    plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # nothing of ours
    np.testing.assert_allclose(
        plain.run(None, {plain.get_inputs()[0].name: x.numpy()})[0],
        expected.astype(np.float32),
        rtol=0,
        atol=0,
    )  # exact (see Big)
    del plain
    gc.collect()
    report = onnx_custom.verify(model, (x,), path)  # from the file: the loaded proto is > 2 GiB too
    assert report.passed, report
