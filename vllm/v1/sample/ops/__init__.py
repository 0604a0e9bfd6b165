"""Sampling kernels: each a Triton kernel, its launcher and its torch reference."""
