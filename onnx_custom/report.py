"""Verification and zoo reports as Markdown (``.md``) or JSON (``.json``) files.

A report holds the environment (library versions, python, platform), per-output statistics with
a log-scale histogram of ``|torch - onnx|`` (decades 1e-12..1e+0, plus exact zeros and
non-finite mismatches), the tolerances and why they were chosen, and the per-node localization
when one was made.
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

from onnx_custom.compare import OutputComparison
from onnx_custom.errors import OnnxCustomError
from onnx_custom.verify import VerificationReport

__all__ = [
    "HISTOGRAM_EDGES",
    "environment",
    "histogram",
    "render_markdown",
    "report_to_dict",
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


def _comparison_dict(c: OutputComparison) -> dict[str, Any]:
    data = {k: v for k, v in dataclasses.asdict(c).items() if k != "abs_diffs"}
    data["passed"] = c.passed
    data["histogram"] = histogram(c.abs_diffs, c.nonfinite_mismatch)
    return data


def report_to_dict(report: VerificationReport | Sequence[Any], *, title: str = "") -> dict[str, Any]:
    """A JSON-ready dict of a `VerificationReport` or of zoo results (``list[ZooResult]``)."""
    data: dict[str, Any] = {"title": title, "environment": environment()}
    if isinstance(report, VerificationReport):
        data["kind"] = "verify"
        data |= report.to_dict()
        data["outputs"] = [_comparison_dict(c) for c in report.comparisons]
        return data
    data["kind"] = "zoo"
    rows = list(report)
    data["passed"] = all(r.status != "fail" for r in rows)
    data["results"] = [
        {
            "model": r.model,
            "case": r.case.label,
            "status": r.status,
            "seconds": round(r.seconds, 3),
            "nodes": r.nodes,
            "detail": r.detail,
            "verification": report_to_dict(r.report)["outputs"] if getattr(r, "report", None) is not None else None,
        }
        for r in rows
    ]
    return data


def _markdown_histogram(hist: dict[str, int]) -> str:
    used = [(label, n) for label, n in hist.items() if n]
    if not used:
        return "(no elements)"
    total = sum(n for _, n in used)
    width = 30
    rows = ["| abs diff | count | |", "|---|---:|---|"]
    for label, n in used:
        rows.append(f"| `{label}` | {n} | `{'#' * max(1, round(width * n / total))}` |")
    return "\n".join(rows)


def _markdown_comparisons(comparisons: Sequence[OutputComparison]) -> list[str]:
    lines = [
        "| trial | backend | output | shape | dtype | max abs | max rel | mismatched | rtol | atol | tolerance source |",
        "|---:|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.trial} | {c.backend} | `{c.name}` | {list(c.shape)} | {c.dtype} | {c.max_abs_diff:.3g} | "
            f"{c.max_rel_diff:.3g} | {c.mismatched}/{c.total} | {c.rtol:.2g} | {c.atol:.2g} | {c.tolerance_source} |"
        )
    lines.append("")
    for c in comparisons:
        lines += [f"#### trial {c.trial}, {c.backend}, `{c.name}` — {'PASS' if c.passed else 'FAIL'}", ""]
        lines += [_markdown_histogram(histogram(c.abs_diffs, c.nonfinite_mismatch)), ""]
    return lines


def _markdown_environment(env: dict[str, str]) -> list[str]:
    lines = ["## Environment", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    return [*lines, ""]


def render_markdown(report: VerificationReport | Sequence[Any], *, title: str = "") -> str:
    """The Markdown text of a `VerificationReport` or of zoo results."""
    env = environment()
    if isinstance(report, VerificationReport):
        status = "PASSED" if report.passed else "FAILED"
        lines = [f"# {title or 'onnx-custom verification'}: {status}", ""]
        lines += _markdown_environment(env)
        lines += ["## Outputs", "", f"{report.trials} trial(s), backends: {', '.join(report.backends)}.", ""]
        lines.append(
            "Tolerances: `|torch - onnx| <= atol + rtol * |torch|` per element; NaN/Inf must sit at "
            "the same positions; integers and bools compare exactly. The *tolerance source* column "
            "says whether torch.testing's per-dtype defaults or user overrides apply."
        )
        lines.append("")
        lines += _markdown_comparisons(report.comparisons)
        if report.findings():
            lines += ["## Shapes tried and findings", "", "```", *report.findings(), "```", ""]
        if report.diagnosis():
            lines += ["## Diagnosis", "", report.diagnosis(), ""]
        if report.localization is not None:
            lines += ["## Localization", "", "```", str(report.localization), "```", ""]
        return "\n".join(lines)
    rows = list(report)
    failed = sum(r.status == "fail" for r in rows)
    lines = [f"# {title or 'onnx-custom zoo'}: {'PASSED' if not failed else f'{failed} FAILED'}", ""]
    lines += _markdown_environment(env)
    lines += ["## Results", "", "| model | case | status | time | nodes | detail |", "|---|---|---|---:|---|---|"]
    for r in rows:
        first = r.detail.splitlines()[0] if r.detail else ""
        lines.append(f"| {r.model} | {r.case.label} | {r.status.upper()} | {r.seconds:.1f}s | {r.nodes} | {first.replace('|', '/')} |")
    lines.append("")
    for r in rows:
        verification = getattr(r, "report", None)
        if verification is not None:
            lines += [f"### {r.model} {r.case.label}", ""]
            lines += _markdown_comparisons(verification.comparisons)
        elif r.status == "fail":
            lines += [f"### {r.model} {r.case.label}", "", "```", r.detail, "```", ""]
    return "\n".join(lines)


def write_report(path: str | os.PathLike[str], report: VerificationReport | Sequence[Any], *, title: str = "") -> str:
    """Write ``report`` to ``path``: Markdown for ``.md``, JSON for ``.json``. Returns the path."""
    target = os.fspath(path)
    extension = os.path.splitext(target)[1].lower()
    if extension not in (".md", ".json"):
        raise OnnxCustomError(f"Report path {target!r} must end in .md (Markdown) or .json (JSON), got {extension or 'no extension'!r}.")
    if extension == ".json":
        text = json.dumps(_finite(report_to_dict(report, title=title)), indent=2, default=_json_default, allow_nan=False)
    else:
        text = render_markdown(report, title=title)
    directory = os.path.dirname(target)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text)
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
