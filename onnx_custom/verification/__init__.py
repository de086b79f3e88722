"""Stage 4, verify: compare tensors, run ONNX models, pick trial shapes, verify PyTorch against
ONNX Runtime, localize the first diverging node, report, and the pre-export ``check``."""
