"""``onnx-custom zoo``: export and verify every example model."""

from __future__ import annotations

import argparse
import sys

from onnx_custom.cli.shared import EXIT_FAILED, stderr

__all__ = ["cmd_zoo"]


def cmd_zoo(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.zoo_console import ZooConsole
    from onnx_custom.zoo import list_zoo, run_zoo

    if getattr(ns, "hf", False):
        return _cmd_hf_zoo(ns)
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

        stderr(f"report written to {write_report(ns.report, results, title='onnx-custom zoo')}")
    return EXIT_FAILED if any(r.status == "fail" for r in results) else 0


def _cmd_hf_zoo(ns: argparse.Namespace) -> int:
    from onnx_custom.hf_zoo import (
        EXPORTERS,
        HfOptions,
        family_names,
        format_hf_row,
        format_hf_table,
        run_hf_zoo,
        transformers_missing,
    )

    missing = transformers_missing()
    if missing:
        stderr(missing)
        return EXIT_FAILED
    if ns.list:
        print("\n".join(family_names()))
        return 0
    options = HfOptions(seed=ns.seed, check_torch=not ns.no_torch_check, fuse=ns.fuse)
    exporters = tuple(ns.exporter) if ns.exporter else EXPORTERS
    results = run_hf_zoo(
        ns.models or None,
        exporters,
        options,
        on_row=lambda r: print(format_hf_row(r), file=sys.stderr, flush=True),
    )
    print(format_hf_table(results))
    fused_failed = any(r.fused is not None and r.fused.status == "fail" for r in results)
    return EXIT_FAILED if fused_failed or any(r.status == "fail" for r in results) else 0
