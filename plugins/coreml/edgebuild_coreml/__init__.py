"""edgebuild-coreml: ONNX to Core ML lowering, compression, a MIL interpreter and ANE rules."""

__version__ = "0.1.0"
