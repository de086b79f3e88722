"""Native kernels (libonnx_custom_ops.so) against their natural baselines, side by side in one run.

Run: ``python benchmarks/native_ops.py [--rounds 7] [--repeat 10] [--only dcn,my_add,bev,gemm]``

Every ORT session uses 2 intra-op threads with spinning off; torch uses 2 threads. Contenders of
one comparison run interleaved (the order flips every round; ``harness.rounds_wall_cpu_ms``) and
each ratio is the median of the per-round ratios of medians, so load drift hits both sides alike.
CPU time (all threads) is reported next to wall time: on a loaded machine it is the steadier of
the two.

- dcn: native onnx_custom::DeformConv2d vs ORT's built-in DeformConv (opset 19), N=4, C=64, 56x56,
  3x3, Cout=64, mask on (goal <= 1.0); also our kernel with ORT's Gemm (CreateOp/InvokeOp) in
  place of our GEMM, and the eager torch op.
- my_add: native onnx_custom::my_add vs native Mul+Add at 64x1024 (goal <= 1.1).
- bev: native onnx_custom::BEVPoolV2 vs the eager op at a BEVDet-R50-like size: 6 cameras, D=59,
  16x44 features, C=80, 128x128 grid (goal <= 1.0).
- gemm: onnx_custom::CustomLinear with our GEMM vs with ORT's Gemm through InvokeOp vs a plain ORT
  Gemm node (the measurement behind the GEMM choice).
- user: a user kernel built from an op spec (onnx_custom/kernel.h, build_native_library):
  scale_add at 64x1024 vs ORT Mul+Add (goal <= 1.1: the generated binding adds nothing
  measurable); a compute-bound user kernel with parallel_for on 2 threads vs 1 (goal <= 0.6);
  cold build of a one-op library into an empty cache (goal <= 30 s) and a warm build (<= 1 s).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

from onnx_custom.runtime.native import library_path

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path (a smoke test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import paired_ratio, rounds_wall_cpu_ms

__all__ = ["compare", "main"]

Fn = Callable[[], object]


def _options(native: bool) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if native:
        so.register_custom_ops_library(str(library_path()))
    return so


def _session(
    model: onnx.ModelProto, native: bool = True, gemm: str = "own"
) -> ort.InferenceSession:
    os.environ["ONNX_CUSTOM_NATIVE_GEMM"] = gemm  # read when ORT creates the kernels
    try:
        return ort.InferenceSession(
            model.SerializeToString(), _options(native), providers=["CPUExecutionProvider"]
        )
    finally:
        os.environ.pop("ONNX_CUSTOM_NATIVE_GEMM", None)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: Sequence[tuple[str, int]],
    outputs: list[str],
    opset: int,
    domains: tuple[str, ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def compare(
    title: str,
    fns: dict[str, Fn],
    baseline: str,
    rounds: int,
    repeat: int,
    goals: dict[str, float] | None = None,
) -> dict[str, float]:
    """Prints wall/CPU medians and paired ratios against ``baseline``; returns wall ratios."""
    # (2 untimed calls each first: kernel creation, thread pools, caches)
    per_round = rounds_wall_cpu_ms(fns, rounds, repeat, warmup=2)
    names = list(fns)
    print(f"\n{title}")
    print(
        f"  {'contender':<40}{'wall ms':>9}{'cpu ms':>9}{'wall ratio':>12}{'cpu ratio':>11}  goal"
    )
    ratios = {}
    for name in names:
        wall = statistics.median(w for w, _ in per_round[name])
        cpu = statistics.median(c for _, c in per_round[name])
        rw = paired_ratio([w for w, _ in per_round[name]], [w for w, _ in per_round[baseline]])
        rc = paired_ratio([c for _, c in per_round[name]], [c for _, c in per_round[baseline]])
        ratios[name] = rw
        goal = (goals or {}).get(name)
        verdict = "" if goal is None else f"<= {goal:.1f} {'ok' if rw <= goal else 'MISS'}"
        print(f"  {name:<40}{wall:>9.3f}{cpu:>9.3f}{rw:>11.2f}x{rc:>10.2f}x  {verdict}")
    return ratios


# ---- DeformConv2d --------------------------------------------------------------------------------
def bench_dcn(rounds: int, repeat: int) -> dict[str, float]:
    from onnx_custom.ops.deform_conv import deform_conv2d

    g = torch.Generator().manual_seed(0)
    n, c, h, w, k, cout = 4, 64, 56, 56, 3, 64
    t = {
        "X": torch.randn(n, c, h, w, generator=g),
        "W": torch.randn(cout, c, k, k, generator=g) * 0.05,
        "offset": torch.randn(n, 2 * k * k, h, w, generator=g) * 2.0,
        "B": torch.randn(cout, generator=g),
        "mask": torch.rand(n, k * k, h, w, generator=g),
    }
    f = {key: v.numpy() for key, v in t.items()}
    ref_inputs = ["X", "W", "offset", "B", "mask"]
    builtin = _session(
        _model(
            [helper.make_node("DeformConv", ref_inputs, ["Y"], kernel_shape=[k, k], pads=[1] * 4)],
            [(i, TensorProto.FLOAT) for i in ref_inputs],
            ["Y"],
            19,
        ),
        native=False,
    )
    ours_inputs = ["input", "weight", "offset", "mask", "bias"]
    node = helper.make_node(
        "DeformConv2d", ours_inputs, ["Y"], domain="onnx_custom", pad_h=1, pad_w=1, use_mask=1
    )
    model = _model(
        [node], [(i, TensorProto.FLOAT) for i in ours_inputs], ["Y"], 11, ("onnx_custom",)
    )
    feeds = {
        "input": f["X"],
        "weight": f["W"],
        "offset": f["offset"],
        "mask": f["mask"],
        "bias": f["B"],
    }
    own, via_ort = _session(model, gemm="own"), _session(model, gemm="ort")
    expected = builtin.run(None, f)[0]
    for s in (own, via_ort):
        np.testing.assert_allclose(s.run(None, feeds)[0], expected, rtol=1e-4, atol=1e-4)
    torch.set_num_threads(2)

    def eager() -> object:
        with torch.inference_mode():
            return deform_conv2d(t["X"], t["offset"], t["W"], t["B"], padding=1, mask=t["mask"])

    return compare(
        "onnx_custom::DeformConv2d, float32, N=4 C=64 56x56 3x3 Cout=64 mask on (baseline: ORT"
        " DeformConv op19)",
        {
            "ORT DeformConv (opset 19)": lambda: builtin.run(None, f),
            "native DeformConv2d (our GEMM)": lambda: own.run(None, feeds),
            "native DeformConv2d (ORT Gemm via InvokeOp)": lambda: via_ort.run(None, feeds),
            "eager onnx_custom::deform_conv2d (torch)": eager,
        },
        "ORT DeformConv (opset 19)",
        rounds,
        repeat,
        {"native DeformConv2d (our GEMM)": 1.0},
    )


# ---- my_add --------------------------------------------------------------------------------------
def bench_my_add(rounds: int, repeat: int) -> dict[str, float]:
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    ab = [("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT)]
    mul_add = _model(
        [
            helper.make_node("Constant", [], ["c"], value=two),
            helper.make_node("Mul", ["a", "c"], ["t"]),
            helper.make_node("Add", ["t", "b"], ["y"]),
        ],
        ab,
        ["y"],
        18,
    )
    ours = _model(
        [helper.make_node("my_add", ["a", "b"], ["y"], domain="onnx_custom", alpha=2.0)],
        ab,
        ["y"],
        18,
        ("onnx_custom",),
    )
    rng = np.random.default_rng(0)
    feeds = {
        "a": rng.standard_normal((64, 1024), np.float32),
        "b": rng.standard_normal((64, 1024), np.float32),
    }
    s_ref, s_ours = _session(mul_add, native=False), _session(ours)
    np.testing.assert_allclose(s_ours.run(None, feeds)[0], s_ref.run(None, feeds)[0], rtol=1e-6)
    return compare(
        "onnx_custom::my_add (alpha=2), float32 64x1024 (baseline: ORT Mul+Add)",
        {
            "ORT Mul + Add": lambda: s_ref.run(None, feeds),
            "native my_add": lambda: s_ours.run(None, feeds),
        },
        "ORT Mul + Add",
        rounds,
        repeat * 20,
        {"native my_add": 1.1},
    )


# ---- BEVPoolV2 -----------------------------------------------------------------------------------
def bench_bev(rounds: int, repeat: int) -> dict[str, float]:
    from onnx_custom.ops.bev_pool import bev_pool_v2, prepare_bev_ranks, synthetic_frustum

    cams, d, (fh, fw), c, grid = 6, 59, (16, 44), 80, (128, 128, 1)
    coor = synthetic_frustum(1, cams, d, (fh, fw))
    ranks_bev, ranks_depth, ranks_feat, starts, lengths = prepare_bev_ranks(
        coor, (-51.2, -51.2, -5.0), (0.8, 0.8, 8.0), grid
    )
    g = torch.Generator().manual_seed(0)
    depth = torch.randn(1, cams, d, fh, fw, generator=g).softmax(2)
    feat = torch.randn(1, cams, fh, fw, c, generator=g)
    shape = [1, grid[2], grid[1], grid[0], c]
    names = [
        "depth",
        "feat",
        "ranks_depth",
        "ranks_feat",
        "ranks_bev",
        "interval_starts",
        "interval_lengths",
    ]
    values = [depth, feat, ranks_depth, ranks_feat, ranks_bev, starts, lengths]
    feeds = {n: v.numpy() for n, v in zip(names, values, strict=True)}
    types = [(n, TensorProto.FLOAT if i < 2 else TensorProto.INT32) for i, n in enumerate(names)]
    model = _model(
        [helper.make_node("BEVPoolV2", names, ["bev"], domain="onnx_custom", bev_feat_shape=shape)],
        types,
        ["bev"],
        17,
        ("onnx_custom",),
    )
    sess = _session(model)
    torch.set_num_threads(2)

    def eager() -> object:
        with torch.inference_mode():
            return bev_pool_v2(
                depth, feat, ranks_depth, ranks_feat, ranks_bev, shape, starts, lengths
            )

    torch.testing.assert_close(torch.from_numpy(sess.run(None, feeds)[0]), eager())
    print(f"\n(BEV: {int(ranks_bev.numel())} points in {int(starts.numel())} intervals)", end="")
    return compare(
        "onnx_custom::BEVPoolV2, float32, 6 cams, D=59, 16x44, C=80, 128x128 grid (baseline:"
        " eager op)",
        {
            "eager onnx_custom::bev_pool_v2 (torch)": eager,
            "native BEVPoolV2": lambda: sess.run(None, feeds),
        },
        "eager onnx_custom::bev_pool_v2 (torch)",
        rounds,
        repeat,
        {"native BEVPoolV2": 1.0},
    )


# ---- GEMM choice: onnx_custom::CustomLinear ------------------------------------------------------
def bench_gemm(rounds: int, repeat: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for m, k, n in [(64, 1024, 1024), (4096, 256, 256), (8, 512, 512)]:
        rng = np.random.default_rng(0)
        feeds = {
            "x": rng.standard_normal((m, k), np.float32),
            "w": rng.standard_normal((n, k), np.float32) * 0.05,
            "b": rng.standard_normal(n, np.float32),
        }
        io = [("x", TensorProto.FLOAT), ("w", TensorProto.FLOAT), ("b", TensorProto.FLOAT)]
        gemm = _session(
            _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], io, ["y"], 13),
            native=False,
        )
        lin = _model(
            [helper.make_node("CustomLinear", ["x", "w", "b"], ["y"], domain="onnx_custom")],
            io,
            ["y"],
            13,
            ("onnx_custom",),
        )
        own, via_ort = _session(lin, gemm="own"), _session(lin, gemm="ort")
        for s in (own, via_ort):
            np.testing.assert_allclose(
                s.run(None, feeds)[0], gemm.run(None, feeds)[0], rtol=1e-4, atol=1e-4
            )
        ratios = compare(
            f"onnx_custom::CustomLinear, float32, x {m}x{k} @ W^T {k}x{n} + b (baseline: ORT Gemm"
            " node)",
            {
                "ORT Gemm node (MLAS)": functools.partial(gemm.run, None, feeds),
                "native CustomLinear (our GEMM)": functools.partial(own.run, None, feeds),
                "native CustomLinear (ORT Gemm via InvokeOp)": functools.partial(
                    via_ort.run, None, feeds
                ),
            },
            "ORT Gemm node (MLAS)",
            rounds,
            repeat,
        )
        out.update({f"{name} {m}x{k}x{n}": r for name, r in ratios.items()})
    return out


# ---- user kernels built from op specs ------------------------------------------------------------
USER_KERNELS = """
#include <onnx_custom/kernel.h>
#include <cmath>
using onnx_custom::Tensor;

