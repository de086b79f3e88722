"""Run every benchmark under benchmarks/ and write docs/benchmarks.md from what they print.

Run: ``python benchmarks/run_all.py [--quick] [--only NAME ...] [--output docs/benchmarks.md]``

Each benchmark runs in a fresh interpreter, one after the other, with the arguments listed in
``BENCHMARKS`` (``--quick``: fewer rounds and smaller sweeps, for a smoke run; the figures are
then noisier). Every line a benchmark prints that carries a ratio (``1.23x``, or the ratio column
of ``export_overhead.py``) or a value with a goal becomes a row of the page, with its goal when the
line states one (``<= 1.2``), met or missed, the machine, the date, the load average before and
after the run (``os.getloadavg()``: these are shared-machine timings, and a reader judges them by
it), and the command that reproduces it. This script is the only source of the page's figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUTPUT = ROOT / "docs" / "benchmarks.md"


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str
    what: str  # one line for the page
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # modules it imports beyond the project's dependencies


BENCHMARKS = (
    Benchmark(
        "export_overhead",
        "`onnx_custom.export` / raw `torch.onnx.export` with the same symbolics (goal <= 1.03)",
        ("--plain",),
        ("--repeats", "3", "--plain"),
    ),
    Benchmark(
        "export_spans",
        "CPU time of each step `export` adds to `torch.onnx.export` (a profile, no goal)",
        (),
        ("--repeats", "3"),
    ),
    Benchmark(
        "kernel_overhead",
        "Python-kernel host overhead per node; parallel custom-node branches",
        (),
        ("--quick", "--repeats", "2", "--runs", "100"),
    ),
    Benchmark(
        "deform_conv2d",
        "eager `deform_conv2d` against ORT's `DeformConv` and `F.conv2d`",
        (),
        ("--repeat", "4", "--rounds", "1"),
    ),
    Benchmark(
        "native_ops",
        "native kernels against their baselines",
        (),
        ("--rounds", "1", "--repeat", "3"),
    ),
    Benchmark(
        "function_bodies",
        "ONNX function bodies against ORT's built-in ops; memory per warm call",
        (),
        ("--repeat", "3", "--rounds", "1"),
    ),
    Benchmark(
        "bev_pool",
        "`bev_pool_v2`: kernels against the eager op, training cost",
        (),
        ("--rounds", "3"),
    ),
    Benchmark(
        "msda",
        "multi-scale deformable attention against its `grid_sample` formulation",
        (),
        ("--repeat", "3", "--rounds", "1"),
    ),
    Benchmark(
        "verify_cost",
        "`verify` and `localize` against what they run (eager + ORT); comparison cost",
        (),
        (
            "--rounds",
            "1",
            "--verify-blocks",
            "2",
            "--localize-blocks",
            "8",
            "--rss-blocks",
            "8",
        ),
    ),
    Benchmark(
        "verify_shapes",
        "`verify`'s default shape trials against the export shape only (report)",
        (),
        ("--repeat", "1"),
    ),
    Benchmark(
        "verify_half",
        "half-precision `verify` with its float32 reference against without (report)",
        (),
        ("--rounds", "1", "--models", "custom_linear"),
    ),
    Benchmark(
        "compile",
        "the `torch.compile` backend: setup, hand-off, backend work, compiled against eager",
        (),
        ("--rounds", "1"),
    ),
    Benchmark(
        "fuse_file",
        "`fuse_file` on a file of stacked `grid_sample` attention blocks: fuse and proof time;"
        " fused file (native kernel, Python kernels) against the original (goal <= 0.6)",
        (),
        ("--blocks", "2", "--rounds", "1", "--repeat", "2"),
    ),
    Benchmark(
        "hf_models",
        "transformers' Deformable DETR, Mask2Former and RT-DETR (default configs, 640x640) exported"
        " with `fuse=True` (native kernel) against plain `torch.onnx.export`: ORT latency of the"
        " whole model (goal <= 0.6, RT-DETR <= 0.9) and of the MSDA nodes alone (<= 0.25), export"
        " time (<= 1.05) and peak RSS (<= 1.1), `verify` cost (<= 1.3), `torch.compile` against"
        " eager (<= 0.8; needs transformers)",
        (),
        ("--config", "small", "--size", "128", "--rounds", "3", "--repeat", "5"),
        requires=("transformers",),
    ),
)

# a goal stated on a line: "<= 1.2 ok", "goal <= 2 s", "(goal <= 1.0)"
_GOAL = re.compile(r"(?:goal\s*)?(?:<=|≤)\s*(?P<goal>[\d.]+)\s*(?P<unit>[a-zµ]*)", re.I)
_RATIO = re.compile(r"(?<![\w.])(?P<ratio>\d+\.\d+)x(?!\w)")
_EXPORT_ROW = re.compile(
    r"^(?P<label>dynamo|torchscript|TS, plain)\s+[\d.]+ ms\s+[\d.]+ ms\s+"
    r"(?P<ratio>[\d.]+)(?P<rest>.*)$"
)
_PAIR_ROW = re.compile(r"^(?P<a>\S.*?)\s+\d+\.\d+\s{2,}(?P<b>\S.*?)\s+\d+\.\d+\s+\d+\.\d+x")
_SUMMARY_RATIO = re.compile(r"\bratio (?P<ratio>\d+\.\d+)")
_TABLE_ROW = re.compile(r"^(?P<label>\S.*?)\s{2,}[\d.]+(?:\s+[\d.]+)*\s+(?P<last>[\d.]+)$")
_VALUE_ROW = re.compile(
    r"^\s+(?P<label>\S.*?)\s{2,}(?P<value>-?\d[\d.]*(?: ?[a-zµ]+| / \d+)?)\s+goal (?P<goal>.*)$"
)


@dataclasses.dataclass
class Row:
    benchmark: str
    label: str
    figure: str
    goal: str
    status: str


def _status(value: float, goal: float | None) -> str:
    if goal is None:
        return "report"
    return "met" if value <= goal + 1e-12 else "MISS"


def _verdict(text: str) -> str:
    """The benchmark's own verdict on the line, if it printed one (it compares unrounded)."""
    m = re.search(r"\b(ok|MISS)\b", text)
    return "" if m is None else ("met" if m[1] == "ok" else "MISS")


