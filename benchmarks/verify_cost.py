"""What verification and localization cost, against what they verify.

Rows (paired: contender and baseline alternate round by round in one process; medians):

- ``compare_arrays`` / ``torch.isclose(...).all()`` on the same 1x64x56x56 float32 pair.
- ``verify(trials=3)`` / 3 x (eager forward + ONNX Runtime run) of a small DCN ResNet with N
  deformable residual blocks (``models/deform_conv.py``'s ``DeformBlock``), N = 2 and 32. Like
  with like: both sides run eager and ORT three times at the export shape (verify's trials: the
  example, then two N(0, 1) draws; no sign trial, which only ``trials=1`` adds for one-signed
  examples, and no size trials: the file's shapes are static; the row checks both). The
  baseline's inputs are drawn and its session made once, outside the timing; verify draws its
  two inputs, copies them for eager, checks the weights and compares inside it. Its ORT session
  is shared across calls on the same file (``onnx_custom.runtime.session_cache``), made by the
  warm-up call as the baseline's is; the "cold" line empties that cache before every call (a
  session per call: one verify of a file seen once).
- ``verify(localize=True)`` / plain ``verify`` on a file whose DeformConv translation drops the
  modulation mask (every block diverges; the first is the origin), N = 8, 32, 128: localize
  must grow linearly with the nodes. Two contenders, interleaved with the baseline: the file
  exported in this process (localize reuses the dynamo exporter's ``torch.export`` program, and
  one segmented pass over the file serves both the verdict and the localization) and
  "cold" (`program_cache` cleared first: a file exported elsewhere, as ``onnx-custom verify``
  sees it; the TorchScript exporter has no program to reuse, so there both are cold).
- Peak RSS of a fresh process that exports and localizes / one that only exports (the raw
  exporter), N = 32; and the increase of each over the process's RSS before exporting.

Run::

    python benchmarks/verify_cost.py [--exporter dynamo|torchscript] [--rounds 5] [--threads 2]

torch uses ``--threads`` threads; ORT its defaults, as ``verify`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

import onnx_custom
from onnx_custom.exporter import program_cache
from onnx_custom.models.deform_conv import DeformBlock
from onnx_custom.runtime.session_cache import clear_session_cache
from onnx_custom.verification.compare import compare_arrays
from onnx_custom.verification.runner import make_session

__all__ = ["DcnResNet", "main", "paired", "planted_registry"]

OPSET = 19  # ONNX DeformConv: ORT's own kernel, so the rows measure the verifier, not our kernels


class DcnResNet(nn.Module):
    """ResNet stem (7x7/2 conv, 3x3/2 max pool: 1x3x224x224 -> 1x64x56x56), then ``blocks``
    residual DCNv2 blocks at 64x56x56 (ResNet's first stage, its 3x3 convs deformable)."""

    def __init__(self, blocks: int, channels: int = 64) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            self.stem = nn.Sequential(
                nn.Conv2d(3, channels, 7, stride=2, padding=3),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
            self.blocks = nn.ModuleList(DeformBlock(channels) for _ in range(blocks))
            for block in self.blocks:
                nn.init.normal_(block.predict.weight, std=0.05)  # offsets of about +-1 px
                nn.init.zeros_(block.predict.bias)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return x


def example(seed: int = 0) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(seed)),)


def planted_registry() -> onnx_custom.Registry:
    """The default registry with a wrong DeformConv translation (the modulation mask dropped)."""
    from onnx_custom.symbolics import deform_conv as deform_conv_symbolics

    def planted_deform_conv2d(
        g: Any, input: Any, weight: Any, offset: Any, mask: Any, bias: Any, **attrs: Any
    ) -> Any:
        return deform_conv_symbolics.deform_conv2d(
            g, input, weight, offset, mask, bias, **{**attrs, "use_mask": False}
        )

    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::deform_conv2d", opset=OPSET, replace=True)(
        planted_deform_conv2d
    )
    return registry


