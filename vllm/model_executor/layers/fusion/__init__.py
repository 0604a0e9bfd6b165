"""Producer-consumer fusions: activations handed to a linear already quantized."""
