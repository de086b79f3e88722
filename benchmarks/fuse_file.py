"""``fuse_file`` on an ONNX file: fuse time (match + rewrite, no proof), the proof's time, and
ONNX Runtime latency of the fused file against the original, side by side in one run.

    python benchmarks/fuse_file.py [model.onnx] [--rounds 5 --repeat 3 --dim batch=1]

Contenders: the fused file with the native kernel library (``kernels="native"``, what a C++
deployment loads) and with the Python kernels; baseline: the original (GridSample) file. Goal
(ratio fused native / original): <= 0.6 for encoders running MSDA at every layer. Inputs are
seeded random feeds, symbolic dims 2 unless ``--dim`` names them. Without a file, a stack of
``--blocks`` attention blocks written with ``F.grid_sample`` (two levels) is exported on the spot
with ``torch.onnx.export`` (TorchScript, opset 17) and measured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F

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


LEVELS = ((16, 16), (8, 8))  # (H, W) of each level of the built-in file


class _Block(torch.nn.Module):
    """A projection, then MSDA the pure-PyTorch way: one ``grid_sample`` per level."""

    def __init__(self, heads: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.value_proj = torch.nn.Linear(heads * dim, heads * dim)

    def forward(self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        bs, keys, _ = value.shape
        _, queries, heads, levels, points, _ = loc.shape
        parts = (
            self.value_proj(value)
            .view(bs, keys, heads, self.dim)
            .split([h * w for h, w in LEVELS], dim=1)
        )
        grids = 2 * loc - 1
        sampled = []
        for level, (h, w) in enumerate(LEVELS):
            image = parts[level].flatten(2).transpose(1, 2).reshape(bs * heads, self.dim, h, w)
            grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
            sampled.append(F.grid_sample(image, grid, padding_mode="zeros", align_corners=False))
        weights = attn.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
        out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
        return value + out.view(bs, heads * self.dim, queries).transpose(1, 2)


class _Stack(torch.nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(blocks))

    def forward(self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            value = block(value, loc, attn)
        return value


def _builtin_file(blocks: int, folder: str) -> str:
    """A file of ``blocks`` stacked attention blocks (queries = keys, as in an encoder)."""
    g = torch.Generator().manual_seed(0)
    keys = sum(h * w for h, w in LEVELS)
    args = (
        torch.randn(1, keys, 64, generator=g),
        torch.rand(1, keys, 4, len(LEVELS), 4, 2, generator=g),
        torch.rand(1, keys, 4, len(LEVELS), 4, generator=g).softmax(-1),
    )
    path = str(Path(folder) / "stack.onnx")
    torch.onnx.export(_Stack(blocks).eval(), args, path, dynamo=False, opset_version=17)
    return path


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "onnx", nargs="?", help="an ONNX file with GridSample-based MSDA (default: built-in)"
    )
    parser.add_argument("--blocks", type=int, default=6, help="attention blocks (built-in file)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE")
    ns = parser.parse_args(argv)
    dims = {k: int(v) for k, _, v in (d.partition("=") for d in ns.dim)}

    if ns.onnx is None:
        with tempfile.TemporaryDirectory() as folder:
            model = onnx.load(_builtin_file(ns.blocks, folder))
        print(f"built-in file: {ns.blocks} attention blocks, {len(model.graph.node)} nodes")
    else:
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
