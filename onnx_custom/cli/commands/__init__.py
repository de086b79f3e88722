"""One module per ``onnx-custom`` sub-command; each imports what it needs when it runs."""
