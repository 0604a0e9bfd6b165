"""The `QuantizedActivation` contract between a producer of quantized activations and a linear.

A linear whose kernel can consume an activation that is already quantized advertises the kernel's
`QuantKey` on the layer (`expose_input_quant_key`). A producer (for example the KDA epilogue's fused
gated RMSNorm + per-token FP8 op) asks `get_input_quant_key(linear)` and, only when it equals its
own key, hands the linear a `QuantizedActivation` instead of a plain tensor. The consuming kernel
calls `as_quantized_activation`, which validates the pair, and skips its own quantization.

The key fixes dtype, scale granularity and symmetry; the layout is the consumer's. For PTPC FP8 that
is data `[M, K]` (any leading dims that flatten to M) in the platform FP8 dtype and scale `[M, 1]`
fp32 on the same device, which `as_quantized_activation` checks (upstream checks only the key).

`orig_shape` and `orig_dtype` describe the activation before quantization, and the consumer uses
them as it would a plain tensor's: the output is `[*orig_shape[:-1], N]` in `orig_dtype`. Both are
checked: `orig_shape` must flatten to the data's `[M, K]`, and a consumer whose output dtype is
fixed (an FP8 linear built with `out_dtype`) refuses an `orig_dtype` that differs, rather than
return a dtype the producer did not ask for.
"""

import math
from dataclasses import dataclass, replace

import torch

from vllm.model_executor.layers.quantization.utils.quant_utils import QuantKey
from vllm.platforms import current_platform, supported_fp8_dtypes


@dataclass
class QuantizedActivation:
    """An activation already quantized for the next linear."""

    data: torch.Tensor
    scale: torch.Tensor
    orig_dtype: torch.dtype  # dtype of the activation before quantization: the GEMM output dtype
    orig_shape: torch.Size  # shape before quantization, [..., K]: its leading dims shape the output
    quant_key: QuantKey

    def weak_ref(self) -> "QuantizedActivation":
        """A copy whose tensors do not keep their memory alive (for CUDA-graph replay).

        Uses the native `weak_ref_tensor` op of `vllm._C` when built; otherwise the tensors are
        plain aliases, which keep the memory alive a little longer but are otherwise equivalent.
        """
        return replace(self, data=weak_ref_tensor(self.data), scale=weak_ref_tensor(self.scale))


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A tensor over `t`'s memory that does not own it (alias when `vllm._C` is not built)."""
    from vllm import _custom_ops

    if _custom_ops.has_native_ops() and t.is_cuda:
        return torch.ops._C.weak_ref_tensor(t)
    return t.detach()


def expose_input_quant_key(layer: torch.nn.Module, kernel: object) -> None:
    """Mark `layer` with its kernel's input key, if the kernel can consume quantized input."""
    key = kernel.input_quant_key()
    if key is not None:
        layer._input_quant_key = key


def get_input_quant_key(layer: torch.nn.Module) -> QuantKey | None:
    """The key a producer must match to hand `layer` a `QuantizedActivation`, else None.

    None when the layer needs the raw activation (`requires_unquantized_input`, e.g. LoRA).
    """
    if getattr(layer, "requires_unquantized_input", False):
        return None
    return getattr(layer, "_input_quant_key", None)


def as_quantized_activation(
    x: "torch.Tensor | QuantizedActivation",
    expected_key: QuantKey | None,
    in_features: int | None = None,
    out_dtype: torch.dtype | None = None,
) -> QuantizedActivation | None:
    """Validate a pre-quantized input for a consumer; None for a plain tensor.

    Raises ValueError when `x` is a `QuantizedActivation` that the consumer cannot take as is:
    a key other than `expected_key` (including a consumer that expects none), data that does not
    view as `[M, in_features]`, an FP8 dtype other than the platform's, or a scale that is not a
    `[M, 1]` float32 tensor on the data's device, an `orig_shape` that is not `[..., K]` with
    leading dims multiplying to M, or an `orig_dtype` other than the consumer's fixed `out_dtype`.
    """
    if not isinstance(x, QuantizedActivation):
        return None
    if expected_key is None or x.quant_key != expected_key:
        raise ValueError(
            f"QuantizedActivation with key {x.quant_key} handed to a consumer that expects "
            f"{expected_key}"
        )
    data, scale = x.data, x.scale
    k = in_features if in_features is not None else data.shape[-1]
    if data.dim() == 0 or data.shape[-1] != k:  # then numel is a multiple of k
        raise ValueError(
            f"QuantizedActivation data of shape {tuple(data.shape)} does not view as [M, {k}]"
        )
    if data.dtype != expected_key.dtype:
        raise ValueError(
            f"QuantizedActivation data is {data.dtype} but its key says {expected_key.dtype}"
        )
    if data.dtype in supported_fp8_dtypes() and data.dtype != current_platform.fp8_dtype():
        raise ValueError(
            f"QuantizedActivation data is {data.dtype}, the platform's FP8 dtype is "
            f"{current_platform.fp8_dtype()}"
        )
    m = data.numel() // max(k, 1)
    if scale.shape != (m, 1) or scale.dtype != torch.float32 or scale.device != data.device:
        raise ValueError(
            f"QuantizedActivation scale must be a [{m}, 1] float32 tensor on {data.device}, got "
            f"{tuple(scale.shape)} {scale.dtype} on {scale.device}"
        )
    shape = tuple(x.orig_shape)
    if len(shape) == 0 or shape[-1] != k or math.prod(shape[:-1]) != m:
        raise ValueError(
            f"QuantizedActivation orig_shape {shape} does not match its data: expected [..., {k}] "
            f"with leading dims multiplying to {m} rows"
        )
    if out_dtype is not None and x.orig_dtype != out_dtype:
        raise ValueError(
            f"QuantizedActivation orig_dtype {x.orig_dtype} differs from the consumer's output "
            f"dtype {out_dtype}"
        )
    return x
