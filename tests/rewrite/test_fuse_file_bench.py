"""Smoke test of benchmarks/fuse_file.py (timings themselves are not asserted: shared CPUs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from _mmcv_style import Standalone, export_raw, standalone_inputs

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fuse_file.py"


def test_benchmark_runs_and_reports_every_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    path = export_raw(
        Standalone(),
        standalone_inputs(),
        tmp_path / "m.onnx",
        exporter="torchscript",
        opset=17,
        names=("value", "loc", "attn"),
        dynamic={"value": {0: "batch"}, "loc": {0: "batch"}, "attn": {0: "batch"}},
    )
    spec = importlib.util.spec_from_file_location("bench_fuse_file", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main([str(path), "--rounds", "1", "--repeat", "1", "--dim", "batch=2"])
    for label, base, _ in module.ROWS:
        assert results[f"{label} / {base}"] > 0
    assert results["fuse_seconds"] > 0
    assert "fused 1 multi-scale" in capsys.readouterr().out
