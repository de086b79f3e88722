"""Reports: environment, one line per passing output, histograms for failing outputs only,
shapes tried, localization; zoo reports short when everything passes; written atomically."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add and onnx_custom::multi_out
from onnx_custom.cli import main
from onnx_custom.errors import OnnxCustomError
from onnx_custom.testing import ZooCase
from onnx_custom.verification.report import (
    environment,
    histogram,
    render_markdown,
    report_to_dict,
    summarize_outputs,
    summary_text,
    write_report,
)
from onnx_custom.zoo import MODULE_ROW, ZooResult


class AddOneAndTriple(torch.nn.Module):
    """Output 0 goes through the (broken) my_add translation, output 1 does not."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.onnx_custom.my_add(a.relu(), b) + 1.0, a * 3.0


DYNAMIC = {"a": {0: "batch"}, "b": {0: "batch"}}


@pytest.fixture(scope="module")
def broken_report() -> onnx_custom.VerificationReport:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(
        lambda g, a, b: g.op("Add", a, b)
    )  # 2a + b is not a + b
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g))
    proto = onnx_custom.export(
        AddOneAndTriple(), args, exporter="dynamo", registry=registry, dynamic_shapes=DYNAMIC
    )
    return onnx_custom.verify(
        AddOneAndTriple(),
        args,
        proto,
        trials=2,
        localize=True,
        registry=registry,
        raise_on_mismatch=False,
        atol=1e-4,
        rtol=1e-4,
    )


def test_histogram_bins() -> None:
    hist = histogram(np.array([0.0, 0.0, 1e-13, 3e-7, 1e-6, 0.5, 2.0]), nonfinite_mismatch=1)
    assert hist["0"] == 2 and hist["(0, 1e-12)"] == 1
    assert hist["[1e-07, 1e-06)"] == 1 and hist["[1e-06, 1e-05)"] == 1
    assert (
        hist["[1e-01, 1e+00)"] == 1 and hist[">= 1e+00"] == 1 and hist["non-finite mismatch"] == 1
    )
    assert sum(hist.values()) == 8 and len(hist) == 16
    assert sum(histogram(None).values()) == 0


def test_environment_has_versions() -> None:
    env = environment()
    for key in ("torch", "onnx", "onnxruntime", "onnxscript", "python", "platform"):
        assert env[key]


def test_outputs_are_summarized_by_index_and_name(
    broken_report: onnx_custom.VerificationReport,
) -> None:
    summaries = summarize_outputs(broken_report)
    assert [(s.index, s.path) for s in summaries] == [(0, "output[0]"), (1, "output[1]")]
    first, second = summaries
    assert not first.passed and second.passed
    # 2 trials at the export shape + 3 at other batch sizes, each output compared in all of them
    assert len(first.comparisons) == len(second.comparisons) == 5
    assert {s[0] for s in first.shapes} == {2, 1, 3, 4}
    assert first.label == f"#0 output[0] (ONNX {first.onnx_name!r})"
    assert second.line().startswith("PASS #1 output[1] (ONNX ")
    text = summary_text(broken_report)
    assert (
        text.startswith("Verification FAILED")
        and "FAIL #0 output[0]" in text
        and "Shapes tried:" in text
    )


def test_markdown_histograms_only_for_failing_outputs(
    broken_report: onnx_custom.VerificationReport, tmp_path: Path
) -> None:
    text = Path(write_report(tmp_path / "r.md", broken_report)).read_text()
    assert text.startswith("# onnx-custom verification: FAILED")
    assert (
        "## Environment" in text
        and "| onnxruntime |" in text
        and "## Localization" in text
        and "onnx_custom::my_add" in text
    )
    assert "## Shapes tried" in text and "batch=1" in text and "batch=4" in text
    failing = text[text.index("## Failing outputs") :]
    assert "#0 output[0]" in failing and "#1 output[1]" not in failing
    assert text.count("| abs diff | count |") == 1  # one histogram: the failing output's
    assert "user override" in text  # the tolerance source
    passing_lines = [line for line in text.splitlines() if "#1 output[1]" in line]
    assert len(passing_lines) == 1 and passing_lines[0].startswith("- PASS")


