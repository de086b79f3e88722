"""What the commands share: exit codes, stderr lines, loading the model and its inputs, the
registry with --variant, path checks before long runs, verify with the CLI's warnings. Only the
standard library at import (``--help`` stays fast); first-time native builds announce themselves
(`onnx_custom.common.native_build.announce_build`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CLI_METADATA_KEY",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "check_output",
    "cli_metadata",
    "import_all",
    "load_model_and_args",
    "registry_with_variants",
    "require_file",
    "shape_trials",
    "stderr",
    "verify_model",
]

EXIT_FAILED = 1  # verification or check found a problem

EXIT_ERROR = 2  # the command could not run (bad input, missing file, ...)

EXIT_INTERRUPTED = 130

CLI_METADATA_KEY = (  # how `export` made the file: model spec, seed, exporter, variants
    "onnx_custom.cli"
)


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def import_all(targets: Sequence[str]) -> None:
    from onnx_custom.cli.loading import load_user_import

    for target in targets:
        load_user_import(target)


def registry_with_variants(variants: Sequence[str]) -> Any:
    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.translate.registry import default_registry

    registry = default_registry()
    known = sorted({entry.variant for entry in registry})
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise CliInputError(
            f"unknown --variant {', '.join(map(repr, unknown))}; expected one of:"
            f" {', '.join(known)}; fix: pick one of those ('onnx-custom ops' lists which op has"
            " which), or --import the module defining yours."
        )
    return registry.with_variants(*variants) if variants else registry


def load_model_and_args(ns: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from onnx_custom.cli.loading import example_args, load_model_spec

    import_all(ns.imports)
    loaded = load_model_spec(ns.model, ns.seed)
    args = example_args(loaded, ns.input, ns.seed)
    _forward_once(loaded, args, ns)
    return loaded, args


def _forward_once(loaded: Any, args: tuple[Any, ...], ns: argparse.Namespace) -> None:
    """Run the model once on the example inputs: inputs that do not fit its forward (a wrong rank,
    a wrong channel count) fail here with one line naming the inputs, instead of deep inside an
    exporter as an "unexpected RuntimeError"."""
    import torch

    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.errors import OnnxCustomError

    try:
        with torch.no_grad():
            loaded.model(*args)
    except OnnxCustomError:
        raise  # already says what was wrong and the fix
    except Exception as exc:
        shapes = ", ".join(
            (
                f"{list(a.shape)}:{str(a.dtype).removeprefix('torch.')}"
                if isinstance(a, torch.Tensor)
                else type(a).__name__
            )
            for a in args
        )
        given = "the --input values" if ns.input else "its example inputs"
        raise CliInputError(
            f"{ns.model}: forward failed on {given} ({shapes}): {type(exc).__name__}:"
            f" {' '.join(str(exc).split())}; expected inputs its forward accepts; fix: pass --input"
            " DIMS[:DTYPE] once per forward argument, in order, with the shapes the model expects."
        ) from exc


def require_file(path: str, what: str) -> None:
    from onnx_custom.cli.loading import CliInputError

    if not os.path.exists(path):
        raise CliInputError(
            f"{what} {path!r} does not exist (working directory {os.getcwd()}); expected an"
            " existing file; fix: check the path."
        )
    if os.path.isdir(path):
        raise CliInputError(
            f"{what} {path!r} is a directory; expected a file; fix: name the file inside it."
        )


def check_output(path: str) -> None:
    """Fail before a long export when the output cannot be written."""
    from onnx_custom.cli.loading import CliInputError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliInputError(
            f"Output {path!r} is a directory; expected a file path; fix: name a file, e.g. -o"
            f" {os.path.join(path, 'model.onnx')}."
        )
    if not os.path.isdir(folder):
        raise CliInputError(
            f"Output folder {folder!r} does not exist; expected an existing folder; fix: create it"
            f" (mkdir -p {folder}) or choose another -o."
        )
    if not os.access(folder, os.W_OK):
        raise CliInputError(
            f"Output folder {folder!r} is not writable; fix: choose another -o or change its"
            " permissions."
        )


def shape_trials(ns: argparse.Namespace) -> tuple[dict[str, Any], ...] | None:
    from onnx_custom.cli.loading import CliInputError

    if ns.no_shape_trials and ns.shape:
        raise CliInputError(
            "--shape and --no-shape-trials contradict each other; expected one of them; fix: drop"
            " one."
        )
    if (ns.rtol is None) != (ns.atol is None):
        raise CliInputError(
            f"got {'--rtol' if ns.atol is None else '--atol'} alone; expected both --rtol and"
            " --atol, or neither (per-dtype defaults); fix: pass both."
        )
    return () if ns.no_shape_trials else (tuple(ns.shape) or None)


def verify_model(
    ns: argparse.Namespace, model: Any, args: tuple[Any, ...], proto: Any, **options: Any
) -> Any:
    """Run verify; the initializer warning becomes one stderr line with the likely cause."""
    import onnx_custom
    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.verification.initializers import InitializerMismatchWarning
    from onnx_custom.verification.trial_shapes import ShapeSpecError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InitializerMismatchWarning)
        try:
            report = onnx_custom.verify(
                model,
                args,
                proto,
                trials=ns.trials,
                rtol=ns.rtol,
                atol=ns.atol,
                seed=ns.seed,
                shapes=shape_trials(ns),
                raise_on_mismatch=False,
                **options,
            )
        except ShapeSpecError as exc:  # shapes[i] is the (i+1)-th --shape
            raise CliInputError(
                f"--shape: {' '.join(str(exc).split())}; fix: use a dim or input name listed there."
            ) from exc
    for w in caught:
        if not issubclass(w.category, InitializerMismatchWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if report.initializer_mismatches:
        made = cli_metadata(proto)
        names = ", ".join(m.parameter for m in report.initializer_mismatches[:5])
        more = (
            ""
            if len(report.initializer_mismatches) <= 5
            else f" and {len(report.initializer_mismatches) - 5} more"
        )
        cause = (
            f"the file was exported with --seed {made['seed']}, this run used --seed {ns.seed}"
            if made.get("seed") not in (None, ns.seed)
            else "was the file exported from this model, built the same way (same --seed)?"
        )
        stderr(
            f"onnx-custom: warning: the file's weights differ from the model's ({names}{more});"
            f" {cause}"
        )
    return report


def cli_metadata(proto: Any) -> dict[str, Any]:
    for prop in proto.metadata_props:
        if prop.key == CLI_METADATA_KEY:
            try:
                value = json.loads(prop.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}
