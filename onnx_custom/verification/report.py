"""Verification and zoo reports: Markdown (``.md``) or JSON (``.json``) files, and the text the
command line prints.

A passing output takes one line (its name and index, dtype, the shapes it ran at, the worst
difference, the tolerance); a failing output gets its per-trial rows and a log-scale histogram
of ``|torch - onnx|`` (decades 1e-12..1e+0, plus exact zeros and non-finite mismatches). Reports
also hold the environment (library versions, python, platform), every shape tried, the findings
(declared types, pruned inputs, weights) and the localization when one was made. Files are
written to a temporary file and renamed into place: an interrupted write leaves the previous
report intact.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import numpy as np

from onnx_custom.common.atomic import atomic_write
from onnx_custom.errors import OnnxCustomError
from onnx_custom.verification.compare import OutputComparison
from onnx_custom.verification.verifier import VerificationReport

__all__ = [
    "HISTOGRAM_EDGES",
    "OutputSummary",
    "environment",
    "histogram",
    "render_markdown",
    "report_to_dict",
    "summarize_outputs",
    "summary_text",
    "write_report",
]

HISTOGRAM_EDGES = tuple(10.0**e for e in range(-12, 1))  # 1e-12 .. 1e+0
_PACKAGES = ("torch", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "numpy", "onnx-custom")


def environment() -> dict[str, str]:
    """Versions of the libraries that decide the numbers, plus python and platform."""
    env = {"python": sys.version.split()[0], "platform": platform.platform()}
    for package in _PACKAGES:
        try:
            env[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            env[package] = "not installed"
    env["generated"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return env


def _bin_labels() -> list[str]:
    labels = ["0", f"(0, {HISTOGRAM_EDGES[0]:.0e})"]
    labels += [f"[{lo:.0e}, {hi:.0e})" for lo, hi in itertools.pairwise(HISTOGRAM_EDGES)]
    labels += [f">= {HISTOGRAM_EDGES[-1]:.0e}", "non-finite mismatch"]
    return labels


def histogram(abs_diffs: np.ndarray | None, nonfinite_mismatch: int = 0) -> dict[str, int]:
    """Counts of ``|diff|`` per decade bin (label -> count), exact zeros and non-finite apart."""
    counts = dict.fromkeys(_bin_labels(), 0)
    labels = list(counts)
    if abs_diffs is not None and abs_diffs.size:
        diffs = np.asarray(abs_diffs, dtype=np.float64).ravel()
        finite = diffs[np.isfinite(diffs)]
        counts["0"] = int((finite == 0).sum())
        positive = finite[finite > 0]
        # bin 0: below 1e-12; bin i: [edge[i-1], edge[i]); last: >= 1e+0
        index = np.searchsorted(np.asarray(HISTOGRAM_EDGES), positive, side="right")
        for i, n in zip(*np.unique(index, return_counts=True), strict=True):
            counts[labels[1 + int(i)]] += int(n)
        nonfinite_mismatch += int((~np.isfinite(diffs)).sum())
    counts[labels[-1]] = int(nonfinite_mismatch)
    return counts


# ---------------------------------------------------------------------------- per-output summary


@dataclasses.dataclass(frozen=True)
class OutputSummary:
    """One model output over every trial of one backend."""

    index: int  # position among the model's (flattened) outputs
    path: str  # where PyTorch returns it: "output", "output[1]", "output.boxes"
    onnx_name: str  # the ONNX graph output
    backend: str
    dtype: str
    shapes: tuple[tuple[int, ...], ...]  # distinct shapes, in trial order
    comparisons: tuple[OutputComparison, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def label(self) -> str:
        return f"#{self.index} {self.path} (ONNX {self.onnx_name!r})"

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.comparisons), default=0.0)

    @property
    def failing(self) -> tuple[OutputComparison, ...]:
        return tuple(c for c in self.comparisons if not c.passed)

    def line(self) -> str:
        first = self.comparisons[0]
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        trials = (
            f"{len(self.comparisons)} trial(s)"
            if self.passed
            else f"failed in {len(self.failing)} of {len(self.comparisons)} trial(s)"
        )
        backend = "" if self.backend == "onnxruntime" else f" [{self.backend}]"
        return (
            f"{'PASS' if self.passed else 'FAIL'} {self.label}{backend}: {self.dtype} {shapes}; max"
            f" abs diff {self.max_abs_diff:.3g}, {trials}; rtol {first.rtol:.2g}, atol"
            f" {first.atol:.2g} ({first.tolerance_source})"
        )


def _split_name(name: str) -> tuple[str, str]:
    path, sep, onnx_name = name.rpartition("=")
    return (path, onnx_name) if sep else (name, name)


def summarize_outputs(report: VerificationReport) -> list[OutputSummary]:
    """One `OutputSummary` per (output, backend), in output order."""
    groups: dict[tuple[str, int], list[OutputComparison]] = {}
    position: dict[tuple[int, str], int] = {}
    for c in report.comparisons:
        index = position.get((c.trial, c.backend), 0)
        position[(c.trial, c.backend)] = index + 1
        groups.setdefault((c.backend, index), []).append(c)
    summaries = []
    for (backend, index), comparisons in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][0])
    ):
        path, onnx_name = _split_name(comparisons[0].name)
        shapes = tuple(dict.fromkeys(c.shape for c in comparisons))
        summaries.append(
            OutputSummary(
                index, path, onnx_name, backend, comparisons[0].dtype, shapes, tuple(comparisons)
            )
        )
    return summaries


def _shape_lines(report: VerificationReport) -> list[str]:
    return [r.describe() for r in report.shapes_tried]


def _other_findings(report: VerificationReport) -> list[str]:
    """`VerificationReport.findings` without the shapes tried (listed on their own)."""
    shape_lines = {"Shapes tried:", *(f"  {line}" for line in _shape_lines(report))}
    return [line for line in report.findings() if line not in shape_lines]


def summary_text(report: VerificationReport) -> str:
    """What the command line prints: a verdict, one line per output, the shapes tried, findings.

    A failing output adds its failing trials; the localization (if any) comes last.
    """
    status = "PASSED" if report.passed else "FAILED"
    shape_trials = sum(r.kind in ("shape", "apart") for r in report.shapes_tried)
    lines = [
        f"Verification {status}: {len({s.index for s in summarize_outputs(report)})} output(s), "
        f"{report.trials} trial(s) ({shape_trials} at other sizes of the dynamic dims), "
        f"backends: {', '.join(report.backends)}"
    ]
    for summary in summarize_outputs(report):
        lines.append(f"  {summary.line()}")
        for c in summary.failing:
            worst = f"; worst {c.worst}" if c.worst else ""
            lines.append(
                f"      trial {c.trial}: shape {list(c.shape)}, {c.mismatched}/{c.total}"
                f" mismatched, max abs {c.max_abs_diff:.3g}, max rel {c.max_rel_diff:.3g}{worst}"
            )
    if report.shapes_tried:
        lines.append("Shapes tried:")
        lines += [f"  {line}" for line in _shape_lines(report)]
    lines += _other_findings(report)
    if report.diagnosis():
        lines.append(report.diagnosis())
    if report.localization is not None:
        lines.append(str(report.localization))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- JSON


def _comparison_dict(c: OutputComparison) -> dict[str, Any]:
    data = {k: v for k, v in dataclasses.asdict(c).items() if k != "abs_diffs"}
    data["passed"] = c.passed
    if not c.passed:  # the distribution matters only where it went wrong
        data["histogram"] = histogram(c.abs_diffs, c.nonfinite_mismatch)
    return data


def _summary_dict(s: OutputSummary) -> dict[str, Any]:
    data: dict[str, Any] = {
        "index": s.index,
        "path": s.path,
        "onnx_name": s.onnx_name,
        "backend": s.backend,
        "dtype": s.dtype,
        "shapes": [list(shape) for shape in s.shapes],
        "passed": s.passed,
        "trials": len(s.comparisons),
        "max_abs_diff": s.max_abs_diff,
        "max_rel_diff": max(c.max_rel_diff for c in s.comparisons),
        "rtol": s.comparisons[0].rtol,
        "atol": s.comparisons[0].atol,
        "tolerance_source": s.comparisons[0].tolerance_source,
    }
    if not s.passed:
        data["failing_trials"] = [_comparison_dict(c) for c in s.failing]
    return data


def _verification_dict(report: VerificationReport) -> dict[str, Any]:
    data = report.to_dict()
    data["outputs"] = [_summary_dict(s) for s in summarize_outputs(report)]
    return data


def _zoo_row_dict(r: Any) -> dict[str, Any]:
    verification = getattr(r, "report", None)
    return {
        "model": r.model,
        "case": r.case.label,
        "status": r.status,
        "seconds": round(r.seconds, 3),
        "nodes": r.nodes,
        "detail": r.detail,
        "verification": None if verification is None else _verification_dict(verification),
    }


def report_to_dict(
    report: VerificationReport | Sequence[Any], *, title: str = ""
) -> dict[str, Any]:
    """A JSON-ready dict of a `VerificationReport` or of zoo results (``list[ZooResult]``)."""
    data: dict[str, Any] = {"title": title, "environment": environment()}
    if isinstance(report, VerificationReport):
        return data | {"kind": "verify"} | _verification_dict(report)
    rows = list(report)
    data["kind"] = "zoo"
    data["passed"] = all(r.status != "fail" for r in rows)
    data["counts"] = {
        status: sum(r.status == status for r in rows) for status in ("pass", "fail", "skip")
    }
    data["results"] = [_zoo_row_dict(r) for r in rows]
    return data


# ---------------------------------------------------------------------------- Markdown


def _markdown_histogram(hist: dict[str, int]) -> list[str]:
    used = [(label, n) for label, n in hist.items() if n]
    if not used:
        return ["(no elements)"]
    total = sum(n for _, n in used)
    rows = ["| abs diff | count | |", "|---|---:|---|"]
    rows += [f"| `{label}` | {n} | `{'#' * max(1, round(30 * n / total))}` |" for label, n in used]
    return rows


def _markdown_failing(summary: OutputSummary) -> list[str]:
    lines = [
        f"#### {summary.label} — FAIL",
        "",
        (
            "| trial | shape | max abs | max rel | mismatched | rtol | atol | tolerance source |"
            " worst element |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in summary.failing:
        lines.append(
            f"| {c.trial} | {list(c.shape)} | {c.max_abs_diff:.3g} | {c.max_rel_diff:.3g} |"
            f" {c.mismatched}/{c.total} | {c.rtol:.2g} | {c.atol:.2g} | {c.tolerance_source} |"
            f" {_cell(c.worst)} |"
        )
    lines += [
        "",
        (
            "`|torch - onnx|` over the failing trial(s)"
            f" {', '.join(str(c.trial) for c in summary.failing)}:"
        ),
        "",
    ]
    return [*lines, *_markdown_histogram(_failing_histogram(summary)), ""]


def _failing_histogram(summary: OutputSummary) -> dict[str, int]:
    diffs = [c.abs_diffs for c in summary.failing if c.abs_diffs is not None]
    return histogram(
        np.concatenate(diffs) if diffs else None, sum(c.nonfinite_mismatch for c in summary.failing)
    )


def _markdown_verification(report: VerificationReport, heading: str = "##") -> list[str]:
    summaries = summarize_outputs(report)
    lines = [
        f"{heading} Outputs",
        "",
        f"{report.trials} trial(s), backends: {', '.join(report.backends)}.",
        "",
    ]
    lines += [f"- {s.line()}" for s in summaries]
    lines.append("")
    if report.shapes_tried:
        lines += [
            f"{heading} Shapes tried",
            "",
            *[f"- {line}" for line in _shape_lines(report)],
            "",
        ]
    findings = _other_findings(report)
    if findings:
        lines += [f"{heading} Findings", "", "```", *findings, "```", ""]
    failing = [s for s in summaries if not s.passed]
    if failing:
        lines += [
            f"{heading} Failing outputs",
            "",
            (
                "Tolerances: `|torch - onnx| <= atol + rtol * |torch|` per element; NaN/Inf must"
                " sit at the same positions; integers and bools compare exactly."
            ),
            "",
        ]
        for s in failing:
            lines += _markdown_failing(s)
    if report.diagnosis():
        lines += [f"{heading} Diagnosis", "", report.diagnosis(), ""]
    if report.localization is not None:
        lines += [f"{heading} Localization", "", "```", str(report.localization), "```", ""]
    return lines


def _markdown_environment(env: dict[str, str]) -> list[str]:
    lines = ["## Environment", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    return [*lines, ""]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _zoo_shapes(r: Any) -> str:
    verification = getattr(r, "report", None)
    if verification is None:
        return ""
    sizes = [dict(t.sizes) for t in verification.shapes_tried if t.kind == "shape"]
    if not sizes:
        return "export shape"
    exported = next((dict(t.sizes) for t in verification.shapes_tried if t.kind == "example"), {})
    names = sorted({k for s in sizes for k in s})
    return "; ".join(
        f"{n}: {', '.join(str(s[n]) for s in sizes if n in s)}"
        + (f" (export {exported[n]})" if n in exported else "")
        for n in names
    )


def render_markdown(report: VerificationReport | Sequence[Any], *, title: str = "") -> str:
    """The Markdown text of a `VerificationReport` or of zoo results."""
    env = environment()
    if isinstance(report, VerificationReport):
        status = "PASSED" if report.passed else "FAILED"
        lines = [f"# {title or 'onnx-custom verification'}: {status}", ""]
        lines += _markdown_verification(report)
        lines += _markdown_environment(env)
        return "\n".join(lines)
    rows = list(report)
    counts = {status: sum(r.status == status for r in rows) for status in ("pass", "fail", "skip")}
    verdict = "PASSED" if not counts["fail"] else f"{counts['fail']} FAILED"
    lines = [f"# {title or 'onnx-custom zoo'}: {verdict}", ""]
    lines += [f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped.", ""]
    lines += [
        "| model | case | status | time | other sizes tried | max abs diff | nodes | detail |",
        "|---|---|---|---:|---|---:|---|---|",
    ]
    for r in rows:
        verification = getattr(r, "report", None)
        worst = (
            f"{max((c.max_abs_diff for c in verification.comparisons), default=0.0):.2g}"
            if verification is not None
            else ""
        )
        # a verified PASS needs no words; a skip, a failure or a documented refusal does
        first = (
            r.detail.splitlines()[0]
            if r.detail and (r.status != "pass" or verification is None)
            else ""
        )
        lines.append(
            f"| {r.model} | {r.case.label} | {r.status.upper()} | {r.seconds:.1f}s |"
            f" {_zoo_shapes(r)} | {worst} | {_cell(r.nodes)} | {_cell(first)} |"
        )
    lines.append("")
    for r in rows:
        if r.status != "fail":
            continue
        lines += [f"## FAIL: {r.model} {r.case.label}", ""]
        verification = getattr(r, "report", None)
        lines += (
            _markdown_verification(verification, "###")
            if verification is not None
            else ["```", r.detail, "```", ""]
        )
    lines += _markdown_environment(env)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- files


def write_report(
    path: str | os.PathLike[str], report: VerificationReport | Sequence[Any], *, title: str = ""
) -> str:
    """Write ``report`` to ``path``: Markdown for ``.md``, JSON for ``.json``. Returns the path."""
    target = os.fspath(path)
    extension = os.path.splitext(target)[1].lower()
    if extension not in (".md", ".json"):
        raise OnnxCustomError(
            f"Report path {target!r} must end in .md (Markdown) or .json (JSON), got"
            f" {extension or 'no extension'!r}."
        )
    if extension == ".json":
        text = json.dumps(
            _finite(report_to_dict(report, title=title)),
            indent=2,
            default=_json_default,
            allow_nan=False,
        )
    else:
        text = render_markdown(report, title=title)
    directory = os.path.dirname(target)
    if directory:
        os.makedirs(directory, exist_ok=True)
    atomic_write(target, text + "\n")  # the previous report survives any failure
    return target


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _finite(value: Any) -> Any:
    """Strict JSON has no Infinity/NaN: write them as strings ("inf", "nan")."""
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
