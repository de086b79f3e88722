"""``onnx-custom export``: export a model to ONNX with our translations."""

from __future__ import annotations

import argparse
import json

from onnx_custom.cli.loading import check_paths
from onnx_custom.cli.shared import (
    CLI_METADATA_KEY,
    EXIT_FAILED,
    check_output,
    load_model_and_args,
    registry_with_variants,
    shape_trials,
    stderr,
    verify_model,
)

__all__ = ["cmd_export"]


def cmd_export(ns: argparse.Namespace) -> int:
    check_output(ns.output)  # paths and flags before torch loads (a typo is answered at once)
    shape_trials(ns)  # contradicting flags fail before the export, not after
    check_paths(ns.model, ns.imports)
    import onnx_custom
    from onnx_custom.cli.loading import CliInputError
    from onnx_custom.exporter.pipeline import save_model
    from onnx_custom.verification.report import summary_text

    loaded, args = load_model_and_args(ns)
    dynamic = getattr(loaded.module, "dynamic_shapes", None) if ns.dynamic else None
    if ns.dynamic and dynamic is None:
        raise CliInputError(
            f"--dynamic: {ns.model!r} declares no dynamic_shapes; expected a module-level"
            f" `dynamic_shapes` (e.g. ({{0: 'batch'}},)) in {loaded.module.__name__}; fix: define"
            " it or drop --dynamic."
        )
    registry = registry_with_variants(ns.variant)
    proto = onnx_custom.export(
        loaded.model,
        args,
        exporter=ns.exporter,
        opset=ns.opset,
        dynamic_shapes=dynamic,
        registry=registry,
        fuse=ns.fuse,
    )
    if ns.fuse:
        from onnx_custom.fusion import fusion_report

        print(fusion_report(proto))
    made = {
        "model": ns.model,
        "seed": ns.seed,
        "exporter": ns.exporter,
        "variants": list(ns.variant),
    }
    if ns.fuse:
        made["fuse"] = True
    proto.metadata_props.add(key=CLI_METADATA_KEY, value=json.dumps(made))
    if ns.verify:
        report = verify_model(
            ns,
            loaded.model,
            args,
            proto,
            input_generator=getattr(loaded.module, "input_generator", None),
            dynamic_shapes=dynamic,
            registry=registry,
            exporter=ns.exporter,
            fuse=ns.fuse,
        )
        print(summary_text(report))
        if not report.passed:
            stderr(
                f"onnx-custom: verification failed; {ns.output} was not written (an existing file"
                " there is unchanged)"
            )
            return EXIT_FAILED
    save_model(proto, ns.output)
    opsets = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    nodes = sorted(
        {f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node}
    )
    print(
        f"wrote {ns.output} ({ns.exporter}, opset {opsets[0] if opsets else '?'}, IR"
        f" {proto.ir_version}); node types: {', '.join(nodes)}"
    )
    return 0
