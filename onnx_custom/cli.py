"""The ``onnx-custom`` command line: export, verify, ops, zoo, build-library (and check/inspect)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from onnx_custom._loading import example_args, load_model_spec
from onnx_custom.errors import OnnxCustomError

__all__ = ["build_parser", "main"]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model spec: models/asinh.py:Model, onnx_custom.models.asinh:Model, or a zoo name")
    p.add_argument("--input", action="append", metavar="DIMS[:DTYPE]", help="example input, e.g. 2x3:float32 (repeat per input); default: the module's example_inputs()")
    p.add_argument("--seed", type=int, default=0)


def _add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    p.add_argument("--opset", type=int, default=None)
    p.add_argument("--variant", action="append", default=[], help="prefer this translation variant (e.g. custom)")


def _registry(variants: list[str]):  # type: ignore[no-untyped-def]
    from onnx_custom.registry import default_registry

    reg = default_registry()
    return reg.with_variants(*variants) if variants else reg


def cmd_export(ns: argparse.Namespace) -> int:
    import onnx_custom

    loaded = load_model_spec(ns.model)
    args = example_args(loaded, ns.input, ns.seed)
    dynamic = getattr(loaded.module, "dynamic_shapes", None) if ns.dynamic else None
    if ns.dynamic and dynamic is None:
        raise OnnxCustomError(f"{ns.model!r} declares no dynamic_shapes; define `dynamic_shapes` in its module.")
    proto = onnx_custom.export(loaded.model, args, ns.output, exporter=ns.exporter, opset=ns.opset, dynamic_shapes=dynamic, registry=_registry(ns.variant), verify=ns.verify)
    nodes = sorted({f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node})
    print(f"wrote {ns.output} ({ns.exporter}, opset {[o.version for o in proto.opset_import if o.domain in ('', 'ai.onnx')]}, IR {proto.ir_version}); node types: {', '.join(nodes)}")
    return 0


def cmd_verify(ns: argparse.Namespace) -> int:
    import onnx_custom

    loaded = load_model_spec(ns.model)
    args = example_args(loaded, ns.input, ns.seed)
    report = onnx_custom.verify(loaded.model, args, ns.onnx, trials=ns.trials, rtol=ns.rtol, atol=ns.atol, raise_on_mismatch=False, input_generator=getattr(loaded.module, "input_generator", None), **_verify_extras(ns))
    print(report)
    if ns.report:
        from onnx_custom.report import write_report

        print(f"report written to {write_report(ns.report, report, title=f'verify {ns.model} against {ns.onnx}')}", file=sys.stderr)
    return 0 if report.passed else 1


def _verify_extras(ns: argparse.Namespace) -> dict[str, Any]:
    """verify() options of the diagnostics flags (--localize, --backend, --exporter/--opset/--variant)."""
    progress = (lambda line: print(line, file=sys.stderr, flush=True)) if ns.trials > 1 or ns.localize else None
    return {
        "localize": ns.localize,
        "backends": tuple(ns.backend or ("onnxruntime",)),
        "exporter": ns.exporter,
        "opset": ns.opset,
        "registry": _registry(ns.variant),
        "progress": progress,
    }


def cmd_check(ns: argparse.Namespace) -> int:
    import onnx_custom.preflight as checking

    loaded = load_model_spec(ns.model)
    args = example_args(loaded, ns.input, ns.seed)
    opset = ns.opset if ns.opset is not None else 18
    report = checking.check(loaded.model, args, exporter=ns.exporter, opset=opset, registry=_registry(ns.variant))
    print(report)
    return 0 if report.ok else 1


def cmd_inspect(ns: argparse.Namespace) -> int:
    from onnx_custom.inspect_model import inspect_model

    summary = inspect_model(ns.onnx)
    print(summary)
    return 0 if summary.ok else 1


def cmd_ops(ns: argparse.Namespace) -> int:
    from onnx_custom.registry import default_registry

    try:
        from onnx_custom.runtime import default_kernel_registry

        kernels = default_kernel_registry()
        has_kernel = lambda node: kernels.find(node) is not None  # noqa: E731
    except ImportError:
        has_kernel = lambda node: False  # noqa: E731
    print(f"{'target':<36} {'opset':>5} {'variant':<8} {'emits':<28} {'kernel':<6} source")
    for entry in default_registry():
        emits = ",".join(entry.emits) or "(standard ops)"
        kernel = ("yes" if all(has_kernel(e) for e in entry.emits) else "NO") if entry.emits else "-"
        print(f"{entry.target!s:<36} {entry.opset:>5} {entry.variant:<8} {emits:<28} {kernel:<6} {entry.source}")
    return 0


def cmd_zoo(ns: argparse.Namespace) -> int:
    from onnx_custom.zoo import format_table, run_zoo

    results = run_zoo(ns.models or None, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_table(results))
    if ns.report:
        from onnx_custom.report import write_report

        print(f"report written to {write_report(ns.report, results, title='onnx-custom zoo')}", file=sys.stderr)
    failures = [r for r in results if r.status == "fail"]
    for r in failures:
        print(f"\n--- {r.model} {r.case.label} ---\n{r.detail}", file=sys.stderr)
    return 1 if failures else 0


def cmd_build_library(ns: argparse.Namespace) -> int:
    from onnx_custom.runtime.native import build_library, native_ops

    path = build_library(ns.output)
    print(path)
    print(f"serves {', '.join(native_ops())}; load it with SessionOptions.register_custom_ops_library "
          f"(Python) or RegisterCustomOpsLibrary_V2 (C API)", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx-custom", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("export", help="export a model to ONNX with our translations")
    _add_model_args(p)
    _add_export_args(p)
    p.add_argument("--dynamic", action="store_true", help="use the module's dynamic_shapes")
    p.add_argument("--verify", action="store_true", help="verify after export (non-zero exit on mismatch)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("verify", help="compare PyTorch eager with ONNX Runtime")
    _add_model_args(p)
    p.add_argument("onnx", help="the .onnx file")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--rtol", type=float)
    p.add_argument("--atol", type=float)
    p.add_argument("--localize", action="store_true", help="on mismatch, find the first diverging node (torch op, ONNX nodes, translation)")
    p.add_argument("--backend", action="append", choices=("onnxruntime", "reference"), help="run with this backend (repeat; default onnxruntime)")
    p.add_argument("--exporter", choices=("dynamo", "torchscript"), default=None, help="exporter that made the file (for --localize; default: inferred)")
    p.add_argument("--opset", type=int, default=None, help="opset of the translations (for --localize; default: the file's)")
    p.add_argument("--variant", action="append", default=[], help="translation variant the file was exported with (for --localize)")
    p.add_argument("--report", metavar="PATH", help="write a report: PATH.md (Markdown) or PATH.json")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("check", help="pre-flight: ops without translations and custom nodes without kernels (no file written)")
    _add_model_args(p)
    _add_export_args(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("inspect", help="summarize an .onnx file: domains, custom nodes and their kernels/schemas/functions")
    p.add_argument("onnx", help="the .onnx file")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("ops", help="list the registry: targets, opsets, domains, kernels")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("build-library", help="build libonnx_custom_ops.so, the native kernels for plain ONNX Runtime (prints its path)")
    p.add_argument("-o", "--output", metavar="DIR", help="copy the library into DIR (default: leave it in the build cache)")
    p.set_defaults(func=cmd_build_library)

    p = sub.add_parser("zoo", help="export + verify every example model with both exporters")
    p.add_argument("models", nargs="*", help="only these zoo models (default: all)")
    p.add_argument("--report", metavar="PATH", help="write a report: PATH.md (Markdown) or PATH.json")
    p.set_defaults(func=cmd_zoo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return int(ns.func(ns))
    except OnnxCustomError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, TypeError, ValueError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
