"""``fuse_file`` on an ONNX file: fuse time (match + rewrite, no proof), the proof's time, and
ONNX Runtime latency of the fused file against the original, side by side in one run.

    python benchmarks/fuse_file.py model.onnx [--rounds 5 --repeat 3 --dim batch=1]

Contenders: the fused file with the native kernel library (``kernels="native"``, what a C++
deployment loads) and with the Python kernels; baseline: the original (GridSample) file. Goal
(ratio fused native / original): <= 0.6 for encoders running MSDA at every layer. Inputs are
seeded random feeds, symbolic dims 2 unless ``--dim`` names them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

import onnx_custom
from onnx_custom.rewrite import fuse_file

ROWS = [
    ("fused (native kernel)", "original (GridSample)", 0.6),
    ("fused (Python kernels)", "original (GridSample)", None),
]


def _feeds(session: onnx_custom.InferenceSession, dims: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) else dims.get(str(d), 2) for d in info.shape]
        if "int" in info.type:
            feeds[info.name] = rng.integers(0, 2, size=shape).astype(np.int64)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("onnx", help="an ONNX file with GridSample-based MSDA")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE")
    ns = parser.parse_args(argv)
    dims = {k: int(v) for k, _, v in (d.partition("=") for d in ns.dim)}

    model = onnx.load(ns.onnx)
    started = time.perf_counter()
    fused, report = fuse_file(model, prove=False)
    fuse_s = time.perf_counter() - started
    started = time.perf_counter()
    _, proven = fuse_file(model, dims=dims)
    total_s = time.perf_counter() - started
    print(str(report).splitlines()[0])
    print(
        f"fuse (match + rewrite, no proof): {fuse_s:.2f} s; with the proof: {total_s:.2f} s"
        f" (proof {proven.proof_seconds:.2f} s)"
    )
    results = {"fuse_seconds": fuse_s, "proof_seconds": proven.proof_seconds}
    if not report.count:
        return results

    original = onnx_custom.InferenceSession(model, harness.ort_options())
    sessions = {
        "original (GridSample)": original,
        "fused (native kernel)": onnx_custom.InferenceSession(
            fused, harness.ort_options(), kernels="native"
        ),
        "fused (Python kernels)": onnx_custom.InferenceSession(fused, harness.ort_options()),
    }
    feeds = _feeds(original, dims)
    calls = {label: (lambda s=s: s.run(None, feeds)) for label, s in sessions.items()}
    times = harness.alternating_rounds(calls, ns.rounds, ns.repeat)
    results.update(harness.print_ratios(ROWS, times))
    return results


if __name__ == "__main__":
    main()
