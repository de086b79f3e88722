"""Smoke test of benchmarks/msda.py (timings themselves are not asserted: shared CPUs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "msda.py"


@pytest.mark.slow  # the full encoder size, every contender, two memory subprocesses
def test_benchmark_runs_and_reports_every_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_msda", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--repeat", "1", "--rounds", "1"])
    for label, base, _ in module.ROWS:
        assert results[f"{label} / {base}"] > 0
    assert results["eager_peak_bytes"] > 0 and results["grid_peak_bytes"] > 0
    out = capsys.readouterr().out
    assert "peak RSS increase of one fwd+bwd" in out and "ORT native kernel" in out
