"""The ``onnx-custom`` command line: export, verify, check, inspect, ops, zoo, build-library.

Exit codes: 0 success, 1 verification or check failed, 2 error (one line on stderr; ``--debug``
prints the traceback), 130 interrupted. Nothing heavy is imported until a command runs, so
``--help`` answers at once. The parser is in ``parser``, each command in ``commands/``."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

from onnx_custom.cli.parser import DEFAULT_OPSET, build_parser
from onnx_custom.cli.shared import EXIT_ERROR, EXIT_FAILED, EXIT_INTERRUPTED, stderr
from onnx_custom.common.torch_notices import drop_cuda_home_notice

__all__ = ["DEFAULT_OPSET", "EXIT_ERROR", "EXIT_FAILED", "build_parser", "main"]


def _error_line(exc: BaseException) -> str:
    from onnx_custom.errors import OnnxCustomError

    text = " ".join(str(exc).split())
    if isinstance(exc, OnnxCustomError):
        return text or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename or text}; fix: check the path"
    if isinstance(exc, PermissionError):
        return (
            f"permission denied: {exc.filename or text}; fix: choose another path or change its"
            " permissions"
        )
    if isinstance(exc, OSError):
        return (
            f"{type(exc).__name__}:"
            f" {exc.strerror or text}{f' ({exc.filename})' if exc.filename else ''}"
        )
    return f"unexpected {type(exc).__name__}: {text} (add --debug for the traceback)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    drop_cuda_home_notice()  # torch's import-time CUDA_HOME line, whichever module imports it
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        stderr("onnx-custom: interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if ns.debug:
            traceback.print_exc()
        stderr(f"onnx-custom {ns.command}: error: {_error_line(exc)}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