def export(
    model: nn.Module, exporter: str, registry: onnx_custom.Registry | None = None
) -> onnx.ModelProto:
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx_custom.export(
            model, example(), exporter=exporter, opset=OPSET, registry=registry
        )


CLOCK = time.perf_counter  # --cpu-time: time.process_time (steadier on a loaded machine, 1 thread)


def timed(fn: Callable[[], object]) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


def paired(
    contender: Callable[[], object], baseline: Callable[[], object], rounds: int, inner: int = 1
) -> tuple[float, float]:
    """Median seconds of (contender, baseline), alternating which runs first each round."""
    mine, base = interleaved([contender, baseline], rounds, inner)
    return mine, base


def interleaved(fns: list[Callable[[], object]], rounds: int, inner: int = 1) -> list[float]:
    """Median seconds of each of ``fns``, rotating which runs first each round."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for k in range(len(fns)):
            i = (k + r) % len(fns)
            times[i].append(sum(timed(fns[i]) for _ in range(inner)) / inner)
    return [statistics.median(t) for t in times]


def _row(
    label: str,
    mine: float,
    base: float,
    goal: float | None,
    unit: float = 1e3,
    unit_name: str = "ms",
) -> float:
    ratio = mine / base
    verdict = "" if goal is None else f"goal <= {goal:g}: {'ok' if ratio <= goal else 'MISS'}"
    print(
        f"{label:<46} {mine * unit:>10.3f} {base * unit:>10.3f} {unit_name}  {ratio:>6.2f}x "
        f" {verdict}"
    )
    return ratio


def compare_row(rounds: int) -> float:
    g = torch.Generator().manual_seed(0)
    expected = torch.randn(1, 64, 56, 56, generator=g)
    actual = (expected + 1e-7 * torch.randn(expected.shape, generator=g)).numpy()
    actual_t = torch.from_numpy(actual)
    mine, base = paired(
        lambda: compare_arrays(expected, actual, name="y", trial=0),
        lambda: torch.isclose(expected, actual_t).all(),
        rounds * 4,
        inner=5,
    )
    return _row("compare_arrays / isclose().all() 1x64x56x56", mine, base, 2.0)


def verify_rows(blocks: int, exporter: str, rounds: int) -> float:
    model = DcnResNet(blocks).eval()
    proto = export(model, exporter)
    session = make_session(proto)
    name = session.get_inputs()[0].name
    inputs = [example(seed)[0] for seed in range(3)]

    def plain() -> None:
        for x in inputs:
            with torch.no_grad():
                model(x)
            session.run(None, {name: x.numpy()})

    args = example()  # drawn once, as the baseline's inputs are

    def verify() -> onnx_custom.VerificationReport:
        # 32 deformable blocks drift by ~1e-3 relative (bilinear sampling is discontinuous where a
        # sample crosses a pixel edge), so deep rows use deep-network tolerances;
        # the cost is the same.
        return onnx_custom.verify(model, args, proto, trials=3, rtol=1e-3, atol=1e-3)

    def cold() -> None:
        clear_session_cache()
        verify()

    report = verify()  # warm: the kernel host, the dispatcher, ORT's first-run allocations
    kinds = [r.kind for r in report.shapes_tried]
    assert kinds == [
        "example",
        "values",
        "values",
    ], f"verify ran {kinds}: not the baseline's 3 runs"
    mine, mine_cold, base = interleaved([verify, cold, plain], rounds)
    ratio = _row(f"verify(trials=3) / 3x(eager+ORT), N={blocks}", mine, base, 1.10)
    _row("    cold: a new ORT session per call", mine_cold, base, 1.10)
    session_s = statistics.median(timed(lambda: make_session(proto)) for _ in range(rounds))
    with torch.no_grad():
        out = model(inputs[0])
    (ort_out,) = session.run(None, {name: inputs[0].numpy()})
    compare_s = statistics.median(
        timed(lambda: compare_arrays(out, ort_out, name="y", trial=0)) for _ in range(rounds * 5)
    )
    # Page faults the baseline's warm session never takes: a new session's memory (arena,
    # weights, worker-thread buffers) comes fresh from the OS when malloc gave the last one back
    # (bimodal), and verify's own fresh tensors (input draws, eager copies, outputs).
    fault_s = page_fault_seconds()
    base_faults = minor_faults(plain, rounds)
    for label, fn, total in (("shared session", verify, mine), ("cold", cold, mine_cold)):
        faults = max(0, minor_faults(fn, rounds) - base_faults)
        made = session_s if fn is cold else 0.0
        print(
            f"    of which ({label}): session creation {made * 1e3:.1f} ms, 3 compares"
            f" {3 * compare_s * 1e3:.2f} ms, {faults} more page faults {faults * fault_s * 1e3:.1f}"
            f" ms, rest {(total - base - made - 3 * compare_s - faults * fault_s) * 1e3:.1f} ms"
        )
    return ratio


def minor_faults(fn: Callable[[], object], rounds: int) -> int:
    """Median minor page faults of one call of ``fn`` (Linux; 0 elsewhere)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not Linux
        return 0
    counts = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return int(statistics.median(counts))


