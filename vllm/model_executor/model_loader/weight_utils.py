"""Checks on checkpoint tensors: the one shape-checked copy into a parameter (or a slice of one),
the shape check of a tensor that a loader cuts up itself before copying, the dtype check of
every tensor a model loads, and the names of a quantized checkpoint's extra tensors."""

import torch

_QUANTIZED = (
    "quantized checkpoints are not supported (--quantization-config quantizes a bf16 checkpoint "
    "online)"
)
# Leaf names of the tensors that quantized checkpoints store beside (or instead of) a weight:
# FP8 scales (static, per channel, block-wise), GPTQ / AWQ codes and groups, compressed-tensors'
# packed weights and zero points. No Kimi model has a tensor of these names.
QUANTIZED_TENSOR_LEAVES = frozenset({
    "weight_scale", "weight_scale_inv", "input_scale", "weight_zero_point", "input_zero_point",
    "weight_packed", "weight_shape", "qweight", "qzeros", "scales", "g_idx",
})  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint's content (its tensors' names, shapes, dtypes, files) does not match its
    config: found while loading, so callers can tell it from a bad argument."""


def check_not_quantized(name: str) -> None:
    """Raise CheckpointError if `name` is a quantized checkpoint's scale, zero point or packed
    codes (its weights would otherwise fail later, by dtype or as an unknown tensor, or, codes
    without their scales, not at all)."""
    if name.rsplit(".", 1)[-1] in QUANTIZED_TENSOR_LEAVES:
        raise CheckpointError(f"{name}: a quantized checkpoint's tensor; {_QUANTIZED}")


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
            f"more (bfloat16, float16, float32, float64); {_QUANTIZED}"
        )
