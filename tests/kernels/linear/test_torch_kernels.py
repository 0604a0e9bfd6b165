"""Selection conditions of the torch FP8 kernels, answerable on CPU."""

import pytest
import torch

import vllm.platforms
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    ChannelWiseTorchFP8ScaledMMLinearKernel,
    RowWiseTorchFP8ScaledMMLinearKernel,
)
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import CudaPlatform


@pytest.mark.parametrize("capability,supported", [((8, 0), False), ((8, 9), True), ((9, 0), True)])
def test_rowwise_kernel_asks_the_platform_for_the_capability(monkeypatch, capability, supported):
    platform = CudaPlatform()
    platform.__dict__["device_capability"] = capability  # cached_property: no GPU needed
    monkeypatch.setattr(vllm.platforms, "current_platform", platform)
    assert RowWiseTorchFP8ScaledMMLinearKernel.is_supported()[0] is supported


@pytest.mark.parametrize(
    "cls", [RowWiseTorchFP8ScaledMMLinearKernel, ChannelWiseTorchFP8ScaledMMLinearKernel]
)
def test_ptpc_kernels_decline_other_schemes_with_a_reason(cls):
    def config(activation, weight):
        return FP8ScaledMMLinearLayerConfig(
            activation, weight, (32, 64), torch.bfloat16, torch.bfloat16
        )

    assert cls.can_implement(config(kFp8DynamicTokenSym, kFp8StaticChannelSym)) == (True, None)
    assert cls.can_implement(config(kFp8DynamicTensorSym, kFp8StaticChannelSym)) == (
        False,
        "needs per-token dynamic activations",
    )
    assert cls.can_implement(config(kFp8DynamicTokenSym, kFp8DynamicTensorSym)) == (
        False,
        "needs per-channel weights",
    )
