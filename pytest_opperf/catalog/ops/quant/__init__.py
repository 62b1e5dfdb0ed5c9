"""The quantization ops."""
