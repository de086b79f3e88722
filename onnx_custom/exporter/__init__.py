"""Stage 2, export: the pipeline behind ``onnx_custom.export`` (argument checks, TorchScript and
dynamo paths, dynamic shapes and dim params, output metadata for translations, opset lowering)."""