def parse_rows(benchmark: str, stdout: str) -> list[Row]:
    """The rows of one benchmark's output (see the module docstring)."""
    rows: list[Row] = []
    column = ""  # the last column of the table being printed, from its header line
    baseline = section = heading = ""  # a section title and its "(baseline: X)"; a heading
    sections: list[str] = []  # each row's section title
    for raw in stdout.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if m := re.search(r"\(baseline: (?P<b>[^)]+)\)\s*$", line):
            baseline, section = m["b"], line[: m.start()].strip()
            continue
        if not re.search(r"\d", line) and re.search(r"\b(ratio|overhead/node us)$", line):
            column = line.split()[-1] if line.endswith("ratio") else "overhead/node us"
            continue
        if m := _SUMMARY_RATIO.search(line):  # "...: ratio 1.120 (+1489 us)"
            ratio = float(m["ratio"])
            label = line[: m.start()].strip(" :,")
            if goal := _GOAL.search(line, m.end()):  # "ratio 0.55x (goal <= 0.6 ok)"
                status = _verdict(line[goal.end() :]) or _status(ratio, float(goal["goal"]))
                rows.append(Row(benchmark, label, f"{ratio:.3f}", f"<= {goal['goal']}", status))
            else:
                rows.append(Row(benchmark, label, f"{ratio:.3f}", "report", "report"))
            continue
        if column and (m := _TABLE_ROW.match(line)) and not _RATIO.search(line):
            value = float(m["last"])
            if column == "overhead/node us":  # Python-kernel host overhead per node
                label = f"{m['label']}: host overhead per node"
                rows.append(
                    Row(benchmark, label, f"{value:.2f} us", "<= 5 us", _status(value, 5.0))
                )
            else:
                rows.append(Row(benchmark, m["label"], f"{value:.2f}", "report", "report"))
            continue
        if m := _EXPORT_ROW.match(line.strip()):
            ratio = float(m["ratio"])
            plain = m["label"] == "TS, plain"  # against torch with plain symbolics: a report
            label = "torchscript, plain torch symbolics" if plain else m["label"]
            rest = m["rest"].strip()
            rows.append(
                Row(
                    benchmark,
                    f"{label}: onnx_custom.export / torch.onnx.export{rest and ' ' + rest}",
                    f"{ratio:.3f}",
                    "report" if plain else "<= 1.03",
                    _status(ratio, None if plain else 1.03),
                )
            )
            continue
        if m := _VALUE_ROW.match(line):
            goal, wanted = _GOAL.search(m["goal"]), m["goal"].split("(")[0].strip()
            value = float(re.match(r"-?[\d.]+", m["value"])[0])  # type: ignore[index]
            if goal:
                status = _status(value, float(goal["goal"]))
            else:  # "goal 0", "goal 1 / 1": exactly that
                status = "met" if m["value"] == wanted else "MISS"
            sections += [""] * (len(rows) - len(sections)) + [heading]
            rows.append(Row(benchmark, m["label"], m["value"], m["goal"].strip(), status))
            continue
        ratios = list(_RATIO.finditer(line))
        if not ratios:
            if not line.startswith(" "):  # a heading of the rows indented under it
                heading = line.strip()
            continue
        ratio = ratios[0]  # wall time: a CPU-time ratio may follow
        if baseline and all(float(r["ratio"]) == 1.0 for r in ratios):
            continue  # the section's baseline against itself
        goal = _GOAL.search(line, ratios[-1].end())
        pair = _PAIR_ROW.match(line.strip())  # "contender  ms  baseline  ms  ratio": "a / b"
        label = (
            f"{pair['a']} / {pair['b']}"
            if pair
            else re.split(r"\s{2,}|\s+[\d.]+\s*(?:ms|us|µs|s)\b", line.strip())[0]
        )
        if baseline and not pair:
            label = f"{label} / {baseline}"
        if len(label) < 3:
            label = line.strip()[:60]
        value = float(ratio["ratio"])
        sections += [""] * (len(rows) - len(sections)) + [section]
        rows.append(
            Row(
                benchmark,
                label,
                f"{value:.2f}x",
                f"<= {goal['goal']}" if goal else "report",
                _verdict(line[ratios[-1].end() :])
                or _status(value, float(goal["goal"]) if goal else None),
            )
        )
    sections += [""] * (len(rows) - len(sections))
    labels = [r.label for r in rows]
    for row, title in zip(rows, sections, strict=True):
        if title and labels.count(row.label) > 1:  # the same comparison at several shapes
            row.label = f"{row.label} ({title})"
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


