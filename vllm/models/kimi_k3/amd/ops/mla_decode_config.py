"""Launch configurations of the MLA paged decode (`mla_decode.py`): the tiles, warps, stages,
split count, merge form and latent chunks of its Triton kernels, chosen on the host from the
shapes alone (never from `seq_lens`, so a captured graph stays valid), with the H200
measurements behind each choice.
"""

from dataclasses import dataclass

from vllm.config.vllm import decode_batch_class
from vllm.platforms import current_platform
from vllm.triton_utils import next_power_of_2

# A split shorter than this spends more on its partial's write and merge (a [H, L] fp32 row, 64
# KiB at Kimi-Linear's sizes, against 147 KiB of bf16 cache) than it saves, once the splits are
# more than the one-tile ones (`_ONE_TILE_SPLITS`, below).
_MIN_SPLIT_TOKENS = 128
# Bounds the partial buffer ([N, H, splits, L] fp32: 8 MiB at N = 1 for Kimi-Linear's sizes).
_MAX_SPLITS = 128
# Programs of the default launch that an SM holds at once (registers, shared memory): one wave.
_PROGRAMS_PER_SM = 1
# Shared memory of the wide default on CUDA, bf16 [64, 576] tiles with 5 stages (Triton 3.6,
# sm_90).
_PIPELINED_WIDE_SMEM = 189440
# tl.dot needs every dimension of its operands to be at least 16.
MIN_DOT = 16
# Splits the one-launch merge reads per step, their log-sum-exps as one vector.
MERGE_CHUNK = 16
# A single sequence's short capacity is cut into splits of one tile, up to this many (three merge
# steps of 16 in the merges of the time); several sequences' into up to `MERGE_CHUNK`. The count
# is of the capacity's tiles rounded up: rounded down (before), a capacity between multiples of 64
# got one split too few, so two tiles a split. On the H200 (benchmark_mla_decode.py, the capacity
# the context + 32 rounded up to 16-token blocks as the engine's, docs/performance.md "Eighteenth
# run"), one sequence in 16-head blocks: 1034 tokens in 17 one-tile splits 9.88 us against 11.73
# in the 16 of one merge chunk (nine of two tiles; same call); 2058 tokens in 33, 10.87 us, the
# best of 16, 32 and 33; 4106 tokens in 33 splits of two tiles 13.66 us, against 15.48 in 32 of
# three and 18.14 in 65 of one in an earlier call: more one-tile splits than this cost the merge
# more than they save. Several sequences keep `MERGE_CHUNK`: the engine was timed at one sequence
# only, and at 2-4 sequences the kernel benchmark printed each config's best count only (32-head
# blocks: 33 no slower than 16 or 32 at 2058-4106 tokens), not every count.
_ONE_TILE_SPLITS = 33
# Partial bytes (`num_splits * block_h * L * 4`) up to which the default merges in the split
# launch. One program reads them all, while the merge kernel spreads them over hundreds. On the
# H200 (benchmark_mla_decode.py, engine-wide tables, 2026-12-01, docs/performance.md "Eighth
# run") the one-launch form lost at every split count from 4 up, batch 1-128, e.g. 28.0 against
# 23.7 us at 8 splits, batch 16, 1k context; at 2 splits of 32 heads (128 KiB, batch 64) it won
# at 1k context (53.0 against 56.9 us) and lost at 8k (311.8 against 301.5), and is kept there.
_FUSED_MERGE_MAX_BYTES = 128 * 1024
# Latent chunks of the pipelined wide tiles ([64, 576] bf16, 8 warps, 5 stages). The scores'
# MMA chains, not HBM, set the pace of one program there (ncu: short-scoreboard and fixed-latency
# stalls, one program per SM): on the H200 (benchmark_mla_decode.py, 2026-12-02,
# docs/performance.md "Eleventh run") 4 chunks took batch 64 from 304.4 to 252.1 us at 8k context
# (46% to 56% of copy) and from 1135 to 930 us at 32k (50% to 61%), batch 1 from 19.5 to 17.3 us
# at 8k; 2 chunks gained about half as much.
_PIPELINED_WIDE_CHUNKS = 4
# Batch 1 takes 16-head blocks: twice the programs, half the `tl.dot` work per cache tile each
# (H200, same run: 12.0 / 19.5 us at 1k / 8k context against 14.6 / 22.6 with 32-head blocks;
# at batch 4 and up the 32-head blocks are faster).
_SINGLE_SEQUENCE_BLOCK_H = 16
# Arrival counters a caller holds for the one-launch merge (mla_decode.py): more than the
# (sequence, head block) pairs of any default launch that splits (at most half the SMs).
DECODE_COUNTERS = 1024


@dataclass(frozen=True)
class MlaDecodeConfig:
    """Launch parameters of the Triton path (all powers of two except `num_splits`).
    `fused_merge`: merge the splits in the split launch (needs `counters`), else in a second
    launch; no merge either way with one split. `latent_chunks`: 1, 2 or 4 column chunks of the
    latent in the split kernel (mla_decode.py), each at least 16 columns of the padded
    latent."""

    num_splits: int
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    fused_merge: bool = False
    latent_chunks: int = 1


