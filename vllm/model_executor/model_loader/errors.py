"""The errors of loading a model (no torch here: the tokenizer raises them too): a checkpoint
whose content cannot be loaded, and weights larger than their device. Both are ValueErrors, so
callers that catch bad input catch them, and `vllm serve` reports each in one line (exit 2)."""

QUANTIZED_CHECKPOINTS = (
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
    """A checkpoint's content (its tensors' names, shapes, dtypes, files, its tokenizer files)
    cannot be loaded into the model of its config: found while loading, so callers can tell it
    from a bad argument."""


class ModelSizeError(ValueError):
    """The model of a config is larger than its device can hold."""
