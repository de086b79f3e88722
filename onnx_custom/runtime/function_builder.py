"""Compatibility alias: the function-body builder moved to
:mod:`onnx_custom.function_bodies.builder`.

Kept because the README documented this path; new code imports the new one. The only import
from ``runtime`` upwards, allowed by name in ``tests/test_import_layers.py``.
"""

from __future__ import annotations

from onnx_custom.function_bodies.builder import *  # noqa: F403
from onnx_custom.function_bodies.builder import __all__ as __all__