template <typename T>
void scale_add(const Tensor<T>& x, const Tensor<T>& y, Tensor<T>& out, float alpha) {
  onnx_custom::parallel_for(out.size(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = T(alpha * float(x[i]) + float(y[i]));
  });
}

// compute-bound: 64 steps of a logistic map per element
void chaos(const Tensor<float>& x, Tensor<float>& out, int64_t steps) {
  onnx_custom::parallel_for(x.size(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = 0.5f + 0.4f * std::tanh(x[i]);
      for (int64_t s = 0; s < steps; ++s) v = 3.7f * v * (1.0f - v);
      out[i] = v;
    }
  });
}
"""

USER_SPECS = """
- op_name: "bench::scale_add"
  op_type: ScaleAdd
  input_desc: [{name: x, dtype: [float32, float16]}, {name: y, dtype: [float32, float16]}]
  output_desc: [{name: out, shape: "like:x"}]
  attr_desc: [{name: alpha, dtype: float, default_value: 2.0}]
  native: {source: kernels.cpp, function: scale_add}
- op_name: "bench::chaos"
  op_type: Chaos
  input_desc: [{name: x, dtype: [float32]}]
  output_desc: [{name: out, shape: "like:x"}]
  attr_desc: [{name: steps, dtype: int, default_value: 64}]
  native: {source: kernels.cpp, function: chaos}
