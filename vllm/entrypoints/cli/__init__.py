"""The `vllm` console script (`vllm serve MODEL [flags]`)."""
