"""The argument parser of ``onnx-custom``: argument types that fail with one line, the shared
option groups, and one sub-command per module of ``onnx_custom.cli.commands``."""

from __future__ import annotations

import argparse
import os
from typing import Any, NoReturn, TypeAlias

from onnx_custom import __version__
from onnx_custom.cli.commands import (
    build_library,
    check,
    export,
    fuse,
    inspect,
    ops,
    package,
    verify,
    zoo,
)
from onnx_custom.cli.shared import EXIT_ERROR
from onnx_custom.common.rng import DEFAULT_SEED

__all__ = ["DEFAULT_OPSET", "build_parser"]

# onnx_custom.exporter.pipeline.DEFAULT_OPSET, without importing torch for --help (a test keeps
# them equal)
DEFAULT_OPSET = 18

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
  onnx-custom fuse detr.onnx -o detr_fused.onnx
  onnx-custom zoo --report zoo.md

exit codes: 0 ok, 1 verification/check failed, 2 error (add --debug for the traceback)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Raw description/epilog, and every option's default (when it has a meaningful one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        meaningless = (
            default is None or default is False or default == [] or default == argparse.SUPPRESS
        )
        if "%(default)" in text or meaningless or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other error of the command line (argparse prints the usage too).
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}; fix: see '{self.prog} --help'\n")


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
        raise argparse.ArgumentTypeError(
            f"expected a non-negative number such as 1e-5, got {text!r}"
        ) from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"expected a finite non-negative number such as 1e-5, got {text!r}"
        )
    return value


def _shape_case(text: str) -> dict[str, Any]:
    """``batch=5`` / ``batch=5,height=16`` / ``x=5x3x4``: one shape trial."""
    case: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        name, size = name.strip(), size.strip()
        if not sep or not name or not size:
            raise argparse.ArgumentTypeError(
                "expected NAME=SIZE (a dim name) or INPUT=DxDxD (an input's shape),"
                f" comma-separated, got {text!r}; e.g. --shape batch=5"
            )
        try:
            dims = tuple(int(d) for d in size.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"size {size!r} of {name!r} in {text!r}: expected an integer or a DxDxD shape, e.g."
                " --shape batch=5 or --shape x=5x3x4"
            ) from None
        if any(d < 0 for d in dims):
            raise argparse.ArgumentTypeError(f"negative size in {text!r}; expected sizes >= 0")
        if name in case:
            raise argparse.ArgumentTypeError(
                f"{name!r} appears twice in {text!r}; give one case per --shape"
            )
        case[name] = dims[0] if len(dims) == 1 and "x" not in size else dims
    return case


def _report_path(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in (".md", ".json"):
        raise argparse.ArgumentTypeError(
            f"expected a path ending in .md (Markdown) or .json, got {text!r}"
        )
    folder = existing = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(existing):  # missing folders are created when the report is written
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(
            f"{text!r}: {existing!r} is a file, not a folder; expected a path inside a folder such"
            " as report.md"
        )
    if existing == folder:
        from onnx_custom.common.atomic import check_output_path
        from onnx_custom.errors import OnnxCustomError

        try:  # before the run, not after minutes of it
            check_output_path(text, what="--report", example="report.md")
        except OnnxCustomError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_common(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: a sub-command's --debug must not reset one given before the sub-command.
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on error, print the full traceback",
    )


def _add_imports(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=(
            "import a module (pkg.mod), a .py file or a .yaml op-spec file first, to register your"
            " translations and kernels (repeatable)"
        ),
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        help="file.py:Class, package.module:Class or a zoo name (see: onnx-custom zoo --list)",
    )
    p.add_argument(
        "--input",
        action="append",
        metavar="DIMS[:DTYPE]",
        help=(
            "example input, e.g. 2x3:float32 or scalar:int64 (repeat per forward argument);"
            " default: the module's example_inputs()"
        ),
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=DEFAULT_SEED,
        help=(
            "seed of torch's RNG while the model and its inputs are built (use the same value for"
            " export and verify)"
        ),
    )


def _add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="torch exporter"
    )
    p.add_argument(
        "--opset",
        type=_positive_int,
        default=DEFAULT_OPSET,
        help="ONNX opset of the default domain",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help=(
            "prefer this translation variant, e.g. custom (one custom node) or gemm; repeatable;"
            " 'onnx-custom ops' lists them"
        ),
    )


