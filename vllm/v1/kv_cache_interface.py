"""What each attention layer keeps per sequence, for the cache manager to size its pools from.

Two kinds of layer state, one spec each (frozen: a spec is a value, compared and hashed):

- `KDAStateSpec`: a linear-attention layer keeps a fixed-size state per sequence slot, whatever
  the sequence length: the short-conv window and the recurrent state.
- `MLAAttentionSpec`: an MLA layer caches one latent entry per token, in paged blocks.

The shapes are a layer's local (tensor-parallel) ones, without the leading slot / block dims.
"""

import math
from dataclasses import dataclass

import torch


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


@dataclass(frozen=True)
class KDAStateSpec:
    """One KDA layer's state per slot: conv window `conv_shape` and recurrent state `ssm_shape`."""

    conv_shape: tuple[int, ...]  # [3 * H_local * K, conv_kernel_size - 1]
    conv_dtype: torch.dtype
    ssm_shape: tuple[int, ...]  # [H_local, K, V]
    ssm_dtype: torch.dtype

    @property
    def bytes_per_slot(self) -> int:
        return _nbytes(self.conv_shape, self.conv_dtype) + _nbytes(self.ssm_shape, self.ssm_dtype)


@dataclass(frozen=True)
class MLAAttentionSpec:
    """One MLA layer's paged cache: per token an entry of `entry_size` (kv_lora_rank + rope)."""

    entry_size: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return self.entry_size * self.dtype.itemsize

    def bytes_per_block(self, block_size: int) -> int:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return block_size * self.bytes_per_token


KVCacheSpec = KDAStateSpec | MLAAttentionSpec
