"""The routed rows of a MoE layer grouped by expert on the device: the order and block table
that the expert-grouped paths multiply by (experts_triton_grouped.py's kernels, and
`torch._grouped_mm` in experts.py). R = T * K routed rows, row r = (t, k) = (r // K, r % K).

`group_rows(topk_ids, num_experts, block_m)` returns a `GroupedRows`:

  order    `[R]` int32, a stable sort of the rows by expert (rows of one expert keep token
           order; rows whose id is outside `[0, E)` come after all others, and no block
           covers them)
  inverse  `[R]` int32, its inverse (each row's sorted position)
  blocks   `[3, max_blocks]` int32, the block table: per block its expert (-1: unused), first
           and end sorted position. Each expert's rows are cut into blocks of `block_m`, so
           there are at most `max_blocks_for(R, E, block_m)` blocks whatever the routing:
           grids over the table are static, and their programs of unused blocks return after
           reading it.
  offs     `[E]` int32, each expert's end position (`torch._grouped_mm`'s offsets)

Up to GROUP_KERNEL_MAX_ROWS rows: one launch, grid (E + 1,). Program e histograms all ids (its
first position and first block are the rows and blocks of the experts before it), then writes
its rows and blocks; program E places the out-of-range rows and marks the unused tail of the
table. Past it (a prefill), where E + 1 programs reading every id cost E * R,
`group_rows_chunked` computes the same in two launches: a histogram per chunk of 2048 rows, then
a program per chunk placing its rows (a stable tl.sort of the chunk's (expert, row) pairs,
offset by the rows of lower experts and of earlier chunks) and one per expert writing its end
and blocks. `group_rows_reference` computes the same with a torch sort (the tests compare them
exactly).

Nothing reads a tensor value on the host: no sync, static shapes, CUDA-graph capturable.
"""

from typing import NamedTuple

import torch

from vllm.config.vllm import decode_batch_class
from vllm.triton_utils import next_power_of_2, use_triton
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

# Ids per step of the grouping kernel: all of a decode batch's (up to 256 tokens of top-8) in one.
_GROUP_MAX_BLOCK_R = 2048
# Most rows the grouping kernel takes: each of its E + 1 programs reads every id, so its time grows
# with E * R; above this the torch sort (flat at ~140 us on the H200) was faster, and the chunked
# kernels now take over. H200, 257 experts, 9 slots (benchmark_moe.py --paths grouping,
# 2026-12-01): 3.6 / 8.3 / 26.6 / 199 us at 1 / 256 / 1024 / 8192 tokens against 60 / 97 / 146 /
# 142 us for the sort. The chunked kernels' placing launch took 44 us a layer of an 8192-token
# prefill (engine profile, docs/performance.md "Eighth run"); the crossover against them, likely
# lower than this, is not measured yet.
GROUP_KERNEL_MAX_ROWS = 32768
_GROUP_MIN_BLOCK_R = 256
# Block-table entries per store of the grouping kernel.
_GROUP_BLOCK_B = 64
# Larger batches (a prefill: 8192 tokens of top-8 + shared are 73728 rows) take the chunked
# grouping: a histogram per chunk of rows, then each chunk placed by a stable sort of its own
# rows. Rows per chunk (one tl.sort of that many keys per program):
_GROUP_CHUNK = 2048
# Bins (E + 2: the experts, out-of-range ids, padding) the chunked grouping keeps in registers.
_GROUP_CHUNKED_MAX_BINS = 1024

