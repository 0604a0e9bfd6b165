"""The Kimi-K3 model tree (upstream keeps it under amd/; here it runs on ROCm, CUDA and CPU)."""