def mla_decode_config(
    n: int,
    heads: int,
    latent: int,
    capacity: int,
    num_sms: int,
    max_smem: int = 2**31,
    elem_bytes: int = 2,
    counters: int = 0,
) -> MlaDecodeConfig:
    """The default launch for N sequences of `heads` heads over `capacity` cached positions, with
    `counters` arrival counters for the one-launch merge (0: two launches).

    Decode reads the cache once, so the kernel is bound by the bytes in flight per SM. Wide
    latents on CUDA: `[64, 576]` bf16 cache tiles (72 KiB), 8 warps, 5 stages, one program per
    SM. The cache rows are found through the block table and Triton's pipeliner spends two
    stages on that indirection: below 5 stages each tile is loaded into a single buffer after
    the previous one is consumed, so loads and compute do not overlap (sm_90, Triton 3.6 and
    3.9). At 5 stages the tiles are double buffered (two in flight, ~185 KiB of shared memory;
    ~216 registers a thread, so one program per SM). Where that does not fit the shared memory
    a program may use (`max_smem`, bytes: A100 164 KiB, Ada 99 KiB; fp32 caches, `elem_bytes`
    4, need twice as much), single-buffered `[32, 576]` tiles with 2 stages; ROCm keeps 32-token
    tiles and one stage (64 KiB of LDS).

    Splits: as many as fill one wave (`_PROGRAMS_PER_SM * num_sms` programs, rounded down so that
    equal-length sequences leave no nearly empty last wave), at most `_MAX_SPLITS`, and no split
    shorter than `_MIN_SPLIT_TOKENS` positions of capacity, except that a short capacity is cut
    into splits of one tile, up to `_ONE_TILE_SPLITS` of them for one sequence and `MERGE_CHUNK`
    for more: a program's time grows with its tiles (on the H200 a `[16 heads, 64 tokens]` tile
    costs it about 2 us of `tl.dot` operand traffic, not HBM time), while the merges cost more
    with more splits (the one-launch merge reads `MERGE_CHUNK` a step; the two-launch merge
    unrolls up to 66 and loops over the live ones past them).

    Heads: blocks of up to 32 (`BLOCK_H`), of 16 for a single wide-latent sequence on CUDA
    (`_SINGLE_SEQUENCE_BLOCK_H`).

    Latent chunks: `_PIPELINED_WIDE_CHUNKS` for the pipelined wide tiles (measured there), else
    one.

    Merge: in the split launch where there are splits, one latent chunk, counters for every
    (sequence, head block) and at most `_FUSED_MERGE_MAX_BYTES` of partials per merging program
    (`num_splits * block_h * latent * 4`); not on ROCm, where the ordering argument (PTX's) is
    unchecked. With chunks the one-launch form's merge code costs the main loop more than the
    second launch costs (H200, same run: 267.6 against 252.1 us at batch 64, 8k context; 1009
    against 930 at 32k). At 1k context, where one chunk merged in one launch had won, the engine's
    7 MLA layers at batch 64 took 343 us a step with 4 chunks and two launches against 391 with
    one chunk and one launch (docs/performance.md, "Eleventh run").

    Depends on shapes only, so a captured graph stays valid for every `seq_lens`, and on N only
    through its batch class (`decode_batch_class`), so an eager decode launches what a graph's
    capture compiled.
    """
    n = decode_batch_class(n)
    wide = next_power_of_2(latent) >= 256
    rocm = current_platform.is_rocm()
    widest_h = _SINGLE_SEQUENCE_BLOCK_H if n == 1 and wide and not rocm else 32
    block_h = max(MIN_DOT, min(next_power_of_2(heads), widest_h))
    if rocm:
        block_n, num_warps, num_stages = (32, 8, 1) if wide else (64, 4, 1)
    elif not wide:
        block_n, num_warps, num_stages = 64, 4, 2
    elif max_smem >= _PIPELINED_WIDE_SMEM * elem_bytes // 2:
        block_n, num_warps, num_stages = 64, 8, 5
    else:
        block_n, num_warps, num_stages = 32, 8, 2
    chunks = _PIPELINED_WIDE_CHUNKS if (block_n, num_warps, num_stages) == (64, 8, 5) else 1
    head_blocks = -(-heads // block_h)
    programs = n * head_blocks
    one_tile = min(-(-capacity // block_n), _ONE_TILE_SPLITS if n == 1 else MERGE_CHUNK)
    longest = max(capacity // _MIN_SPLIT_TOKENS, one_tile)
    splits = max(1, min(_PROGRAMS_PER_SM * num_sms // programs, longest, _MAX_SPLITS))
    fused = (
        splits > 1
        and not rocm
        and chunks == 1
        and counters >= programs
        and splits * block_h * latent * 4 <= _FUSED_MERGE_MAX_BYTES
    )
    return MlaDecodeConfig(splits, block_h, block_n, num_warps, num_stages, fused, chunks)


def merge_block_l(n: int, heads: int, latent: int, num_sms: int) -> int:
    """Output columns per merge program: narrower until there are ~4 programs per SM, so that a
    small batch reads its partials from many SMs at once. Chosen for N's batch class, as
    `mla_decode_config`."""
    n = decode_batch_class(n)
    block = next_power_of_2(latent)
    while block > 64 and n * heads * -(-latent // block) < 4 * num_sms:
        block //= 2
    return block