"""


def _user_library(folder: str, specs: str, name: str) -> tuple[object, float]:
    from onnx_custom.spec import build_native_library, parse_specs

    with open(os.path.join(folder, "kernels.cpp"), "w") as f:
        f.write(USER_KERNELS)
    with open(os.path.join(folder, "ops.yaml"), "w") as f:
        f.write(specs)
    start = time.perf_counter()
    lib = build_native_library(parse_specs(os.path.join(folder, "ops.yaml")), name=name)
    return lib, time.perf_counter() - start


def bench_user(rounds: int, repeat: int) -> dict[str, float]:
    import tempfile

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # cold: an empty build cache (our runtime objects compile too); warm: the same call again
        old = os.environ.get("ONNX_CUSTOM_CACHE_DIR")
        os.environ["ONNX_CUSTOM_CACHE_DIR"] = os.path.join(tmp, "cache")
        try:
            one_op = USER_SPECS.split('- op_name: "bench::chaos"')[0]
            _, cold = _user_library(tmp, one_op, "bench_cold")
            _, warm = _user_library(tmp, one_op, "bench_cold")
        finally:
            if old is None:
                os.environ.pop("ONNX_CUSTOM_CACHE_DIR")
            else:
                os.environ["ONNX_CUSTOM_CACHE_DIR"] = old
        print(
            f"\nuser library build, one op: cold {cold:.1f} s (goal <= 30"
            f" {'ok' if cold <= 30 else 'MISS'}), warm {warm * 1e3:.0f} ms (goal <= 1000"
            f" {'ok' if warm <= 1 else 'MISS'})"
        )
        out.update({"user build cold s": cold, "user build warm s": warm})
        lib, _ = _user_library(tmp, USER_SPECS, "bench_user")

        def session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
            so = _options(native=False)
            so.intra_op_num_threads = threads
            so.register_custom_ops_library(str(lib.path))  # type: ignore[attr-defined]
            return ort.InferenceSession(
                model.SerializeToString(), so, providers=["CPUExecutionProvider"]
            )

        two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
        xy = [("x", TensorProto.FLOAT), ("y", TensorProto.FLOAT)]
        mul_add = _model(
            [
                helper.make_node("Constant", [], ["c"], value=two),
                helper.make_node("Mul", ["x", "c"], ["t"]),
                helper.make_node("Add", ["t", "y"], ["out"]),
            ],
            xy,
            ["out"],
            18,
        )
        ours = _model(
            [helper.make_node("ScaleAdd", ["x", "y"], ["out"], domain="bench", alpha=2.0)],
            xy,
            ["out"],
            18,
            ("bench",),
        )
        rng = np.random.default_rng(0)
        feeds = {
            "x": rng.standard_normal((64, 1024), np.float32),
            "y": rng.standard_normal((64, 1024), np.float32),
        }
        s_ref, s_ours = session(mul_add, 2), session(ours, 2)
        np.testing.assert_allclose(s_ours.run(None, feeds)[0], s_ref.run(None, feeds)[0], rtol=1e-6)
        out.update(
            compare(
                "user bench::scale_add (spec + C++ function), float32 64x1024 (baseline: ORT"
                " Mul+Add)",
                {
                    "ORT Mul + Add": lambda: s_ref.run(None, feeds),
                    "user scale_add": lambda: s_ours.run(None, feeds),
                },
                "ORT Mul + Add",
                rounds,
                repeat * 20,
                {"user scale_add": 1.1},
            )
        )
        chaos = _model(
            [helper.make_node("Chaos", ["x"], ["out"], domain="bench")],
            [("x", TensorProto.FLOAT)],
            ["out"],
            18,
            ("bench",),
        )
        big = {"x": rng.standard_normal(1 << 20, np.float32)}
        one, two_threads = session(chaos, 1), session(chaos, 2)
        np.testing.assert_array_equal(one.run(None, big)[0], two_threads.run(None, big)[0])
        out.update(
            compare(
                "user bench::chaos with parallel_for, float32 1M elements x 64 steps (baseline: 1"
                " thread)",
                {
                    "1 intra-op thread": lambda: one.run(None, big),
                    "2 intra-op threads": lambda: two_threads.run(None, big),
                },
                "1 intra-op thread",
                rounds,
                repeat,
                {"2 intra-op threads": 0.6},
            )
        )
    return out


BENCHES = {
    "dcn": bench_dcn,
    "my_add": bench_my_add,
    "bev": bench_bev,
    "gemm": bench_gemm,
    "user": bench_user,
}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--only", default=",".join(BENCHES), help="comma-separated subset of " + ", ".join(BENCHES)
    )
    args = parser.parse_args(argv)
    from onnx_custom.runtime.native import native_ops

    print(
        f"library {library_path()} ({', '.join(native_ops())}); onnxruntime {ort.__version__}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    results: dict[str, float] = {}
    for name in args.only.split(","):
        results.update(BENCHES[name](args.rounds, args.repeat))
    return results


if __name__ == "__main__":
    main()
