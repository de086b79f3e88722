"""The ``onnx-custom`` command line (``main``): one module per command, model loading, console."""

from __future__ import annotations

from onnx_custom.cli.main import DEFAULT_OPSET, EXIT_ERROR, EXIT_FAILED, build_parser, main

__all__ = ["DEFAULT_OPSET", "EXIT_ERROR", "EXIT_FAILED", "build_parser", "main"]
