"""onnx_custom.export vs raw torch.onnx.export on the same model and translations.

The baseline is what a user writes by hand: torch.onnx.export with the same symbolics already
registered (TorchScript) or the same custom_translation_table (dynamo). Both are timed
alternately in one run; the printed ratio is median(ours) / median(raw). Goal: <= 1.05.

``--plain`` adds a third contender for TorchScript: torch.onnx.export with plain torch symbolics
(``g.op`` straight into torch's graph, what a user without onnx-custom registers). Our symbolic
adapter runs in both of the first two (the baseline registers our symbolics); against plain
symbolics the ratio also shows what the adapter costs per custom node (exact output types from
the op's fake kernel, the checks in ``g.op``).

Run::

    python benchmarks/export_overhead.py [--repeats 10] [--cpu-time --threads 1] \
        [--only torchscript]

(``--cpu-time``: process CPU time, steadier than wall time when the machine is shared).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import time
import warnings

import torch

import onnx_custom
import onnx_custom.ops.seed
from onnx_custom.exporter.torchscript import registered


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.layers:
            x = torch.ops.onnx_custom.my_add(torch.asinh(layer(x)), y)
        return torch.ops.onnx_custom.multi_out(x)


CLOCK = time.perf_counter  # --cpu-time: time.process_time (steadier on a loaded machine)


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    gc.collect()  # otherwise whichever runs second pays for the first one's garbage
    start = CLOCK()
    fn()
    return CLOCK() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--cpu-time", action="store_true", help="process CPU time instead of wall time"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--only", choices=("dynamo", "torchscript"), default=None)
    parser.add_argument(
        "--plain",
        action="store_true",
        help="also TorchScript with plain torch symbolics (see above)",
    )
    ns = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if ns.cpu_time else time.perf_counter
    if ns.threads:
        torch.set_num_threads(ns.threads)
    warnings.simplefilter("ignore")
    model = Model().eval()
    args = (torch.randn(8, 64), torch.randn(8, 64))
    table = onnx_custom.translation_table(18)

    def raw_dynamo() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(
                model,
                args,
                dynamo=True,
                opset_version=18,
                custom_translation_table=table,
                verbose=False,
            )

    def ours_dynamo() -> None:
        onnx_custom.export(model, args, exporter="dynamo", opset=18)

    def raw_ts() -> None:
        torch.onnx.export(model, args, io.BytesIO(), dynamo=False, opset_version=13)

    def ours_ts() -> None:
        onnx_custom.export(model, args, exporter="torchscript", opset=13)

    print(f"{'wall' if not ns.cpu_time else 'CPU'} time, medians of {ns.repeats} paired rounds")
    print(f"{'exporter':<12} {'raw torch.onnx.export':>22} {'onnx_custom.api':>20} {'ratio':>7}")
    for name, raw, ours, scope in (
        ("dynamo", raw_dynamo, ours_dynamo, contextlib.nullcontext),
        ("torchscript", raw_ts, ours_ts, registered),
    ):
        if ns.only and name != ns.only:
            continue
        raw_samples: list[float] = []
        our_samples: list[float] = []
        with scope():  # the baseline gets the same symbolics, registered once outside the timing
            raw()
        ours()  # warm-up: caches, lazy imports
        for i in range(ns.repeats):  # alternate which goes first: no order bias
            for which in (0, 1) if i % 2 == 0 else (1, 0):
                if which == 0:
                    with scope():
                        raw_samples.append(_time(raw))
                else:
                    our_samples.append(_time(ours))
        r, o = statistics.median(raw_samples), statistics.median(our_samples)
        print(f"{name:<12} {r * 1e3:>19.1f} ms {o * 1e3:>17.1f} ms {o / r:>7.3f}")
    if ns.plain and ns.only != "dynamo":
        _plain_row(model, args, ns.repeats)


def _plain_row(model: torch.nn.Module, args: tuple[torch.Tensor, ...], repeats: int) -> None:
    """ours / torch with plain symbolics, and per custom-node call what the difference costs."""

    def my_add(g, a, b):  # type: ignore[no-untyped-def]
        return g.op("Add", g.op("Mul", a, g.op("Constant", value_t=torch.tensor(1.0))), b)

    def multi_out(g, x):  # type: ignore[no-untyped-def]
        scaled = g.op("Mul", x, g.op("Constant", value_t=torch.tensor(2.0)))
        return scaled, g.op("Add", x, g.op("Constant", value_t=torch.tensor(1.0)))

    def asinh(g, x):  # type: ignore[no-untyped-def]
        return g.op("Asinh", x)

    plain = {
        "onnx_custom::my_add": my_add,
        "onnx_custom::multi_out": multi_out,
        "aten::asinh": asinh,
    }
    for name, fn in plain.items():
        torch.onnx.register_custom_op_symbolic(name, fn, 13)

    def raw_plain() -> None:
        torch.onnx.export(model, args, io.BytesIO(), dynamo=False, opset_version=13)

    def ours() -> None:
        onnx_custom.export(model, args, exporter="torchscript", opset=13)

    raw_plain()
    ours()
    samples: dict[str, list[float]] = {"plain": [], "ours": []}
    for i in range(repeats):
        for which in ("plain", "ours") if i % 2 == 0 else ("ours", "plain"):
            samples[which].append(_time(raw_plain if which == "plain" else ours))
    p, o = statistics.median(samples["plain"]), statistics.median(samples["ours"])
    calls = 9  # 4 asinh + 4 my_add + 1 multi_out in Model.forward
    print(
        f"{'TS, plain':<12} {p * 1e3:>19.1f} ms {o * 1e3:>17.1f} ms {o / p:>7.3f}  "
        f" (+{(o - p) * 1e3 / calls:.2f} ms per custom-node call)"
    )


if __name__ == "__main__":
    main()
