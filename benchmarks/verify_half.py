"""What the float32 reference of half-precision outputs adds to ``verify``.

Rows: ``verify(model, args, file, shapes=())`` of shipped models at float16/bfloat16 with the
reference (the model once more in float32, plus `PERTURBATIONS` nudged runs) against the same
call with it switched off (the one-ulp-of-max|expected| bound it replaced). Paired: both run back
to back in one process, alternating which goes first, CPU time (``time.process_time``: ORT's
threads included) with torch at one thread (``harness.paired_rounds``); medians over the rounds
and of the pair ratios.

Run: ``python benchmarks/verify_half.py [--rounds 9] [--models custom_linear deform_conv msda]``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import onnx_custom
from onnx_custom.verification.half_reference import HalfReference
from onnx_custom.verification.verifier import verify

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its path (a smoke test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import paired_rounds

__all__ = ["main"]


def _case(name: str, dtype: torch.dtype) -> tuple[Any, tuple[Any, ...], Any]:
    module = importlib.import_module(f"onnx_custom.models.{name}")
    model = module.Model().eval().to(dtype)
    args = tuple(
        a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in module.example_inputs()
    )
    return model, args, onnx_custom.export(model, args, exporter="dynamo")


def _paired(
    model: Any, args: tuple[Any, ...], proto: Any, rounds: int
) -> tuple[float, float, float]:
    real = HalfReference.for_trial

    def without() -> object:
        HalfReference.for_trial = lambda *a, **k: None  # type: ignore[method-assign]
        try:
            return verify(model, args, proto, shapes=(), raise_on_mismatch=False)
        finally:
            HalfReference.for_trial = real  # type: ignore[method-assign]

    def with_reference() -> object:
        return verify(model, args, proto, shapes=(), raise_on_mismatch=False)

    with_reference(), without()  # warm: lazy inits, kernels, sessions' first runs
    return paired_rounds(with_reference, without, rounds, 1, clock=time.process_time)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--models", nargs="+", default=["custom_linear", "deform_conv", "msda"])
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"{'model':<16} {'dtype':<9} {'with ref ms':>12} {'without ms':>11} {'ratio':>7}")
    for name in options.models:
        for dtype in (torch.float16, torch.bfloat16):
            model, args, proto = _case(name, dtype)
            mine, base, ratio = _paired(model, args, proto, options.rounds)
            print(
                f"{name:<16} {str(dtype).removeprefix('torch.'):<9} {mine:>12.1f} {base:>11.1f}"
                f" {ratio:>7.2f}"
            )


if __name__ == "__main__":
    main()
