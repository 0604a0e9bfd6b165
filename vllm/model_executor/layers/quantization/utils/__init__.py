"""Quantization descriptors (group shapes, scale descriptions, quant keys)."""
