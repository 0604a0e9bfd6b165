"""vllm-k3: a vLLM-style engine for Kimi-K3 / Kimi-Linear with PTPC FP8 linears."""

__version__ = "0.1.0"
