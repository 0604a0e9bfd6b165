"""Kernels behind layers, chosen per platform."""
