"""Smoke test of benchmarks/deform_conv2d.py (timings themselves are not asserted: shared CPUs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "deform_conv2d.py"


@pytest.mark.slow
def test_benchmark_runs_and_reports_every_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_deform_conv2d", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--repeat", "1", "--rounds", "1"])
    assert "eager op (C++) / ORT DeformConv op19" in results
    assert "eager op (C++) / F.conv2d (no deformation)" in results
    assert "ORT custom-node kernel / eager op (C++)" in results
    assert "DCN net, ORT opset 19 / DCN net, eager" in results
    assert "eager fwd+bwd (C++) / eager op (C++)" in results
    assert "F.conv2d fwd+bwd / F.conv2d (no deformation)" in results
    assert results["training cost / F.conv2d training cost"] > 0
    assert results["eager_peak_bytes"] > 0
    out = capsys.readouterr().out
    assert "peak RSS increase" in out and "training cost, (fwd+bwd)/fwd: ours" in out


@pytest.mark.slow
def test_forward_only_row_reports_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_deform_conv2d_fwd", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(
        ["--forward-only", "--threads", "1", "--cpu-time", "--repeat", "1", "--rounds", "2"]
    )
    assert results["eager_ms"] > 0 and results["conv2d_ms"] > 0 and results["ratio"] > 0
    assert "CPU time" in capsys.readouterr().out
