"""``onnx-custom verify``: compare PyTorch eager with ONNX Runtime on an exported file."""

from __future__ import annotations

import argparse

from onnx_custom.cli.loading import check_paths
from onnx_custom.cli.shared import (
    EXIT_FAILED,
    cli_metadata,
    load_model_and_args,
    registry_with_variants,
    require_file,
    shape_trials,
    stderr,
    verify_model,
)

__all__ = ["cmd_verify"]


def cmd_verify(ns: argparse.Namespace) -> int:
    # every path and flag is checked before torch loads (a typo is answered in well under a second)
    require_file(ns.onnx, "ONNX file")
    shape_trials(ns)
    check_paths(ns.model, ns.imports)
    from onnx_custom.verification.report import summary_text
    from onnx_custom.verification.runner import load_model

    proto = load_model(ns.onnx)
    loaded, args = load_model_and_args(ns)
    made = cli_metadata(proto)
    variants = ns.variant or made.get("variants") or []
    report = verify_model(
        ns,
        loaded.model,
        args,
        proto,
        input_generator=getattr(loaded.module, "input_generator", None),
        localize=ns.localize,
        backends=tuple(ns.backend or ("onnxruntime",)),
        exporter=ns.exporter or made.get("exporter"),
        opset=ns.opset,
        registry=registry_with_variants(variants),
        progress=stderr if ns.localize or ns.trials > 1 else None,
    )
    print(summary_text(report))
    if ns.report:
        from onnx_custom.verification.report import write_report

        stderr(
            "report written to"
            f" {write_report(ns.report, report, title=f'verify {ns.model} against {ns.onnx}')}"
        )
    return 0 if report.passed else EXIT_FAILED
