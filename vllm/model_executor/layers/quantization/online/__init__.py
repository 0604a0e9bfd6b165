"""Online quantization: bf16 checkpoints quantized at load time."""
