"""Small helpers that upstream vLLM keeps under `vllm.utils`, one module per concern."""
