"""``onnx-custom build-library``: build the native kernel library."""

from __future__ import annotations

import argparse

from onnx_custom.cli.shared import stderr

__all__ = ["cmd_build_library"]


def cmd_build_library(ns: argparse.Namespace) -> int:
    from onnx_custom.runtime.native import build_library, native_ops

    path = build_library(ns.output)  # a first-time compile announces itself on stderr
    print(path, flush=True)
    stderr(f"serves {', '.join(native_ops())}; load it with SessionOptions.register_custom_ops_library (Python) or RegisterCustomOpsLibrary_V2 (C API)")
    return 0
