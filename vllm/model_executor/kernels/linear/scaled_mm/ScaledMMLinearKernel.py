"""Base classes of the scaled-mm linear kernels (upstream's file name, for reviewers).

A kernel owns one FP8 linear's weight layout and GEMM. `FP8ScaledMMLinearKernel.apply_weights`
implements the `QuantizedActivation` contract once for every FP8 kernel: a matching pre-quantized
activation goes straight to the GEMM (no quantization, no padding); a plain tensor is quantized per
token with the numerics of `per_token_fp8_quant`. Kernels that can consume a pre-quantized input
return their key from `input_quant_key()`; the base returns None (in-kernel quantization only).

Layer parameters handed to a kernel's `process_weights_after_loading` (online PTPC): `weight`
`[K, N]` FP8 (a transposed view of the row-major `[N, K]` codes), `weight_scale` `[N, 1]` fp32.
Kernels may re-lay them out there (the AITER kernels do; see aiter.py).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    as_quantized_activation,
)
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)


@dataclass(frozen=True)
class FP8ScaledMMLinearLayerConfig:
    """What a kernel must implement: activation/weight keys, the local weight shape (N, K)."""

    activation_quant_key: QuantKey
    weight_quant_key: QuantKey
    weight_shape: tuple[int, int]
    input_dtype: torch.dtype
    out_dtype: torch.dtype | None  # None: the activation's dtype


def ptpc_mismatch(config: FP8ScaledMMLinearLayerConfig) -> str | None:
    """Why `config` is not PTPC (per-token dynamic activations, per-channel weights), or None."""
    if config.activation_quant_key != kFp8DynamicTokenSym:
        return "needs per-token dynamic activations"
    if config.weight_quant_key != kFp8StaticChannelSym:
        return "needs per-channel weights"
    return None


class ScaledMMLinearKernel(ABC):
    """A GEMM implementation for a quantized linear layer."""

    def __init__(self, config: FP8ScaledMMLinearLayerConfig) -> None:
        self.config = config

    @classmethod
    @abstractmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        """Whether the platform and environment allow this kernel; else (False, reason)."""

    @classmethod
    @abstractmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        """Whether this kernel can run `config`; else (False, reason)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:  # noqa: B027
        """Rearrange the layer's quantized weights for this kernel (default: as they are)."""

    def input_quant_key(self) -> QuantKey | None:
        """The key of a pre-quantized activation this kernel consumes, or None.

        A kernel returning a key must consume it through `as_quantized_activation`; None means it
        needs to quantize inside (padding, swizzling, another granularity).
        """
        return None

    @abstractmethod
    def apply_weights(
        self,
        layer: torch.nn.Module,
        x: "torch.Tensor | QuantizedActivation",
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


class FP8ScaledMMLinearKernel(ScaledMMLinearKernel):
    """FP8 kernels: one `apply_weights`, subclasses provide `apply_scaled_mm`."""

    def quantize_input(self, x_2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token dynamic FP8 quantization of a plain `[M, K]` input (one launch on GPU)."""
        return per_token_fp8_quant(x_2d)

    def apply_weights(
        self,
        layer: torch.nn.Module,
        x: "torch.Tensor | QuantizedActivation",
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        w, w_s = layer.weight, layer.weight_scale
        k = self.config.weight_shape[1]
        qa = as_quantized_activation(x, self.input_quant_key(), k, self.config.out_dtype)
        if qa is not None:
            x_q, x_s = qa.data.reshape(-1, k), qa.scale
            orig_shape, orig_dtype = qa.orig_shape, qa.orig_dtype
        else:
            orig_shape, orig_dtype = x.shape, x.dtype
            if x.dim() == 0 or orig_shape[-1] != k:
                # Else a reshape to [-1, K] fails, or regroups the rows, with torch's message.
                raise ValueError(
                    f"x must be [..., K={k}] (the weight's in_features), got {tuple(orig_shape)}"
                )
            x_q, x_s = self.quantize_input(x.reshape(-1, k))
        out_dtype = self.config.out_dtype or orig_dtype
        output_shape = (*orig_shape[:-1], self.config.weight_shape[0])
        out = self.apply_scaled_mm(x_q, w, out_dtype, x_s, w_s, bias)
        return out.reshape(output_shape)

    @abstractmethod
    def apply_scaled_mm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out_dtype: torch.dtype,
        a_scale: torch.Tensor,
        b_scale: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """`(a * a_scale) @ (b * b_scale^T) + bias` for `a` `[M, K]` FP8 and the layer's `b`."""
