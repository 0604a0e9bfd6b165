"""A PTPC FP8 `o_proj`-like layer for the kernel-selection tests of faked platforms: built under
whatever platform the test installed, so its FP8 kernel is the one that platform selects."""

import torch

from vllm.config.quantization import parse_quantization_config
from vllm.model_executor.layers.linear import RowParallelLinear
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

N, K = 96, 256  # N and K multiples of 16; small enough for the GEMV on NVIDIA


def ptpc_o_proj(seed: int = 0) -> RowParallelLinear:
    """`[K] -> [N]` bf16 weights drawn from `seed`, quantized online per channel."""
    config = OnlineQuantizationConfig(parse_quantization_config({"linear": "fp8_per_channel"}))
    layer = RowParallelLinear(K, N, bias=False, params_dtype=torch.bfloat16, quant_config=config)
    gen = torch.Generator().manual_seed(seed)
    layer.weight_loader(layer.weight, (torch.randn(N, K, generator=gen) * 0.05).to(torch.bfloat16))
    layer.process_weights_after_loading()
    return layer
