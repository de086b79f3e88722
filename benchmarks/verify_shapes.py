"""What the default shape trials add to ``verify``: zoo rows with dynamic dims, verified with
``shapes=()`` (export shape only, the old behaviour) and by default, side by side.

Run: ``python benchmarks/verify_shapes.py [--repeat 5]``. Each row is exported once; the two
verify calls alternate (order flipped every repeat) and the medians are compared. Both use the
zoo's ``trials=2``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
import warnings
from typing import Any

import onnx_custom
from onnx_custom.verification.verifier import DEFAULT_SHAPE_TRIALS, verify
from onnx_custom.zoo import discover

__all__ = ["main", "time_row"]


def time_row(module: Any, case: Any, repeat: int) -> tuple[float, float, int]:
    """Median seconds of verify with ``shapes=()`` and by default,
    and the shapes tried by default."""
    model, args = module.Model().eval(), module.example_inputs()
    registry = onnx_custom.default_registry()
    if case.variant:
        registry = registry.with_variants(case.variant)
    proto = onnx_custom.export(
        model,
        args,
        exporter=case.exporter,
        opset=case.opset,
        registry=registry,
        dynamic_shapes=module.dynamic_shapes,
    )
    times: dict[str, list[float]] = {"export shape only": [], "default": []}
    tried = 0
    for i in range(repeat):
        order = ("export shape only", "default") if i % 2 == 0 else ("default", "export shape only")
        for mode in order:
            start = time.perf_counter()
            report = verify(
                model,
                args,
                proto,
                trials=case.trials,
                raise_on_mismatch=False,
                **({"shapes": ()} if mode == "export shape only" else {}),
            )
            times[mode].append(time.perf_counter() - start)
            if mode == "default":
                tried = sum(r.kind == "shape" for r in report.shapes_tried)
    return statistics.median(times["export shape only"]), statistics.median(times["default"]), tried


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    ns = parser.parse_args()
    warnings.simplefilter("ignore")
    print(
        f"default shape trials: up to {DEFAULT_SHAPE_TRIALS}; medians of {ns.repeat} alternating"
        " runs"
    )
    print(f"{'row':<44} {'export shape':>12} {'default':>10} {'ratio':>7} {'+ms':>8} shapes")
    for short, name in discover().items():
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        for case in getattr(module, "ZOO", ()):
            if not case.dynamic or case.skip:  # skip rows say why they cannot be dynamic
                continue
            base, default, tried = time_row(module, case, ns.repeat)
            label = f"{short} {case.label}"
            print(
                f"{label:<44} {base * 1e3:>10.1f}ms {default * 1e3:>8.1f}ms {default / base:>6.2f}x"
                f" {(default - base) * 1e3:>8.1f} {tried}"
            )


if __name__ == "__main__":
    main()
