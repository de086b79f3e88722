"""Leaf helpers every stage uses: atomic file writes, native builds (cache, lock, compiler),
small ONNX helpers, quiet exporter logs, and the list of built-in family modules."""
