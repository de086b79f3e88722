"""``onnx-custom zoo``: export and verify every example model."""

from __future__ import annotations

import argparse
import sys

from onnx_custom.cli.shared import EXIT_FAILED, stderr

__all__ = ["cmd_zoo"]


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

        stderr(f"report written to {write_report(ns.report, results, title='onnx-custom zoo')}")
    return EXIT_FAILED if any(r.status == "fail" for r in results) else 0