@dataclasses.dataclass
class Run:
    benchmark: Benchmark
    command: str
    rows: list[Row]
    returncode: int
    seconds: float
    load_before: str
    load_after: str
    date: str


def missing(benchmark: Benchmark) -> list[str]:
    """The modules ``benchmark.requires`` that this interpreter cannot import."""
    return [m for m in benchmark.requires if importlib.util.find_spec(m) is None]


def run(benchmark: Benchmark, *, quick: bool, timeout: float, raw: Path | None = None) -> Run:
    args = benchmark.quick if quick else benchmark.args
    command = ["python", f"benchmarks/{benchmark.name}.py", *args]
    if absent := missing(benchmark):  # a row that says so, not a failed run
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        label = f"(not run: {', '.join(absent)} not installed)"
        rows = [Row(benchmark.name, label, "—", "—", "not run")]
        return Run(benchmark, " ".join(command), rows, 0, 0.0, _load(), _load(), date)
    load_before = _load()
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, str(HERE / f"{benchmark.name}.py"), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        stdout, code = proc.stdout, proc.returncode
        if code:
            sys.stderr.write(proc.stderr[-2000:])
    except subprocess.TimeoutExpired as err:
        out = err.stdout or ""
        stdout, code = out.decode() if isinstance(out, bytes) else out, -1
    seconds = time.monotonic() - start
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    meta = {
        "command": " ".join(command),
        "returncode": code,
        "seconds": seconds,
        "load_before": load_before,
        "load_after": _load(),
        "date": date,
    }
    if raw is not None:  # what the benchmark printed, to check the rows against or re-render
        raw.mkdir(parents=True, exist_ok=True)
        (raw / f"{benchmark.name}.txt").write_text(stdout, encoding="utf-8")
        (raw / f"{benchmark.name}.json").write_text(json.dumps(meta), encoding="utf-8")
    return _run_from(benchmark, stdout, meta)


