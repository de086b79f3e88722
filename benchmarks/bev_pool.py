"""Benchmark ``onnx_custom::bev_pool_v2`` at BEVDet-R50 size: eager op, custom node, ORT graph.

6 cameras, 59 depth bins, 16x44 features, C=80, a 128x128 BEV grid from ``synthetic_frustum`` /
``prepare_bev_ranks`` (230,592 points in 9,604 intervals). Rows, paired (contender and baseline
alternate round by round in one process, ``harness.paired_rounds``; the ratio is the median of the
rounds' ratios):

- the custom node ``onnx_custom::BEVPoolV2`` in ONNX Runtime (our Python kernel) / the eager op;
- the eager forward / the standard-op translation (Gather, Mul, ScatterND) in ONNX Runtime;
- the eager forward + backward / the eager forward.

Also shown: the NumPy kernel the node falls back to without the C++ kernels / the eager op.

Run: ``python benchmarks/bev_pool.py [--rounds 15] [--threads 2] [--cpu-time]``. torch and ONNX
Runtime (intra-op, spinning off) use the same number of threads. ``--cpu-time`` times with the
process's CPU time instead of the wall clock: steadier on a shared machine, meaningful with
``--threads 1`` (with more threads it adds the threads' times up).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import torch

import onnx_custom
import onnx_custom.symbolics.bev_pool
from onnx_custom.ops.bev_pool import bev_pool_v2, prepare_bev_ranks, synthetic_frustum
from onnx_custom.ort_kernels.bev_pool import bev_pool_v2_numpy

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path (a smoke test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import paired_rounds

__all__ = ["Pool", "inputs", "main"]

CAMERAS, DEPTH_BINS, FEAT_HW, CHANNELS = 6, 59, (16, 44), 80
GRID_LOWER, GRID_STEP, GRID_SIZE = (-51.2, -51.2, -5.0), (0.8, 0.8, 8.0), (128, 128, 1)
BEV_SHAPE = [1, GRID_SIZE[2], GRID_SIZE[1], GRID_SIZE[0], CHANNELS]


class Pool(torch.nn.Module):
    """bev_pool_v2 with the ranks as buffers (as BEVDet deploys it): inputs depth and feat."""

    def __init__(self) -> None:
        super().__init__()
        ranks = prepare_bev_ranks(
            synthetic_frustum(1, CAMERAS, DEPTH_BINS, FEAT_HW), GRID_LOWER, GRID_STEP, GRID_SIZE
        )
        for name, value in zip(
            ("ranks_bev", "ranks_depth", "ranks_feat", "starts", "lengths"), ranks, strict=True
        ):
            self.register_buffer(name, value)

    def forward(self, depth: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return bev_pool_v2(
            depth,
            feat,
            self.ranks_depth,
            self.ranks_feat,
            self.ranks_bev,
            BEV_SHAPE,
            self.starts,
            self.lengths,
        )


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    fh, fw = FEAT_HW
    depth = torch.rand(1, CAMERAS, DEPTH_BINS, fh, fw, generator=g).softmax(dim=2)
    return depth, torch.randn(1, CAMERAS, fh, fw, CHANNELS, generator=g)


def _session(proto: onnx.ModelProto, threads: int) -> onnx_custom.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnx_custom.InferenceSession(proto, options)


def _export(model: Pool, args: tuple[torch.Tensor, ...], variant: str | None) -> onnx.ModelProto:
    registry = onnx_custom.default_registry()
    if variant:
        registry = registry.with_variants(variant)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx_custom.export(model, args, exporter="dynamo", opset=18, registry=registry)


def contenders(threads: int) -> dict[str, Callable[[], Any]]:
    model = Pool().eval()
    depth, feat = inputs()
    feeds = {"depth": depth.numpy(), "feat": feat.numpy()}
    custom = _session(_export(model, (depth, feat), "custom"), threads)
    graph = _session(_export(model, (depth, feat), None), threads)
    with torch.no_grad():
        expected = model(depth, feat)
    for session in (custom, graph):  # all contenders compute the same thing
        (actual,) = session.run(None, feeds)
        torch.testing.assert_close(torch.from_numpy(actual), expected)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    depth_g, feat_g = depth.clone().requires_grad_(), feat.clone().requires_grad_()

    def eager() -> torch.Tensor:
        with torch.no_grad():
            return model(depth, feat)

    def eager_backward() -> None:
        depth_g.grad = feat_g.grad = None
        model(depth_g, feat_g).backward(grad)

    arrays = [
        a.numpy()
        for a in (
            depth,
            feat,
            model.ranks_depth,
            model.ranks_feat,
            model.ranks_bev,
            model.starts,
            model.lengths,
        )
    ]
    torch.testing.assert_close(torch.from_numpy(bev_pool_v2_numpy(*arrays, BEV_SHAPE)), expected)
    return {
        "NumPy fallback kernel": lambda: bev_pool_v2_numpy(*arrays, BEV_SHAPE),
        "custom node (Python kernel)": lambda: custom.run(None, feeds),
        "ORT standard-op graph": lambda: graph.run(None, feeds),
        "eager forward": eager,
        "eager forward+backward": eager_backward,
    }


ROWS: tuple[tuple[str, str, float | None], ...] = (
    ("custom node (Python kernel)", "eager forward", 1.0),
    ("eager forward", "ORT standard-op graph", 1.0),
    ("eager forward+backward", "eager forward", 2.0),
    ("NumPy fallback kernel", "eager forward", None),
)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads and ORT intra-op threads"
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="time with process CPU time (use with --threads 1)"
    )
    args = parser.parse_args(argv)
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    fns = contenders(args.threads)
    for fn in fns.values():  # warm: lazy builds, allocator, ORT's first run
        fn()
        fn()
    r = Pool().ranks_bev.numel(), Pool().starts.numel()
    print(
        f"bev_pool_v2 forward, float32: {r[0]:,} points, {r[1]:,} intervals, C={CHANNELS}, grid"
        f" 128x128; torch {torch.get_num_threads()} threads, ORT {args.threads} intra-op threads;"
        f" medians of {args.rounds} paired rounds{' (CPU time)' if args.cpu_time else ''}"
    )
    print(f"{'contender':<30}{'ms':>9}  {'baseline':<24}{'ms':>9}{'ratio':>8}")
    results: dict[str, float] = {}
    for label, base_label, goal in ROWS:
        mine, base, ratio = paired_rounds(fns[label], fns[base_label], args.rounds, 1, clock)
        results[f"{label} / {base_label}"] = ratio
        verdict = "" if goal is None else f"goal <= {goal:g}: {'ok' if ratio <= goal else 'MISS'}"
        print(f"{label:<30}{mine:>9.2f}  {base_label:<24}{base:>9.2f}{ratio:>7.2f}x  {verdict}")
    return results


if __name__ == "__main__":
    main()
