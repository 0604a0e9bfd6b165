"""The QuantizedActivation contract: which kernels consume pre-quantized input, the layer bridge,
and the validation `as_quantized_activation` performs."""

import dataclasses

import pytest
import torch

from vllm.model_executor.kernels.linear import ALL_FP8_KERNELS
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    as_quantized_activation,
    expose_input_quant_key,
    get_input_quant_key,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)

SUPPORTING = {
    "AiterHipbMMPerTokenFp8ScaledMMLinearKernel",
    "AiterPreshuffledPerTokenFp8ScaledMMLinearKernel",
    "AiterPerTokenFp8ScaledMMLinearKernel",
    "RowWiseTorchFP8ScaledMMLinearKernel",
    "ChannelWiseTorchFP8ScaledMMLinearKernel",
}
PTPC_CONFIG = FP8ScaledMMLinearLayerConfig(
    kFp8DynamicTokenSym, kFp8StaticChannelSym, (32, 64), torch.bfloat16, torch.bfloat16
)


def probe(cls):
    # No constructor: hardware-gated setup must not run to answer the question.
    kernel = cls.__new__(cls)
    kernel.config = PTPC_CONFIG
    return kernel


def test_only_known_kernels_consume_prequantized_input():
    consuming = {name for name, cls in ALL_FP8_KERNELS.items() if probe(cls).input_quant_key()}
    assert consuming == SUPPORTING
    for name in SUPPORTING:
        assert probe(ALL_FP8_KERNELS[name]).input_quant_key() == kFp8DynamicTokenSym


@pytest.mark.parametrize("name", sorted(SUPPORTING))
def test_consuming_kernels_go_through_the_helper(name):
    apply_weights = ALL_FP8_KERNELS[name].apply_weights
    assert "as_quantized_activation" in apply_weights.__code__.co_names


def test_bridge_marks_consumers_and_leaves_others_unmarked():
    consumer, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expose_input_quant_key(
        consumer, probe(ALL_FP8_KERNELS["ChannelWiseTorchFP8ScaledMMLinearKernel"])
    )
    expose_input_quant_key(other, probe(ALL_FP8_KERNELS["PerTensorTorchFP8ScaledMMLinearKernel"]))
    assert get_input_quant_key(consumer) == kFp8DynamicTokenSym
    assert get_input_quant_key(other) is None
    consumer.requires_unquantized_input = True  # e.g. LoRA needs the raw activation
    assert get_input_quant_key(consumer) is None


def make_qa(m=5, k=64, **changes):
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(m, k, generator=gen).to(kFp8DynamicTokenSym.dtype)
    scale = torch.rand(m, 1, generator=gen)
    qa = QuantizedActivation(data, scale, torch.bfloat16, torch.Size([m, k]), kFp8DynamicTokenSym)
    return dataclasses.replace(qa, **changes)


def test_as_quantized_activation_accepts_a_match_and_ignores_plain_tensors():
    qa = make_qa()
    assert as_quantized_activation(qa, kFp8DynamicTokenSym, 64) is qa
    plain = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    assert as_quantized_activation(plain, kFp8DynamicTokenSym, 64) is None
    # leading dims that flatten to M are fine
    qa3 = make_qa(data=qa.data.view(5, 1, 64))
    assert as_quantized_activation(qa3, kFp8DynamicTokenSym, 64) is qa3


@pytest.mark.parametrize(
    "message,kwargs,expected_key,k",
    [
        ("expects", {}, kFp8DynamicTensorSym, 64),
        ("expects None", {}, None, 64),
        ("does not view as", {}, kFp8DynamicTokenSym, 32),
        ("but its key says", {"data": torch.zeros(5, 64, dtype=torch.float8_e5m2)},
         kFp8DynamicTokenSym, 64),
        ("scale must be", {"scale": torch.ones(5)}, kFp8DynamicTokenSym, 64),
        ("scale must be", {"scale": torch.ones(5, 1, dtype=torch.float64)},
         kFp8DynamicTokenSym, 64),
        ("scale must be", {"scale": torch.ones(4, 1)}, kFp8DynamicTokenSym, 64),
        ("scale must be", {"scale": torch.ones(5, 1, device="meta")}, kFp8DynamicTokenSym, 64),
        # orig_shape must describe the data: last dim K, leading dims multiplying to M
        ("orig_shape", {"orig_shape": torch.Size([5, 32])}, kFp8DynamicTokenSym, 64),
        ("orig_shape", {"orig_shape": torch.Size([2, 2, 64])}, kFp8DynamicTokenSym, 64),
        ("orig_shape", {"orig_shape": torch.Size([])}, kFp8DynamicTokenSym, 64),
    ],
)  # fmt: skip
def test_as_quantized_activation_rejects(message, kwargs, expected_key, k):
    with pytest.raises(ValueError, match=message):
        as_quantized_activation(make_qa(**kwargs), expected_key, k)


def test_orig_shape_with_leading_dims_and_orig_dtype_against_a_fixed_output_dtype():
    qa = make_qa(m=6, orig_shape=torch.Size([2, 3, 64]))
    assert as_quantized_activation(qa, kFp8DynamicTokenSym, 64, torch.bfloat16) is qa
    with pytest.raises(ValueError, match="orig_dtype torch.float32 differs .* torch.bfloat16"):
        as_quantized_activation(
            make_qa(orig_dtype=torch.float32), kFp8DynamicTokenSym, 64, torch.bfloat16
        )


def test_foreign_fp8_flavour_is_rejected():
    other = (
        torch.float8_e4m3fnuz
        if kFp8DynamicTokenSym.dtype == torch.float8_e4m3fn
        else torch.float8_e4m3fn
    )
    key = QuantKey(other, kFp8DynamicTokenSym.scale)
    qa = make_qa(data=torch.zeros(5, 64, dtype=other), quant_key=key)
    with pytest.raises(ValueError, match="platform's FP8 dtype"):
        as_quantized_activation(qa, key, 64)


def test_weak_ref_keeps_values():
    qa = make_qa()
    ref = qa.weak_ref()
    assert ref.data.data_ptr() == qa.data.data_ptr() and torch.equal(ref.scale, qa.scale)
    assert ref.quant_key == qa.quant_key and ref.orig_shape == qa.orig_shape
