"""Routed experts above the GEMV path's sizes (from about 4 tokens of top-8 up to 8192-token
prefills): the routed rows are grouped by expert on the device, and two Triton GEMM kernels read
each expert's weight tile once per block of up to `block_m` of its rows.

`moe_experts_triton_grouped(x, w13, w2, topk_weights, topk_ids, act_and_mul)` computes what the
implementations in `experts.py` compute (`moe_experts_loop` is its reference), with the shapes and
dtypes of `moe_experts_triton` (experts_triton.py):

  x             `[T, H]` bf16 / fp16 / fp32, unit stride on the last dim
  w13           `[E, 2 * I, H]` (gate | up of each expert), x's dtype, unit stride on the last dim
  w2            `[E, H, I]`, x's dtype, unit stride on the last dim
  topk_weights  `[T, K]` floating point (read as fp32)
  topk_ids      `[T, K]` int32 / int64, values in `[0, E)` (not checked: that would read them on
                the host)
  act_and_mul   `SiluAndMul` or `SituAndMul` (fused_activation.py)
  returns       `[T, H]` in x's dtype

Steps (R = T * K routed rows, row r = (t, k) = (r // K, r % K)):

  grouping  `group_rows` (group_rows.py): `order` `[R]` int32, the rows sorted by expert (stable;
            ids outside `[0, E)` last), and the block table `[3, max_blocks]` int32: per block
            of up to `block_m` rows its expert (-1: unused), first and end sorted position. The
            grids below are static (`max_blocks_for`): programs of unused blocks return after
            reading the table.
  gate/up   grid (max_blocks * cdiv(I, block_n),). The block's rows of x (gathered by token) times
            block_n gate and block_n up columns of w13[e], `tl.dot` over H in chunks of block_k
            with fp32 accumulation; writes `a = act(gate) * up` `[R, I]` in sorted order.
  down      grid (max_blocks * cdiv(H, down_block_n),). The block's rows of `a` times down_block_n
            rows of w2[e], over I in chunks of down_block_k; writes `y` `[R, H]` in x's dtype at
            each row's (token, slot) position.
  sum       `moe_weighted_sum` (weighted_sum.py): `sum_k topk_weights[t, k] * y[t, k]` in fp32,
            slots in order (no atomics: deterministic), output in x's dtype.

Nothing reads a tensor value on the host: no sync, static shapes, CUDA-graph capturable.

Grid order: program p takes block p // tiles and output tile p % tiles, so the tiles of one
block run next to each other and read its rows of x (or `a`) from L2 after the first, and the
blocks of one expert follow each other and share its weight tiles in L2. With the block as the
fastest axis instead, a prefill's rows were read from HBM once per output tile (8 times for
gate/up, 18 for down at 128-wide tiles): 2963 against 2636 us at 8192 tokens on the H200, the
same at decode sizes (docs/performance.md, "Tenth run").

TMA: on NVIDIA GPUs from Hopper on (`supports_tma`), and for weights TMA can address
(`tma_operands_ok`), the prefill tiles read through tensor descriptors built on the host
(`triton.tools.tensor_descriptor.TensorDescriptor`): w13 as `[E * 2I, H]` rows, w2 as
`[E * H, I]` rows, and the down kernel's block rows of `a` `[R, I]`. A tile may run past its
expert's rows (gate into up, up into the next expert) or past its block's rows: those values only
reach output columns or rows that the stores mask, and TMA reads zeros past a tensor's end. The
rows of x, gathered by token, stay pointer loads (Hopper's TMA has no row gather, and a sorted
copy of x cost more than it saved). The products and their order are the pointer path's, so the
results are the same bits (tests). On the H200 at 8192 tokens of top-8 + shared, 2044 against
2349 us a layer for the two kernels (docs/performance.md, "Fourteenth run").

Tail blocks: an expert's rows fill `block_m`-row blocks but its last, and a 128-row tile multiplies
every row it holds, padding or not. In the engine's 8k prefill (docs/performance.md, "Twenty-sixth
run") 18% of the 128-row blocks' rows are padding, and a fifth of the blocks hold at most 64 rows.
With `tail_block_m`, a program whose block holds at most that many rows runs the same loop on
`tail_block_m`-row tiles (a second instantiation of the block's code in the kernel; the block
table is unchanged). It reads the same weight tiles, from L2 when its expert's full blocks ran
just before (grid order, above).

Rounding, as in experts_triton.py (chosen to match the references): `gate` and `up` are rounded
to x's dtype, and the activation's product is computed from them as its torch module rounds it
(`gated_product`, fused_activation.py) (`a`); each `y` row is rounded to x's dtype before the fp32
weighted sum.
fp32 inputs use IEEE fp32 dots (no TF32), so the kernels differ from the references only in the
GEMMs' accumulation order.

Launch shapes (`default_tiles`): `tl.dot` needs every tile dim >= 16, so block_m >= 16. They are
for Hopper at Kimi-Linear sizes (H 2304, I 1024, E 256, K 8). Up to 4096 rows (512 tokens), 1-16
rows per expert on average, the kernels are bound by reading the weights: 16- then 32-row blocks,
64 x 128 tiles (64 x 64 for fp32 gate/up), 4 warps, 3 stages; a bf16 gate/up stage holds 36 KB of
loads (x 4 KB, gate and up 16 KB each), a down stage 20 KB. Prefills have 16-290 rows per expert
and are bound by the MMAs: where the shared memory holds them, 64-row blocks with 128 x 64 tiles
at 4 stages, then 128-row blocks at 8 warps. `benchmarks/kernels/benchmark_moe.py
--tgrouped-configs` sweeps them.
"""

