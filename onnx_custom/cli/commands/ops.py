"""``onnx-custom ops``: list the translations and their kernels."""

from __future__ import annotations

import argparse

from onnx_custom.cli.shared import import_all

__all__ = ["cmd_ops"]


def cmd_ops(ns: argparse.Namespace) -> int:
    from onnx_custom.translate.registry import default_registry
    from onnx_custom.verification.preflight import has_kernel, kernel_registry_or_none

    import_all(ns.imports)
    kernels = kernel_registry_or_none()
    entries = list(default_registry())
    rows = [("target", "opset", "variant", "custom nodes (emits=)", "kernel", "source")]
    for entry in entries:
        emits = ", ".join(entry.emits) or "-"
        kernel = (
            "-"
            if not entry.emits
            else (
                "yes"
                if kernels is not None and all(has_kernel(kernels, e) for e in entry.emits)
                else "NO"
            )
        )
        rows.append(
            (str(entry.target), str(entry.opset), entry.variant, emits, kernel, entry.source)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        )
    print(
        f"{len(entries)} translation(s); variants:"
        f" {', '.join(sorted({e.variant for e in entries}))}"
    )
    return 0
