"""MLA decode over the paged latent cache, in the weight-absorbed form.

One query token for each of N sequences, H local heads, latent width L (`kv_lora_rank`), shared
position part R (`qk_rope_head_dim`; unrotated here, MLA is NoPE):

- `q_latent` `[N, H, L]`: the query's nope part already multiplied into the latent space
  (`q_nope @ W_UK` per head), `q_pe` `[N, H, R]`; any strides, unit last stride;
- `kv_cache` `[num_blocks, block_size, L + R]`: per token the normed latent `c` and `k_pe`; any
  block and token strides, unit last stride; same dtype as the queries (fp16, bf16 or fp32);
- `block_tables` `[N, max_blocks]` (any row stride) and `seq_lens` `[N]`, int32/int64 with unit
  last stride, on the device:
  sequence n attends to its first `seq_lens[n]` cached tokens, token p at
  `kv_cache[block_tables[n, p // block_size], p % block_size]`. Entries of `block_tables` past a
  sequence's length are never read. `seq_lens[n] >= 1`;
- `counters` (optional) int32 `[C]` on the device, all 0, owned by the caller and used by one
  launch at a time (the kernel leaves it at 0): the arrival counters of the one-launch merge
  below, one per (sequence, head block). `DECODE_COUNTERS` slots suffice for every default
  launch.

Output `[N, H, L]` in `q_latent`'s dtype: `sum_p softmax_p(scale * (q_latent . c_p + q_pe . k_pe_p))
* c_p`, computed in fp32; the caller maps it out of the latent space with `W_UV`.

Shapes are fixed by the buffers, not by the lengths, and nothing is read back to the host: the op
can be captured in a CUDA graph.

GPU path (Triton, split-KV). Program (head block, split, n) holds `BLOCK_H` heads of sequence n,
so each cache tile it loads serves all of them (MLA heads share `c` and `k_pe`). Its split is the
`s`-th of `num_splits` equal, `BLOCK_N`-aligned slices of `[0, seq_lens[n])`, cut on the device;
the first `active = cdiv(seq_lens[n], slice)` splits hold tokens, the others do nothing. It walks
its slice in tiles of `BLOCK_N` tokens (rows found through `block_tables`), scores them with
`tl.dot`, and keeps an online softmax (running max and sum, fp32, base 2). A sequence with one
active split gets its output from that program directly. Otherwise each active program writes its
normalized fp32 partial `[BLOCK_H, L]` and log2-sum-exp, and the splits are merged, in one of two
ways (`MlaDecodeConfig.fused_merge`):

- two launches: `_mla_decode_merge_kernel`, program (n, head, column block), reads every
  split's log-sum-exp and the first `_MERGE_UNROLLED_SPLITS` splits' partials before it knows
  which are active (unrolled over the split count, a constexpr: no load waits for `seq_lens`),
  and the active ones past those after;
- one launch: the last active program of each (n, head block) to finish merges all of them. It
  learns that it is last from an atomic increment of that pair's counter, `n * head_blocks +
  head_block` in `counters`, and sets the counter back to 0. Saves the second launch and the gap
  before it, but one program reads all `active * BLOCK_H * L * 4` bytes of partials: worth it
  while the splits are few.

Both merges compute, per head and column, `top = max_s lse_s`, then in split order `acc += part_s
* exp2(lse_s - top)`, `total += exp2(lse_s - top)`, and `acc / total`: the same operations in the
same order (sm_90 PTX: `ex2.approx.ftz`, `fma.rn`, `div.full` in both), so the two forms give the
same bits. Both launches ask for FP contraction (`enable_fp_fusion=True`) rather than take
Triton's default, which Triton 3.9 announces will change in 3.10.

Ordering of the one-launch merge (why the last program reads every partial; NVIDIA): the argument
of fused_router.py, whose pattern Triton 3.9's sm_90 PTX of this kernel shows. The partial
stores, a CTA barrier (`tl.debug_barrier`, `bar.sync`), then one `atom.acq_rel.gpu` add per
program (Triton issues a scalar atomic from one thread and broadcasts its result through shared
memory and a barrier). The adds on one counter form a release sequence, so the last one's acquire
synchronizes with every other program's release, and the barriers extend that to all threads of
both programs. The merge reads partials and log-sum-exps with `cache_modifier=".cg"` (L2; the SM's
L1 is not coherent) in loops that are not software-pipelined (`num_stages=1`), so no load is
issued before the acquire. No program waits for another, so any grid and the interpreter
(programs in order) are safe. The last program's store of 0 races with nothing (every other
program has added), and the kernel's end orders it before the next launch on the stream or the
next replay of a graph holding it (with programmatic dependent launch, the next kernel's wait
does: vllm/triton_utils/pdl.py).

Latent chunks (`MlaDecodeConfig.latent_chunks`: 1, 2 or 4). A program holds `q_latent`, each
cache tile's `c` and its accumulator as that many column chunks of `BLOCK_L / chunks`: a tile's
scores are the sum of one `tl.dot` per chunk and one for the position part, and `p @ c` goes to
one `[BLOCK_H, BLOCK_L / chunks]` accumulator per chunk, stored to its columns. The loads and MMAs
are those of one chunk; only their dependencies change. With one chunk each warp's score fragment
is one chain of (L + R) / 16 dependent MMAs (Triton folds the position product into the latent
one's accumulator); with more, `chunks + 1` independent chains that the schedulers can
interleave. To keep them apart each product is scaled to log2 units before the sum (Triton folds
`x + tl.dot(a, b)` into the dot's accumulator), so the scores differ from one chunk's only in the
rounding of that scaling and sum (fp32, a few ulps); the rest is the same operations per column.
Chunks past the count are compiled out (no loads, no MMAs).

`MlaDecodeConfig` (mla_decode_config.py) sets the tiles, warps, pipeline stages, split count,
merge form and latent chunks; `mla_decode_config` chooses them on the host from N, H, the SM
count and the context capacity (`max_blocks * block_size`), never from `seq_lens`.
bf16/fp16 caches: the probabilities are rounded to the cache dtype for the `p @ c` tensor-core
product (relative 2^-9 per weight); fp32 caches use IEEE fp32 products throughout.
"""

