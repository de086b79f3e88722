"""The ``onnx-custom`` command line: export, verify, check, inspect, ops, zoo, build-library.

Exit codes: 0 success, 1 verification or check failed, 2 error (one line on stderr; ``--debug``
prints the traceback), 130 interrupted. Nothing heavy is imported until a command runs, so
``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from onnx_custom import __version__
from onnx_custom.cli.loading import DEFAULT_SEED

__all__ = ["DEFAULT_OPSET", "EXIT_ERROR", "EXIT_FAILED", "build_parser", "main"]

EXIT_FAILED = 1  # verification or check found a problem
EXIT_ERROR = 2  # the command could not run (bad input, missing file, ...)
EXIT_INTERRUPTED = 130
DEFAULT_OPSET = 18  # onnx_custom.exporter.pipeline.DEFAULT_OPSET, without importing torch for --help (a test keeps them equal)
CLI_METADATA_KEY = "onnx_custom.cli"  # how `export` made the file: model spec, seed, exporter, variants

_DESCRIPTION = """\
Export PyTorch models whose custom ops ONNX export does not handle, run them in ONNX Runtime
with our kernels, and verify PyTorch against ONNX Runtime.

MODEL is a file and class (models/asinh.py:Model), a module and class
(onnx_custom.models.asinh:Model) or a zoo name (asinh). Models are built with torch's RNG seeded
(--seed, default 0), so random weights are the same in every process."""

_EPILOG = """\
examples:
  onnx-custom export asinh -o asinh.onnx --dynamic --verify
  onnx-custom verify asinh asinh.onnx --shape batch=5
  onnx-custom inspect model.onnx --import my_kernels.py
  onnx-custom zoo --report zoo.md

exit codes: 0 ok, 1 verification/check failed, 2 error (add --debug for the traceback)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Raw description/epilog, and every option's default (when it has a meaningful one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        meaningless = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if "%(default)" in text or meaningless or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other error of the command line (argparse prints the usage too).
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}; fix: see '{self.prog} --help'\n")


# ---------------------------------------------------------------------------- argument types


def _bounded_int(text: str, low: int, high: int | None, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < low or (high is not None and value >= high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _bounded_int(text, 1, None, "a positive integer")


def _seed(text: str) -> int:
    return _bounded_int(text, 0, 2**63, "an integer seed in [0, 2**63)")


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number such as 1e-5, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite non-negative number such as 1e-5, got {text!r}")
    return value


def _shape_case(text: str) -> dict[str, Any]:
    """``batch=5`` / ``batch=5,height=16`` / ``x=5x3x4``: one shape trial."""
    case: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        name, size = name.strip(), size.strip()
        if not sep or not name or not size:
            raise argparse.ArgumentTypeError(f"expected NAME=SIZE (a dim name) or INPUT=DxDxD (an input's shape), comma-separated, got {text!r}; e.g. --shape batch=5")
        try:
            dims = tuple(int(d) for d in size.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"size {size!r} of {name!r} in {text!r}: expected an integer or a DxDxD shape, e.g. --shape batch=5 or --shape x=5x3x4") from None
        if any(d < 0 for d in dims):
            raise argparse.ArgumentTypeError(f"negative size in {text!r}; expected sizes >= 0")
        if name in case:
            raise argparse.ArgumentTypeError(f"{name!r} appears twice in {text!r}; give one case per --shape")
        case[name] = dims[0] if len(dims) == 1 and "x" not in size else dims
    return case


def _report_path(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in (".md", ".json"):
        raise argparse.ArgumentTypeError(f"expected a path ending in .md (Markdown) or .json, got {text!r}")
    folder = existing = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(existing):  # missing folders are created when the report is written
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing!r} is a file, not a folder; expected a path inside a folder such as report.md")
    if existing == folder:
        from onnx_custom.common.atomic import check_output_path
        from onnx_custom.errors import OnnxCustomError

        try:  # before the run, not after minutes of it
            check_output_path(text, what="--report", example="report.md")
        except OnnxCustomError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# ---------------------------------------------------------------------------- arguments


def _add_common(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: a sub-command's --debug must not reset one given before the sub-command.
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="on error, print the full traceback")


def _add_imports(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import a module (pkg.mod), a .py file or a .yaml op-spec file first, to register your translations and kernels (repeatable)",
    )  # fmt: skip


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="file.py:Class, package.module:Class or a zoo name (see: onnx-custom zoo --list)")
    p.add_argument("--input", action="append", metavar="DIMS[:DTYPE]", help="example input, e.g. 2x3:float32 or scalar:int64 (repeat per forward argument); default: the module's example_inputs()")
    p.add_argument("--seed", type=_seed, default=DEFAULT_SEED, help="seed of torch's RNG while the model and its inputs are built (use the same value for export and verify)")


def _add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="torch exporter")
    p.add_argument("--opset", type=_positive_int, default=DEFAULT_OPSET, help="ONNX opset of the default domain")
    p.add_argument("--variant", action="append", default=[], help="prefer this translation variant, e.g. custom (one custom node) or gemm; repeatable; 'onnx-custom ops' lists them")


