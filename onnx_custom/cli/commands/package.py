"""``onnx-custom package``: a model, the native library its custom nodes need, and a README."""

from __future__ import annotations

import argparse

__all__ = ["cmd_package"]


def cmd_package(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.package_model import package_model
    from onnx_custom.spec import parse_specs

    specs = [spec for path in ns.spec or () for spec in parse_specs(path)]
    written = package_model(
        ns.onnx, ns.output, specs, name=ns.name
    )  # a first build announces itself
    for path in written:
        print(path, flush=True)
    return 0