def page_fault_seconds(pages: int = 4096) -> float:
    """Measured cost of one first-touch page fault (fresh anonymous memory, one byte per page)."""
    import mmap

    step = mmap.PAGESIZE

    def touch(memory: mmap.mmap) -> float:
        return timed(lambda: [memory.__setitem__(i, 1) for i in range(0, pages * step, step)])

    fresh = []
    for _ in range(5):
        with mmap.mmap(-1, pages * step) as memory:
            fresh.append(touch(memory))
    with mmap.mmap(-1, pages * step) as memory:
        touch(memory)
        warm = statistics.median(touch(memory) for _ in range(5))
    return max(0.0, statistics.median(fresh) - warm) / pages


def localize_rows(blocks: int, exporter: str, rounds: int) -> float:
    model = DcnResNet(blocks).eval()
    registry = planted_registry()
    proto = export(model, exporter, registry)
    args = example()

    def plain() -> None:
        onnx_custom.verify(model, args, proto, registry=registry, raise_on_mismatch=False)

    remembered = program_cache.recall(
        model, args
    )  # the dynamo exporter's program; None for TorchScript

    def localized() -> None:
        if remembered is not None:
            program_cache.remember(model, args, remembered)  # as right after the export
        report = onnx_custom.verify(
            model, args, proto, registry=registry, raise_on_mismatch=False, localize=True
        )
        first = report.localization.first
        assert first is not None and first.torch_op.startswith("onnx_custom::deform_conv2d"), (
            report.localization
        )

    def cold() -> None:
        program_cache.clear()
        localized_cold = onnx_custom.verify(
            model, args, proto, registry=registry, raise_on_mismatch=False, localize=True
        )
        assert localized_cold.localization.first is not None, localized_cold.localization

    localized()  # warm, and check that it names a DeformConv
    cold()
    nodes = sum(
        1
        for n in torch.export.export(model, args, strict=False).graph.nodes
        if n.op == "call_function"
    )
    if remembered is None:
        mine, base = paired(cold, plain, rounds)
        ratio = _row(f"verify(localize) / verify, N={blocks} ({nodes} nodes)", mine, base, 2.0)
    else:
        mine, mine_cold, base = interleaved([localized, cold, plain], rounds)
        ratio = _row(f"verify(localize) / verify, N={blocks} ({nodes} nodes)", mine, base, 2.0)
        _row("    cold: file exported in another process", mine_cold, base, 2.0)
    print(
        f"    localize alone {(mine - base) * 1e3:.0f} ms = {(mine - base) / nodes * 1e3:.2f} ms"
        " per node"
    )
    return ratio


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def _rss_child(kind: str, blocks: int, exporter: str) -> None:
    """Subprocess body: print the process's peak RSS (KiB) after exporting (and localizing)."""
    torch.set_num_threads(2)
    model = DcnResNet(blocks).eval()
    registry = planted_registry()
    args = example()
    with torch.no_grad():
        model(*args)  # the eager kernels loaded and run once: both kinds start from here
    before = _status_kib("VmRSS")
    proto = export(model, exporter, registry)
    if kind in ("localize", "localize-cold"):
        if kind == "localize-cold":
            program_cache.clear()
        onnx_custom.verify(
            model, args, proto, registry=registry, raise_on_mismatch=False, localize=True
        )
    print(before, _status_kib("VmHWM"))


