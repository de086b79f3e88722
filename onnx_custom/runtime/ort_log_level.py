"""The log severity of every ONNX Runtime session onnx-custom creates (ours, verify's trials,
localize's segments, the zoo's).

ORT logs a failing kernel or a refused input at ERROR (``[E:onnxruntime:, sequential_executor.cc
... ExecuteKernel]`` in red) and raises; we raise a typed error for the same failure, so by
default our sessions log nothing and each failure is reported once. ``sess_options`` with a
``log_severity_level`` of its own, or ``$ONNX_CUSTOM_ORT_LOG_SEVERITY`` (0 verbose .. 4 fatal),
bring ORT's logs back. No import of the kernel host: plain-ORT fallbacks use it too.
"""

from __future__ import annotations

import os

import onnxruntime as ort

__all__ = ["ORT_LOG_ENV", "ort_log_severity", "quiet_session_options"]

# ORT log severity FATAL: our typed errors report failures, once (ORT would also log each at ERROR)
_QUIET = 4
ORT_LOG_ENV = "ONNX_CUSTOM_ORT_LOG_SEVERITY"  # 0 verbose .. 4 fatal: ORT's logs back, for debugging


def ort_log_severity() -> int:
    """The log severity of the sessions onnx-custom creates: FATAL (nothing on stderr; failures
    reach the caller as typed errors) unless ``$ONNX_CUSTOM_ORT_LOG_SEVERITY`` asks for more."""
    value = os.environ.get(ORT_LOG_ENV, "").strip()
    if value in {"0", "1", "2", "3", "4"}:
        return int(value)
    return _QUIET


def quiet_session_options(options: ort.SessionOptions | None = None) -> ort.SessionOptions:
    """``options`` (or new ones) logging at `ort_log_severity` unless the caller chose a level."""
    so = options if options is not None else ort.SessionOptions()
    if so.log_severity_level < 0:  # not chosen by the caller
        so.log_severity_level = ort_log_severity()
    return so