def _add_verify_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("verification")
    g.add_argument(
        "--trials",
        type=_positive_int,
        default=1,
        help="trials at the export shape (the example inputs, then random values)",
    )
    g.add_argument(
        "--shape",
        action="append",
        type=_shape_case,
        default=[],
        metavar="NAME=SIZE",
        help=(
            "also verify at these sizes: a dim name (batch=5), several (batch=5,height=16) or an"
            " input's shape (x=5x3x4); one trial per --shape, replacing the default size trials"
        ),
    )
    g.add_argument(
        "--no-shape-trials",
        action="store_true",
        help="verify at the export shape only (by default dynamic dims are tried at 3 other sizes)",
    )
    g.add_argument(
        "--rtol",
        type=_tolerance,
        help="relative tolerance (with --atol; default: torch.testing's per-dtype values)",
    )
    g.add_argument("--atol", type=_tolerance, help="absolute tolerance (with --rtol)")


_Subparsers: TypeAlias = "argparse._SubParsersAction[_Parser]"


def _command(sub: _Subparsers, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=help_text,
        description=help_text[0].upper() + help_text[1:] + ".",
        formatter_class=_HelpFormatter,
    )
    _add_common(p)
    return p


def _add_export_parser(sub: _Subparsers) -> None:
    p = _command(sub, "export", "export a model to ONNX with our translations")
    _add_model_args(p)
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE.onnx",
        help="where to write the file (written only when complete)",
    )
    _add_export_args(p)
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="export with the module's dynamic_shapes (e.g. a dynamic batch)",
    )
    p.add_argument(
        "--fuse",
        action="store_true",
        help=(
            "replace recognised pure-PyTorch implementations (transformers'/mmcv's multi-scale"
            " deformable attention) by our ops for the export, and print what was fused"
        ),
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="verify before writing; on a mismatch nothing is written and the exit code is 1",
    )
    _add_verify_args(p)
    _add_imports(p)
    p.set_defaults(func=export.cmd_export)


def _add_verify_parser(sub: _Subparsers) -> None:
    p = _command(sub, "verify", "compare PyTorch eager with ONNX Runtime on an exported file")
    _add_model_args(p)
    p.add_argument("onnx", metavar="FILE.onnx", help="the ONNX file")
    _add_verify_args(p)
    p.add_argument(
        "--report",
        type=_report_path,
        metavar="PATH",
        help="also write a report: PATH.md (Markdown) or PATH.json",
    )
    g = p.add_argument_group("diagnostics")
    g.add_argument(
        "--localize",
        action="store_true",
        help="on a mismatch, find the first diverging node (torch op, ONNX nodes, translation)",
    )
    g.add_argument(
        "--backend",
        action="append",
        choices=("onnxruntime", "reference", "onnxruntime-native"),
        help=(
            "run with this backend (repeatable; default: onnxruntime, our Python kernels;"
            " onnxruntime-native: the native library libonnx_custom_ops.so a C++ deployment loads)"
        ),
    )
    g.add_argument(
        "--exporter",
        choices=("dynamo", "torchscript"),
        default=None,
        help=(
            "exporter that made the file, for --localize (default: recorded by export, else"
            " inferred)"
        ),
    )
    g.add_argument(
        "--opset",
        type=_positive_int,
        default=None,
        help="opset of the translations, for --localize (default: the file's)",
    )
    g.add_argument(
        "--variant",
        action="append",
        default=[],
        help=(
            "translation variant the file was exported with, for --localize (default: recorded by"
            " export)"
        ),
    )
    _add_imports(p)
    p.set_defaults(func=verify.cmd_verify)


def _add_check_parser(sub: _Subparsers) -> None:
    p = _command(
        sub,
        "check",
        "pre-flight: ops without translations and custom nodes without kernels (writes nothing)",
    )
    _add_model_args(p)
    _add_export_args(p)
    _add_imports(p)
    p.set_defaults(func=check.cmd_check)


def _add_fuse_parser(sub: _Subparsers) -> None:
    p = _command(
        sub,
        "fuse",
        "fuse the GridSample-based multi-scale deformable attention of an ONNX file into one node,"
        " proven in ONNX Runtime before writing",
    )
    p.add_argument("onnx", metavar="IN.onnx", help="the ONNX file (e.g. from torch.onnx.export)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT.onnx",
        help="where to write the fused file (written only when proven)",
    )
    p.add_argument(
        "--variant",
        choices=("custom", "mmdeploy"),
        default="custom",
        help=(
            "fused node: onnx_custom::MultiScaleDeformableAttn, or"
            " mmdeploy::MMCVMultiScaleDeformableAttention for mmdeploy's TensorRT plugin"
        ),
    )
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="size of a symbolic input dim for the proof run (repeatable; default 2, then 3)",
    )
    p.add_argument(
        "--seed", type=_seed, default=DEFAULT_SEED, help="seed of the proof's random inputs"
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="prove with the native kernel library (default: the Python kernels)",
    )
    _add_imports(p)
    p.set_defaults(func=fuse.cmd_fuse)