def _add_verify_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("verification")
    g.add_argument("--trials", type=_positive_int, default=1, help="trials at the export shape (the example inputs, then random values)")
    g.add_argument("--shape", action="append", type=_shape_case, default=[], metavar="NAME=SIZE", help="also verify at these sizes: a dim name (batch=5), several (batch=5,height=16) or an input's shape (x=5x3x4); one trial per --shape, replacing the default size trials")
    g.add_argument("--no-shape-trials", action="store_true", help="verify at the export shape only (by default dynamic dims are tried at 3 other sizes)")
    g.add_argument("--rtol", type=_tolerance, help="relative tolerance (with --atol; default: torch.testing's per-dtype values)")
    g.add_argument("--atol", type=_tolerance, help="absolute tolerance (with --rtol)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onnx-custom", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"onnx-custom {__version__}")
    parser.add_argument("--debug", action="store_true", default=False, help="on error, print the full traceback")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".", formatter_class=_HelpFormatter)
        _add_common(p)
        return p

    p = command("export", "export a model to ONNX with our translations")
    _add_model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.onnx", help="where to write the file (written only when complete)")
    _add_export_args(p)
    p.add_argument("--dynamic", action="store_true", help="export with the module's dynamic_shapes (e.g. a dynamic batch)")
    p.add_argument("--verify", action="store_true", help="verify before writing; on a mismatch nothing is written and the exit code is 1")
    _add_verify_args(p)
    _add_imports(p)
    p.set_defaults(func=cmd_export)

    p = command("verify", "compare PyTorch eager with ONNX Runtime on an exported file")
    _add_model_args(p)
    p.add_argument("onnx", metavar="FILE.onnx", help="the ONNX file")
    _add_verify_args(p)
    p.add_argument("--report", type=_report_path, metavar="PATH", help="also write a report: PATH.md (Markdown) or PATH.json")
    g = p.add_argument_group("diagnostics")
    g.add_argument("--localize", action="store_true", help="on a mismatch, find the first diverging node (torch op, ONNX nodes, translation)")
    g.add_argument("--backend", action="append", choices=("onnxruntime", "reference"), help="run with this backend (repeatable; default: onnxruntime)")
    g.add_argument("--exporter", choices=("dynamo", "torchscript"), default=None, help="exporter that made the file, for --localize (default: recorded by export, else inferred)")
    g.add_argument("--opset", type=_positive_int, default=None, help="opset of the translations, for --localize (default: the file's)")
    g.add_argument("--variant", action="append", default=[], help="translation variant the file was exported with, for --localize (default: recorded by export)")
    _add_imports(p)
    p.set_defaults(func=cmd_verify)

    p = command("check", "pre-flight: ops without translations and custom nodes without kernels (writes nothing)")
    _add_model_args(p)
    _add_export_args(p)
    _add_imports(p)
    p.set_defaults(func=cmd_check)

    p = command("inspect", "summarize an ONNX file: domains, custom nodes and what can run them")
    p.add_argument("onnx", metavar="FILE.onnx", help="the ONNX file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_imports(p)
    p.set_defaults(func=cmd_inspect)

    p = command("ops", "list the translations: targets, opsets, variants, custom nodes and their kernels")
    _add_imports(p)
    p.set_defaults(func=cmd_ops)

    p = command("build-library", "build libonnx_custom_ops.so (or, with --spec, a library of your C++ kernels) for plain ONNX Runtime, and print its path")
    p.add_argument("-o", "--output", metavar="DIR", help="copy the library into DIR (default: leave it in the build cache)")
    p.add_argument("--spec", action="append", metavar="YAML", help="op spec file (or folder) whose ops name their C++ kernel (native: {source, function}); repeatable")
    p.add_argument("--name", metavar="NAME", help="with --spec: library name, lib<NAME>_ops.so (default: the first op's namespace)")
    p.add_argument("--with-shipped", action="store_true", help="with --spec: also hold every shipped native kernel")
    p.add_argument("--cmake", metavar="DIR", help="with --spec: also write a standalone CMake project of the library into DIR")
    p.set_defaults(func=cmd_build_library)

    p = command("package", "write a model, the native library its custom nodes need and a README with load snippets")
    p.add_argument("onnx", metavar="FILE.onnx", help="the ONNX file (e.g. written by onnx-custom export)")
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="folder to write into")
    p.add_argument("--spec", action="append", metavar="YAML", help="op specs with C++ kernels (native: {source, function}) for the model's own ops; repeatable")
    p.add_argument("--name", metavar="NAME", help="with --spec: library name, lib<NAME>_ops.so")
    p.set_defaults(func=cmd_package)

    p = command("zoo", "export and verify every example model with both exporters")
    p.add_argument("models", nargs="*", metavar="NAME", help="only these zoo models (default: all)")
    p.add_argument("--list", action="store_true", help="list the zoo models and their rows, run nothing")
    p.add_argument("--report", type=_report_path, metavar="PATH", help="also write a report: PATH.md (Markdown) or PATH.json")
    p.add_argument("--seed", type=_seed, default=DEFAULT_SEED, help="seed of torch's RNG while each model is built")
    p.set_defaults(func=cmd_zoo)
    return parser


