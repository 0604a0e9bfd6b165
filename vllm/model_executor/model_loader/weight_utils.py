"""The one shape-checked copy of a checkpoint tensor into a parameter (or a slice of one)."""

import torch


def copy_checked(target: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    """Copy `loaded` into `target` in place (converting dtype and device); a shape mismatch is a
    ValueError naming `name` (`copy_` alone would broadcast a `[1]` tensor silently)."""
    if target.shape != loaded.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(loaded.shape)}, expected {tuple(target.shape)}"
        )
    with torch.no_grad():
        target.copy_(loaded)