def _add_inspect_parser(sub: _Subparsers) -> None:
    p = _command(
        sub, "inspect", "summarize an ONNX file: domains, custom nodes and what can run them"
    )
    p.add_argument("onnx", metavar="FILE.onnx", help="the ONNX file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_imports(p)
    p.set_defaults(func=inspect.cmd_inspect)


def _add_ops_parser(sub: _Subparsers) -> None:
    p = _command(
        sub,
        "ops",
        "list the translations: targets, opsets, variants, custom nodes and their kernels",
    )
    _add_imports(p)
    p.set_defaults(func=ops.cmd_ops)


def _add_build_library_parser(sub: _Subparsers) -> None:
    p = _command(
        sub,
        "build-library",
        "build libonnx_custom_ops.so (or, with --spec, a library of your C++ kernels) for plain"
        " ONNX Runtime, and print its path",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="copy the library into DIR (default: leave it in the build cache)",
    )
    p.add_argument(
        "--spec",
        action="append",
        metavar="YAML",
        help=(
            "op spec file (or folder) whose ops name their C++ kernel (native: {source, function});"
            " repeatable"
        ),
    )
    p.add_argument(
        "--name",
        metavar="NAME",
        help="with --spec: library name, lib<NAME>_ops.so (default: the first op's namespace)",
    )
    p.add_argument(
        "--with-shipped",
        action="store_true",
        help="with --spec: also hold every shipped native kernel",
    )
    p.add_argument(
        "--cmake",
        metavar="DIR",
        help="with --spec: also write a standalone CMake project of the library into DIR",
    )
    p.set_defaults(func=build_library.cmd_build_library)


def _add_package_parser(sub: _Subparsers) -> None:
    p = _command(
        sub,
        "package",
        "write a model, the native library its custom nodes need and a README with load snippets",
    )
    p.add_argument(
        "onnx", metavar="FILE.onnx", help="the ONNX file (e.g. written by onnx-custom export)"
    )
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="folder to write into")
    p.add_argument(
        "--spec",
        action="append",
        metavar="YAML",
        help=(
            "op specs with C++ kernels (native: {source, function}) for the model's own ops;"
            " repeatable"
        ),
    )
    p.add_argument("--name", metavar="NAME", help="with --spec: library name, lib<NAME>_ops.so")
    p.set_defaults(func=package.cmd_package)


def _add_zoo_parser(sub: _Subparsers) -> None:
    p = _command(sub, "zoo", "export and verify every example model with both exporters")
    p.add_argument("models", nargs="*", metavar="NAME", help="only these zoo models (default: all)")
    p.add_argument(
        "--list", action="store_true", help="list the zoo models and their rows, run nothing"
    )
    p.add_argument(
        "--report",
        type=_report_path,
        metavar="PATH",
        help="also write a report: PATH.md (Markdown) or PATH.json",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=DEFAULT_SEED,
        help="seed of torch's RNG while each model is built",
    )
    p.add_argument(
        "--hf",
        action="store_true",
        help="run the real-model zoo instead: transformers detectors (needs the hf extra);"
        " NAMEs pick families (DeformableDetr, RTDetrV2, ...)",
    )
    p.add_argument(
        "--exporter",
        choices=("dynamo", "torchscript"),
        action="append",
        help="with --hf: only this exporter (repeatable; default: both)",
    )
    p.add_argument(
        "--no-torch-check",
        action="store_true",
        help="with --hf: skip the raw torch.onnx.export of rows that export (the 'beyond torch'"
        " column stays empty; rows that fail are always checked)",
    )
    p.add_argument(
        "--fuse",
        action="store_true",
        help="with --hf: also export each row with fuse=True and verify that file against the"
        " unfused model (the 'fused' column: MSDA nodes, GridSample left, what was not fused)",
    )
    p.set_defaults(func=zoo.cmd_zoo)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onnx-custom", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"onnx-custom {__version__}")
    parser.add_argument(
        "--debug", action="store_true", default=False, help="on error, print the full traceback"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for add in (
        _add_export_parser,
        _add_verify_parser,
        _add_check_parser,
        _add_fuse_parser,
        _add_inspect_parser,
        _add_ops_parser,
        _add_build_library_parser,
        _add_package_parser,
        _add_zoo_parser,
    ):
        add(sub)
    return parser