def _run_from(benchmark: Benchmark, stdout: str, meta: dict[str, Any]) -> Run:
    return Run(
        benchmark,
        meta["command"],
        parse_rows(benchmark.name, stdout),
        meta["returncode"],
        meta["seconds"],
        meta["load_before"],
        meta["load_after"],
        meta["date"],
    )


def load_raw(benchmark: Benchmark, raw: Path) -> Run | None:
    """A run kept with ``--raw``, read back (``--from-raw``: render the page again)."""
    meta_path = raw / f"{benchmark.name}.json"
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return _run_from(benchmark, (raw / f"{benchmark.name}.txt").read_text(encoding="utf-8"), meta)


def render(runs: list[Run], *, quick: bool, host: str) -> str:
    ones = [float(load.split("/")[0]) for r in runs for load in (r.load_before, r.load_after)]
    ones = ones or [0.0]
    mode = (
        "quick mode (`--quick`: few rounds, small sweeps; smoke figures)" if quick else "full mode"
    )
    loaded = (
        " (a shared, loaded machine: treat the figures as rough)"
        if max(ones) > (os.cpu_count() or 1)
        else ""
    )
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/run_all.py`; do not edit by hand. Every figure is a ratio",
        "(or a value) a benchmark measured side by side with its natural baseline in one run",
        "(alternating rounds, medians; see `benchmarks/harness.py`). Each row gives the goal it is",
        "held to, whether it was met, the machine, the date, the load average (1/5/15 min) before",
        "and after its benchmark ran, and the command that reproduces it. Ratios travel between",
        "machines better than times, but both move with load: judge a row by its load column.",
        "",
        f"**This run:** {mode}, on {host}, Python {platform.python_version()}; 1-minute load"
        f" average between {min(ones):.1f} and {max(ones):.1f} while it ran{loaded}.",
        "",
        "| benchmark | row | figure | goal | status | machine | date"
        " | load before → after | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rows = r.rows or [
            Row(
                r.benchmark.name,
                "(no rows: the run failed)" if r.returncode else "(no ratio lines)",
                "—",
                "—",
                "failed" if r.returncode else "report",
            )
        ]
        for row in rows:
            cells = [
                f"`{r.benchmark.name}`",
                row.label.replace("|", "\\|"),
                row.figure,
                row.goal,
                row.status,
                host,
                r.date,
                f"{r.load_before} → {r.load_after}",
                f"`{r.command}`",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## What each benchmark measures", ""]
    for r in runs:
        lines.append(
            f"- `{r.benchmark.name}.py`: {r.benchmark.what} (ran {r.seconds:.0f} s, "
            + (
                "timed out: the rows it printed before"
                if r.returncode == -1
                else f"exit {r.returncode}"
            )
            + "; `--help` lists its options)."
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, small sweeps")
    parser.add_argument(
        "--only", nargs="+", choices=[b.name for b in BENCHMARKS], help="run only these"
    )
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    parser.add_argument("--raw", type=Path, help="also keep each benchmark's output in this folder")
    parser.add_argument(
        "--from-raw", type=Path, help="render the page from a --raw folder instead of running"
    )
    options = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not options.only or b.name in options.only]
    host = machine()
    runs = []
    for benchmark in chosen:
        if options.from_raw is not None:
            kept = load_raw(benchmark, options.from_raw)
            if kept is not None:
                runs.append(kept)
            continue
        print(f"running {benchmark.name} (load {_load()}) ...", flush=True)
        result = run(benchmark, quick=options.quick, timeout=options.timeout, raw=options.raw)
        runs.append(result)
        print(
            f"  {len(result.rows)} row(s), {result.seconds:.0f} s, exit {result.returncode}",
            flush=True,
        )
    text = render(runs, quick=options.quick, host=host)
    options.output.write_text(text, encoding="utf-8")
    print(f"wrote {options.output}")
    return 0 if all(r.returncode == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