def peak_rss(kind: str, blocks: int, exporter: str) -> tuple[int, int]:
    """(RSS before exporting, peak RSS) of a fresh process, in bytes."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--rss-child",
            kind,
            "--exporter",
            exporter,
            "--blocks",
            str(blocks),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    before, peak = out.split()[-2:]
    return int(before) * 1024, int(peak) * 1024


def rss_row(blocks: int, exporter: str) -> float:
    mib = 1 / 2**20
    export_before, export_peak = (
        statistics.median(v)
        for v in zip(*(peak_rss("export", blocks, exporter) for _ in range(3)), strict=True)
    )
    kinds = ["localize"] + (["localize-cold"] if exporter == "dynamo" else [])
    ratio = 0.0
    for kind in kinds:
        before, peak = (
            statistics.median(v)
            for v in zip(*(peak_rss(kind, blocks, exporter) for _ in range(3)), strict=True)
        )
        label = f"peak RSS export+{kind} / export, N={blocks}"
        print(
            f"{label:<46} {peak * mib:>10.0f} {export_peak * mib:>10.0f} MiB "
            f" {peak / export_peak:>6.2f}x  goal <= 1.1:"
            f" {'ok' if peak / export_peak <= 1.1 else 'MISS'}"
        )
        grown, export_grown = peak - before, export_peak - export_before
        print(
            f"{'    increase over the RSS before export':<46} {grown * mib:>10.0f}"
            f" {export_grown * mib:>10.0f} MiB  {grown / export_grown:>6.2f}x  goal <= 1.5:"
            f" {'ok' if grown / export_grown <= 1.5 else 'MISS'}"
        )
        ratio = ratio or peak / export_peak
    return ratio


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument(
        "--cpu-time", action="store_true", help="process CPU time instead of wall time"
    )
    parser.add_argument("--verify-blocks", type=int, nargs="*", default=[2, 32])
    parser.add_argument("--localize-blocks", type=int, nargs="*", default=[8, 32, 128])
    parser.add_argument("--rss-blocks", type=int, nargs="*", default=[32])
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument(
        "--rss-child", choices=("export", "localize", "localize-cold"), help=argparse.SUPPRESS
    )
    parser.add_argument("--blocks", type=int, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child, args.blocks, args.exporter)
        return {}
    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}; "
        f"{args.exporter} exporter, opset {OPSET}; medians of {args.rounds} paired rounds of "
        f"{'CPU' if args.cpu_time else 'wall'} time"
    )
    print(f"{'contender / baseline':<46} {'contender':>10} {'baseline':>10}")
    results: dict[str, float] = {}
    if not args.skip_compare:
        results["compare"] = compare_row(args.rounds)
    for blocks in args.verify_blocks:
        results[f"verify N={blocks}"] = verify_rows(blocks, args.exporter, args.rounds)
    for blocks in args.localize_blocks:
        results[f"localize N={blocks}"] = localize_rows(
            blocks, args.exporter, max(3, args.rounds // 2)
        )
    for blocks in args.rss_blocks:
        results[f"rss N={blocks}"] = rss_row(blocks, args.exporter)
    return results


if __name__ == "__main__":
    main()
