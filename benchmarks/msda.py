"""Benchmark ``onnx_custom::multi_scale_deformable_attn`` (eager C++, the ONNX Runtime kernels)
against the pure-PyTorch ``grid_sample`` formulation and ORT running its ``GridSample`` export.

Size: Deformable DETR's encoder on a 512x512 image: bs 1, 4 levels at strides 8-64 (64x64, 32x32,
16x16, 8x8: 5440 keys), 8 heads, head_dim 32, 4 points, queries = keys. Sampling locations are
each query's reference point (its pixel centre) plus offsets of about one pixel of each level,
as a trained encoder's are; attention weights are a softmax over levels x points.

Run: ``python benchmarks/msda.py [--repeat 10] [--rounds 3]``. torch uses 2 threads; ORT 2
intra-op threads, spinning off. Contenders are timed side by side in one process, alternating
round by round (each round: the median of ``--repeat`` calls per contender); the table shows
the median over rounds. The forward rows with a goal are then timed again as pairs (contender and
baseline back to back each round, `harness.paired_rounds`): their ratio is the median of the
rounds' ratios, robust to load drifting on a shared machine. Peak memory is the RSS high-water
increase of one warm fwd+bwd call in a fresh subprocess (``MALLOC_MMAP_THRESHOLD_`` so freed buffers
are not silently reused).

Goals: eager fwd / grid_sample fwd <= 0.5; eager (fwd+bwd)/fwd <= 2.5; native ORT
kernel / ORT GridSample decomposition <= 0.3; Python kernel / eager <= 1.1; peak memory of eager
fwd+bwd <= 1.0x the grid_sample formulation's.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

from onnx_custom.ops.msda import load_extension, multi_scale_deformable_attn

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path (the smoke test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import alternating_rounds, ort_options, paired_rounds, print_ratios, rss_child
from harness import peak_memory as _peak_memory

__all__ = ["LEVELS", "grid_sample_formulation", "main", "make_inputs", "peak_memory"]

LEVELS = ((64, 64), (32, 32), (16, 16), (8, 8))
BS, HEADS, HEAD_DIM, POINTS = 1, 8, 32, 4
Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_inputs(seed: int = 0) -> Inputs:
    """(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)."""
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(LEVELS, dtype=torch.int64)
    sizes = shapes.prod(1)
    starts = torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1]))
    keys = int(sizes.sum())
    centres = []
    for h, w in LEVELS:
        ys, xs = torch.meshgrid(
            (torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij"
        )
        centres.append(torch.stack([xs.reshape(-1), ys.reshape(-1)], -1))
    ref = torch.cat(centres)[None, :, None, None, None, :]  # (1, Q, 1, 1, 1, 2)
    pixel = (1.0 / shapes.flip(-1).float())[None, None, None, :, None, :]  # one pixel per level
    offsets = torch.randn(BS, keys, HEADS, len(LEVELS), POINTS, 2, generator=g) * pixel
    loc = ref + offsets
    attn = torch.randn(BS, keys, HEADS, len(LEVELS) * POINTS, generator=g).softmax(-1)
    attn = attn.view(BS, keys, HEADS, len(LEVELS), POINTS)
    value = torch.randn(BS, keys, HEADS, HEAD_DIM, generator=g)
    return value, shapes, starts, loc, attn


def grid_sample_formulation(
    value: torch.Tensor, shapes: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor
) -> torch.Tensor:
    """The pure-PyTorch baseline: one F.grid_sample per level (mmcv's CPU path)."""
    bs, _, heads, dim = value.shape
    _, queries, _, levels, points, _ = loc.shape
    parts = value.split([h * w for h, w in LEVELS], dim=1)
    sampled = []
    for level, (h, w) in enumerate(LEVELS):
        image = parts[level].flatten(2).transpose(1, 2).reshape(bs * heads, dim, h, w)
        grid = (2 * loc[:, :, :, level] - 1).transpose(1, 2).flatten(0, 1)
        sampled.append(
            F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    weights = attn.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
    return out.view(bs, heads * dim, queries).transpose(1, 2).contiguous()


def _training(inputs: Inputs, kind: str) -> Callable[[], object]:
    value, shapes, starts, loc, attn = inputs
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    grad = torch.randn(
        BS, loc.shape[1], HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(2)
    )

    def ours() -> object:
        out = multi_scale_deformable_attn(leaves[0], shapes, starts, leaves[1], leaves[2])
        return torch.autograd.grad(out, leaves, grad)

    def grid() -> object:
        out = grid_sample_formulation(leaves[0], shapes, leaves[1], leaves[2])
        return torch.autograd.grad(out, leaves, grad)

    return ours if kind == "eager" else grid


def _rss_child(kind: str) -> None:
    """Subprocess body: the RSS high-water increase (KiB) of one warm fwd+bwd call of ``kind``."""
    torch.set_num_threads(2)
    load_extension()
    rss_child(_training(make_inputs(), kind))


def peak_memory(kind: str) -> int:
    """Peak RSS increase in bytes of one fwd+bwd call (``kind``: eager or grid),
    fresh subprocess."""
    return _peak_memory(__file__, kind)


class _Op(torch.nn.Module):
    def forward(
        self,
        value: torch.Tensor,
        shapes: torch.Tensor,
        starts: torch.Tensor,
        loc: torch.Tensor,
        attn: torch.Tensor,
    ) -> torch.Tensor:
        return torch.ops.onnx_custom.multi_scale_deformable_attn(
            value, shapes, starts, loc, attn, 64
        )


def _sessions(inputs: Inputs) -> dict[str, Callable[[], object]]:
    """ORT contenders: native and Python kernels of the custom node, the GridSample and gather
    decompositions (standard variants at opsets 16 and 11), all checked against eager first."""
    import onnx_custom
    from onnx_custom.runtime.native import library_path

    feeds_list = [t.numpy() for t in inputs]
    expected = grid_sample_formulation(inputs[0], inputs[1], inputs[3], inputs[4]).numpy()
    standard = onnx_custom.default_registry().with_variants("standard")
    node = onnx_custom.export(_Op(), inputs, exporter="torchscript", opset=17)
    files = {
        "native": node,
        "python": node,
        "gridsample": onnx_custom.export(
            _Op(), inputs, exporter="torchscript", opset=16, registry=standard
        ),
        "gather": onnx_custom.export(
            _Op(), inputs, exporter="torchscript", opset=11, registry=standard
        ),
    }
    fns: dict[str, Callable[[], object]] = {}
    for kind, proto in files.items():
        opts = ort_options(2)
        if kind == "native":
            opts.register_custom_ops_library(str(library_path()))
            sess = ort.InferenceSession(
                proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        elif kind == "python":
            sess = onnx_custom.InferenceSession(proto, opts)
        else:
            sess = ort.InferenceSession(
                proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), feeds_list, strict=True)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], expected, rtol=1e-4, atol=1e-4, err_msg=kind
        )
        fns[kind] = functools.partial(sess.run, None, feeds)
    return fns


