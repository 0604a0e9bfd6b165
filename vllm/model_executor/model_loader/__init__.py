"""Building models and filling their weights (safetensors checkpoints or dummy weights)."""
