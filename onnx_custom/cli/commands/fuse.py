"""``onnx-custom fuse``: fuse the GridSample-based MSDA of an existing ONNX file into one node."""

from __future__ import annotations

import argparse

from onnx_custom.cli.loading import check_paths
from onnx_custom.cli.shared import EXIT_FAILED, check_output, import_all, require_file

__all__ = ["cmd_fuse"]


def _dims(pairs: list[str]) -> dict[str, int]:
    from onnx_custom.cli.loading import CliInputError

    dims = {}
    for pair in pairs:
        name, _, size = pair.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise CliInputError(
                f"--dim expects NAME=SIZE with a positive size; received {pair!r}. Fix: e.g."
                " --dim batch=2."
            )
        dims[name] = int(size)
    return dims


def cmd_fuse(ns: argparse.Namespace) -> int:
    require_file(ns.onnx, "ONNX file")  # before onnxruntime loads
    check_output(ns.output)
    check_paths(None, ns.imports)
    from onnx_custom.errors import FuseProofError
    from onnx_custom.rewrite import fuse_file

    import_all(ns.imports)
    try:
        _, report = fuse_file(
            ns.onnx,
            variant=ns.variant,
            output=ns.output,
            dims=_dims(ns.dim),
            seed=ns.seed,
            kernels="native" if ns.native else None,
        )
    except FuseProofError as exc:
        print(exc)
        print(f"nothing written to {ns.output}")
        return EXIT_FAILED
    print(report)
    return 0