if triton is not None:

    @triton.jit
    def _expert_keys(ids_ptr, r, num_rows, num_experts):
        # The row's expert, or num_experts for an out-of-range id and for r past the rows.
        ids = tl.load(ids_ptr + r, mask=r < num_rows, other=num_experts)
        valid = (ids >= 0) & (ids < num_experts)
        return tl.where(valid, ids, num_experts).to(tl.int32)

    @triton.jit
    def _store_expert_blocks(
        blocks_ptr, max_blocks, blk_first, e, start, end,
        BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr,
    ):  # fmt: skip
        # Expert e's rows [start, end) cut into blocks of BLOCK_M, from table entry blk_first on:
        # expert, first and end sorted position.
        bb = tl.arange(0, BLOCK_B)
        for b0 in range(0, (end - start + BLOCK_M - 1) // BLOCK_M, BLOCK_B):
            b = b0 + bb
            row0 = start + b * BLOCK_M
            ok = row0 < end
            tl.store(blocks_ptr + blk_first + b, e + 0 * b, mask=ok)
            tl.store(blocks_ptr + max_blocks + blk_first + b, row0, mask=ok)
            tl.store(blocks_ptr + 2 * max_blocks + blk_first + b,
                     tl.minimum(row0 + BLOCK_M, end), mask=ok)  # fmt: skip

    @triton.jit
    def _store_unused_blocks(blocks_ptr, max_blocks, first_unused, BLOCK_B: tl.constexpr):
        # Table entries first_unused .. max_blocks - 1: expert -1, an empty row range.
        bb = tl.arange(0, BLOCK_B)
        zero = tl.zeros([BLOCK_B], dtype=tl.int32)
        for b0 in range(first_unused, max_blocks, BLOCK_B):
            b = b0 + bb
            ok = b < max_blocks
            tl.store(blocks_ptr + b, zero - 1, mask=ok)
            tl.store(blocks_ptr + max_blocks + b, zero, mask=ok)
            tl.store(blocks_ptr + 2 * max_blocks + b, zero, mask=ok)

    @triton.jit
    def _moe_group_rows_kernel(
        ids_ptr, order_ptr, inverse_ptr, blocks_ptr, offs_ptr,
        num_rows, num_experts, max_blocks,
        BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
        BLOCK_B: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Program e < E: expert e's rows and blocks; program E: the out-of-range rows (bin E of
        # the histogram, which also counts the padding past the rows) and the unused blocks.
        e = tl.program_id(0)
        rr = tl.arange(0, BLOCK_R)
        hist = tl.zeros([BLOCK_E], dtype=tl.int32)
        for r0 in range(0, num_rows, BLOCK_R):
            hist += tl.histogram(_expert_keys(ids_ptr, r0 + rr, num_rows, num_experts), BLOCK_E)
        bins = tl.arange(0, BLOCK_E)
        before = bins < e
        first = tl.sum(tl.where(before, hist, 0), axis=0)
        blk_first = tl.sum(tl.where(before, (hist + BLOCK_M - 1) // BLOCK_M, 0), axis=0)
        seen = first
        for r0 in range(0, num_rows, BLOCK_R):
            r = r0 + rr
            hit = (_expert_keys(ids_ptr, r, num_rows, num_experts) == e) & (r < num_rows)
            # Stable: a row's rank among its expert's rows is the hits before it.
            pos = seen + tl.cumsum(hit.to(tl.int32), 0) - 1
            tl.store(order_ptr + pos, r, mask=hit)
            tl.store(inverse_ptr + r, pos, mask=hit)
            seen += tl.sum(hit.to(tl.int32), axis=0)
        if e < num_experts:
            tl.store(offs_ptr + e, seen)
            _store_expert_blocks(
                blocks_ptr, max_blocks, blk_first, e, first, seen, BLOCK_M, BLOCK_B
            )
        else:
            _store_unused_blocks(blocks_ptr, max_blocks, blk_first, BLOCK_B)

    @triton.jit
    def _chunk_keys(ids_ptr, r, num_rows, num_experts, BLOCK_E: tl.constexpr):
        # Each row's bin: its expert, num_experts if out of range, and the last bin (> E) past the
        # rows, so that padding sorts after a chunk's rows and into no placed bin.
        keys = _expert_keys(ids_ptr, r, num_rows, num_experts)
        return tl.where(r < num_rows, keys, BLOCK_E - 1)

    @triton.jit
    def _moe_group_count_kernel(
        ids_ptr, counts_ptr, num_rows, num_experts,
        CHUNK: tl.constexpr, BLOCK_E: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        c = tl.program_id(0)
        keys = _chunk_keys(ids_ptr, c * CHUNK + tl.arange(0, CHUNK), num_rows, num_experts, BLOCK_E)
        tl.store(counts_ptr + c * BLOCK_E + tl.arange(0, BLOCK_E), tl.histogram(keys, BLOCK_E))

    # `num_chunks` and `max_blocks` change with the batch and only bound loops and masks whose
    # accesses keep their width; specialized on being 1 or a multiple of 16, a new class of
    # either is a new key, i.e. a compile of this kernel (its `tl.sort`: 4.2-4.4 s on a fresh
    # H100, in two steps of one batch phase). `num_rows` stays specialized: the id loads go out
    # in vectors on it.
    @triton.jit(do_not_specialize=["num_chunks", "max_blocks"])
    def _moe_group_place_kernel(
        ids_ptr, counts_ptr, delta_ptr, order_ptr, inverse_ptr, blocks_ptr, offs_ptr,
        num_rows, num_experts, num_chunks, max_blocks,
        BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr,
        BLOCK_CH: tl.constexpr, BLOCK_B: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Program c < num_chunks places chunk c's rows; program num_chunks + e writes expert e's
        # end and blocks; the last program marks the unused tail of the block table. Each first
        # sums the chunk histograms: per bin, all chunks' rows and those of chunks before its own.
        pid = tl.program_id(0)
        bins = tl.arange(0, BLOCK_E)
        total = tl.zeros([BLOCK_E], dtype=tl.int32)
        before = tl.zeros([BLOCK_E], dtype=tl.int32)
        ch = tl.arange(0, BLOCK_CH)
        for c0 in range(0, num_chunks, BLOCK_CH):
            cc = c0 + ch
            tile = tl.load(counts_ptr + cc[:, None] * BLOCK_E + bins[None, :],
                           mask=(cc < num_chunks)[:, None], other=0)  # fmt: skip
            total += tl.sum(tile, axis=0)
            before += tl.sum(tl.where((cc < pid)[:, None], tile, 0), axis=0)
        first = tl.cumsum(total, 0) - total  # each bin's first sorted position
        nblk = tl.where(bins < num_experts, (total + BLOCK_M - 1) // BLOCK_M, 0)
        if pid < num_chunks:
            # A row's position: its bin's first, the rows of its bin in earlier chunks, then its
            # rank in its own chunk. That rank comes from sorting (bin, row) pairs: position p of
            # the sorted chunk less the chunk's rows of lower bins. The per-bin offset goes
            # through memory to be read back by bin (a gather).
            local = tl.arange(0, CHUNK)
            own = tl.load(counts_ptr + pid * BLOCK_E + bins)
            tl.store(delta_ptr + pid * BLOCK_E + bins, first + before - (tl.cumsum(own, 0) - own))
            tl.debug_barrier()
            keys = _chunk_keys(ids_ptr, pid * CHUNK + local, num_rows, num_experts, BLOCK_E)
            pairs = tl.sort(keys * CHUNK + local)
            row = pid * CHUNK + pairs % CHUNK
            pos = tl.load(delta_ptr + pid * BLOCK_E + pairs // CHUNK) + local
            ok = row < num_rows
            tl.store(order_ptr + pos, row, mask=ok)
            tl.store(inverse_ptr + row, pos, mask=ok)
        elif pid < num_chunks + num_experts:
            e = pid - num_chunks
            start = tl.sum(tl.where(bins == e, first, 0), axis=0)
            end = start + tl.sum(tl.where(bins == e, total, 0), axis=0)
            blk_first = tl.sum(tl.where(bins < e, nblk, 0), axis=0)
            tl.store(offs_ptr + e, end)
            _store_expert_blocks(blocks_ptr, max_blocks, blk_first, e, start, end, BLOCK_M, BLOCK_B)
        else:
            _store_unused_blocks(blocks_ptr, max_blocks, tl.sum(nblk, axis=0), BLOCK_B)


def max_blocks_for(num_rows: int, num_experts: int, block_m: int) -> int:
    """Most blocks of `block_m` rows that `num_rows` rows over `num_experts` experts can need:
    each non-empty expert (at most min(E, R) of them) pads its last block by < block_m rows."""
    return (num_rows + min(num_experts, num_rows) * (block_m - 1)) // block_m


class GroupedRows(NamedTuple):
    """The routed rows grouped by expert (module docstring); R = T * K rows."""

    order: torch.Tensor  # [R] int32: the (token, slot) row at each sorted position
    inverse: torch.Tensor  # [R] int32: the sorted position of each (token, slot) row
    blocks: torch.Tensor  # [3, max_blocks] int32: expert or -1, first and end sorted position
    offs: torch.Tensor  # [E] int32: each expert's end sorted position


def _check_group_args(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_ids.numel() >= 2**31:
        raise ValueError(f"topk_ids has {topk_ids.numel()} rows; int32 positions hold < 2**31")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if block_m < 1:
        raise ValueError(f"block_m must be >= 1, got {block_m}")


def group_rows_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> GroupedRows:
    """`group_rows` with torch ops only (a stable sort; no host sync)."""
    _check_group_args(topk_ids, num_experts, block_m)
    device = topk_ids.device
    flat = topk_ids.reshape(-1)
    num_rows = flat.numel()
    valid = (flat >= 0) & (flat < num_experts)
    keys = torch.where(valid, flat, num_experts)
    if num_experts < 2**15:
        # CUDA's radix sort makes one pass per key byte: 2 for int16 keys against 8 for int64
        # ids (whose 8 passes were 51 us of each MoE layer's prefill at 8192 tokens on the H200,
        # before the chunked kernels took prefills over; the sort still serves expert counts
        # beyond their bins). The same keys, so the same stable order.
        keys = keys.to(torch.int16)
    keys, order = keys.sort(stable=True)
    rows = torch.arange(num_rows, device=device)
    inverse = torch.empty_like(order).scatter_(0, order, rows)
    experts = torch.arange(num_experts, device=device, dtype=keys.dtype)
    first = torch.searchsorted(keys, experts)
    end = torch.searchsorted(keys, experts, right=True)
    nblk = (end - first + block_m - 1) // block_m
    blk_end = nblk.cumsum(0)
    b = torch.arange(max_blocks_for(num_rows, num_experts, block_m), device=device)
    owner = torch.searchsorted(blk_end, b, right=True)
    used = owner < num_experts
    e = owner.clamp(max=num_experts - 1)
    row0 = first[e] + (b - (blk_end - nblk)[e]) * block_m
    row1 = torch.minimum(row0 + block_m, end[e])
    blocks = torch.stack(
        [torch.where(used, owner, -1), torch.where(used, row0, 0), torch.where(used, row1, 0)]
    )
    i32 = torch.int32
    return GroupedRows(order.to(i32), inverse.to(i32), blocks.to(i32), end.to(i32))


def group_rows(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> GroupedRows:
    """The routed rows of `topk_ids` (`[T, K]` int32 / int64, any layout) grouped by expert for
    `num_experts` experts and blocks of `block_m` rows: one Triton launch where `use_triton`, for
    at most `GROUP_KERNEL_MAX_ROWS` rows, two (`group_rows_chunked`) above (else
    `group_rows_reference`, the same result). Ids outside `[0, num_experts)` are sorted after all
    others and left out of `blocks` and `offs`."""
    _check_group_args(topk_ids, num_experts, block_m)
    device = topk_ids.device
    # The kernels read the ids at unit stride: a column-strided [T, K] view flattens to a strided
    # view, so it is copied (a no-op for the router's contiguous ids).
    flat = topk_ids.reshape(-1).contiguous()
    num_rows = flat.numel()
    if num_rows == 0 or not use_triton(device):
        return group_rows_reference(topk_ids, num_experts, block_m)
    if num_rows > GROUP_KERNEL_MAX_ROWS:
        if next_power_of_2(num_experts + 2) > _GROUP_CHUNKED_MAX_BINS:
            return group_rows_reference(topk_ids, num_experts, block_m)
        return group_rows_chunked(flat, num_experts, block_m)
    max_blocks = max_blocks_for(num_rows, num_experts, block_m)
    order = torch.empty(num_rows, dtype=torch.int32, device=device)
    inverse = torch.empty(num_rows, dtype=torch.int32, device=device)
    blocks = torch.empty(3, max_blocks, dtype=torch.int32, device=device)
    offs = torch.empty(num_experts, dtype=torch.int32, device=device)
    # Rows per step for the rows of T's batch class (`decode_batch_class`), so that an eager
    # decode of T sequences launches what its class's graph compiled (at top-8 + shared, 9T
    # rows cross a power of two inside the classes of 32 and 120).
    tokens, slots = topk_ids.shape
    class_rows = decode_batch_class(tokens) * slots
    block_r = min(max(next_power_of_2(class_rows), _GROUP_MIN_BLOCK_R), _GROUP_MAX_BLOCK_R)
    # Bin E (out-of-range ids and padding) must exist: E + 1 bins at least.
    block_e = next_power_of_2(num_experts + 1)
    launch(
        _moe_group_rows_kernel, (num_experts + 1, 1, 1),
        (flat, order, inverse, blocks, offs, num_rows, num_experts, max_blocks),
        launch_spec(
            _moe_group_rows_kernel, BLOCK_M=block_m, BLOCK_E=block_e, BLOCK_R=block_r,
            BLOCK_B=_GROUP_BLOCK_B, num_warps=4, **pdl_options(use_pdl(device)),
        ),
    )  # fmt: skip
    return GroupedRows(order, inverse, blocks, offs)


def group_rows_chunked(
    flat_ids: torch.Tensor, num_experts: int, block_m: int, chunk: int = _GROUP_CHUNK
) -> GroupedRows:
    """`group_rows` of the flat ids `[R]` in two launches, for batches past the one-launch
    kernel's: a histogram of each chunk of `chunk` rows (a power of two), then one program per
    chunk placing its rows (a stable sort of the chunk's (bin, row) pairs) and one per expert
    writing its end and blocks. Needs next_power_of_2(num_experts + 2) bins in registers."""
    if flat_ids.dim() != 1 or flat_ids.stride(0) != 1:
        raise ValueError(f"flat_ids must be [R] with unit stride, got {tuple(flat_ids.shape)}")
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a positive power of two, got {chunk}")
    device = flat_ids.device
    num_rows = flat_ids.numel()
    num_chunks = -(-num_rows // chunk)
    block_e = next_power_of_2(num_experts + 2)  # + out-of-range ids, + padding past the rows
    max_blocks = max_blocks_for(num_rows, num_experts, block_m)
    order = torch.empty(num_rows, dtype=torch.int32, device=device)
    inverse = torch.empty(num_rows, dtype=torch.int32, device=device)
    blocks = torch.empty(3, max_blocks, dtype=torch.int32, device=device)
    offs = torch.empty(num_experts, dtype=torch.int32, device=device)
    # Per chunk and bin: its rows (written by the first launch), then its placing offset.
    counts, delta = torch.empty(2, num_chunks, block_e, dtype=torch.int32, device=device)
    pdl = pdl_options(use_pdl(device))
    launch(
        _moe_group_count_kernel,
        (num_chunks, 1, 1),
        (flat_ids, counts, num_rows, num_experts),
        launch_spec(_moe_group_count_kernel, CHUNK=chunk, BLOCK_E=block_e, num_warps=4, **pdl),
    )
    launch(
        _moe_group_place_kernel, (num_chunks + num_experts + 1, 1, 1),
        (
            flat_ids, counts, delta, order, inverse, blocks, offs,
            num_rows, num_experts, num_chunks, max_blocks,
        ),
        launch_spec(
            _moe_group_place_kernel, BLOCK_M=block_m, CHUNK=chunk, BLOCK_E=block_e,
            BLOCK_CH=max(1, 4096 // block_e), BLOCK_B=_GROUP_BLOCK_B, num_warps=4, **pdl,
        ),
    )  # fmt: skip
    return GroupedRows(order, inverse, blocks, offs)