import math

import torch

from vllm.models.kimi_k3.amd.ops.mla_decode_config import (
    MERGE_CHUNK,
    MIN_DOT,
    MlaDecodeConfig,
    merge_block_l,
    mla_decode_config,
)
from vllm.platforms import current_platform

# The one switch every op here uses to run its Triton kernels on CPU tensors (the interpreter).
from vllm.triton_utils import max_shared_memory, next_power_of_2, num_sms, use_triton
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = math.log2(math.e)
# Splits whose partials the two-launch merge reads before it knows which are active (its code is
# unrolled over them): the most the default launch gives 32 local heads on 132 SMs (Kimi-Linear
# on an H200). There (docs/performance.md "Twenty-second run") one 8k sequence's 64 splits took
# 14.3 us read this way against 17.9 with only 16 read early and the rest in a loop over the
# active ones. Unrolled further, the merge spilled registers (128 splits, the default for 16
# local heads at batch 1) and took minutes to compile (264 and more).
_MERGE_UNROLLED_SPLITS = 66

if triton is not None:

    @triton.jit
    def _split_slice(seq_len, num_splits, BLOCK_N: tl.constexpr):
        """Tokens per split of a sequence (`BLOCK_N`-aligned, equal for its splits) and how many
        of its splits hold tokens. Slices of its own length, not of the capacity, so that every
        split of a long sequence has work. At least one tile, so that a (forbidden) length of 0
        gives no active split rather than a division by zero."""
        per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), 1) * BLOCK_N
        return per_split, tl.cdiv(seq_len, per_split)

    @triton.jit
    def _load_columns(row_ptrs, row_ok, cols, L: tl.constexpr):
        """`row_ptrs [rows, 1] + cols [C]`: a [rows, C] tile, zeros outside `row_ok` and past
        column L."""
        return tl.load(
            row_ptrs + cols[None, :], mask=row_ok[:, None] & (cols < L)[None, :], other=0.0
        )

    @triton.jit
    def _scaled_scores(q, k, scale, DOT_PRECISION: tl.constexpr):
        """`scale * (q @ k^T)`. Summing such products keeps them apart: Triton folds `x +
        tl.dot(a, b)` into the dot's accumulator, which would chain the latent chunks' MMAs
        again."""
        return tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale

    @triton.jit
    def _store_latent(acc, divisor, cols, L: tl.constexpr, out_rows, direct, part_rows,
                      part_offset, partial, SPLIT: tl.constexpr):  # fmt: skip
        """`acc / divisor` to the output's columns `cols` for the heads `direct`, and with SPLIT
        as the fp32 partial to `part_rows + part_offset` for the heads `partial` (pointer rows
        `[BLOCK_H, 1]`)."""
        o = acc / divisor[:, None]
        col_ok = (cols < L)[None, :]
        tl.store(out_rows + cols[None, :], o.to(out_rows.dtype.element_ty),
                 mask=direct[:, None] & col_ok)  # fmt: skip
        if SPLIT:
            tl.store(part_rows + cols[None, :] + part_offset, o, mask=partial[:, None] & col_ok)

    @triton.jit
    def _mla_decode_split_kernel(
        q_ptr, qpe_ptr, kv_ptr, bt_ptr, seq_lens_ptr, out_ptr, part_ptr, lse_ptr, counters_ptr,
        stride_qn, stride_qh, stride_pn, stride_ph, stride_kb, stride_kt, stride_btn,
        stride_on, stride_oh, stride_wn, stride_wh, stride_ws, stride_ln, stride_lh,
        heads, qk_scale_log2,
        L: tl.constexpr, R: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
        DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr,
        MERGE_CHUNK: tl.constexpr, LATENT_CHUNKS: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Head blocks vary fastest in launch order: the programs that read the same cache tiles
        # for different heads run at the same time, and the later ones find the tiles in L2.
        h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
        split = tl.program_id(1)
        num_splits = tl.num_programs(1)
        n = tl.program_id(2).to(tl.int64)
        h_ok = h < heads
        # The latent in LATENT_CHUNKS column chunks of BLOCK_C (module docstring); chunk j holds
        # columns col_0 + j * BLOCK_C. Chunks past LATENT_CHUNKS are compiled out.
        BLOCK_C: tl.constexpr = BLOCK_L // LATENT_CHUNKS
        col_0 = tl.arange(0, BLOCK_C)
        col_r = tl.arange(0, BLOCK_R)
        r_ok = col_r < R
        # Padded heads and columns load as zeros: they add nothing to the scores, and padded
        # heads (whose rows are never stored) still see finite scores.
        q_rows = q_ptr + n * stride_qn + h[:, None] * stride_qh
        q_0 = _load_columns(q_rows, h_ok, col_0, L)
        if LATENT_CHUNKS >= 2:
            q_1 = _load_columns(q_rows, h_ok, col_0 + BLOCK_C, L)
        if LATENT_CHUNKS == 4:
            q_2 = _load_columns(q_rows, h_ok, col_0 + 2 * BLOCK_C, L)
            q_3 = _load_columns(q_rows, h_ok, col_0 + 3 * BLOCK_C, L)
        q_pe = tl.load(
            qpe_ptr + n * stride_pn + h[:, None] * stride_ph + col_r[None, :],
            mask=h_ok[:, None] & r_ok[None, :], other=0.0,
        )  # fmt: skip

        seq_len = tl.load(seq_lens_ptr + n).to(tl.int32)
        per_split, active = _split_slice(seq_len, num_splits, BLOCK_N)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, seq_len)

        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        denom = tl.zeros([BLOCK_H], tl.float32)
        acc_0 = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        if LATENT_CHUNKS >= 2:
            acc_1 = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        if LATENT_CHUNKS == 4:
            acc_2 = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
            acc_3 = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        bt_row = bt_ptr + n * stride_btn
        for start in range(lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            ok = pos < hi
            # Masked positions read no block-table entry and no cache row.
            block = tl.load(bt_row + pos // PAGE, mask=ok, other=0).to(tl.int64)
            rows = block * stride_kb + (pos % PAGE).to(tl.int64) * stride_kt
            c_rows = kv_ptr + rows[:, None]
            c_0 = _load_columns(c_rows, ok, col_0, L)
            k_pe = tl.load(c_rows + L + col_r[None, :], mask=ok[:, None] & r_ok[None, :],
                           other=0.0)  # fmt: skip
            if LATENT_CHUNKS == 1:
                scores = tl.dot(q_0, tl.trans(c_0), input_precision=DOT_PRECISION)
                scores += tl.dot(q_pe, tl.trans(k_pe), input_precision=DOT_PRECISION)
                scores = scores * qk_scale_log2
            else:
                # One independent MMA chain per chunk and one for the position part.
                c_1 = _load_columns(c_rows, ok, col_0 + BLOCK_C, L)
                scores = _scaled_scores(q_pe, k_pe, qk_scale_log2, DOT_PRECISION)
                scores += _scaled_scores(q_0, c_0, qk_scale_log2, DOT_PRECISION)
                scores += _scaled_scores(q_1, c_1, qk_scale_log2, DOT_PRECISION)
                if LATENT_CHUNKS == 4:
                    c_2 = _load_columns(c_rows, ok, col_0 + 2 * BLOCK_C, L)
                    c_3 = _load_columns(c_rows, ok, col_0 + 3 * BLOCK_C, L)
                    scores += _scaled_scores(q_2, c_2, qk_scale_log2, DOT_PRECISION)
                    scores += _scaled_scores(q_3, c_3, qk_scale_log2, DOT_PRECISION)
            # Every tile starts inside [lo, hi), so each row has a finite maximum.
            scores = tl.where(ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[:, None])
            denom = denom * alpha + tl.sum(p, axis=1)
            acc_0 = acc_0 * alpha[:, None] + tl.dot(p.to(c_0.dtype), c_0,
                                                    input_precision=DOT_PRECISION)  # fmt: skip
            if LATENT_CHUNKS >= 2:
                acc_1 = acc_1 * alpha[:, None] + tl.dot(p.to(c_1.dtype), c_1,
                                                        input_precision=DOT_PRECISION)  # fmt: skip
            if LATENT_CHUNKS == 4:
                acc_2 = acc_2 * alpha[:, None] + tl.dot(p.to(c_2.dtype), c_2,
                                                        input_precision=DOT_PRECISION)  # fmt: skip
                acc_3 = acc_3 * alpha[:, None] + tl.dot(p.to(c_3.dtype), c_3,
                                                        input_precision=DOT_PRECISION)  # fmt: skip
            m = m_new

        out_rows = out_ptr + n * stride_on + h[:, None] * stride_oh
        if SPLIT:
            # A program past the sequence's active splits has no tokens (denominators 0): it
            # stores nothing. The conditions are per head (the interpreter's masks cannot
            # combine a block with a scalar condition).
            per_head = tl.zeros([BLOCK_H], tl.int32)
            has_tokens = per_head + lo < seq_len
            divisor = tl.where(denom > 0.0, denom, 1.0)
            direct = h_ok & has_tokens & (per_head + active == 1)
            partial = h_ok & has_tokens & (per_head + active > 1)
        else:
            divisor, direct, partial = denom, h_ok, h_ok
        part_rows = part_ptr + n * stride_wn + h[:, None] * stride_wh
        offset = split * stride_ws
        _store_latent(acc_0, divisor, col_0, L, out_rows, direct, part_rows, offset, partial, SPLIT)
        if LATENT_CHUNKS >= 2:
            _store_latent(acc_1, divisor, col_0 + BLOCK_C, L, out_rows, direct, part_rows, offset,
                          partial, SPLIT)  # fmt: skip
        if LATENT_CHUNKS == 4:
            _store_latent(acc_2, divisor, col_0 + 2 * BLOCK_C, L, out_rows, direct, part_rows,
                          offset, partial, SPLIT)  # fmt: skip
            _store_latent(acc_3, divisor, col_0 + 3 * BLOCK_C, L, out_rows, direct, part_rows,
                          offset, partial, SPLIT)  # fmt: skip
        if SPLIT:
            lse_rows = lse_ptr + n * stride_ln + h * stride_lh
            tl.store(lse_rows + split, m + tl.log2(divisor), mask=partial)
            if FUSED_MERGE:
                if (lo < seq_len) & (active > 1):
                    # The module docstring argues the ordering of the barrier, the add and the
                    # merge's loads.
                    tl.debug_barrier()
                    counter = counters_ptr + n * tl.num_programs(0) + tl.program_id(0)
                    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
                    if arrived == active - 1:
                        # The merge kernel's sums, per head. Padded heads take a maximum and
                        # log-sum-exps of 0: weights of 1, no inf - inf.
                        top = tl.full([BLOCK_H], float("-inf"), tl.float32)
                        for s0 in tl.range(0, active, MERGE_CHUNK, num_stages=1):
                            s = s0 + tl.arange(0, MERGE_CHUNK)
                            lse = tl.load(
                                lse_rows[:, None] + s[None, :],
                                mask=h_ok[:, None] & (s < active)[None, :],
                                other=float("-inf"), cache_modifier=".cg",
                            )  # fmt: skip
                            top = tl.maximum(top, tl.max(lse, axis=1))
                        top = tl.where(h_ok, top, 0.0)
                        # The whole latent at once, whatever the chunks.
                        col_l = tl.arange(0, BLOCK_L)
                        out_mask = h_ok[:, None] & (col_l < L)[None, :]
                        merged = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
                        total = tl.zeros([BLOCK_H], tl.float32)
                        for s in tl.range(0, active, num_stages=1):
                            lse = tl.load(lse_rows + s, mask=h_ok, other=0.0, cache_modifier=".cg")
                            weight = tl.exp2(lse - top)
                            part = tl.load(
                                part_rows + col_l[None, :] + s * stride_ws, mask=out_mask,
                                other=0.0, cache_modifier=".cg",
                            )  # fmt: skip
                            merged += part * weight[:, None]
                            total += weight
                        o = merged / total[:, None]
                        tl.store(out_rows + col_l[None, :], o.to(out_ptr.dtype.element_ty),
                                 mask=out_mask)  # fmt: skip
                        tl.store(counter, 0)

    @triton.jit
    def _mla_decode_merge_kernel(
        part_ptr, lse_ptr, seq_lens_ptr, out_ptr,
        stride_pn, stride_ph, stride_ps, stride_ln, stride_lh, stride_on, stride_oh,
        L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
        SPLITS_P2: tl.constexpr, UNROLLED: tl.constexpr, MERGE_CHUNK: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Program (n, h, j): columns [j * BLOCK_L, (j + 1) * BLOCK_L) of head h's output, so
        # that a small batch still spreads its partials' reads over many SMs. A sequence with
        # one active split has its output from the split kernel already: nothing is stored.
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        col = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)
        col_ok = col < L
        _, active = _split_slice(tl.load(seq_lens_ptr + n).to(tl.int32), SPLITS, BLOCK_N)
        lse_row = lse_ptr + n * stride_ln + h * stride_lh
        part_row = part_ptr + n * stride_pn + h * stride_ph + col
        # Loads that do not wait for the length: every split's log-sum-exp (one vector) and the
        # first UNROLLED splits' partials (unrolled, whether live or not), so that they are in
        # flight together, one memory round trip. Splits past UNROLLED (a bound on the unrolled
        # code and its registers) are read after the length, in a loop over the live ones,
        # MERGE_CHUNK at a time. A split that is not live was not written this step: its
        # values are replaced before use, its log-sum-exp by -inf (weight exactly +0) and its
        # partial by -0, so that it adds -0 * +0 = -0, which leaves every sum as it was (+0
        # would turn a sum of -0 into +0). The selects sit on the loaded values, not on the
        # weight: with both on `live`, LLVM can fold them into one select of `part * weight`,
        # and the multiply-add then no longer contracts to the one-launch merge's `fma.rn` (a
        # different rounding). Without a merge no split is live; the finite floor of `top` and
        # the divisor of 1 then keep the unstored sums free of NaN. Neither changes a merge:
        # its live log-sum-exps are finite.
        merging = active > 1
        # -0 by its bits: Triton 3.6 folds a literal -0.0 into +0.
        neg_zero = tl.full([BLOCK_L], -2147483648, tl.int32).to(tl.float32, bitcast=True)
        every = tl.arange(0, SPLITS_P2)
        lse_all = tl.load(lse_row + every, mask=every < SPLITS, other=float("-inf"))
        top = tl.max(tl.where((every < active) & merging, lse_all, float("-inf")), axis=0)
        top = tl.maximum(top, -3.4028234663852886e38)
        merged = tl.zeros([BLOCK_L], tl.float32)
        total = tl.zeros([BLOCK_L], tl.float32)
        # The one-launch merge's sums, in the same order.
        for s in tl.static_range(UNROLLED):
            live = (s < active) & merging
            weight = tl.exp2(tl.where(live, tl.load(lse_row + s), float("-inf")) - top)
            part = tl.load(part_row + s * stride_ps, mask=col_ok, other=0.0)
            merged += tl.where(live, part, neg_zero) * weight
            total += weight
        if SPLITS > UNROLLED:
            # Per-column conditions (`_v`): the interpreter's masks take no scalar one.
            zeros = tl.zeros([BLOCK_L], tl.int32)
            for s0 in range(UNROLLED, active, MERGE_CHUNK):
                for j in tl.static_range(MERGE_CHUNK):
                    live_v = zeros + s0 + j < active
                    lse_v = tl.load(lse_row + zeros + s0 + j, mask=live_v, other=float("-inf"))
                    weight_v = tl.exp2(lse_v - top)
                    part_v = tl.load(part_row + (s0 + j) * stride_ps, mask=col_ok & live_v,
                                     other=0.0)  # fmt: skip
                    merged += tl.where(live_v, part_v, neg_zero) * weight_v
                    total += weight_v
        o = merged / tl.where(merging, total, 1.0)
        stores = (tl.zeros([BLOCK_L], tl.int32) + active > 1) & col_ok
        tl.store(
            out_ptr + n * stride_on + h * stride_oh + col, o.to(out_ptr.dtype.element_ty),
            mask=stores,
        )  # fmt: skip


def mla_decode_paged_ref(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The torch reference: gathers every sequence's whole block table (masked past its length)."""
    n, _, latent = q_latent.shape
    block_size = kv_cache.shape[1]
    ctx = kv_cache[block_tables.long()].reshape(n, -1, kv_cache.shape[-1]).float()  # [N, P, L+R]
    scores = torch.einsum("nhl,npl->nhp", q_latent.float(), ctx[..., :latent])
    scores += torch.einsum("nhr,npr->nhp", q_pe.float(), ctx[..., latent:])
    positions = torch.arange(block_tables.shape[1] * block_size, device=q_latent.device)
    masked = positions[None, :] >= seq_lens.long()[:, None]  # [N, P]
    probs = (scores * scale).masked_fill(masked[:, None, :], float("-inf")).softmax(dim=-1)
    return torch.einsum("nhp,npl->nhl", probs, ctx[..., :latent]).to(q_latent.dtype)


def launch_mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    config: MlaDecodeConfig,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the Triton kernels with an explicit `config` (inputs already validated); `counters`
    as in the module docstring, needed by `config.fused_merge` with more than one split."""
    if config.num_splits < 1:
        raise ValueError(f"config.num_splits must be >= 1, got {config.num_splits}")
    for name in ("block_h", "block_n"):
        value = getattr(config, name)
        if value < MIN_DOT or value & (value - 1):
            raise ValueError(f"config.{name} must be a power of two >= {MIN_DOT}, got {value}")
    n, heads, latent = q_latent.shape
    block_l = max(MIN_DOT, next_power_of_2(latent))
    if config.latent_chunks not in (1, 2, 4) or block_l // config.latent_chunks < MIN_DOT:
        raise ValueError(
            f"config.latent_chunks must be 1, 2 or 4 with chunks of >= {MIN_DOT} of the "
            f"{block_l} padded latent columns, got {config.latent_chunks}"
        )
    rope = q_pe.shape[-1]
    head_blocks = -(-heads // config.block_h)
    split = config.num_splits > 1
    fused = split and config.fused_merge
    if fused:
        if current_platform.is_rocm():
            # Its ordering argument is made from NVIDIA's PTX (module docstring).
            raise ValueError("the one-launch merge (config.fused_merge) is not checked on ROCm")
        _check_counters(counters, n * head_blocks, q_latent.device)
    out = q_latent.new_empty(n, heads, latent)
    if n == 0:
        return out
    if split:
        part = torch.empty(
            n, heads, config.num_splits, latent, dtype=torch.float32, device=q_latent.device
        )
        lse = torch.empty(n, heads, config.num_splits, dtype=torch.float32, device=q_latent.device)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
    else:
        part = lse = out  # not read without splits
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    grid = (head_blocks, config.num_splits, n)
    pdl = pdl_options(use_pdl(out.device))
    _mla_decode_split_kernel[grid](
        q_latent, q_pe, kv_cache, block_tables, seq_lens, out, part, lse,
        counters if fused else out,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), block_tables.stride(0),
        *out.stride()[:2], *part_strides, *lse_strides,
        heads, scale * _LOG2E,
        L=latent, R=rope, BLOCK_L=block_l, BLOCK_R=max(MIN_DOT, next_power_of_2(rope)),
        BLOCK_H=config.block_h, BLOCK_N=config.block_n, PAGE=kv_cache.shape[1],
        # fp32 caches: full fp32 products (not TF32); 16-bit: the backend's default.
        DOT_PRECISION="ieee" if q_latent.dtype == torch.float32 else None, SPLIT=split,
        FUSED_MERGE=fused, MERGE_CHUNK=MERGE_CHUNK, LATENT_CHUNKS=config.latent_chunks,
        num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=True, **pdl,
    )  # fmt: skip
    if split and not fused:
        merge_l = merge_block_l(n, heads, latent, num_sms(q_latent.device))
        _mla_decode_merge_kernel[(n, heads, -(-latent // merge_l))](
            part, lse, seq_lens, out,
            *part.stride()[:3], *lse.stride()[:2], *out.stride()[:2],
            L=latent, BLOCK_L=merge_l, BLOCK_N=config.block_n, SPLITS=config.num_splits,
            SPLITS_P2=next_power_of_2(config.num_splits),
            UNROLLED=min(config.num_splits, _MERGE_UNROLLED_SPLITS), MERGE_CHUNK=MERGE_CHUNK,
            # Four columns (16 bytes) a thread.
            num_warps=max(1, min(4, merge_l // 128)), enable_fp_fusion=True, **pdl,
        )  # fmt: skip
    return out


def _check_counters(counters: torch.Tensor | None, needed: int, device: torch.device) -> None:
    if counters is None:
        raise ValueError("the one-launch merge (config.fused_merge) needs a counters tensor")
    if counters.dtype != torch.int32 or counters.dim() != 1 or counters.stride(0) != 1:
        raise ValueError(
            f"counters must be a contiguous 1-D int32 tensor, got {counters.dtype} "
            f"{tuple(counters.shape)}"
        )
    if counters.numel() < needed:
        raise ValueError(
            f"counters holds {counters.numel()} slots, the launch needs {needed} (one per "
            "sequence and head block)"
        )
    if counters.device != device:
        raise ValueError(f"counters must be on q_latent's device {device}, not {counters.device}")


def _validate(q_latent, q_pe, kv_cache, block_tables, seq_lens) -> None:
    if q_latent.dim() != 3 or q_pe.dim() != 3 or q_latent.shape[:2] != q_pe.shape[:2]:
        raise ValueError(
            f"q_latent {tuple(q_latent.shape)} and q_pe {tuple(q_pe.shape)} must be [N, H, L] and "
            "[N, H, R]"
        )
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != q_latent.shape[-1] + q_pe.shape[-1]:
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} must be [blocks, block_size, L + R] with L + R = "
            f"{q_latent.shape[-1] + q_pe.shape[-1]}"
        )
    n = q_latent.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != n:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} must be [N={n}, max_blocks]")
    if seq_lens.shape != (n,):
        raise ValueError(f"seq_lens {tuple(seq_lens.shape)} must be [N={n}]")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
        # The kernels step through a table row and through seq_lens at unit stride.
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} must have unit stride on its last dim, got {t.stride()}")
    if q_latent.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q_latent must be fp16, bf16 or fp32, got {q_latent.dtype}")
    for name, t in (("q_pe", q_pe), ("kv_cache", kv_cache)):
        if t.dtype != q_latent.dtype:
            raise ValueError(f"{name} must have q_latent's dtype {q_latent.dtype}, got {t.dtype}")
    for name, t in (("q_latent", q_latent), ("q_pe", q_pe), ("kv_cache", kv_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride on its last dim, got {t.stride()}")
    for name, t in (("q_pe", q_pe), ("kv_cache", kv_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens)):  # fmt: skip
        if t.device != q_latent.device:
            raise ValueError(
                f"{name} must be on q_latent's device {q_latent.device}, not {t.device}"
            )


def mla_decode_paged(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed-form MLA decode attention (see the module docstring for shapes, numerics and
    `counters`; without them the splits are always merged in a second launch)."""
    _validate(q_latent, q_pe, kv_cache, block_tables, seq_lens)
    if counters is not None:
        _check_counters(counters, 0, q_latent.device)
    if q_latent.shape[0] == 0:
        return q_latent.new_empty(q_latent.shape)
    if not use_triton(q_latent.device):
        return mla_decode_paged_ref(q_latent, q_pe, kv_cache, block_tables, seq_lens, scale)
    n, heads, latent = q_latent.shape
    capacity = block_tables.shape[1] * kv_cache.shape[1]
    device = q_latent.device
    config = mla_decode_config(
        n, heads, latent, capacity, num_sms(device), max_shared_memory(device),
        q_latent.element_size(), counters.numel() if counters is not None else 0,
    )  # fmt: skip
    return launch_mla_decode(
        q_latent, q_pe, kv_cache, block_tables, seq_lens, scale, config, counters
    )
