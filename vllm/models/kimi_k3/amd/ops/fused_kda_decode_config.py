"""Launch configurations of the fused KDA decode (`fused_kda_decode.py`): the V-split width,
warps, the epilogue's window-shift programs, whether the kernel computes the gate projections (and
how it tiles them) and whether the state is evicted first from L2, chosen on the host from the
shapes alone, with the H200 measurements behind each choice.
"""

from dataclasses import dataclass

from vllm.config.vllm import decode_batch_class
from vllm.triton_utils import next_power_of_2


@dataclass(frozen=True)
class KdaDecodeConfig:
    """Launch parameters of the Triton path.

    `block_v`: value columns per program, a power of two dividing D. `block_v == D` is the
    single-kernel variant (program per (sequence, head), norm in the kernel); below D the V-split
    variant (program per (sequence, head, V block) on a `[D, block_v]` state tile, then the
    epilogue kernel).

    `shift_programs`: the V-split epilogue's window-shift programs per token, at most (see
    `kda_epilogue_tiling`); None takes `kda_epilogue_programs` for the launch's shapes.

    `gate_proj`: whether a caller that can (the layer, where `f_b_proj` / `g_b_proj` are plain
    linears) passes `raw_g` and `gate` as `LowRankProj` for the kernel to compute, or runs the
    linears first. The op computes whatever it is passed; the choice is made here because its
    cost depends on the launch: each of a head's D / block_v programs recomputes raw_g.

    `evict_state`: load and store the state tile with the `evict_first` cache policy, so that
    its lines, touched once a step, are the first to leave L2 (`kda_decode_config`).
    """

    block_v: int
    num_warps: int
    shift_programs: int | None = None
    gate_proj: bool = False
    evict_state: bool = False


# Sequences for which `kda_decode_config` evicts the state first. H200, Kimi-Linear (32 heads of
# 128), the engine's quantizing call (docs/performance.md, "Thirteenth run"): in the engine's
# profile at batch 64 the KDA decode took 1654 against 1779 us a step (79.0% against 73.4% of its
# floor; the kernel benchmark: 82.4 against 88.8 us, and the epilogue after it 4.1 against 5.1,
# the state's dirty lines no longer crowding L2), at 128 in the kernel benchmark 166.3 against
# 172.5 us; no gain in the engine at batch 1 and 8 (152 against 148, 336 against 338 us; the
# kernel benchmark, alone on the GPU, gains there), and slower at 256 (344 against 338 us).
EVICT_STATE_MIN_BATCH = 64
EVICT_STATE_MAX_BATCH = 128
# A shift program moves at most this many window elements (channels x BLOCK_W) per tile: 32 a
# thread with the epilogue kernel's 4 warps, all loaded before any is stored.
_SHIFT_TILE = 4096
# Shift programs per SM that `kda_epilogue_programs` aims for: about one wave of blocks, each with
# a whole tile of loads in flight, instead of many waves of one-row blocks.
_SHIFT_PROGRAMS_PER_SM = 4

# Programs per SM the V-split's block width must give: the widest of 64 and 32 columns that
# does, else 16. With the gate projections in the kernel (`gate_proj`, up to
# `GATE_PROJ_MAX_BATCH`) each of a head's programs re-reads its f_b slice, so the narrowest
# blocks are not the fastest. H100, benchmark_kda_decode.py --sweep-gate-proj --quantize
# (docs/performance.md, "Fifty-seventh run"), us per call with its epilogue: Kimi-Linear (32
# heads): 1 / 2 / 4 sequences take 16 / 32 / 64 columns, 9.2 / 11.0 / 15.9 (the best 8.9 / 11.0 /
# 15.3), where the previous rule's 16 columns took 9.2 / 13.4 / 20.0. Kimi-K3 TP8 (12 heads): 4 /
# 8 sequences take 32 / 64 columns, 9.0 (64 columns 8.99, a tie) / 11.9 (the best) against 9.2 /
# 14.3; at 1-2 its 16 columns are within 10% of the best. The engine (the 48B config with 128
# experts, H100): 2 sequences 3.84 against 3.89 ms a step at 1k context, 4 sequences 5.48
# against 5.59, one sequence unchanged.
_MIN_PROGRAMS_PER_SM = 1

# `kda_decode_config` has the kernel compute the gate projections up to this many sequences. The
# kernel re-reads a head's 32 KB f_b slice (Kimi-Linear, D = R = 128) per program: N * H * D /
# block_v slices, 32 MB from L2 at batch 16 (64-column blocks), 128 MB at 64. On the H200
# (benchmark_kda_decode.py --gate-proj --quantize, 2026-12-01, docs/performance.md "Seventh run"),
# fused against the two GEMVs plus the kernels: 12.8 / 15.0 us at batch 1, 22.8 / 26.6 at 8, 36.2
# / 36.8 at 16, but 63.0 / 57.6 at 32 and 114 / 97 at 64; batch 4, then in 16-column V blocks
# (8 programs per head; 64-column ones since the fifty-seventh run), was the exception below the
# cut, 21.7 / 20.7.
GATE_PROJ_MAX_BATCH = 16


