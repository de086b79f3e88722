"""Benchmark ``onnx_custom::deform_conv2d`` against ONNX Runtime's native ``DeformConv``, and its
training cost against ``F.conv2d``'s.

Run: ``python benchmarks/deform_conv2d.py [--repeat 20]``. Ratios are measured side by side in one
process (torch with 2 threads; ORT with 2 intra-op threads and spinning off).
``--forward-only [--threads 1] [--cpu-time]`` times just the eager forward against ``F.conv2d`` in
paired rounds (which goes first alternates; the ratio is the median of the rounds' ratios), with
process CPU time on a shared machine (use it with ``--threads 1``: with more threads it adds the
threads' times up). Peak memory is the
RSS high-water increase of one warm call in a fresh subprocess (see ``peak_memory``).

Training cost: (forward + backward) / forward of our op (all five inputs requiring grad) against
the same ratio of ``F.conv2d`` (input, weight, bias requiring grad); the goal is at most 1.5x
F.conv2d's ratio. Both backwards get the same output gradient through ``torch.autograd.grad``
(no ``.grad`` accumulation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from onnx_custom.ops.deform_conv import deform_conv2d, load_extension

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path (the smoke test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import alternating_rounds, median_ms, ort_options, print_ratios, rss_child
from harness import peak_memory as _peak_memory

__all__ = ["build_ort_deformconv", "forward_row", "main", "make_inputs", "peak_memory", "time_fn"]

SHAPE = {"N": 4, "C": 64, "H": 56, "W": 56, "K": 3, "Cout": 64}


def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, c, h, w, k, cout = (SHAPE[key] for key in ("N", "C", "H", "W", "K", "Cout"))
    return {
        "X": torch.randn(n, c, h, w, generator=g),
        "W": torch.randn(cout, c, k, k, generator=g) * 0.05,
        "offset": torch.randn(n, 2 * k * k, h, w, generator=g) * 2.0,
        "B": torch.randn(cout, generator=g),
        "mask": torch.rand(n, k * k, h, w, generator=g),
    }


def build_ort_deformconv(k: int, pad: int, threads: int = 2) -> ort.InferenceSession:
    """A one-node opset-19 ``DeformConv`` model (float32, mask and bias inputs)."""
    names = ["X", "W", "offset", "B", "mask"]
    node = helper.make_node("DeformConv", names, ["Y"], kernel_shape=[k, k], pads=[pad] * 4)
    graph = helper.make_graph(
        [node],
        "deformconv",
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (1 if n == "B" else 4))
            for n in names
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None] * 4)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model)
    return ort.InferenceSession(
        model.SerializeToString(), ort_options(threads), providers=["CPUExecutionProvider"]
    )


def time_fn(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    """Median wall time in milliseconds."""
    return median_ms(fn, repeat, warmup)


def _rss_child(kind: str) -> None:
    """Subprocess body: print the RSS high-water increase (KiB) of one warm call of ``kind``."""
    torch.set_num_threads(2)
    load_extension()
    rss_child(_contenders(make_inputs())[kind])


def peak_memory(kind: str) -> int:
    """Peak RSS increase in bytes of one call, measured in a fresh subprocess (see
    harness.peak_memory)."""
    return _peak_memory(__file__, kind)


def _contenders(t: dict[str, torch.Tensor]) -> dict[str, Callable[[], torch.Tensor]]:
    pad = SHAPE["K"] // 2

    def eager() -> torch.Tensor:
        with torch.inference_mode():
            return deform_conv2d(t["X"], t["offset"], t["W"], t["B"], padding=pad, mask=t["mask"])

    def conv() -> torch.Tensor:
        with torch.inference_mode():
            return F.conv2d(t["X"], t["W"], t["B"], padding=pad)

    return {"eager": eager, "conv2d": conv}


def _training(t: dict[str, torch.Tensor]) -> tuple[Callable[[], object], Callable[[], object]]:
    """(our forward + backward, F.conv2d's forward + backward) on the same inputs."""
    pad = SHAPE["K"] // 2
    leaves = {k: v.clone().requires_grad_() for k, v in t.items()}
    grad_out = torch.randn(
        SHAPE["N"],
        SHAPE["Cout"],
        SHAPE["H"],
        SHAPE["W"],
        generator=torch.Generator().manual_seed(2),
    )
    ours = [leaves[k] for k in ("X", "offset", "W", "B", "mask")]
    theirs = [leaves[k] for k in ("X", "W", "B")]

    def eager_train() -> object:
        x, offset, w, b, mask = ours
        y = deform_conv2d(x, offset, w, b, padding=pad, mask=mask)
        return torch.autograd.grad(y, ours, grad_out)

    def conv_train() -> object:
        x, w, b = theirs
        y = F.conv2d(x, w, b, padding=pad)
        return torch.autograd.grad(y, theirs, grad_out)

    return eager_train, conv_train


class _OneOp(torch.nn.Module):
    def forward(self, x, w, offset, mask, bias):
        pad = SHAPE["K"] // 2
        return torch.ops.onnx_custom.deform_conv2d(
            x, w, offset, mask, bias, 1, 1, pad, pad, 1, 1, 1, 1, True
        )


def _session_fn(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    import onnx_custom

    sess = onnx_custom.InferenceSession(proto, ort_options())
    names = [i.name for i in sess.get_inputs()]
    bound = dict(zip(names, feeds.values(), strict=True))
    return lambda: sess.run(None, bound)


def _comparisons(
    t: dict[str, torch.Tensor],
) -> list[tuple[str, str, Callable[[], object], Callable[[], object], float | None]]:
    """(label, baseline label, contender, baseline, goal ratio) rows, all on the same inputs."""
    import onnx_custom
    from onnx_custom.models import deform_conv as dcn

    eager, conv = _contenders(t).values()
    k, pad = SHAPE["K"], SHAPE["K"] // 2
    feeds = {name: v.numpy() for name, v in t.items()}
    native = build_ort_deformconv(k, pad)
    ort_native = lambda: native.run(None, feeds)  # noqa: E731
    np.testing.assert_allclose(eager().numpy(), ort_native()[0], rtol=1e-4, atol=1e-4)

    op_args = (t["X"], t["W"], t["offset"], t["mask"], t["B"])
    one = onnx_custom.export(_OneOp(), op_args, exporter="torchscript", opset=11)
    kernel = _session_fn(one, {n: a.numpy() for n, a in zip("abcde", op_args, strict=True)})

    net = dcn.Model().eval()
    image = torch.randn(
        SHAPE["N"], 3, 4 * SHAPE["H"], 4 * SHAPE["W"], generator=torch.Generator().manual_seed(1)
    )

    def net_eager() -> torch.Tensor:
        with torch.inference_mode():
            return net(image)

    net19 = _session_fn(
        onnx_custom.export(net, (image,), exporter="torchscript", opset=19), {"x": image.numpy()}
    )
    net11 = _session_fn(
        onnx_custom.export(net, (image,), exporter="torchscript", opset=11), {"x": image.numpy()}
    )
    eager_train, conv_train = _training(t)
    return [
        ("eager op (C++)", "ORT DeformConv op19", eager, ort_native, 1.2),
        ("F.conv2d (no deformation)", "ORT DeformConv op19", conv, ort_native, None),
        ("eager op (C++)", "F.conv2d (no deformation)", eager, conv, 1.6),
        ("ORT custom-node kernel", "eager op (C++)", kernel, eager, 1.1),
        ("DCN net, ORT opset 19", "DCN net, eager", net19, net_eager, 1.0),
        ("DCN net, ORT opset 11 (kernel)", "DCN net, eager", net11, net_eager, None),
        (TRAIN, "eager op (C++)", eager_train, eager, None),
        (CONV_TRAIN, "F.conv2d (no deformation)", conv_train, conv, None),
        (TRAIN, CONV_TRAIN, eager_train, conv_train, None),
    ]


TRAIN, CONV_TRAIN = "eager fwd+bwd (C++)", "F.conv2d fwd+bwd"
FORWARD_GOAL = 1.6  # eager forward / F.conv2d forward


def forward_row(rounds: int, repeat: int, threads: int, cpu_time: bool) -> dict[str, float]:
    """Eager forward vs ``F.conv2d`` alone, paired rounds; returns both medians
    (ms) and the ratio."""
    clock = time.process_time if cpu_time else time.perf_counter
    torch.set_num_threads(threads)
    load_extension()
    eager, conv = _contenders(make_inputs()).values()

    def ms(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeat):
            start = clock()
            fn()
            times.append((clock() - start) * 1e3)
        return statistics.median(times)

    for fn in (eager, conv, eager, conv):  # warm: extension, allocator, oneDNN primitives
        fn()
    ours: list[float] = []
    base: list[float] = []
    for r in range(rounds):
        if r % 2 == 0:
            ours.append(ms(eager))
            base.append(ms(conv))
        else:
            base.append(ms(conv))
            ours.append(ms(eager))
    ratio = statistics.median(a / b for a, b in zip(ours, base, strict=True))
    kind = "CPU time" if cpu_time else "wall time"
    print(
        f"deform_conv2d forward vs F.conv2d, float32, {SHAPE}, mask on; torch {threads} thread(s), "
        f"{kind}, medians of {rounds} paired rounds of {repeat} calls"
    )
    print(
        f"  eager op (C++) {statistics.median(ours):7.2f} ms   F.conv2d"
        f" {statistics.median(base):7.2f} ms   ratio {ratio:.2f}  <={FORWARD_GOAL}"
        f" {'ok' if ratio <= FORWARD_GOAL else 'MISS'}"
    )
    return {
        "eager_ms": statistics.median(ours),
        "conv2d_ms": statistics.median(base),
        "ratio": ratio,
    }


TRAINING_GOAL = 1.5  # our (fwd+bwd)/fwd at most 1.5x F.conv2d's


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rss-child", choices=["eager", "conv2d"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--forward-only",
        action="store_true",
        help="time only the eager forward against F.conv2d (paired rounds)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (--forward-only)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with process CPU time (--forward-only; use with --threads 1)",
    )
    args = parser.parse_args(argv)
    if args.forward_only:
        previous = torch.get_num_threads()
        try:
            return forward_row(args.rounds, args.repeat, args.threads, args.cpu_time)
        finally:
            torch.set_num_threads(previous)
    if args.rss_child:
        _rss_child(args.rss_child)
        return {}
    torch.set_num_threads(2)
    load_extension()
    rows = _comparisons(make_inputs())
    fns: dict[str, Callable[[], object]] = {}
    for label, base_label, fn, base, _ in rows:
        fns.setdefault(label, fn)
        fns.setdefault(base_label, base)
    # Interleave contenders round by round so load drift hits all alike; keep each one's best round.
    times = alternating_rounds(fns, args.rounds, args.repeat, combine=min, warmup=3)
    shape = ", ".join(f"{key}={v}" for key, v in SHAPE.items())
    print(
        f"deform_conv2d forward, float32, {shape}, pad={SHAPE['K'] // 2}, mask on; torch 2 threads,"
        " ORT 2 intra threads, spinning off; DCN net input"
        f" {SHAPE['N']}x3x{4 * SHAPE['H']}x{4 * SHAPE['W']}"
    )
    results = print_ratios(
        [(label, base, goal) for label, base, _, _, goal in rows], times, width=32
    )
    ours = results[f"{TRAIN} / eager op (C++)"]
    conv = results[f"{CONV_TRAIN} / F.conv2d (no deformation)"]
    cost = results["training cost / F.conv2d training cost"] = ours / conv
    print(
        f"training cost, (fwd+bwd)/fwd: ours {ours:.2f}, F.conv2d {conv:.2f}; ours / F.conv2d's "
        f"{cost:.2f}x  <={TRAINING_GOAL:.1f} {'ok' if cost <= TRAINING_GOAL else 'MISS'}"
    )
    mib = 1024 * 1024
    eager_peak, conv_peak = peak_memory("eager"), peak_memory("conv2d")
    results["eager_peak_bytes"], results["conv2d_peak_bytes"] = eager_peak, conv_peak
    out_mib = SHAPE["N"] * SHAPE["Cout"] * SHAPE["H"] * SHAPE["W"] * 4 / mib
    print(
        f"peak RSS increase of one call (fresh subprocess; the output alone is {out_mib:.2f} MiB):"
    )
    print(f"  eager deform_conv2d {eager_peak / mib:8.2f} MiB")
    print(f"  F.conv2d            {conv_peak / mib:8.2f} MiB")
    return results


if __name__ == "__main__":
    main()
