"""Per-call overhead of Python kernels in ONNX Runtime, on every kind of ORT thread.

1. One node: ``onnx_custom::my_add`` (alpha=2, writes into ORT's output buffer with ``out=``) and a
   variant that *returns* its result, against native ``Mul(a, 2) -> Add(., b)``; one intra-op
   thread, spinning off.
2. Thread kinds: a chain of 32 ``my_add`` nodes against a chain of 32 native ``Mul+Add`` pairs,
   run on the caller's thread (ORT_SEQUENTIAL), on an inter-op pool thread (ORT_PARALLEL, 2
   inter-op threads) and on an intra-op pool thread (``run_async``). Overhead per custom node =
   (custom - native) / 32.
3. Branches: 8 independent chains of custom nodes with ORT_PARALLEL (2 inter-op threads) against
   ORT_SEQUENTIAL, for small (overhead-bound) kernels and for kernels whose numpy math releases
   the GIL; native Mul+Add branches and the native library's ``onnx_custom::my_add`` (a custom
   op with no Python: ORT's own floor for custom ops in the parallel executor) for reference.
4. ``--per-node``: what the parallel executor costs per node, for ORT's own ops and ours: the 8
   branches at chain depths 2 and 8, sequential and parallel; the marginal cost per node is
   (depth 8 - depth 2) / the extra nodes, the rest a fixed cost per run. Meant with ``--cpu-time``.

Sessions are measured side by side in one process, interleaved round by round; medians.

Run::

    python benchmarks/kernel_overhead.py [--repeats 7] [--quick | --branches-only | --per-node] \
        [--cpu-time]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnx_custom.runtime as rt
from onnx_custom.runtime import KernelRegistry

SHAPES = [(2, 3), (64, 1024), (4, 64, 56, 56)]
CLOCK_NS = (
    time.perf_counter_ns
)  # --cpu-time: time.process_time_ns (all threads' CPU; steadier when shared)
CHAIN = 32
BRANCHES = 8
kernels = KernelRegistry()


@kernels.kernel(
    "bench::my_add",
    inputs=["a", "b"],
    outputs=["y"],
    attrs={"alpha": ("float", 2.0)},
    shape_fn="broadcast",
)
def my_add(a: np.ndarray, b: np.ndarray, *, alpha: float, out: tuple[np.ndarray, ...]) -> None:
    np.multiply(a, np.asarray(alpha, dtype=out[0].dtype), out=out[0])
    np.add(out[0], b, out=out[0])


@kernels.kernel(
    "bench::my_add_ret",
    inputs=["a", "b"],
    outputs=["y"],
    attrs={"alpha": ("float", 2.0)},
    shape_fn="broadcast",
)
def my_add_ret(a: np.ndarray, b: np.ndarray, *, alpha: float) -> np.ndarray:
    return a * np.float32(alpha) + b


def _model(nodes: list, shape: list | None = None, inits: list | None = None) -> bytes:
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("a", "b")],
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
            for o in dict.fromkeys(n.output[0] for n in nodes if n.output[0].startswith("y"))
        ],
        initializer=inits or [],
    )
    m = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 18),
            helper.make_opsetid("bench", 1),
            helper.make_opsetid("onnx_custom", 1),
        ],
        ir_version=10,
    )
    return m.SerializeToString()


def _chain(
    n: int, custom: bool, first: str = "a", tag: str = "", out: str = "y", domain: str = "bench"
) -> list:
    nodes, prev = [], first
    for i in range(n):
        res = out if i == n - 1 else f"t{tag}_{i}"
        if custom:
            nodes.append(helper.make_node("my_add", [prev, "b"], [res], domain=domain, alpha=2.0))
        else:  # each branch scales by its own initializer: identical branches would be merged
            nodes += [
                helper.make_node("Mul", [prev, f"two{tag}"], [f"m{tag}_{i}"]),
                helper.make_node("Add", [f"m{tag}_{i}", "b"], [res]),
            ]
        prev = res
    return nodes


def _two(tags: tuple[str, ...] = ("",)) -> list:
    """The scale initializers of chains tagged ``tags``: distinct values, so that ONNX Runtime's
    common-subexpression elimination cannot merge branches (8 identical Mul+Add branches became
    one chain of 15 nodes, which measured ORT's parallel executor on a graph with nothing to run
    in parallel)."""
    return [
        numpy_helper.from_array(np.array(2.0 + i / 64, np.float32), f"two{tag}")
        for i, tag in enumerate(tags)
    ]


def _options(mode: str = "sequential", inter: int = 1) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1 if mode != "async" else 2
    so.inter_op_num_threads = inter
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


def _session(model: bytes, custom: bool | str, so: ort.SessionOptions) -> ort.InferenceSession:
    if (
        custom == "native"
    ):  # the shipped native library's onnx_custom::my_add: a custom op, no Python
        return rt.InferenceSession(model, so, kernels="native")
    if custom:
        return rt.InferenceSession(model, so, kernels=kernels)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _timer(
    sess: ort.InferenceSession, feeds: dict, asynchronous: bool = False
) -> Callable[[int], float]:
    if not asynchronous:

        def sync(n: int) -> float:
            run = sess.run
            t0 = CLOCK_NS()
            for _ in range(n):
                run(None, feeds)
            return (CLOCK_NS() - t0) / n / 1e3

        return sync

    def via_async(n: int) -> float:  # run_async runs the graph on an intra-op pool thread
        done = threading.Event()
        errors: list[str] = []

        def callback(results: object, user_data: object, err: str) -> None:
            if err:
                errors.append(err)
            done.set()

        t0 = time.perf_counter_ns()
        for _ in range(n):
            done.clear()
            sess.run_async(None, feeds, callback, None)
            done.wait()
        if errors:
            raise RuntimeError(errors[0])
        return (time.perf_counter_ns() - t0) / n / 1e3

    return via_async


def _paired(timers: list[Callable[[int], float]], n: int, repeats: int) -> list[float]:
    """Median per-call microseconds of each timer, measured round by round in rotating order."""
    for t in timers:
        t(max(5, n // 10))  # warm-up
    samples: list[list[float]] = [[] for _ in timers]
    for r in range(repeats):
        order = list(range(len(timers)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            samples[i].append(timers[i](n))
    return [statistics.median(s) for s in samples]


def single_node(repeats: int) -> None:
    two = _two()
    native = _session(
        _model(
            [
                helper.make_node("Mul", ["a", "two"], ["t"]),
                helper.make_node("Add", ["t", "b"], ["y"]),
            ],
            None,
            two,
        ),
        False,
        _options(),
    )
    ours = _session(
        _model([helper.make_node("my_add", ["a", "b"], ["y"], domain="bench", alpha=2.0)]),
        True,
        _options(),
    )
    ret = _session(
        _model([helper.make_node("my_add_ret", ["a", "b"], ["y"], domain="bench", alpha=2.0)]),
        True,
        _options(),
    )
    print("\n1. one node, caller thread, 1 intra-op thread")
    header = (
        f"{'shape':<16} {'native us':>10} {'ours us':>10} {'overhead us':>12} {'ratio':>7}"
        f" {'ours(return) us':>16} {'overhead us':>12}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        feeds = {
            "a": rng.standard_normal(shape).astype(np.float32),
            "b": rng.standard_normal(shape).astype(np.float32),
        }
        want = native.run(None, feeds)[0]
        for s in (ours, ret):
            np.testing.assert_allclose(s.run(None, feeds)[0], want, rtol=1e-6)
        size = int(np.prod(shape))
        n = max(20, min(20000, int(4e7 / max(size, 1) / 20)))
        nat, our, rtn = _paired([_timer(s, feeds) for s in (native, ours, ret)], n, repeats)
        print(
            f"{'x'.join(map(str, shape)):<16} {nat:>10.1f} {our:>10.1f} {our - nat:>12.1f} "
            f"{our / nat:>7.2f} {rtn:>16.1f} {rtn - nat:>12.1f}"
        )


def thread_kinds(repeats: int, n: int) -> None:
    feeds = {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)}
    kinds = [
        ("caller thread (ORT_SEQUENTIAL)", "sequential", 1, False),
        ("inter-op pool thread (ORT_PARALLEL)", "parallel", 2, False),
        ("intra-op pool thread (run_async)", "async", 1, True),
    ]
    print(f"\n2. chain of {CHAIN} custom nodes vs {CHAIN} native Mul+Add pairs, 2x3 float32")
    header = (
        f"{'thread running the kernels':<38} {'native us':>10} {'ours us':>10}"
        f" {'overhead/node us':>17}"
    )
    print(header)
    print("-" * len(header))
    for label, mode, inter, asynchronous in kinds:
        native = _session(
            _model(_chain(CHAIN, False), [2, 3], _two()), False, _options(mode, inter)
        )
        ours = _session(_model(_chain(CHAIN, True), [2, 3]), True, _options(mode, inter))
        np.testing.assert_allclose(ours.run(None, feeds)[0], native.run(None, feeds)[0], rtol=1e-6)
        nat, our = _paired(
            [_timer(native, feeds, asynchronous), _timer(ours, feeds, asynchronous)], n, repeats
        )
        print(f"{label:<38} {nat:>10.1f} {our:>10.1f} {(our - nat) / CHAIN:>17.2f}")


@kernels.kernel("bench::heavy", inputs=["a", "b"], outputs=["y"], shape_fn="like0")
def heavy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.tanh(a) * b  # large numpy ufunc loops run with the GIL released


def branches(repeats: int, n: int) -> None:
    print(
        f"\n3. {BRANCHES} independent branches: ORT_PARALLEL (2 inter-op threads) / ORT_SEQUENTIAL"
    )
    header = f"{'branch nodes':<54} {'sequential us':>14} {'parallel us':>12} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    cases = [
        ("native Mul+Add x4, 2x3", "native", (2, 3), 4, n),
        ("native-library my_add x4, 2x3 (custom op, no Python)", "library", (2, 3), 4, n),
        ("custom my_add x4, 2x3 (overhead-bound)", "custom", (2, 3), 4, n),
        ("custom tanh*b x1, 1x1M (GIL released)", "heavy", (1, 1 << 20), 1, max(5, n // 100)),
    ]
    for label, kind, shape, depth, runs in cases:
        nodes: list = []
        for br in range(BRANCHES):
            if kind == "heavy":
                nodes.append(helper.make_node("heavy", ["a", "b"], [f"y{br}"], domain="bench"))
            else:
                nodes += _chain(
                    depth,
                    kind != "native",
                    tag=str(br),
                    out=f"y{br}",
                    domain="onnx_custom" if kind == "library" else "bench",
                )
        model = _model(
            nodes,
            list(shape),
            None if kind != "native" else _two(tuple(str(br) for br in range(BRANCHES))),
        )
        custom: bool | str = "native" if kind == "library" else kind != "native"
        seq = _session(model, custom, _options("sequential", 1))
        par = _session(model, custom, _options("parallel", 2))
        rng = np.random.default_rng(0)
        feeds = {
            "a": rng.standard_normal(shape).astype(np.float32),
            "b": rng.standard_normal(shape).astype(np.float32),
        }
        for got, want in zip(par.run(None, feeds), seq.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        t_seq, t_par = _paired([_timer(seq, feeds), _timer(par, feeds)], runs, repeats)
        print(f"{label:<54} {t_seq:>14.1f} {t_par:>12.1f} {t_par / t_seq:>7.2f}")


def per_node(repeats: int, n: int) -> None:
    print(
        f"\n4. marginal cost per node, {BRANCHES} branches of depth 2 and 8: ORT_SEQUENTIAL ->"
        " ORT_PARALLEL (2 inter-op threads)"
    )
    header = (
        f"{'branch nodes':<34} {'seq us/node':>12} {'par us/node':>12} {'added':>7}"
        f" {'seq us/run':>11} {'par us/run':>11}"
    )
    print(header)
    print("-" * len(header))
    feeds = {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)}
    tags = tuple(str(br) for br in range(BRANCHES))
    for label, kind in (
        ("ORT Mul+Add", "native"),
        ("native-library my_add", "library"),
        ("Python kernel my_add", "custom"),
    ):
        timers, counts = [], []
        for depth in (2, 8):
            nodes = [
                node
                for br in tags
                for node in _chain(
                    depth,
                    kind != "native",
                    tag=br,
                    out=f"y{br}",
                    domain="onnx_custom" if kind == "library" else "bench",
                )
            ]
            model = _model(nodes, [2, 3], _two(tags) if kind == "native" else None)
            custom: bool | str = "native" if kind == "library" else kind != "native"
            timers += [
                _timer(_session(model, custom, _options("sequential", 1)), feeds),
                _timer(_session(model, custom, _options("parallel", 2)), feeds),
            ]
            counts.append(len(nodes))
        s2, p2, s8, p8 = _paired(timers, n, repeats)
        extra = counts[1] - counts[0]
        seq, par = (s8 - s2) / extra, (p8 - p2) / extra
        print(
            f"{label:<34} {seq:>12.2f} {par:>12.2f} {par - seq:>+7.2f}"
            f" {s2 - counts[0] * seq:>11.1f} {p2 - counts[0] * par:>11.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds per case (median)")
    ap.add_argument("--runs", type=int, default=400, help="session runs per round (sections 2, 3)")
    ap.add_argument("--quick", action="store_true", help="sections 2 and 3 only")
    ap.add_argument("--branches-only", action="store_true", help="section 3 only")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="process CPU time (all threads) instead of wall time",
    )
    ap.add_argument(
        "--per-node",
        action="store_true",
        help="section 4 only: the parallel executor's cost per node",
    )
    args = ap.parse_args()
    global CLOCK_NS
    CLOCK_NS = time.process_time_ns if args.cpu_time else time.perf_counter_ns
    print(
        f"onnxruntime {ort.__version__}, numpy {np.__version__}; median of {args.repeats} "
        f"interleaved rounds; spinning off; {'CPU' if args.cpu_time else 'wall'} time"
    )
    if args.per_node:
        per_node(args.repeats, args.runs)
        return
    if not args.quick and not args.branches_only:
        single_node(args.repeats)
    if not args.branches_only:
        thread_kinds(args.repeats, args.runs)
    branches(args.repeats, args.runs)


if __name__ == "__main__":
    main()
