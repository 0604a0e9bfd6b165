"""Model execution: layers, quantization, kernels."""
