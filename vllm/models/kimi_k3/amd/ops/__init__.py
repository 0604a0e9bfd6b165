"""Custom ops of the Kimi-K3 model: one op per file, Triton kernel beside its torch reference."""
