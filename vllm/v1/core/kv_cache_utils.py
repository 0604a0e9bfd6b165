"""Sizing the caches of the hybrid model from a memory budget.

Kimi's two kinds of cache grow differently: the MLA latent cache grows with context (paged in
blocks of `block_size` tokens), the KDA state is a fixed size per running sequence (one slot). The
engine keeps one KDA slot per schedulable sequence (`max_num_seqs`) and gives the rest of the
budget to MLA blocks. Block 0 and slot 0 are reserved dummies that padded CUDA-graph rows use, so
both counts include one more than can be handed out.
"""

import math
from dataclasses import dataclass

from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class CacheSizes:
    num_blocks: int  # including the reserved dummy block 0
    num_kda_slots: int  # including the reserved dummy slot 0
    max_concurrency: float  # sequences of max_model_len tokens that fit at once


def cache_bytes(spec: dict, block_size: int) -> tuple[int, int]:
    """(bytes of one MLA block over all layers, bytes of one KDA slot over all layers)."""
    block = slot = 0
    for layer_spec in spec.values():
        if hasattr(layer_spec, "bytes_per_slot"):
            slot += layer_spec.bytes_per_slot
        else:
            block += layer_spec.bytes_per_block(block_size)
    return block, slot


def blocks_per_sequence(max_model_len: int, block_size: int) -> int:
    """Cache blocks one sequence of `max_model_len` tokens holds at most: every token but its last
    sampled one, which ends it unfed (the scheduler's admission bound)."""
    return math.ceil((max_model_len - 1) / block_size)


class CacheSizeError(ValueError):
    """The cache arguments cannot hold what they must (found once the model's memory is known)."""


def determine_cache_sizes(
    spec: dict,
    block_size: int,
    max_num_seqs: int,
    max_model_len: int,
    budget_bytes: int | None = None,
    num_blocks_override: int | None = None,
) -> CacheSizes:
    """Blocks and slots for `budget_bytes` of cache memory (or exactly `num_blocks_override`
    blocks). Raises `CacheSizeError` when one sequence of `max_model_len` tokens would not fit."""
    block_bytes, slot_bytes = cache_bytes(spec, block_size)
    num_slots = max_num_seqs + 1
    blocks_per_seq = blocks_per_sequence(max_model_len, block_size)
    if num_blocks_override is not None:
        num_blocks = num_blocks_override + 1
    else:
        if budget_bytes is None:
            raise ValueError("determine_cache_sizes needs budget_bytes or num_blocks_override")
        left = budget_bytes - num_slots * slot_bytes
        if left <= 0:
            raise CacheSizeError(
                f"the cache budget ({budget_bytes / 2**30:.2f} GiB) does not hold the KDA states "
                f"of max_num_seqs={max_num_seqs} sequences ({slot_bytes / 2**20:.1f} MiB each): "
                "lower max_num_seqs or give the cache more memory"
            )
        # A model without MLA layers needs no blocks; keep the dummy and one sequence's worth.
        num_blocks = left // block_bytes if block_bytes else blocks_per_seq + 1
    if num_blocks - 1 < blocks_per_seq:
        # An override fixes the block count: neither max_num_seqs nor memory changes it.
        remedy = (
            f"raise num_gpu_blocks_override to at least {blocks_per_seq} or lower max_model_len"
            if num_blocks_override is not None
            else "lower max_model_len or max_num_seqs, or give the cache more memory"
        )
        raise CacheSizeError(
            f"{num_blocks - 1} cache blocks of {block_size} tokens cannot hold one sequence of "
            f"max_model_len={max_model_len} tokens ({blocks_per_seq} blocks): {remedy}"
        )
    concurrency = min(max_num_seqs, (num_blocks - 1) / blocks_per_seq)
    sizes = CacheSizes(int(num_blocks), num_slots, concurrency)
    logger.info(
        "KV cache: %d blocks of %d tokens (%.1f MiB), %d KDA slots (%.1f MiB), max concurrency "
        "%.2f at max_model_len %d",
        sizes.num_blocks - 1, block_size, sizes.num_blocks * block_bytes / 2**20,
        num_slots - 1, num_slots * slot_bytes / 2**20, concurrency, max_model_len,
    )  # fmt: skip
    return sizes
