"""GroupShape, ScaleDesc and QuantKey: the descriptors producers and consumers agree through."""

import dataclasses

import pytest
import torch

from vllm.model_executor.layers.quantization.utils.quant_utils import (
    FP8_DTYPE,
    GroupShape,
    QuantKey,
    ScaleDesc,
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
    kFp8StaticTensorSym,
)
from vllm.platforms import current_platform


def test_group_shape_predicates():
    assert GroupShape.PER_TENSOR.is_per_tensor() and not GroupShape.PER_TENSOR.is_per_token()
    assert GroupShape.PER_TOKEN.is_per_token() and GroupShape.PER_TOKEN == (1, -1)
    assert GroupShape.PER_CHANNEL.is_per_channel() and GroupShape.PER_CHANNEL == (-1, 1)
    assert GroupShape(1, 128).is_per_group() and not GroupShape(1, 128).is_per_token()


def test_quant_keys_are_frozen_and_value_equal():
    rebuilt = QuantKey(FP8_DTYPE, ScaleDesc(torch.float32, False, GroupShape(1, -1)))
    assert rebuilt == kFp8DynamicTokenSym and hash(rebuilt) == hash(kFp8DynamicTokenSym)
    assert kFp8DynamicTokenSym != kFp8DynamicTensorSym
    assert kFp8DynamicTokenSym != QuantKey(FP8_DTYPE, kFp8DynamicTokenSym.scale, symmetric=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        kFp8DynamicTokenSym.symmetric = False


def test_ptpc_keys():
    assert FP8_DTYPE == current_platform.fp8_dtype()
    assert not kFp8DynamicTokenSym.scale.static
    assert kFp8DynamicTokenSym.scale.group_shape.is_per_token()
    assert kFp8StaticChannelSym.scale.static
    assert kFp8StaticChannelSym.scale.group_shape.is_per_channel()
    assert kFp8StaticTensorSym.scale.group_shape.is_per_tensor()
    assert str(kFp8DynamicTokenSym).startswith("QuantKey(")