from functools import lru_cache
from typing import NamedTuple

import torch

from vllm.config.vllm import decode_batch_class
from vllm.model_executor.layers.fused_moe.experts_triton import (
    check_expert_shapes,
    check_power_of_two,
    check_triton_operands,
)
from vllm.model_executor.layers.fused_moe.group_rows import group_rows
from vllm.model_executor.layers.fused_moe.weighted_sum import moe_weighted_sum
from vllm.triton_utils import (
    cdiv,
    max_shared_memory,
    supports_tma,
    triton_interpreting,
)
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    from vllm.model_executor.layers.fused_moe.fused_activation import gated_product
    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton never select this path
    triton = None

if triton is not None:

    @triton.jit
    def _program_block(blocks_ptr, max_blocks, num_tiles):
        """(expert, first row, end row, output tile) of this program's block. One grid axis, the
        output tiles of a block fastest: a block's rows are read by its tiles one after another,
        from L2 after the first (module docstring, "grid order"). The three table entries are
        loaded together: one round trip before the block's loop, not two."""
        pid = tl.program_id(0)
        blk = pid // num_tiles
        e = tl.load(blocks_ptr + blk)
        row0 = tl.load(blocks_ptr + max_blocks + blk)
        row1 = tl.load(blocks_ptr + 2 * max_blocks + blk)
        return e, row0, row1, pid % num_tiles

    @triton.jit
    def _gate_up_block(
        x_ptr, w13_ptr, w13_desc, order_ptr, a_ptr, e, row0, row1, tile,
        stride_xt, stride_we, stride_wn, stride_ar, hidden, inter, beta, linear_beta,
        TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, ACT: tl.constexpr,
    ):  # fmt: skip
        # Expert e's sorted rows [row0, row1) (at most BLOCK_M) times output tile `tile`.
        rows = row0 + tl.arange(0, BLOCK_M)
        m_ok = rows < row1
        # int64: a token's offset into x can pass 2**31 elements in long prefills.
        tok = (tl.load(order_ptr + rows, mask=m_ok, other=0) // TOPK).to(tl.int64)
        n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < inter
        kk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + tok[:, None] * stride_xt + kk[None, :]
        # [BLOCK_K, BLOCK_N] views of the gate and up rows (H contiguous in memory).
        gate_ptrs = w13_ptr + e.to(tl.int64) * stride_we + n[None, :] * stride_wn + kk[:, None]
        up_ptrs = gate_ptrs + inter * stride_wn
        # TMA: [BLOCK_N, BLOCK_K] tiles of w13 as [E * 2I, H] rows (module docstring, "TMA").
        gate_row = e * 2 * inter + tile * BLOCK_N
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k_ok = k0 + kk < hidden
            xv = tl.load(x_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if TMA:
                gate = w13_desc.load([gate_row, k0]).T
                up = w13_desc.load([gate_row + inter, k0]).T
            else:
                w_mask = k_ok[:, None] & n_ok[None, :]
                gate = tl.load(gate_ptrs + k0, mask=w_mask, other=0.0)
                up = tl.load(up_ptrs + k0, mask=w_mask, other=0.0)
            acc_gate = tl.dot(xv, gate, acc_gate, input_precision=PRECISION)
            acc_up = tl.dot(xv, up, acc_up, input_precision=PRECISION)
        a = gated_product(acc_gate, acc_up, a_ptr.dtype.element_ty, ACT, beta, linear_beta)
        a_ptrs = a_ptr + rows[:, None] * stride_ar + n[None, :]
        tl.store(a_ptrs, a, mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _moe_grouped_gate_up_kernel(
        x_ptr, w13_ptr, w13_desc, order_ptr, blocks_ptr, a_ptr,
        stride_xt, stride_we, stride_wn, stride_ar,
        hidden, inter, max_blocks, beta, linear_beta,
        TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, ACT: tl.constexpr,
        TAIL_M: tl.constexpr = 0, PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        e, row0, row1, tile = _program_block(blocks_ptr, max_blocks, tl.cdiv(inter, BLOCK_N))
        if e < 0:
            return
        # Module docstring, "tail blocks": an expert's last block of at most TAIL_M rows takes
        # TAIL_M-row tiles (TAIL_M == 0: the condition is a constexpr False, so no tail code).
        if TAIL_M > 0 and row1 - row0 <= TAIL_M:
            _gate_up_block(x_ptr, w13_ptr, w13_desc, order_ptr, a_ptr, e, row0, row1, tile,
                           stride_xt, stride_we, stride_wn, stride_ar, hidden, inter, beta,
                           linear_beta, TOPK, TAIL_M, BLOCK_N, BLOCK_K, PRECISION, TMA,
                           ACT)  # fmt: skip
        else:
            _gate_up_block(x_ptr, w13_ptr, w13_desc, order_ptr, a_ptr, e, row0, row1, tile,
                           stride_xt, stride_we, stride_wn, stride_ar, hidden, inter, beta,
                           linear_beta, TOPK, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, TMA,
                           ACT)  # fmt: skip

    @triton.jit
    def _down_block(
        a_ptr, w2_ptr, a_desc, w2_desc, order_ptr, y_ptr, e, row0, row1, tile,
        stride_ar, stride_we, stride_wh, stride_yr, hidden, inter,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PRECISION: tl.constexpr, TMA: tl.constexpr,
    ):  # fmt: skip
        # Expert e's sorted rows [row0, row1) (at most BLOCK_M) of `a` times output tile `tile`.
        rows = row0 + tl.arange(0, BLOCK_M)
        m_ok = rows < row1
        h = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        h_ok = h < hidden
        kk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows[:, None] * stride_ar + kk[None, :]
        # [BLOCK_K, BLOCK_N] view of w2[e]'s rows h (I contiguous in memory).
        w_ptrs = w2_ptr + e.to(tl.int64) * stride_we + h[None, :] * stride_wh + kk[:, None]
        # TMA: [BLOCK_M, BLOCK_K] tiles of `a` from the block's first row (rows past its end are
        # other experts' or zeros, and only reach output rows the store masks) and
        # [BLOCK_N, BLOCK_K] tiles of w2 as [E * H, I] rows.
        w_row = e * hidden + tile * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            if TMA:
                av = a_desc.load([row0, k0])
                w = w2_desc.load([w_row, k0]).T
            else:
                k_ok = k0 + kk < inter
                av = tl.load(a_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs + k0, mask=k_ok[:, None] & h_ok[None, :], other=0.0)
            acc = tl.dot(av, w, acc, input_precision=PRECISION)
        # Back to (token, slot) order, so the weighted sum reads each token's K rows in order.
        dst = tl.load(order_ptr + rows, mask=m_ok, other=0).to(tl.int64)
        y_ptrs = y_ptr + dst[:, None] * stride_yr + h[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & h_ok[None, :])

    @triton.jit
    def _moe_grouped_down_kernel(
        a_ptr, w2_ptr, a_desc, a_tail_desc, w2_desc, order_ptr, blocks_ptr, y_ptr,
        stride_ar, stride_we, stride_wh, stride_yr,
        hidden, inter, max_blocks,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PRECISION: tl.constexpr, TMA: tl.constexpr,
        TAIL_M: tl.constexpr = 0, PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        e, row0, row1, tile = _program_block(blocks_ptr, max_blocks, tl.cdiv(hidden, BLOCK_N))
        if e < 0:
            return
        if TAIL_M > 0 and row1 - row0 <= TAIL_M:
            _down_block(a_ptr, w2_ptr, a_tail_desc, w2_desc, order_ptr, y_ptr, e, row0, row1,
                        tile, stride_ar, stride_we, stride_wh, stride_yr, hidden, inter,
                        TAIL_M, BLOCK_N, BLOCK_K, PRECISION, TMA)  # fmt: skip
        else:
            _down_block(a_ptr, w2_ptr, a_desc, w2_desc, order_ptr, y_ptr, e, row0, row1, tile,
                        stride_ar, stride_we, stride_wh, stride_yr, hidden, inter,
                        BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, TMA)  # fmt: skip


class GroupedTiles(NamedTuple):
    """Launch shapes of the gate/up and down kernels (`moe_experts_triton_grouped`'s arguments)."""

    block_m: int
    block_n: int
    block_k: int
    gate_up_warps: int
    gate_up_stages: int
    down_block_n: int
    down_block_k: int
    down_warps: int
    down_stages: int
    # Weight tiles (and the down kernel's rows of `a`) through TMA tensor descriptors.
    tma: bool = False
    # Rows of the tiles of an expert's last block where it holds at most that many (module
    # docstring, "tail blocks"); 0: every block takes block_m-row tiles.
    tail_block_m: int = 0


# From `benchmark_moe.py --tgrouped-configs` on the H200 (docs/performance.md, "Ninth run" and
# "Tenth run"). Decode sizes read weights: 32-row blocks read each busy expert's weights half as
# often once experts average more than ~8 rows (128+ tokens of top-8: 87% vs 83% of copy at 256,
# 77% vs 69% at 512) and cost nothing measurable below that. Prefill sizes turn to the MMAs:
# 64-row blocks with 128 x 64 tiles above 4096 rows (T = 512 / 1024 / 2048 of top-8 + shared:
# 658 / 831 / 1141 us against 690 / 982 / 1586 for the 32-row tiles), 128-row blocks at 8 warps
# from 32768 (T = 4096 / 8192: 1650 / 2725 us against 1907 / 3011 for the 64-row tiles). The
# prefill tiles' pipelined loads take 160 / 144 KB of shared memory: only where the device has
# that and `_SMEM_HEADROOM` more (for the epilogue's layout conversions).
BLOCK_M_32_FROM_ROWS = 1024
PREFILL_TILES_ABOVE_ROWS = 4096
LARGE_PREFILL_TILES_FROM_ROWS = 32768
_DECODE_TILES = GroupedTiles(16, 64, 128, 4, 3, 64, 128, 4, 3)
_PREFILL_TILES = GroupedTiles(64, 128, 64, 4, 4, 128, 64, 4, 4)
_LARGE_PREFILL_TILES = GroupedTiles(128, 128, 64, 8, 3, 128, 64, 8, 3)
# With TMA (module docstring) the 128-row gate/up kernel takes a 4th stage: at 8192 tokens of
# top-8 + shared on the H200 (docs/performance.md, "Fourteenth run") 1335 us against 1424 at 3
# stages and 1498 for the pointer loads at 3; its down kernel 709 against 851. Its experts' last
# blocks of at most 64 rows take 64-row tiles (module docstring, "tail blocks"): a layer at 8192 /
# 4096 tokens of random routing 2350 / 1419 us against 2435 / 1489 (32 rows: 2335 / 1444); the
# engine's 8k prefill, whose routing is skewed (median 46-99 rows an expert), 57.2 ms of routed
# experts against 58.8 (32 rows: 58.0) (docs/performance.md, "Twenty-sixth run"). Its down
# kernel takes 256-wide tiles at 4 stages (the gate/up kernel's 192 KB of shared memory): on
# that prefill's recorded routing, all 26 layers, 63.98 ms against 65.35 for 128-wide tiles at 3
# (an H100, faster in 23 of the 26 layers; docs/performance.md, "Forty-fifth run").
_TMA_PREFILL_TILES = _PREFILL_TILES._replace(tma=True)
_TMA_LARGE_PREFILL_TILES = _LARGE_PREFILL_TILES._replace(
    gate_up_stages=4, down_block_n=256, down_stages=4, tma=True, tail_block_m=64
)
_SMEM_HEADROOM = 16 * 1024


def load_buffer_bytes(tiles: GroupedTiles, elem_bytes: int) -> int:
    """Shared memory of the larger kernel's pipelined loads: a stage holds a [block_m, block_k]
    tile of rows and the weight tiles (gate and up: two [block_k, block_n]; down: one)."""
    gate_up = tiles.block_m * tiles.block_k + 2 * tiles.block_k * tiles.block_n
    down = tiles.block_m * tiles.down_block_k + tiles.down_block_k * tiles.down_block_n
    return max(tiles.gate_up_stages * gate_up, tiles.down_stages * down) * elem_bytes


def default_tiles(
    num_rows: int, elem_bytes: int = 2, max_smem: int = 2**31, tma: bool = False
) -> GroupedTiles:
    """The launch shapes for `num_rows = T * K` routed rows of `elem_bytes`-byte elements, on a
    device whose programs may use `max_smem` bytes of shared memory (`max_shared_memory`);
    with `tma` (the device and operands take tensor descriptors: `tma_operands_ok`) the
    prefill tiles load through TMA.

    fp32 keeps the decode tiles with a 64-wide gate/up chunk: its 128-wide gate/up stages would
    take 216 KB of shared memory at 3 stages, and the prefill tiles more.
    """
    if elem_bytes > 2:
        block_m = 32 if num_rows >= BLOCK_M_32_FROM_ROWS else 16
        return _DECODE_TILES._replace(block_m=block_m, block_k=64)
    large, prefill = (
        (_TMA_LARGE_PREFILL_TILES, _TMA_PREFILL_TILES)
        if tma
        else (_LARGE_PREFILL_TILES, _PREFILL_TILES)
    )
    for tiles, takes in (
        (large, num_rows >= LARGE_PREFILL_TILES_FROM_ROWS),
        (prefill, num_rows > PREFILL_TILES_ABOVE_ROWS),
    ):
        if takes and load_buffer_bytes(tiles, elem_bytes) + _SMEM_HEADROOM <= max_smem:
            return tiles
    if num_rows >= BLOCK_M_32_FROM_ROWS:
        return _DECODE_TILES._replace(block_m=32)
    return _DECODE_TILES


def tma_operands_ok(w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether the expert weights can be read through TMA descriptors (module docstring, "TMA"):
    contiguous (each viewed as one 2-D tensor of rows), 16-byte aligned, with rows of a multiple
    of 16 bytes (TMA's stride unit; `a`'s rows are w2's)."""
    return all(
        w.is_contiguous() and w.data_ptr() % 16 == 0 and w.shape[-1] * w.element_size() % 16 == 0
        for w in (w13, w2)
    )


@lru_cache(maxsize=256)
def _resolve_tiles(given: GroupedTiles, default: GroupedTiles) -> GroupedTiles:
    """`given`'s tiles with `default`'s for those left None, checked (ValueError). Cached: an
    eager step asks this of every MoE layer with the same arguments, and the checks were most
    of the launch path's host time besides the launches."""
    if given.block_m is not None:
        # The default tail tiles belong to the default blocks, not to blocks the caller chose.
        default = default._replace(tail_block_m=0)
    t = GroupedTiles(*(d if g is None else g for g, d in zip(given, default, strict=True)))
    for name in ("block_m", "block_n", "block_k", "down_block_n", "down_block_k"):
        value = getattr(t, name)
        check_power_of_two(name, value)
        if value < 16:
            raise ValueError(f"{name} must be >= 16 (tl.dot's smallest tile), got {value}")
    for name in ("gate_up_warps", "gate_up_stages", "down_warps", "down_stages"):
        if getattr(t, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(t, name)}")
    if t.tail_block_m:
        check_power_of_two("tail_block_m", t.tail_block_m)
        if not 16 <= t.tail_block_m < t.block_m:
            raise ValueError(
                f"tail_block_m must be 0 or from 16 to below block_m ({t.block_m}), "
                f"got {t.tail_block_m}"
            )
    return t


def moe_experts_triton_grouped(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: torch.nn.Module,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    gate_up_warps: int | None = None,
    gate_up_stages: int | None = None,
    down_block_n: int | None = None,
    down_block_k: int | None = None,
    down_warps: int | None = None,
    down_stages: int | None = None,
    tma: bool | None = None,
    tail_block_m: int | None = None,
) -> torch.Tensor:
    """Routed experts grouped by expert: four launches (grouping, gate/up, down, weighted sum);
    see the module docstring for shapes, numerics and the steps.

    `block_m` rows per block (>= 16, power of two). Gate/up
    kernel: `block_n` intermediate columns per program, `block_k` hidden chunk per step,
    `gate_up_warps`, `gate_up_stages` (software-pipelined loads in flight). Down kernel:
    `down_block_n` hidden outputs per program, `down_block_k` intermediate chunk per step,
    `down_warps`, `down_stages`. `tma`: the weights (and the down kernel's rows) through TMA
    descriptors, which needs `tma_operands_ok` and `supports_tma` or the interpreter (else
    ValueError); left None, the prefill tiles take it where the operands and the device allow.
    `tail_block_m`: 0, or rows of the tiles of each expert's last block where it holds at most
    that many (a power of two >= 16 below `block_m`); left None, the default blocks' (0 where
    `block_m` is given). Tile dims are powers of two >= 16; each other argument left None takes
    `default_tiles` for T * K rows on x's device.
    """
    check_expert_shapes(x, w13, w2, topk_weights, topk_ids)
    act = check_triton_operands(
        x, w13, w2, topk_weights, topk_ids, act_and_mul, "moe_experts_triton_grouped"
    )
    tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    given = GroupedTiles(block_m, block_n, block_k, gate_up_warps, gate_up_stages, down_block_n,
                         down_block_k, down_warps, down_stages, tma, tail_block_m)  # fmt: skip
    # Tiles for the rows of T's batch class (`decode_batch_class`: the graph an eager decode of
    # T sequences would replay), so that such a decode launches what the capture compiled: at
    # top-8 + shared, 9T rows cross BLOCK_M_32_FROM_ROWS at T = 114 and the prefill tiles at
    # T = 456, both inside a class.
    rows = decode_batch_class(tokens) * topk_ids.shape[1]
    # Only the prefill tiles take TMA: decode-size calls (every eager decode step, per MoE
    # layer) skip the checks.
    operands_ok = rows > PREFILL_TILES_ABOVE_ROWS and tma_operands_ok(w13, w2)
    auto_tma = operands_ok and supports_tma(x.device)
    default = default_tiles(rows, x.element_size(), max_shared_memory(x.device), tma=auto_tma)
    t = _resolve_tiles(given, default)
    if t.tma and not (operands_ok or tma_operands_ok(w13, w2)):
        raise ValueError(
            "tma needs contiguous, 16-byte aligned w13 and w2 whose rows are multiples of 16 "
            f"bytes, got strides {w13.stride()} and {w2.stride()}, base offsets "
            f"{w13.data_ptr() % 16} and {w2.data_ptr() % 16} bytes past 16-byte alignment, rows "
            f"of {hidden * w13.element_size()} and {inter * w2.element_size()} bytes"
        )
    if t.tma and not (supports_tma(x.device) or triton_interpreting()):
        raise ValueError(f"tma needs an NVIDIA GPU from Hopper on (supports_tma), got {x.device}")
    topk = topk_ids.shape[1]
    if 0 in (tokens, topk, hidden, inter, num_experts):
        return torch.zeros(tokens, hidden, dtype=x.dtype, device=x.device)
    if tokens * topk * inter >= 2**31:
        # The kernels address `a` [R, I] with int32 row offsets.
        raise ValueError(f"{tokens} x {topk} routed rows of {inter} exceed 2**31 elements")
    order, _, blocks, _ = group_rows(topk_ids, num_experts, t.block_m)
    max_blocks = blocks.shape[1]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    a = torch.empty(tokens * topk, inter, dtype=x.dtype, device=x.device)
    # A descriptor that a launch does not read (no TMA, or no tail tiles: code compiled out by
    # the `TMA` / `TAIL_M` constexprs) is passed as a tensor already among its arguments, so
    # that the leading arguments are tensors and descriptors only (`launch`'s fast path).
    w13_desc, a_desc, a_tail_desc, w2_desc = w13, a, a, w2
    if t.tma:
        w13_desc = TensorDescriptor.from_tensor(w13.view(-1, hidden), [t.block_n, t.block_k])
        a_desc = TensorDescriptor.from_tensor(a, [t.block_m, t.down_block_k])
        if t.tail_block_m:
            a_tail_desc = TensorDescriptor.from_tensor(a, [t.tail_block_m, t.down_block_k])
        w2_desc = TensorDescriptor.from_tensor(w2.view(-1, inter), [t.down_block_n, t.down_block_k])
    pdl = pdl_options(use_pdl(x.device))
    launch(
        _moe_grouped_gate_up_kernel, (max_blocks * cdiv(inter, t.block_n), 1, 1),
        (
            x, w13, w13_desc, order, blocks, a,
            x.stride(0), w13.stride(0), w13.stride(1), a.stride(0), hidden, inter, max_blocks,
            act.beta, act.linear_beta,
        ),
        launch_spec(
            _moe_grouped_gate_up_kernel, TOPK=topk, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            BLOCK_K=t.block_k, PRECISION=precision, TMA=t.tma, ACT=act.kind,
            TAIL_M=t.tail_block_m,
            num_warps=t.gate_up_warps, num_stages=t.gate_up_stages, **pdl,
        ),
    )  # fmt: skip
    y = torch.empty(tokens * topk, hidden, dtype=x.dtype, device=x.device)
    launch(
        _moe_grouped_down_kernel, (max_blocks * cdiv(hidden, t.down_block_n), 1, 1),
        (
            a, w2, a_desc, a_tail_desc, w2_desc, order, blocks, y,
            a.stride(0), w2.stride(0), w2.stride(1), y.stride(0), hidden, inter, max_blocks,
        ),
        launch_spec(
            _moe_grouped_down_kernel, BLOCK_M=t.block_m, BLOCK_N=t.down_block_n,
            BLOCK_K=t.down_block_k, PRECISION=precision, TMA=t.tma, TAIL_M=t.tail_block_m,
            num_warps=t.down_warps, num_stages=t.down_stages, **pdl,
        ),
    )  # fmt: skip
    return moe_weighted_sum(y, topk_weights, x.dtype)
