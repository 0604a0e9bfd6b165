"""`Fp8PtpcOnlineLinearMethod`: bf16 weights at load, FP8 per-channel weights after loading, FP8
per-token activations at run time (PTPC, llmcompressor's FP8_DYNAMIC recipe).

After loading, each output channel gets `scale = max(amax / fp8_max, 1 / (fp8_max * 512))` (amax
MAX-reduced over the TP ranks of a row-parallel layer, so every shard uses the unsharded model's
scale) and codes `round(w / scale)`, quantized in row chunks to bound peak memory. The layer then
advertises its kernel's input key, so a producer may hand it a pre-quantized activation.
"""

import torch
import torch.distributed as dist

from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.kernels.linear import init_fp8_linear_kernel
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    expose_input_quant_key,
)
from vllm.model_executor.layers.linear import LinearMethodBase, RowParallelLinear
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import current_platform

_CHUNK_ELEMENTS = 16 * 1024 * 1024  # quantize at most this many weights at a time


def quantize_weight_per_channel(
    weight: torch.Tensor, amax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel FP8 codes `[N, K]` and scales `[N, 1]` of `weight` given its fp32 row
    amax, in the platform's FP8 dtype."""
    quant_dtype = current_platform.fp8_dtype()
    fp8_max = current_platform.fp8_max(quant_dtype)
    amax = amax.reshape(-1, 1)
    # A tensor divisor keeps the division correctly rounded on CUDA.
    scale = torch.clamp(
        amax / amax.new_full((), fp8_max), min=current_platform.fp8_min_scale(quant_dtype)
    )
    codes = torch.empty(weight.shape, dtype=quant_dtype, device=weight.device)
    rows = max(1, _CHUNK_ELEMENTS // max(1, weight.shape[1]))
    for start in range(0, weight.shape[0], rows):
        w = weight[start : start + rows].float()
        s = scale[start : start + rows]
        codes[start : start + rows] = (w / s).clamp(-fp8_max, fp8_max).to(quant_dtype)
    return codes, scale


class Fp8PtpcOnlineLinearMethod(LinearMethodBase):
    """Online PTPC FP8 for a linear layer."""

    weight_quant_key = kFp8StaticChannelSym
    activation_quant_key = kFp8DynamicTokenSym

    def create_weights(
        self,
        layer,
        input_size_per_partition,
        output_partition_sizes,
        input_size,
        output_size,
        params_dtype,
        weight_loader,
    ) -> None:
        super().create_weights(
            layer,
            input_size_per_partition,
            output_partition_sizes,
            input_size,
            output_size,
            params_dtype,
            weight_loader,
        )
        layer.fp8_linear = init_fp8_linear_kernel(
            self.activation_quant_key,
            self.weight_quant_key,
            input_dtype=params_dtype,
            out_dtype=params_dtype,
            weight_shape=(sum(output_partition_sizes), input_size_per_partition),
            module_name=getattr(layer, "prefix", None),
        )

    def process_weights_after_loading(self, layer) -> None:
        if getattr(layer, "_fp8_weights_processed", False):
            return
        weight = layer.weight.data  # [N, K_local] in the checkpoint dtype
        amax = weight.abs().amax(dim=1).float()
        if isinstance(layer, RowParallelLinear) and layer.tp_size > 1:
            amax = tensor_model_parallel_all_reduce(amax, op=dist.ReduceOp.MAX)
        codes, scale = quantize_weight_per_channel(weight, amax)
        layer.weight = torch.nn.Parameter(codes.t(), requires_grad=False)  # [K, N] view
        layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)  # [N, 1]
        layer.fp8_linear.process_weights_after_loading(layer)
        expose_input_quant_key(layer, layer.fp8_linear)
        layer._fp8_weights_processed = True

    def apply(
        self,
        layer,
        x: "torch.Tensor | QuantizedActivation",
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return layer.fp8_linear.apply_weights(layer, x, bias)
