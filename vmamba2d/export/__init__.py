"""Export of the models to other runtimes (ONNX)."""