ROWS = [  # (contender, baseline, goal: ratio at most)
    ("eager fwd (C++)", "grid_sample fwd", 0.5),
    ("eager fwd+bwd", "eager fwd (C++)", 2.5),
    ("grid_sample fwd+bwd", "grid_sample fwd", None),
    ("ORT native kernel", "ORT GridSample decomposition", 0.3),
    ("ORT gather decomposition", "ORT GridSample decomposition", None),
    ("ORT Python kernel", "eager fwd (C++)", 1.1),
]
MEMORY_GOAL = 1.0


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rss-child", choices=["eager", "grid"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child)
        return {}
    torch.set_num_threads(2)
    load_extension()
    inputs = make_inputs()
    value, shapes, starts, loc, attn = inputs
    torch.testing.assert_close(
        multi_scale_deformable_attn(value, shapes, starts, loc, attn),
        grid_sample_formulation(value, shapes, loc, attn),
        rtol=1e-4,
        atol=1e-5,
    )
    sessions = _sessions(inputs)

    def eager() -> object:
        with torch.inference_mode():
            return multi_scale_deformable_attn(value, shapes, starts, loc, attn)

    def grid() -> object:
        with torch.inference_mode():
            return grid_sample_formulation(value, shapes, loc, attn)

    fns: dict[str, Callable[[], object]] = {
        "eager fwd (C++)": eager,
        "grid_sample fwd": grid,
        "eager fwd+bwd": _training(inputs, "eager"),
        "grid_sample fwd+bwd": _training(inputs, "grid"),
        "ORT native kernel": sessions["native"],
        "ORT Python kernel": sessions["python"],
        "ORT GridSample decomposition": sessions["gridsample"],
        "ORT gather decomposition": sessions["gather"],
    }
    times = alternating_rounds(fns, args.rounds, args.repeat)
    # The goal rows again as pairs (contender and baseline back to back each round): on a shared
    # machine load drifts between contenders timed far apart in a round.
    pairs = {
        (label, base): paired_rounds(fns[label], fns[base], args.rounds, args.repeat)
        for label, base, goal in ROWS
        if goal is not None and "bwd" not in label
    }
    keys = sum(h * w for h, w in LEVELS)
    print(
        f"multi_scale_deformable_attn, float32, bs {BS}, levels {list(LEVELS)} ({keys} keys ="
        f" queries), {HEADS} heads x {HEAD_DIM}, {POINTS} points; torch 2 threads, ORT 2 intra"
        f" threads, spinning off; median of {args.rounds} alternating rounds x {args.repeat} calls;"
        f" forward goal rows: median of {args.rounds} paired rounds' ratios"
    )
    results = print_ratios(ROWS, times, width=30, pairs=pairs)
    mib = 1024 * 1024
    ours, theirs = peak_memory("eager"), peak_memory("grid")
    results["eager_peak_bytes"], results["grid_peak_bytes"] = ours, theirs
    ratio = results["peak memory eager / grid_sample"] = ours / theirs
    print(
        f"peak RSS increase of one fwd+bwd (fresh subprocess): eager {ours / mib:.1f} MiB,"
        f" grid_sample {theirs / mib:.1f} MiB: {ratio:.2f}x   <= {MEMORY_GOAL:.1f}"
        f" {'ok' if ratio <= MEMORY_GOAL else 'MISS'}"
    )
    return results


if __name__ == "__main__":
    main()
