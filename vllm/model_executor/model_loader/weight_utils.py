"""Checks on checkpoint tensors: the one shape-checked copy into a parameter (or a slice of one),
the shape check of a tensor that a loader cuts up itself before copying, the dtype check of
every tensor a model loads, and a digest that tells two tensors apart without holding both."""

import hashlib

import torch

from vllm.model_executor.model_loader.errors import QUANTIZED_CHECKPOINTS


def copy_checked(target: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    """Copy `loaded` into `target` in place (converting dtype and device); a shape mismatch is a
    ValueError naming `name` (`copy_` alone would broadcast a `[1]` tensor silently)."""
    check_shape(loaded, tuple(target.shape), name)
    with torch.no_grad():
        target.copy_(loaded)


def check_shape(loaded: torch.Tensor, expected: tuple[int, ...], name: str) -> None:
    """Raise ValueError naming `name` unless `loaded` has the full (unsharded) checkpoint shape
    `expected`: for loaders that slice a tensor before copying it, where a wrong shape could be
    narrowed or broadcast into place without an error."""
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(
            f"{name}: checkpoint shape {tuple(loaded.shape)}, expected {tuple(expected)}"
        )


def check_floating(loaded: torch.Tensor, name: str) -> None:
    """Raise ValueError naming `name` unless `loaded` is floating point of 16 bits or more, which
    the model converts to its dtype. FP8 or integer tensors are a quantized checkpoint's codes,
    meaningless without their scales: converting them would load a wrong model silently."""
    if not loaded.is_floating_point() or loaded.element_size() < 2:
        raise ValueError(
            f"{name}: checkpoint dtype {loaded.dtype}, expected floating point of 16 bits or "
            f"more (bfloat16, float16, float32, float64); {QUANTIZED_CHECKPOINTS}"
        )


def tensor_digest(tensor: torch.Tensor) -> bytes:
    """A digest of `tensor`'s shape and values, taken in fp32 (exact for the 16-bit float dtypes,
    so a bf16 tensor and its fp32 copy agree): equal for equal values, and for others only by a
    hash collision. For two checkpoint tensors that arrive one at a time (a tied head's saved
    copy and the embedding) without keeping the first."""
    data = tensor.detach().to("cpu", torch.float32).contiguous()
    digest = hashlib.blake2b(str(tuple(data.shape)).encode(), digest_size=32)
    digest.update(data.view(-1).view(torch.uint8).numpy())
    return digest.digest()
