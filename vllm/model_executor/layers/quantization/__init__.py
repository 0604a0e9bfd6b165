"""Quantization methods and their shared descriptions."""