def kda_epilogue_programs(n: int, heads: int, d: int, num_sms: int) -> int:
    """Window-shift programs per token of the V-split epilogue, for N sequences on `num_sms` SMs.

    Aims at `_SHIFT_PROGRAMS_PER_SM` programs per SM over the batch, between one program per
    q or k head row (2 * heads: small batches, where latency and not bytes bound the launch) and
    one `_SHIFT_TILE` tile per program at conv width 4 (large batches: fewer, fatter programs).
    """
    rows = 2 * heads
    fewest = max(1, -(-rows * d // (_SHIFT_TILE // 4)))
    return max(fewest, min(rows, _SHIFT_PROGRAMS_PER_SM * num_sms // max(n, 1)))


def kda_epilogue_tiling(channels: int, programs: int, block_w: int) -> tuple[int, int, int]:
    """`(block_c, span, grid)`: channels per tile, channels per program (a multiple of block_c)
    and shift programs (at most `programs`) for the q | k `channels` of a token.

    `block_c` is a power of two dividing `channels` (so no tile is partial), at most
    `_SHIFT_TILE // block_w`: the smallest one covering a program's share where those allow.
    """
    share = -(-channels // programs)
    block_c = min(1 << (share - 1).bit_length(), channels & -channels)
    block_c = min(block_c, max(1, _SHIFT_TILE // block_w))
    span = -(-share // block_c) * block_c
    return block_c, span, -(-channels // span)


def kda_decode_config(n: int, heads: int, d: int, num_sms: int) -> KdaDecodeConfig:
    """The default launch for N sequences of `heads` heads of dim `d` on `num_sms` SMs.

    The single kernel holds a [D, D] fp32 tile per program (at D = 128 with 8 warps, 168
    registers a thread on sm_90 with Triton 3.6: one program per SM), so its state loads,
    prologue and reductions barely overlap. The split variant's [D, 64] tiles with 4 warps
    give twice as many programs and let several share an SM: on an H200 at Kimi-Linear sizes
    (32 heads of 128) 89 / 336 us at batch 64 / 256 against 97 / 375 with [D, 32] tiles and
    145 / 554 for the single kernel (2026-12-01). Narrower [D, 32], then [D, 16] blocks when
    that would not put `_MIN_PROGRAMS_PER_SM` programs on every SM. At D = 64 the 64-column
    block is the single kernel (not measured against the split there).
    Small heads have small tiles: no split. The epilogue's shift programs: see
    `kda_epilogue_programs`. Gate projections in the kernel up to `GATE_PROJ_MAX_BATCH`, and the
    state evicted first from L2 from `EVICT_STATE_MIN_BATCH` to `EVICT_STATE_MAX_BATCH`.

    Chosen for N's batch class (`decode_batch_class`: the size of the graph N would replay), so
    an eager decode (a mixed step's decode rows) launches what the graphs' capture compiled.
    """
    n = decode_batch_class(n)
    gate_proj = n <= GATE_PROJ_MAX_BATCH
    evict = EVICT_STATE_MIN_BATCH <= n <= EVICT_STATE_MAX_BATCH
    if d < 64:
        return KdaDecodeConfig(block_v=d, num_warps=4, gate_proj=gate_proj, evict_state=evict)
    least = _MIN_PROGRAMS_PER_SM * num_sms
    block_v = next((b for b in (64, 32) if n * heads * (d // b) >= least), 16)
    shift_programs = kda_epilogue_programs(n, heads, d, num_sms)
    return KdaDecodeConfig(block_v, 4, shift_programs, gate_proj, evict)


# Weight elements per [rows, BLOCK_R] chunk of a gate projection taken in chunks (32 a thread at 4
# warps for D rows), and the most a V-split program loads whole (Kimi-Linear's D = R = 128).
_PROJ_TILE = 4096
_WHOLE_RANK_TILE = 16384


def gate_proj_tiling(rank: int, d: int, block_v: int) -> tuple[int, bool]:
    """``(BLOCK_R, whole)`` for in-kernel gate projections of rank ``rank`` (0: none) at head
    dim ``d`` and ``block_v`` columns a program: the V-split (``block_v < d``) loads the whole
    rank with its other loads where the ``[d, BLOCK_R]`` tile fits ``_WHOLE_RANK_TILE``; the
    single kernel, and wider ranks, take ``_PROJ_TILE`` chunks after the sums.

    ``BLOCK_R`` never equals ``block_v``: a projection tile shaped like the state tile
    ``[d, block_v]`` gets the state tile the projection's layout (bf16 rows) in Triton's
    layout assignment, which changes the order of the state's sums against the same kernel
    without projections (sm_90 TTGIR; the compile test checks it)."""
    block_r = next_power_of_2(max(rank, 1))
    whole = block_v < d and block_r * d <= _WHOLE_RANK_TILE
    if not whole:
        block_r = min(block_r, max(1, _PROJ_TILE // d))
    if block_r == block_v:
        block_r = block_r * 2 if whole else max(1, block_r // 2)
    return block_r, whole
