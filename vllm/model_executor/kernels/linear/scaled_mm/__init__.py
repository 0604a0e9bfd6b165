"""FP8 scaled-mm linear kernels (see ScaledMMLinearKernel.py)."""
