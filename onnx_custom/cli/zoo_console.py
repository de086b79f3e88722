"""What ``onnx-custom zoo`` shows while it runs.

stdout gets one line per row as it finishes (``[n/N]``, status, time, result, every node type:
nothing truncated) and the counts. stderr gets the progress: on a terminal one live line (the
running row, elapsed time, ETA) redrawn every second; elsewhere (CI logs, pipes) one plain line
per row as it starts. One-time native builds are announced with their expected duration.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from onnx_custom.testing import ZooCase
from onnx_custom.zoo import NativeBuild, ZooResult, counts_line

__all__ = ["ZooConsole", "clock"]


def clock(seconds: float) -> str:
    """``75.2`` -> ``1:15``."""
    seconds = max(0, round(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


class ZooConsole:
    """A `onnx_custom.zoo.ZooListener` printing rows to ``out`` and progress to ``err``."""

    def __init__(
        self, out: TextIO, err: TextIO, *, live: bool | None = None, tick: float = 1.0
    ) -> None:
        self.out, self.err = out, err
        self.live = err.isatty() if live is None else live
        self.tick = tick
        self.start = time.perf_counter()
        self.model_width = self.case_width = 0
        self.rows: list[ZooCase] = []
        self.done = 0
        # seconds of finished rows per exporter: the ETA adds each remaining row's exporter mean
        # (a dynamo row costs ~10x a TorchScript row)
        self.durations: dict[str, list[float]] = {}
        self.status = ""
        self.row_start = self.start
        self._lock = threading.Lock()  # the terminal line
        self._durations_lock = (
            threading.Lock()
        )  # durations: appended here, read by the ticker's ETA
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- ZooListener -------------------------------------------------------------------
    def pending(self, builds: Sequence[NativeBuild]) -> None:
        if builds:
            from onnx_custom.common.native_build import cache_root

            names = ", ".join(f"{b.name} ({b.duration})" for b in builds)
            self._note(
                "first run here: one-time native build(s) ahead, cached afterwards in"
                f" {cache_root()}: {names}"
            )

    def building(self, build: NativeBuild) -> None:
        self._note(f"building the {build.name} (one time, usually {build.duration}) ...")

    def built(self, build: NativeBuild, seconds: float, error: BaseException | None) -> None:
        if error is None:
            self._note(f"built the {build.name} in {clock(seconds)}")
        else:  # the rows needing it will skip or fail with the full reason
            self._note(f"could not build the {build.name}: {' '.join(str(error).split())[:300]}")

    def planned(self, rows: Sequence[tuple[str, ZooCase]]) -> None:
        self.model_width = max((len(m) for m, _ in rows), default=5)
        self.case_width = max((len(c.label) for _, c in rows), default=4)
        self.rows = [case for _, case in rows]
        width = 2 * len(str(len(rows))) + 3
        self._print(
            f"{'':<{width}} {'model':<{self.model_width}}  {'case':<{self.case_width}} "
            f" {'status':<6} {'time':>6}  result; nodes"
        )
        if self.live and self._ticker is None:
            self._ticker = threading.Thread(
                target=self._tick, name="onnx-custom-zoo-progress", daemon=True
            )
            self._ticker.start()

    def started(self, index: int, total: int, model: str, case: ZooCase) -> None:
        text = f"[{index}/{total}] {model} {case.label}"
        with self._lock:
            self.status = text
            self.row_start = time.perf_counter()
        if self.live:
            self._draw()
        else:
            print(
                f"{text} ... (elapsed {clock(time.perf_counter() - self.start)}, {self._eta()})",
                file=self.err,
                flush=True,
            )

    def finished(self, index: int, total: int, result: ZooResult) -> None:
        self.done = index
        if result.status != "skip" and result.case.exporter:
            with self._durations_lock:
                self.durations.setdefault(result.case.exporter, []).append(result.seconds)
        tag = f"[{index:>{len(str(total))}}/{total}]"
        line = (
            f"{tag} {result.model:<{self.model_width}}  {result.case.label:<{self.case_width}}  "
            f"{result.status.upper():<6} {result.seconds:>5.1f}s  {result.summary}"
        )
        self._print(f"{line}; {result.nodes}" if result.nodes else line)

    # -- end ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and clear the live line (also when the run is interrupted)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self._clear()

    def finish(self, results: Sequence[ZooResult]) -> None:
        """Print the counts, then every failure in full (stderr)."""
        self.close()
        self._print(f"{counts_line(results)} in {clock(time.perf_counter() - self.start)}")
        for r in results:
            if r.status == "fail":
                print(
                    f"\n--- FAIL {r.model} {r.case.label} ---\n{r.detail}",
                    file=self.err,
                    flush=True,
                )

    # -- drawing ------------------------------------------------------------------------
    def _eta(self) -> str:
        with self._durations_lock:  # not self._lock: _draw holds it while computing the ETA
            durations = {exporter: list(ds) for exporter, ds in self.durations.items()}
        if not durations:
            return "ETA --"
        overall = statistics.fmean(d for ds in durations.values() for d in ds)
        means = {exporter: statistics.fmean(ds) for exporter, ds in durations.items()}
        left = sum(
            0.0 if case.skip else means.get(case.exporter, overall)
            for case in self.rows[self.done :]
        )
        return f"ETA ~{clock(left)}"

    def _status_line(self) -> str:
        running = time.perf_counter() - self.row_start
        return (
            f"{self.status} ... {running:.0f}s (elapsed {clock(time.perf_counter() - self.start)},"
            f" {self._eta()})"
        )

    def _draw(self) -> None:
        with self._lock:
            if self.status:
                self.err.write("\r\x1b[K" + self._status_line())
                self.err.flush()

    def _clear(self) -> None:
        if self.live:
            with self._lock:
                self.err.write("\r\x1b[K")
                self.err.flush()

    def _print(self, line: str) -> None:
        self._clear()
        with self._lock:
            print(line, file=self.out, flush=True)
        if self.live and not self._stop.is_set():
            self._draw()

    def _note(self, line: str) -> None:
        self._clear()
        print(f"onnx-custom: {line}", file=self.err, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.tick):
            self._draw()
