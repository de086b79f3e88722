"""``onnx-custom check``: pre-flight: ops without translations and custom nodes without kernels."""

from __future__ import annotations

import argparse

from onnx_custom.cli.loading import check_paths
from onnx_custom.cli.shared import EXIT_FAILED, load_model_and_args, registry_with_variants

__all__ = ["cmd_check"]


def cmd_check(ns: argparse.Namespace) -> int:
    check_paths(ns.model, ns.imports)  # before torch loads
    from onnx_custom.verification.preflight import check

    loaded, args = load_model_and_args(ns)
    report = check(
        loaded.model,
        args,
        exporter=ns.exporter,
        opset=ns.opset,
        registry=registry_with_variants(ns.variant),
    )
    print(report)
    return 0 if report.ok else EXIT_FAILED
