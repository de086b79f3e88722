"""ONNX function bodies: record a translation as a ``FunctionProto`` (``builder``) and embed the
bodies of a model's custom nodes so plain ONNX Runtime runs them with no kernel (``embed``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnx_custom.function_bodies.embed import embed_functions, function_proto

__all__ = ["embed_functions", "function_proto"]


def __getattr__(name: str) -> Any:
    # onnx/onnxruntime load on first use, so translations importing the builder stay cheap.
    if name not in __all__:
        raise AttributeError(f"module 'onnx_custom.function_bodies' has no attribute {name!r}")
    from onnx_custom.function_bodies import embed

    value = getattr(embed, name)
    globals()[name] = value
    return value