def test_json_report(broken_report: onnx_custom.VerificationReport, tmp_path: Path) -> None:
    write_report(tmp_path / "sub" / "r.json", broken_report)
    data = json.loads((tmp_path / "sub" / "r.json").read_text())
    assert data["kind"] == "verify" and data["passed"] is False and data["environment"]["torch"]
    first, second = data["outputs"]
    assert (first["index"], first["path"], first["passed"]) == (0, "output[0]", False)
    assert (second["index"], second["passed"]) == (1, True) and "failing_trials" not in second
    failing = first["failing_trials"][0]
    assert (
        sum(failing["histogram"].values()) == failing["total"]
        and failing["tolerance_source"] == "user override"
    )
    assert [t["kind"] for t in data["shapes_tried"]] == [
        "example",
        "values",
        "shape",
        "shape",
        "shape",
    ]
    assert data["localization"]["first"] == "my_add" and data["localization"]["method"] == "names"
    with pytest.raises(OnnxCustomError, match=r"must end in \.md .* or \.json"):
        write_report(tmp_path / "r.txt", broken_report)


def test_infinite_diffs_stay_valid_json(tmp_path: Path) -> None:
    from onnx_custom.verification.verifier import VerificationReport, compare_arrays

    c = compare_arrays(torch.zeros(2), np.zeros(3, np.float32), name="y", trial=0)
    path = write_report(tmp_path / "inf.json", VerificationReport([c], 1))
    assert json.loads(Path(path).read_text())["outputs"][0]["max_abs_diff"] == "inf"
    assert "inf" in render_markdown(VerificationReport([c], 1))


def test_report_write_is_atomic(
    broken_report: onnx_custom.VerificationReport, tmp_path: Path
) -> None:
    target = tmp_path / "r.json"
    target.write_text("previous report")
    broken_rows = [
        ZooResult("m", ZooCase("dynamo", 18), "pass", "", 0.0),
        object(),
    ]  # the 2nd row cannot render
    with pytest.raises(AttributeError):
        write_report(target, broken_rows)
    assert target.read_text() == "previous report" and os.listdir(tmp_path) == ["r.json"]
    write_report(target, broken_report)
    assert json.loads(target.read_text())["kind"] == "verify"
    mode = stat.S_IMODE(os.stat(target).st_mode)
    assert mode & stat.S_IRUSR and mode == stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode)
    fresh = Path(write_report(tmp_path / "fresh.md", broken_report))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_skip_rows_are_labelled_plainly() -> None:
    rows = [
        ZooResult("my_add_ext", MODULE_ROW, "skip", "C++ extension unavailable: no compiler", 0.0),
        ZooResult(
            "bev_pool",
            ZooCase("dynamo", 18, "custom", dynamic=True, skip="fixed batch"),
            "skip",
            "fixed batch",
            0.0,
        ),
    ]
    text = render_markdown(rows)
    assert "opset0" not in text and "| my_add_ext | (all rows) | SKIP |" in text
    assert "| bev_pool | dynamo-opset18-custom-dynamic | SKIP |" in text and "fixed batch" in text
    assert report_to_dict([])["results"] == []


def test_documented_refusal_keeps_its_reason() -> None:
    """A PASS row that verified nothing (the exporter refused, as documented) says why."""
    reason = "refused as documented: autograd.Function is TorchScript-only"
    text = render_markdown(
        [
            ZooResult(
                "autograd_fn",
                ZooCase("dynamo", 18, expect_error="TorchScript-only"),
                "pass",
                reason,
                0.0,
            )
        ]
    )
    assert f"| autograd_fn | dynamo-opset18 | PASS | 0.0s |  |  |  | {reason} |" in text, text


def test_cli_zoo_report_is_short_when_all_pass(tmp_path: Path, capsys: Any) -> None:
    md, js = tmp_path / "zoo.md", tmp_path / "zoo.json"
    assert main(["zoo", "multi_out", "--report", str(md)]) == 0
    captured = capsys.readouterr()
    assert "[1/8] multi_out" in captured.err and f"report written to {md}" in captured.err
    text = md.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| multi_out |")]
    assert len(rows) == 8 and len(text.splitlines()) < 40, text
    assert "histogram" not in text.lower() and "| abs diff |" not in text
    assert (
        sum("compile-opset18-custom" in r for r in rows) == 2
    )  # the torch.compile rows every model gets
    dynamic = next(r for r in rows if "custom-dynamic" in r)
    assert "batch: 1, 5, 8 (export 4)" in dynamic and "onnx_custom::multi_out" in dynamic
    assert main(["zoo", "multi_out", "--report", str(js)]) == 0
    data = json.loads(js.read_text())
    assert (
        data["kind"] == "zoo"
        and data["passed"]
        and data["counts"] == {"pass": 8, "fail": 0, "skip": 0}
    )
    verified = [r for r in data["results"] if r["verification"]]
    assert verified and all(
        "failing_trials" not in o for r in verified for o in r["verification"]["outputs"]
    )
