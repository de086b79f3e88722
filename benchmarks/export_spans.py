"""Where `onnx_custom.export`'s own time goes: CPU time per step of one TorchScript export.

Each step of the export pipeline (argument checks, input resolution, the symbolic registration,
torch's export itself, the parse and every post-pass) is wrapped with a thread-time span; raw
``torch.onnx.export`` on the same model (symbolics registered outside the timing, as in
`export_overhead.py`) alternates with ours. Prints each span's median, the sum of our own spans
and torch's export inside ours minus the raw one (what our context managers and symbolics add
inside torch). CPU time at 1 thread: steady on a shared machine.

Run: ``python benchmarks/export_spans.py [--repeats 21]``
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import io
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import onnx
import torch
from export_overhead import Model

import onnx_custom
import onnx_custom.ops.seed  # registers the ops the model calls
from onnx_custom.exporter.torchscript import registered

CLOCK = time.thread_time
_PIPELINE = "onnx_custom.exporter.pipeline"
SPANS = [
    ("onnx_custom.api", "check_export_request"),
    ("onnx_custom.api", "_check_nodes_against_kernels"),
    (_PIPELINE, "resolve_registry"),
    (_PIPELINE, "resolve_dynamic_shapes"),
    (_PIPELINE, "quiet_torch"),
    (_PIPELINE, "deferring_half_precision"),
    (_PIPELINE, "_tensor_bytes"),
    (_PIPELINE, "export_dims"),
    (_PIPELINE, "registered"),
    (_PIPELINE, "model_census"),
    (_PIPELINE, "name_derived_dims"),
    (_PIPELINE, "default_output_names"),
    (_PIPELINE, "rename_outputs"),
    (_PIPELINE, "write_metadata"),
    (_PIPELINE, "finalize_model"),
    (_PIPELINE, "widen_model"),
]
spent: dict[str, float] = collections.defaultdict(float)


class _TimedContext:
    """A context manager whose enter and exit are timed as ``<name>.enter`` / ``<name>.exit``."""

    def __init__(self, name: str, inner: Any) -> None:
        self.name, self.inner = name, inner

    def __enter__(self) -> Any:
        start = CLOCK()
        try:
            return self.inner.__enter__()
        finally:
            spent[f"{self.name}.enter"] += CLOCK() - start

    def __exit__(self, *exc: Any) -> Any:
        start = CLOCK()
        try:
            return self.inner.__exit__(*exc)
        finally:
            spent[f"{self.name}.exit"] += CLOCK() - start


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = CLOCK()
        result = fn(*args, **kwargs)
        spent[name] += CLOCK() - start
        if hasattr(result, "__enter__") and hasattr(result, "__exit__"):
            return _TimedContext(name, result)
        return result

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument(
        "--gc-off",
        action="store_true",
        help=(
            "no garbage collection inside a round: a collection lands in whichever span crosses "
            "the allocation threshold, the same span every round"
        ),
    )
    ns = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for module_name, attr in SPANS:
        module = importlib.import_module(module_name)
        if hasattr(module, attr):  # a step another version of the pipeline lacks is skipped
            setattr(module, attr, _timed(attr, getattr(module, attr)))
    onnx.load_from_string = _timed("parse", onnx.load_from_string)
    raw_export = torch.onnx.export
    torch.onnx.export = _timed("torch.onnx.export", raw_export)  # only ours goes through it

    model = Model().eval()
    args = (torch.randn(8, 64), torch.randn(8, 64))

    def raw() -> None:
        raw_export(model, args, io.BytesIO(), dynamo=False, opset_version=13)

    def ours() -> None:
        onnx_custom.export(model, args, exporter="torchscript", opset=13)

    with registered():
        raw()
    ours()
    raw_times: list[float] = []
    our_times: list[float] = []
    per_span: dict[str, list[float]] = collections.defaultdict(list)
    for i in range(ns.repeats):
        for which in ("raw", "ours") if i % 2 == 0 else ("ours", "raw"):
            gc.collect()
            if ns.gc_off:
                gc.disable()
            if which == "raw":
                with registered():
                    start = CLOCK()
                    raw()
                    raw_times.append(CLOCK() - start)
                continue
            spent.clear()
            start = CLOCK()
            ours()
            our_times.append(CLOCK() - start)
            for name, seconds in spent.items():
                per_span[name].append(seconds)
        gc.enable()
    r, o = statistics.median(raw_times), statistics.median(our_times)
    print(f"CPU time (thread_time, 1 thread), medians of {ns.repeats} alternating rounds")
    print(
        f"raw torch.onnx.export {r * 1e3:.2f} ms, onnx_custom.export {o * 1e3:.2f} ms: ratio"
        f" {o / r:.3f} (+{(o - r) * 1e6:.0f} us)"
    )
    medians = {name: statistics.median(values) for name, values in per_span.items()}
    inner = medians.pop("torch.onnx.export", 0.0)
    for name, seconds in sorted(medians.items(), key=lambda item: -item[1]):
        print(f"  {name:<36} {seconds * 1e6:8.1f} us")
    print(f"  {'sum of our spans':<36} {sum(medians.values()) * 1e6:8.1f} us")
    print(f"  {'torch.onnx.export inside ours - raw':<36} {(inner - r) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
