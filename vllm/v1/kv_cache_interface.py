"""What each attention layer keeps per sequence, for the cache manager to size its pools from.

Two kinds of layer state, one spec each (frozen: a spec is a value, compared and hashed):

- `KDAStateSpec`: a linear-attention layer keeps a fixed-size state per sequence slot, whatever
  the sequence length: the short-conv window and the recurrent state.
- `MLAAttentionSpec`: an MLA layer caches one latent entry per token, in paged blocks.

The shapes are a layer's local (tensor-parallel) ones, without the leading slot / block dims.
`allocate_kv_caches` allocates what a model's spec (`model.get_kv_cache_spec()`, layer index ->
spec) describes; slot 0 and block 0 are reserved dummies that padded rows use (see
`vllm/models/kimi_k3/amd/metadata.py`), never handed to a sequence.
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


@dataclass
class KDAStatePool:
    """Per-slot state of one KDA layer: conv inputs (model dtype) and the fp32 recurrent state."""

    conv_state: torch.Tensor  # [S, 3 * H_local * K, W - 1]
    ssm_state: torch.Tensor  # [S, H_local, K, V]

    @classmethod
    def allocate(
        cls, spec: KDAStateSpec, num_slots: int, device: torch.device | str
    ) -> "KDAStatePool":
        """A zeroed pool of `num_slots` slots shaped by `spec`."""
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        conv = torch.zeros(num_slots, *spec.conv_shape, dtype=spec.conv_dtype, device=device)
        ssm = torch.zeros(num_slots, *spec.ssm_shape, dtype=spec.ssm_dtype, device=device)
        return cls(conv, ssm)

    @property
    def num_slots(self) -> int:
        return self.conv_state.shape[0]


def allocate_kv_caches(
    spec: dict[int, KVCacheSpec],
    num_blocks: int,
    block_size: int,
    num_kda_slots: int,
    device: torch.device | str,
) -> tuple[dict[int, KDAStatePool], dict[int, torch.Tensor]]:
    """Zeroed caches for `spec`: a KDA state pool of `num_kda_slots` slots per KDA layer, a
    `[num_blocks, block_size, entry_size]` cache per MLA layer. Slot 0 and block 0 are the
    reserved dummies, so a pool holds `num_kda_slots - 1` sequences."""
    if num_blocks < 2:
        raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
    if num_kda_slots < 2:
        raise ValueError(f"num_kda_slots must be >= 2 (slot 0 is reserved), got {num_kda_slots}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    kda_pools, mla_caches = {}, {}
    for i, layer_spec in spec.items():
        if isinstance(layer_spec, KDAStateSpec):
            kda_pools[i] = KDAStatePool.allocate(layer_spec, num_kda_slots, device)
        elif isinstance(layer_spec, MLAAttentionSpec):
            mla_caches[i] = torch.zeros(
                num_blocks, block_size, layer_spec.entry_size, dtype=layer_spec.dtype,
                device=device,
            )  # fmt: skip
        else:
            raise ValueError(f"spec[{i}]: unknown cache spec {layer_spec!r}")
    return kda_pools, mla_caches
