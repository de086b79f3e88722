"""Stage 5, compile: reserved for the ``torch.compile(backend="onnx_custom")`` backend."""
