"""``onnx-custom inspect``: summarize an ONNX file."""

from __future__ import annotations

import argparse
import json

from onnx_custom.cli.loading import check_paths
from onnx_custom.cli.shared import EXIT_FAILED, import_all, require_file

__all__ = ["cmd_inspect"]


def cmd_inspect(ns: argparse.Namespace) -> int:
    require_file(ns.onnx, "ONNX file")  # before torch loads
    check_paths(None, ns.imports)
    from onnx_custom.cli.inspect_model import inspect_model

    import_all(ns.imports)
    summary = inspect_model(ns.onnx)
    print(json.dumps(summary.to_dict(), indent=2) if ns.json else summary)
    return 0 if summary.ok else EXIT_FAILED