# ---------------------------------------------------------------------------- commands


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _import_all(targets: Sequence[str]) -> None:
    from onnx_custom.cli.loading import load_user_import

    for target in targets:
        load_user_import(target)


def _registry(variants: Sequence[str]) -> Any:
    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.translate.registry import default_registry

    registry = default_registry()
    known = sorted({entry.variant for entry in registry})
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise CliInputError(f"unknown --variant {', '.join(map(repr, unknown))}; expected one of: {', '.join(known)}; fix: pick one of those ('onnx-custom ops' lists which op has which), or --import the module defining yours.")
    return registry.with_variants(*variants) if variants else registry


def _load(ns: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from onnx_custom.cli.loading import example_args, load_model_spec

    _import_all(ns.imports)
    loaded = load_model_spec(ns.model, ns.seed)
    return loaded, example_args(loaded, ns.input, ns.seed)


def _require_file(path: str, what: str) -> None:
    from onnx_custom.cli.loading import CliInputError

    if not os.path.exists(path):
        raise CliInputError(f"{what} {path!r} does not exist (working directory {os.getcwd()}); expected an existing file; fix: check the path.")
    if os.path.isdir(path):
        raise CliInputError(f"{what} {path!r} is a directory; expected a file; fix: name the file inside it.")


def _check_output(path: str) -> None:
    """Fail before a long export when the output cannot be written."""
    from onnx_custom.cli.loading import CliInputError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliInputError(f"Output {path!r} is a directory; expected a file path; fix: name a file, e.g. -o {os.path.join(path, 'model.onnx')}.")
    if not os.path.isdir(folder):
        raise CliInputError(f"Output folder {folder!r} does not exist; expected an existing folder; fix: create it (mkdir -p {folder}) or choose another -o.")
    if not os.access(folder, os.W_OK):
        raise CliInputError(f"Output folder {folder!r} is not writable; fix: choose another -o or change its permissions.")


def _shape_trials(ns: argparse.Namespace) -> tuple[dict[str, Any], ...] | None:
    from onnx_custom.cli.loading import CliInputError

    if ns.no_shape_trials and ns.shape:
        raise CliInputError("--shape and --no-shape-trials contradict each other; expected one of them; fix: drop one.")
    if (ns.rtol is None) != (ns.atol is None):
        raise CliInputError(f"got {'--rtol' if ns.atol is None else '--atol'} alone; expected both --rtol and --atol, or neither (per-dtype defaults); fix: pass both.")
    return () if ns.no_shape_trials else (tuple(ns.shape) or None)


def _verify(ns: argparse.Namespace, model: Any, args: tuple[Any, ...], proto: Any, **options: Any) -> Any:
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
                shapes=_shape_trials(ns), raise_on_mismatch=False, **options,
            )  # fmt: skip
        except ShapeSpecError as exc:  # shapes[i] is the (i+1)-th --shape
            raise CliInputError(f"--shape: {' '.join(str(exc).split())}; fix: use a dim or input name listed there.") from exc
    for w in caught:
        if not issubclass(w.category, InitializerMismatchWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if report.initializer_mismatches:
        made = _cli_metadata(proto)
        names = ", ".join(m.parameter for m in report.initializer_mismatches[:5])
        more = "" if len(report.initializer_mismatches) <= 5 else f" and {len(report.initializer_mismatches) - 5} more"
        cause = (f"the file was exported with --seed {made['seed']}, this run used --seed {ns.seed}" if made.get("seed") not in (None, ns.seed)
                 else "was the file exported from this model, built the same way (same --seed)?")  # fmt: skip
        _stderr(f"onnx-custom: warning: the file's weights differ from the model's ({names}{more}); {cause}")
    return report


def _cli_metadata(proto: Any) -> dict[str, Any]:
    for prop in proto.metadata_props:
        if prop.key == CLI_METADATA_KEY:
            try:
                value = json.loads(prop.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def cmd_export(ns: argparse.Namespace) -> int:
    import onnx_custom
    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.exporter.pipeline import save_model
    from onnx_custom.verification.report import summary_text

    _check_output(ns.output)
    _shape_trials(ns)  # contradicting flags fail before the export, not after
    loaded, args = _load(ns)
    dynamic = getattr(loaded.module, "dynamic_shapes", None) if ns.dynamic else None
    if ns.dynamic and dynamic is None:
        raise CliInputError(f"--dynamic: {ns.model!r} declares no dynamic_shapes; expected a module-level `dynamic_shapes` (e.g. ({{0: 'batch'}},)) in {loaded.module.__name__}; fix: define it or drop --dynamic.")
    registry = _registry(ns.variant)
    proto = onnx_custom.export(loaded.model, args, exporter=ns.exporter, opset=ns.opset, dynamic_shapes=dynamic, registry=registry)
    made = {"model": ns.model, "seed": ns.seed, "exporter": ns.exporter, "variants": list(ns.variant)}
    proto.metadata_props.add(key=CLI_METADATA_KEY, value=json.dumps(made))
    if ns.verify:
        report = _verify(ns, loaded.model, args, proto, input_generator=getattr(loaded.module, "input_generator", None), dynamic_shapes=dynamic, registry=registry, exporter=ns.exporter)
        print(summary_text(report))
        if not report.passed:
            _stderr(f"onnx-custom: verification failed; {ns.output} was not written (an existing file there is unchanged)")
            return EXIT_FAILED
    save_model(proto, ns.output)
    opsets = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    nodes = sorted({f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node})
    print(f"wrote {ns.output} ({ns.exporter}, opset {opsets[0] if opsets else '?'}, IR {proto.ir_version}); node types: {', '.join(nodes)}")
    return 0


def cmd_verify(ns: argparse.Namespace) -> int:
    from onnx_custom.verification.report import summary_text
    from onnx_custom.verification.runner import load_model

    _require_file(ns.onnx, "ONNX file")
    _shape_trials(ns)
    proto = load_model(ns.onnx)
    loaded, args = _load(ns)
    made = _cli_metadata(proto)
    variants = ns.variant or made.get("variants") or []
    report = _verify(
        ns, loaded.model, args, proto,
        input_generator=getattr(loaded.module, "input_generator", None),
        localize=ns.localize,
        backends=tuple(ns.backend or ("onnxruntime",)),
        exporter=ns.exporter or made.get("exporter"),
        opset=ns.opset,
        registry=_registry(variants),
        progress=_stderr if ns.localize or ns.trials > 1 else None,
    )  # fmt: skip
    print(summary_text(report))
    if ns.report:
        from onnx_custom.verification.report import write_report

        _stderr(f"report written to {write_report(ns.report, report, title=f'verify {ns.model} against {ns.onnx}')}")
    return 0 if report.passed else EXIT_FAILED


def cmd_check(ns: argparse.Namespace) -> int:
    from onnx_custom.verification.preflight import check

    loaded, args = _load(ns)
    report = check(loaded.model, args, exporter=ns.exporter, opset=ns.opset, registry=_registry(ns.variant))
    print(report)
    return 0 if report.ok else EXIT_FAILED


def cmd_inspect(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.inspect_model import inspect_model

    _require_file(ns.onnx, "ONNX file")
    _import_all(ns.imports)
    summary = inspect_model(ns.onnx)
    print(json.dumps(summary.to_dict(), indent=2) if ns.json else summary)
    return 0 if summary.ok else EXIT_FAILED


def cmd_ops(ns: argparse.Namespace) -> int:
    from onnx_custom.translate.registry import default_registry
    from onnx_custom.verification.preflight import has_kernel, kernel_registry_or_none

    _import_all(ns.imports)
    kernels = kernel_registry_or_none()
    entries = list(default_registry())
    rows = [("target", "opset", "variant", "custom nodes (emits=)", "kernel", "source")]
    for entry in entries:
        emits = ", ".join(entry.emits) or "-"
        kernel = "-" if not entry.emits else ("yes" if kernels is not None and all(has_kernel(kernels, e) for e in entry.emits) else "NO")
        rows.append((str(entry.target), str(entry.opset), entry.variant, emits, kernel, entry.source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f"{len(entries)} translation(s); variants: {', '.join(sorted({e.variant for e in entries}))}")
    return 0


def cmd_zoo(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.zoo_console import ZooConsole
    from onnx_custom.zoo import list_zoo, run_zoo

    if ns.list:
        print(list_zoo(ns.models or None))
        return 0
    console = ZooConsole(sys.stdout, sys.stderr)
    try:
        results = run_zoo(ns.models or None, seed=ns.seed, listener=console)
    finally:
        console.close()  # a Ctrl-C must not leave the live line half drawn
    console.finish(results)
    if ns.report:
        from onnx_custom.verification.report import write_report

        _stderr(f"report written to {write_report(ns.report, results, title='onnx-custom zoo')}")
    return EXIT_FAILED if any(r.status == "fail" for r in results) else 0


@contextlib.contextmanager
def _announce_if_slow(what: str, usual: str, *, after: float = 1.0) -> Iterator[None]:
    """A cache hit answers at once; past ``after`` seconds it is a one-time build: say so on
    stderr (and how long it took), instead of sitting silent for half a minute."""
    start = time.perf_counter()
    fired = threading.Event()

    def announce() -> None:
        fired.set()
        _stderr(f"onnx-custom: building {what} (one time, usually {usual}; cached afterwards) ...")

    timer = threading.Timer(after, announce)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
    if fired.is_set():
        _stderr(f"onnx-custom: built {what} in {time.perf_counter() - start:.0f} s")


def cmd_build_library(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.loading import CliInputError

    if ns.spec:
        return _build_user_library(ns)
    for flag in ("name", "cmake"):
        if getattr(ns, flag):
            raise CliInputError(f"--{flag} needs --spec (it applies to a library built from your op specs); fix: add --spec acme.yaml or drop --{flag}.")
    from onnx_custom.runtime.native import LIBRARY_NAME, build_library, native_ops

    with _announce_if_slow(LIBRARY_NAME, "15-45 s"):
        path = build_library(ns.output)
    print(path, flush=True)
    _stderr(f"serves {', '.join(native_ops())}; load it with SessionOptions.register_custom_ops_library (Python) or RegisterCustomOpsLibrary_V2 (C API)")
    return 0


def _build_user_library(ns: argparse.Namespace) -> int:
    from onnx_custom.spec import build_native_library, parse_specs, write_cmake_project

    specs = [spec for path in ns.spec for spec in parse_specs(path)]
    if ns.cmake:
        write_cmake_project(specs, ns.cmake, name=ns.name, include_shipped=ns.with_shipped)
        _stderr(f"wrote the CMake project into {ns.cmake} (cmake -S {ns.cmake} -B build && cmake --build build)")
    with _announce_if_slow("the native library", "10-45 s"):
        library = build_native_library(specs, ns.output, name=ns.name, include_shipped=ns.with_shipped)
    print(library.path, flush=True)
    _stderr(f"serves {', '.join(library.ops)}; load it with SessionOptions.register_custom_ops_library (Python) or RegisterCustomOpsLibrary_V2 (C API)")
    return 0


def cmd_package(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.package_model import package_model
    from onnx_custom.spec import parse_specs

    specs = [spec for path in ns.spec or () for spec in parse_specs(path)]
    with _announce_if_slow("the native library", "10-45 s"):
        written = package_model(ns.onnx, ns.output, specs, name=ns.name)
    for path in written:
        print(path, flush=True)
    return 0


# ---------------------------------------------------------------------------- main

def _error_line(exc: BaseException) -> str:
    from onnx_custom.errors import OnnxCustomError

    text = " ".join(str(exc).split())
    if isinstance(exc, OnnxCustomError):
        return text or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename or text}; fix: check the path"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or text}; fix: choose another path or change its permissions"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or text}{f' ({exc.filename})' if exc.filename else ''}"
    return f"unexpected {type(exc).__name__}: {text} (add --debug for the traceback)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        _stderr("onnx-custom: interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if ns.debug:
            traceback.print_exc()
        _stderr(f"onnx-custom {ns.command}: error: {_error_line(exc)}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
