"""What the commands share: exit codes, stderr lines, loading the model and its inputs, the
registry with --variant, path checks before long runs, verify with the CLI's warnings, and the
one-time build announcement. Only the standard library at import (``--help`` stays fast)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["CLI_METADATA_KEY", "EXIT_ERROR", "EXIT_FAILED", "EXIT_INTERRUPTED", "announce_if_slow", "check_output", "cli_metadata", "import_all", "load_model_and_args", "registry_with_variants", "require_file", "shape_trials", "stderr", "verify_model"]

EXIT_FAILED = 1  # verification or check found a problem

EXIT_ERROR = 2  # the command could not run (bad input, missing file, ...)

EXIT_INTERRUPTED = 130

CLI_METADATA_KEY = "onnx_custom.cli"  # how `export` made the file: model spec, seed, exporter, variants

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
        raise CliInputError(f"unknown --variant {', '.join(map(repr, unknown))}; expected one of: {', '.join(known)}; fix: pick one of those ('onnx-custom ops' lists which op has which), or --import the module defining yours.")
    return registry.with_variants(*variants) if variants else registry


def load_model_and_args(ns: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from onnx_custom.cli.loading import example_args, load_model_spec

    import_all(ns.imports)
    loaded = load_model_spec(ns.model, ns.seed)
    return loaded, example_args(loaded, ns.input, ns.seed)


def require_file(path: str, what: str) -> None:
    from onnx_custom.cli.loading import CliInputError

    if not os.path.exists(path):
        raise CliInputError(f"{what} {path!r} does not exist (working directory {os.getcwd()}); expected an existing file; fix: check the path.")
    if os.path.isdir(path):
        raise CliInputError(f"{what} {path!r} is a directory; expected a file; fix: name the file inside it.")


def check_output(path: str) -> None:
    """Fail before a long export when the output cannot be written."""
    from onnx_custom.cli.loading import CliInputError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliInputError(f"Output {path!r} is a directory; expected a file path; fix: name a file, e.g. -o {os.path.join(path, 'model.onnx')}.")
    if not os.path.isdir(folder):
        raise CliInputError(f"Output folder {folder!r} does not exist; expected an existing folder; fix: create it (mkdir -p {folder}) or choose another -o.")
    if not os.access(folder, os.W_OK):
        raise CliInputError(f"Output folder {folder!r} is not writable; fix: choose another -o or change its permissions.")


def shape_trials(ns: argparse.Namespace) -> tuple[dict[str, Any], ...] | None:
    from onnx_custom.cli.loading import CliInputError

    if ns.no_shape_trials and ns.shape:
        raise CliInputError("--shape and --no-shape-trials contradict each other; expected one of them; fix: drop one.")
    if (ns.rtol is None) != (ns.atol is None):
        raise CliInputError(f"got {'--rtol' if ns.atol is None else '--atol'} alone; expected both --rtol and --atol, or neither (per-dtype defaults); fix: pass both.")
    return () if ns.no_shape_trials else (tuple(ns.shape) or None)


def verify_model(ns: argparse.Namespace, model: Any, args: tuple[Any, ...], proto: Any, **options: Any) -> Any:
    """Run verify; the initializer warning becomes one stderr line with the likely cause."""
    import onnx_custom
    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.verification.initializers import InitializerMismatchWarning
    from onnx_custom.verification.trial_shapes import ShapeSpecError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InitializerMismatchWarning)
        try:
            report = onnx_custom.verify(
                model, args, proto, trials=ns.trials, rtol=ns.rtol, atol=ns.atol, seed=ns.seed,
                shapes=shape_trials(ns), raise_on_mismatch=False, **options,
            )  # fmt: skip
        except ShapeSpecError as exc:  # shapes[i] is the (i+1)-th --shape
            raise CliInputError(f"--shape: {' '.join(str(exc).split())}; fix: use a dim or input name listed there.") from exc
    for w in caught:
        if not issubclass(w.category, InitializerMismatchWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if report.initializer_mismatches:
        made = cli_metadata(proto)
        names = ", ".join(m.parameter for m in report.initializer_mismatches[:5])
        more = "" if len(report.initializer_mismatches) <= 5 else f" and {len(report.initializer_mismatches) - 5} more"
        cause = (f"the file was exported with --seed {made['seed']}, this run used --seed {ns.seed}" if made.get("seed") not in (None, ns.seed)
                 else "was the file exported from this model, built the same way (same --seed)?")  # fmt: skip
        stderr(f"onnx-custom: warning: the file's weights differ from the model's ({names}{more}); {cause}")
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


@contextlib.contextmanager
def announce_if_slow(what: str, usual: str, *, after: float = 1.0) -> Iterator[None]:
    """A cache hit answers at once; past ``after`` seconds it is a one-time build: say so on
    stderr (and how long it took), instead of sitting silent for half a minute."""
    start = time.perf_counter()
    fired = threading.Event()

    def announce() -> None:
        fired.set()
        stderr(f"onnx-custom: building {what} (one time, usually {usual}; cached afterwards) ...")

    timer = threading.Timer(after, announce)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
    if fired.is_set():
        stderr(f"onnx-custom: built {what} in {time.perf_counter() - start:.0f} s")
