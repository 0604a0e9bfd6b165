"""Quantization descriptors (group shapes, scale descriptions, quant keys) and per-token FP8."""
