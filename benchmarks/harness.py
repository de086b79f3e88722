"""Shared scaffolding of the benchmarks (``deform_conv2d.py``, ``msda.py``, ``bev_pool.py``,
``function_bodies.py``, ``native_ops.py``, ``verify_half.py``): timing contenders side by side in
one process, round by round in alternating order (wall or CPU time), the ratio table with goals,
ORT session options, and the peak-RSS measurement of one warm call in a fresh subprocess.

A benchmark imports it as ``harness`` (``python benchmarks/x.py`` puts this folder on ``sys.path``;
a benchmark also adds its folder itself, for the smoke tests that load it from its file path).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import onnxruntime as ort

__all__ = [
    "alternating_rounds",
    "median_ms",
    "median_wall_cpu_ms",
    "ort_options",
    "paired_ratio",
    "paired_rounds",
    "peak_memory",
    "print_ratios",
    "rounds_ms",
    "rounds_wall_cpu_ms",
    "rss_child",
    "status_kib",
]


Clock = Callable[[], float]
_T = TypeVar("_T")


def median_ms(
    fn: Callable[[], object], repeat: int, warmup: int = 0, clock: Clock = time.perf_counter
) -> float:
    """Median time of ``repeat`` calls in milliseconds (after ``warmup`` untimed calls); wall
    time, or process CPU time with ``clock=time.process_time`` (steadier on a loaded machine)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append((clock() - start) * 1e3)
    return statistics.median(times)


def median_wall_cpu_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median wall ms, median process CPU ms, all threads) of the same ``repeat`` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - wall) * 1e3)
        cpus.append((time.process_time() - cpu) * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def _alternate(
    fns: dict[str, Callable[[], object]], rounds: int, warmup: int, measure: Callable[..., _T]
) -> dict[str, list[_T]]:
    """``measure(fn)`` per contender and round, in forward order on even rounds and reverse order
    on odd ones, after ``warmup`` untimed calls of each."""
    for fn in fns.values():  # lazy inits, allocator pools
        for _ in range(warmup):
            fn()
    per_round: dict[str, list[_T]] = {label: [] for label in fns}
    items = list(fns.items())
    for r in range(rounds):
        for label, fn in items if r % 2 == 0 else reversed(items):
            per_round[label].append(measure(fn))
    return per_round


def rounds_ms(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    repeat: int,
    *,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
) -> dict[str, list[float]]:
    """Milliseconds per contender and round: every round times each contender (the median of
    ``repeat`` calls), in forward order on even rounds and reverse order on odd ones, so load
    drift and cache warmth hit all alike. Pair rounds with `paired_ratio`."""
    return _alternate(fns, rounds, warmup, lambda fn: median_ms(fn, repeat, clock=clock))


def rounds_wall_cpu_ms(
    fns: dict[str, Callable[[], object]], rounds: int, repeat: int, *, warmup: int = 1
) -> dict[str, list[tuple[float, float]]]:
    """`rounds_ms` with both clocks on the same calls: (wall ms, CPU ms) per contender and round
    (`median_wall_cpu_ms`); CPU time is the steadier of the two on a loaded machine."""
    return _alternate(fns, rounds, warmup, lambda fn: median_wall_cpu_ms(fn, repeat))


def paired_ratio(contender: Sequence[float], baseline: Sequence[float]) -> float:
    """The median of the rounds' ratios of two contenders timed by `rounds_ms`."""
    return statistics.median(a / b for a, b in zip(contender, baseline, strict=True))


def alternating_rounds(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    repeat: int,
    *,
    combine: Callable[[Sequence[float]], float] = statistics.median,
    warmup: int = 1,
) -> dict[str, float]:
    """Milliseconds per contender (`rounds_ms`); ``combine`` reduces the rounds (default: the
    median)."""
    per_round = rounds_ms(fns, rounds, repeat, warmup=warmup)
    return {label: combine(ms) for label, ms in per_round.items()}


def paired_rounds(
    contender: Callable[[], object],
    baseline: Callable[[], object],
    rounds: int,
    repeat: int,
    clock: Clock = time.perf_counter,
) -> tuple[float, float, float]:
    """(contender ms, baseline ms, ratio) measured as pairs: each round times the two back to back
    (the median of ``repeat`` calls each; which goes first alternates), so load that drifts over
    seconds on a shared machine hits both halves of a pair alike. The ratio is the median of the
    rounds' ratios; the times are the medians over rounds. ``clock``: as in `median_ms`."""
    mine: list[float] = []
    base: list[float] = []
    for r in range(rounds):
        if r % 2 == 0:
            mine.append(median_ms(contender, repeat, clock=clock))
            base.append(median_ms(baseline, repeat, clock=clock))
        else:
            base.append(median_ms(baseline, repeat, clock=clock))
            mine.append(median_ms(contender, repeat, clock=clock))
    ratio = statistics.median(m / b for m, b in zip(mine, base, strict=True))
    return statistics.median(mine), statistics.median(base), ratio


def print_ratios(
    rows: Sequence[tuple[str, str, float | None]],
    times: dict[str, float],
    width: int = 30,
    pairs: dict[tuple[str, str], tuple[float, float, float]] | None = None,
) -> dict[str, float]:
    """Print ``contender ms | baseline ms | ratio | goal`` per row; returns ``{"a / b": ratio}``.
    ``pairs`` (`paired_rounds` results by row) replace the row's times and ratio where given."""
    print(f"{'contender':<{width}}{'ms':>9}  {'baseline':<{width}}{'ms':>9}{'ratio':>8}   goal")
    results: dict[str, float] = {}
    for label, base, goal in rows:
        mine, theirs = times[label], times[base]
        ratio = mine / theirs
        if pairs and (label, base) in pairs:
            mine, theirs, ratio = pairs[(label, base)]
        results[f"{label} / {base}"] = ratio
        verdict = "" if goal is None else f"<= {goal:.1f} {'ok' if ratio <= goal else 'MISS'}"
        print(
            f"{label:<{width}}{mine:>9.2f}  {base:<{width}}{theirs:>9.2f}{ratio:>7.2f}x   {verdict}"
        )
    return results


def ort_options(threads: int = 2) -> ort.SessionOptions:
    """``threads`` intra-op threads, one inter-op thread, spinning off
    (no busy-waiting between calls)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def rss_child(fn: Callable[[], object]) -> None:
    """Subprocess body: print the RSS high-water increase (KiB) of one warm call of ``fn``."""
    fn()  # warm: lazy inits (MKL buffers, dispatcher caches) are not the op's working set
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    fn()
    print(status_kib("VmHWM") - before)


def peak_memory(script: str, kind: str) -> int:
    """Peak RSS increase in bytes of one call, measured by ``script --rss-child kind`` in a fresh
    subprocess (the script calls `rss_child`).

    RSS, not torch.profiler: the profiler misses allocations made in a kernel's worker threads.
    ``MALLOC_MMAP_THRESHOLD_`` makes glibc map and unmap large buffers right away, so memory freed
    by the warm-up call is not silently reused.
    """
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, script, "--rss-child", kind],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.split()[-1]) * 1024
