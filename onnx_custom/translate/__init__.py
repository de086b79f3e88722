"""Stage 1, translate: validated op names, attribute kinds, the translation registry and the
exporter-neutral builder ``g`` that translations write ONNX with, plus coverage of a model's ops."""
