"""Smoke test of benchmarks/verify_cost.py's localize rows (timings are not asserted: shared CPUs).
Its ``localized`` contenders assert that localize names the planted DeformConv each round."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "verify_cost.py"


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_localize_rows_run_reused_and_cold(
    exporter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("bench_verify_cost", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(
        [
            "--exporter",
            exporter,
            "--rounds",
            "1",
            "--skip-compare",
            "--verify-blocks",
            "--localize-blocks",
            "2",
            "--rss-blocks",
        ]
    )
    assert results["localize N=2"] > 1.0  # localize does more than verify
    out = capsys.readouterr().out
    assert "verify(localize) / verify, N=2" in out
    assert ("cold: file exported in another process" in out) == (exporter == "dynamo")
