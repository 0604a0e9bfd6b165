"""Dense linears at decode sizes: a GEMV-style Triton kernel that streams the weight once, for
bf16 / fp16 weights, for PTPC FP8 (per-token activation scale, per-channel weight scale), and for
fp32 weights against bf16 / fp16 / fp32 activations (the MoE router's logits).

At M <= 16 rows a dense linear is a read of its weight: the vendor GEMMs tile for the tensor
cores and leave most of the HBM bandwidth unused at these sizes (cuBLAS bf16 ~40% of copy on
Kimi-Linear's shapes at M = 1, rowwise `torch._scaled_mm` ~17%, and still 13.4-13.7 us, ~16%,
on o_proj at every M in 5..256). Here every program owns BLOCK_N output channels and walks K in
chunks of BLOCK_K, so each weight byte is loaded exactly once, as wide vector loads along the
contiguous K, while the few activation rows come from L1 / L2. Up to a few rows each row is a
multiply-and-sum over the weight tile; above, the same loop runs the tile through the tensor
cores ("swap AB": ``tl.dot`` of the [BLOCK_N, BLOCK_K] weight tile, the MMA's wide side, with
the transposed [BLOCK_M, BLOCK_K] rows), so the time stays that of the weight read up to
hundreds of rows.

Ops (each with its torch reference beside it; CPU tensors use the reference unless
``TRITON_INTERPRET=1``):

``gemv(x, weight, bias=None)``
    ``x`` ``[M, K]`` bf16 / fp16, ``weight`` ``[N, K]`` in x's dtype, ``bias`` ``[N]`` in x's dtype
    or None; returns ``[M, N]`` in x's dtype. Reference: ``gemv_ref`` (``F.linear`` in fp32).
``gemv_fp8(a, a_scale, weight, w_scale, bias=None, out_dtype=torch.bfloat16)``
    ``a`` ``[M, K]`` FP8 codes (the platform's FP8 dtype), ``a_scale`` ``[M, 1]`` (or ``[M]``) fp32,
    ``weight`` ``[N, K]`` FP8 codes of a's dtype, ``w_scale`` ``[N, 1]`` (or ``[N]`` / ``[1, N]``)
    fp32, ``bias`` ``[N]`` or None; returns ``[M, N]`` in ``out_dtype`` (bf16 / fp16 / fp32).
    Reference: ``gemv_fp8_ref`` (what ``dequantized_matmul`` in scaled_mm/pytorch.py computes).
``gemv_batched(x, weight, out=None)``
    ``x`` ``[B, M, K]`` bf16 / fp16, ``weight`` ``[B, N, K]`` in x's dtype; returns (or writes into
    ``out``) ``[B, M, N]`` in x's dtype: the same kernel over B weights, the batch on the grid's
    third axis (MLA's absorbed per-head ``W_UK`` / ``W_UV`` at decode). Reference:
    ``gemv_batched_ref`` (``torch.bmm`` in fp32).
``gemv_fp32(x, weight)``
    ``x`` ``[M, K]`` bf16 / fp16 / fp32, ``weight`` ``[N, K]`` fp32; returns ``[M, N]`` fp32.
    Reference: ``gemv_fp32_ref`` (``F.linear(x.float(), weight)``). x is converted in registers:
    no fp32 copy of it is written.

Strides: unit stride on the last dim of ``x`` / ``a`` and ``weight`` (any row stride), so the K
loads vectorize; ``weight`` may be the ``[N, K]`` transpose of the ``[K, N]`` view that the FP8
layers hold. Scales and bias: contiguous tensors of M (a_scale) or N elements.

Numerics: every product is exact in fp32 (bf16 x bf16 and e4m3 x e4m3 fit in 24 bits), except
with fp32 weights, where each product is rounded to fp32 as in the reference, or fused into an
fma (never TF32: the ``tl.dot`` variant asks for ``input_precision="ieee"``); sums in fp32, in an
order that differs from the references' (K chunks, then a tree within a chunk; with SPLIT_K the
per-split sums are added in split order). The epilogue then does what the references do, in the
same order: ``((acc * a_scale[m]) * w_scale[n] + bias[n])`` in fp32, one rounding to the output
dtype. Kernel and reference therefore differ only by fp32 rounding of the products and of the
sums (at most about (K + 1) * 2^-24 * sum_k |x_k w_k| each off the exact sum) before the shared
final rounding. Deterministic: no atomics; a split-K launch writes fp32 partials that a second
kernel sums in a fixed order. ``tl.dot`` keeps this: bf16 / fp16 MMAs (FP8 codes are widened
to bf16, exactly) give exact products summed in fp32. The exception is ``GemvConfig.fp8_mma``,
FP8 codes straight into sm_90's FP8 MMA, the FP8 default of ``_dot_config``: that tensor core
sums its products in less than fp32 precision (NVIDIA documents no figure; DeepSeek-V3's report
measured about 14 bits), so the kernel adds its partial sums into the fp32 accumulator every 32
products (Triton's ``max_num_imprecise_acc``, the finest promotion there is), as the vendor FP8
GEMM it replaces (rowwise ``_scaled_mm``) runs on the same MMA. Within those 32 products the bound
above is not guaranteed; on the H200 the GPU tests' random o_proj-sized cases stay within it, and
products of small integer codes (exact in any order) come out exact. ``GemvConfig.bf16x3`` (fp32
weights, bf16 x, ``tl.dot``) keeps the products exact on bf16 tensor cores: each fp32 weight is
the exact sum of three bf16 terms (round to bf16, then round the exact remainder, twice; weights
of magnitude 2^-100..2^126, far beyond a router's), each term times a bf16 x is exact in fp32,
and the MMAs sum the 3 K products in fp32: the bound above with 3 K + 1 for K + 1.

Launch shapes (``GemvConfig``, ``default_config``) and when the layers send a linear here
(``use_bf16_gemv``, ``use_fp8_gemv``): gemv_config.py.

Static weights: a caller whose weight no kernel writes while the op may run (a layer's
parameters, written only at load) may pass ``static_weight=True``. Under programmatic dependent
launch (vllm/triton_utils/pdl.py) a multiply-and-sum launch whose split is one BLOCK_K step then
loads that tile, the program's whole weight, before the program waits for the kernel before it,
so that it streams in while that kernel still runs. The sums are the same, in the same order.
Only the kernel just before can still be running then (pdl.py), and only the wait makes its
writes visible, finished or not: a weight written by it must not be passed as static. Measured on
an H100 (2026-12-07, ``benchmarks/kernels/benchmark_gemv_static_weight.py``: each GEMV right after
the short launches before it, graph replay; docs/performance.md "Fifty-first run"): the FP8
o_proj at one row (one 2 x 4096 step, 0.87 of a wave) 0.28-0.41 us faster; the bf16 GEMVs of
MLA's q | kv_a (one step, 4.24 waves) and of KDA's input projection (nine steps, fused with its
norm) 0.4-0.7 us slower. So the PTPC FP8 layers (scaled_mm/pytorch.py) and MLA's absorbed
products (one step, under half a wave) pass their weights as static, the bf16 linears do not,
and weights of several steps (FP8 o_proj at two rows: two 2048-wide steps) load as before: not
measured. In the engine (the 48B config with 128 of the experts, batch 1) the step took 20-25 us
less with the router's early loads too (fused_router.py).

Launches are static-shape and never read tensor values on the host: CUDA-graph capturable.
"""

from dataclasses import replace
from functools import cache

import torch
import torch.nn.functional as F

from vllm.model_executor.kernels.linear.gemv_config import (
    MAX_GRID_Y,
    GemvConfig,
    auto_split_k,
    batched_config,
    block_rows,
    default_config,
)
from vllm.platforms import current_platform, supported_fp8_dtypes
from vllm.triton_utils import cdiv, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch references
    triton = None

__all__ = [
    "gemv",
    "gemv_batched",
    "gemv_batched_ref",
    "gemv_fp32",
    "gemv_fp32_ref",
    "gemv_fp8",
    "gemv_fp8_ref",
    "gemv_ref",
]


_FLOAT_DTYPES = (torch.bfloat16, torch.float16)
_FP32_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_REDUCE_BLOCK = 1024  # outputs per program of the split-K reduction


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _gemv_epilogue_operands(
        m, n, m_ok, n_ok, x_scale_ptr, w_scale_ptr, bias_ptr,
        HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        """``(x_scale[m], w_scale[n], bias[n])`` in fp32 (0.0 where a flag is off). The
        multiply-and-sum path loads them before the weight stream, so that their round trip
        overlaps it instead of following the last reduction (timed at one and two rows); the
        tl.dot path, not timed that way, still loads them after its loop."""
        x_scale = 0.0
        w_scale = 0.0
        bias = 0.0
        if HAS_SCALES:
            x_scale = tl.load(x_scale_ptr + m, mask=m_ok, other=0.0)
            w_scale = tl.load(w_scale_ptr + n, mask=n_ok, other=0.0)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
        return x_scale, w_scale, bias

    @triton.jit
    def _gemv_x_row(x_ptr, row, M, stride_xm, k, kk, K, EVEN_K: tl.constexpr):
        """Row ``row`` of x at columns ``k``, in fp32 (0.0 past M or K)."""
        x_row = x_ptr + tl.where(row < M, row, 0).to(tl.int64) * stride_xm
        row_ok = kk * 0 + row < M  # a block (the interpreter takes no scalar mask)
        x_ok = row_ok if EVEN_K else row_ok & (k < K)
        return tl.load(x_row + k, mask=x_ok, other=0.0).to(tl.float32)

    @triton.jit
    def _gemv_epilogue(
        acc, m, n, m_ok, n_ok, out_ptr, x_scale, w_scale, bias, stride_om,
        HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        """Store ``((acc * x_scale[m]) * w_scale[n] + bias[n])`` of an fp32 ``[BLOCK_N, BLOCK_M]``
        tile at ``out[m, n]``, rounded once to out's dtype (the references' order), from the
        operands of ``_gemv_epilogue_operands``."""
        if HAS_SCALES:
            acc = acc * x_scale[None, :]
            acc = acc * w_scale[:, None]
        if HAS_BIAS:
            acc = acc + bias[:, None]
        out = out_ptr + m.to(tl.int64)[None, :] * stride_om + n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])

    @triton.jit
    def _gemv_weight_tile(w_rows, k, n_ok, K, EVEN_K: tl.constexpr):
        """The ``[BLOCK_N, BLOCK_K]`` weight tile at columns ``k`` of the rows ``w_rows``: 0.0 past
        N (``n_ok``), and past K unless ``EVEN_K``."""
        if EVEN_K:
            return tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0)
        return tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)

    @triton.jit
    def _gemv_step(
        acc, w, k, kk, x_ptr, m, m_ok, M, K, stride_xm,
        EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, USE_DOT: tl.constexpr,
        FP8_MMA: tl.constexpr, BF16X3: tl.constexpr,
    ):  # fmt: skip
        """``acc`` ``[BLOCK_N, BLOCK_M]`` plus the weight tile ``w`` times the rows' columns
        ``k``."""
        if USE_DOT:
            x_rows = x_ptr + tl.where(m_ok, m, 0).to(tl.int64)[:, None] * stride_xm
            x_mask = m_ok[:, None] if EVEN_K else m_ok[:, None] & (k < K)[None, :]
            x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
            if FP8_MMA:
                # FP8 codes straight into the tensor cores. sm_90 sums FP8 products in less
                # than fp32: its partial sums join the fp32 acc every 32 products (one
                # wgmma's K), not once per loop (Triton's sm_90 default).
                acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=32)
            else:
                if w.dtype.is_fp8():  # e4m3 codes are exact in bf16, products in fp32
                    w = w.to(tl.bfloat16)
                    x = x.to(tl.bfloat16)
                if BF16X3:
                    # w = hi + mid + lo exactly (8 significant bits each, fp32 has 24), and
                    # bf16 x times each term is exact in fp32: bf16 MMAs, smallest term first.
                    hi = w.to(tl.bfloat16)
                    rest = w - hi.to(tl.float32)
                    mid = rest.to(tl.bfloat16)
                    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
                    x_t = tl.trans(x)
                    acc = tl.dot(lo, x_t, acc)
                    acc = tl.dot(mid, x_t, acc)
                    acc = tl.dot(hi, x_t, acc)
                elif w.dtype == tl.float32:  # IEEE products: TF32 would round the weight
                    acc += tl.dot(w, tl.trans(x.to(tl.float32)), input_precision="ieee")
                else:
                    acc += tl.dot(w, tl.trans(x))
        else:
            # One row at a time, so no [BLOCK_M, BLOCK_N, BLOCK_K] product is ever live. The
            # weight tile is converted where the first row is used (one conversion: the
            # compiler merges the rows' identical ones), so that row's load is issued with
            # the weight's instead of after the conversion has waited for the weight. The
            # PTX is the same either way (ptxas orders the SASS), so the compile test's
            # barrier check cannot see this placement; the call-54 timings and SASS can.
            # Each row's load is issued before the previous row's sum, whose cross-warp
            # barrier would otherwise hold it back one round trip.
            cols = tl.arange(0, BLOCK_M)[None, :]
            x_next = _gemv_x_row(x_ptr, tl.program_id(0) * BLOCK_M, M, stride_xm, k, kk, K,
                                 EVEN_K)  # fmt: skip
            for i in tl.static_range(BLOCK_M):
                xi = x_next
                if i + 1 < BLOCK_M:
                    x_next = _gemv_x_row(x_ptr, tl.program_id(0) * BLOCK_M + i + 1, M,
                                         stride_xm, k, kk, K, EVEN_K)  # fmt: skip
                part = tl.sum(w.to(tl.float32) * xi[None, :], axis=1)
                acc = tl.where(cols == i, acc + part[:, None], acc)
        return acc

    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr,
        M, N, K, stride_xm, stride_wn, stride_om, k_per_split, stride_xb, stride_wb, stride_ob,
        HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
        EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, FP8_MMA: tl.constexpr,
        BF16X3: tl.constexpr, BATCHED: tl.constexpr, PRELOAD: tl.constexpr = False,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        # Program (M block, N block, K split), or with BATCHED (M block, N block, batch) over
        # the whole K. PARTIAL: write fp32 sums to out_ptr's [SPLIT_K, M, N] buffer for
        # _gemv_split_reduce_kernel instead of the epilogue. PRELOAD: the weight is static (no
        # kernel in flight writes it) and the split's K is one BLOCK_K step, whose tile is
        # loaded before the PDL wait, while the kernel before it still runs
        # (vllm/triton_utils/pdl.py); no loop follows it.
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = m < M
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < N
        if BATCHED:
            batch = tl.program_id(2).to(tl.int64)
            x_ptr += batch * stride_xb
            w_ptr += batch * stride_wb
            out_ptr += batch * stride_ob
            k_lo = 0
        else:
            k_lo = tl.program_id(2) * k_per_split
        kk = tl.arange(0, BLOCK_K)
        # Padded rows and channels address row 0 under a false mask: no address leaves a tensor.
        w_rows = w_ptr + tl.where(n_ok, n, 0).to(tl.int64)[:, None] * stride_wn
        if PRELOAD:
            w_first = _gemv_weight_tile(w_rows, k_lo + kk, n_ok, K, EVEN_K)
        pdl_wait(PDL)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        if not PARTIAL and not USE_DOT:
            x_scale, w_scale, bias = _gemv_epilogue_operands(
                m, n, m_ok, n_ok, x_scale_ptr, w_scale_ptr, bias_ptr, HAS_SCALES, HAS_BIAS
            )
        if PRELOAD:
            acc = _gemv_step(acc, w_first, k_lo + kk, kk, x_ptr, m, m_ok, M, K, stride_xm,
                             EVEN_K, BLOCK_M, USE_DOT, FP8_MMA, BF16X3)  # fmt: skip
        else:
            for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
                w = _gemv_weight_tile(w_rows, k0 + kk, n_ok, K, EVEN_K)
                acc = _gemv_step(acc, w, k0 + kk, kk, x_ptr, m, m_ok, M, K, stride_xm, EVEN_K,
                                 BLOCK_M, USE_DOT, FP8_MMA, BF16X3)  # fmt: skip
        if PARTIAL:
            part_ptr = out_ptr + tl.program_id(2).to(tl.int64) * M * N
            out = part_ptr + m.to(tl.int64)[None, :] * N + n[:, None]
            tl.store(out, acc, mask=n_ok[:, None] & m_ok[None, :])
        else:
            if USE_DOT:
                x_scale, w_scale, bias = _gemv_epilogue_operands(
                    m, n, m_ok, n_ok, x_scale_ptr, w_scale_ptr, bias_ptr, HAS_SCALES, HAS_BIAS
                )
            _gemv_epilogue(
                acc, m, n, m_ok, n_ok, out_ptr, x_scale, w_scale, bias, stride_om, HAS_SCALES,
                HAS_BIAS,
            )  # fmt: skip

    @triton.jit
    def _gemv_split_reduce_kernel(
        part_ptr, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, M, N, stride_om,
        SPLIT_K: tl.constexpr, HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Sums the SPLIT_K fp32 partials of BLOCK outputs in split order (deterministic).
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = idx < M * N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(part_ptr + s * M * N + idx, mask=ok, other=0.0)
        m = idx // N
        n = idx % N
        if HAS_SCALES:
            acc = acc * tl.load(x_scale_ptr + m, mask=ok, other=0.0)
            acc = acc * tl.load(w_scale_ptr + n, mask=ok, other=0.0)
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + n, mask=ok, other=0.0).to(tl.float32)
        tl.store(
            out_ptr + m.to(tl.int64) * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=ok
        )


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


@cache
def _launch_specs(
    config: GemvConfig,
    block_m: int,
    has_scales: bool,
    has_bias: bool,
    even_k: bool,
    fp8_mma: bool,
    bf16x3: bool,
    pdl: bool,
    batched: bool = False,
    static_weight: bool = False,
    one_step: bool = False,
) -> tuple[LaunchSpec, LaunchSpec | None]:
    """Cached ``LaunchSpec`` s (they hold the compiled kernels) of the main and reduce kernels.
    A ``static_weight`` whose split is ``one_step`` (one BLOCK_K step) is loaded before the PDL
    wait in the multiply-and-sum configs (``PRELOAD``, where it was measured faster); the
    ``tl.dot`` configs, pipelined over K by Triton, and weights of several steps keep their timed
    form."""
    preload = static_weight and one_step and not config.use_dot
    main = LaunchSpec(
        HAS_SCALES=has_scales, HAS_BIAS=has_bias, PARTIAL=config.split_k > 1, EVEN_K=even_k,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        USE_DOT=config.use_dot, FP8_MMA=fp8_mma, BF16X3=bf16x3, BATCHED=batched,
        PRELOAD=preload,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl_options(pdl),
    )  # fmt: skip
    if config.split_k == 1:
        return main, None
    reduce = LaunchSpec(
        SPLIT_K=config.split_k, HAS_SCALES=has_scales, HAS_BIAS=has_bias, BLOCK=_REDUCE_BLOCK,
        num_warps=4, **pdl_options(pdl),
    )  # fmt: skip
    return main, reduce


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    x_scale: torch.Tensor | None,
    w_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    config: GemvConfig | None,
    static_weight: bool,
) -> None:
    m, k = x.shape
    n = weight.shape[0]
    if config is None:
        # bf16 x matters to fp32 weights only (bf16x3): one cache entry per shape elsewhere.
        bf16_x = weight.dtype == torch.float32 and x.dtype == torch.bfloat16
        config = default_config(m, n, k, weight.element_size(), bf16_x)
    else:
        config.check()
    if config.split_k is None:
        config = replace(config, split_k=auto_split_k(m, n, k, config))
    block_m = block_rows(config, m)
    # Whole K chunks in every split: the split's last chunk ends on its boundary.
    k_per_split = cdiv(cdiv(k, config.split_k), config.block_k) * config.block_k
    split_k = cdiv(k, k_per_split)
    if split_k != config.split_k:
        config = replace(config, split_k=split_k)
    has_scales = x_scale is not None
    even_k = k % config.block_k == 0 and k_per_split * split_k == k
    fp8_mma = config.fp8_mma and weight.dtype in supported_fp8_dtypes()
    bf16x3 = config.bf16x3 and weight.dtype == torch.float32
    main, reduce = _launch_specs(
        config, block_m, has_scales, bias is not None, even_k, fp8_mma, bf16x3, use_pdl(x.device),
        static_weight=static_weight, one_step=k_per_split == config.block_k,
    )  # fmt: skip
    # Unused pointer arguments get `out`: a valid tensor the constexpr flags never let be read.
    xs = x_scale if has_scales else out
    ws = w_scale if has_scales else out
    b = bias if bias is not None else out
    grid = (cdiv(m, block_m), cdiv(n, config.block_n), split_k)
    if max(grid[1:]) > MAX_GRID_Y:
        raise ValueError(
            f"config.block_n {config.block_n} and {split_k} K splits give a grid of {grid[1]} N "
            f"blocks by {split_k} for N = {n}: CUDA's second and third axes hold {MAX_GRID_Y}"
        )
    target = out
    if reduce is not None:
        target = torch.empty(split_k, m, n, dtype=torch.float32, device=out.device)
    launch(
        _gemv_kernel, grid,
        (x, weight, target, xs, ws, b, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
         k_per_split, 0, 0, 0),
        main,
    )  # fmt: skip
    if reduce is not None:
        launch(
            _gemv_split_reduce_kernel, (cdiv(m * n, _REDUCE_BLOCK), 1, 1),
            (target, out, xs, ws, b, m, n, out.stride(0)),
            reduce,
        )  # fmt: skip


def _launch_batched(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    config: GemvConfig | None,
    static_weight: bool,
) -> None:
    batch, m, k = x.shape
    n = weight.shape[1]
    if config is None:
        config = batched_config(batch, m, n, k)
    else:
        config.check()
        if config.split_k != 1 or config.use_dot:
            raise ValueError(
                f"a batched launch takes multiply-and-sum configs without K splits, got "
                f"split_k={config.split_k}, use_dot={config.use_dot}"
            )
    block_m = block_rows(config, m)
    grid = (cdiv(m, block_m), cdiv(n, config.block_n), batch)
    if max(grid[1:]) > MAX_GRID_Y:
        raise ValueError(
            f"{grid[1]} N blocks of {config.block_n} by {batch} batches: CUDA's second and third "
            f"axes hold {MAX_GRID_Y}"
        )
    main, _ = _launch_specs(
        config, block_m, False, False, k % config.block_k == 0, False, False, use_pdl(x.device),
        batched=True, static_weight=static_weight, one_step=k <= config.block_k,
    )  # fmt: skip
    # The scale and bias pointers get `out`, never read (HAS_SCALES / HAS_BIAS off).
    launch(
        _gemv_kernel, grid,
        (x, weight, out, out, out, out, m, n, k, x.stride(1), weight.stride(1), out.stride(1),
         cdiv(k, config.block_k) * config.block_k, x.stride(0), weight.stride(0),
         out.stride(0)),
        main,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Torch references (used on CPU)
# --------------------------------------------------------------------------------------------


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x @ weight^T + bias`` in fp32, rounded once to x's dtype."""
    b = bias.float() if bias is not None else None
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


def gemv_batched_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x[b] @ weight[b]^T`` for each batch in fp32, rounded once to x's dtype."""
    return torch.bmm(x.float(), weight.float().transpose(1, 2)).to(x.dtype)


def gemv_fp32_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight^T`` of x converted to fp32 and the fp32 weight, in fp32."""
    return F.linear(x.float(), weight)


def gemv_fp8_ref(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    weight: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``((a @ weight^T) * a_scale) * w_scale^T + bias`` in fp32 on the FP8 codes (the scales
    factor out of the sum), rounded once to ``out_dtype``."""
    out = (a.float() @ weight.float().t()) * a_scale.reshape(-1, 1) * w_scale.reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


# --------------------------------------------------------------------------------------------
# Validation and public ops
# --------------------------------------------------------------------------------------------


def _check_operands(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dtypes: tuple,
    weight_dtype: torch.dtype | None = None,
    batched: bool = False,
) -> None:
    """Shapes, devices and strides; ``weight_dtype`` None: the weight shares x's dtype;
    ``batched``: ``[B, M, K]`` x and ``[B, N, K]`` weight (no bias)."""
    if batched:
        if x.dim() != 3 or weight.dim() != 3 or x.shape[0] != weight.shape[0]:
            raise ValueError(
                f"x must be [B, M, K] and weight [B, N, K], got {tuple(x.shape)} and "
                f"{tuple(weight.shape)}"
            )
    elif x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"x must be [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"x and weight must share K (the last dim), got {tuple(x.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if weight_dtype is not None:
        if x.dtype not in dtypes or weight.dtype != weight_dtype:
            raise ValueError(
                f"x must be one of {[str(d) for d in dtypes]} and weight {weight_dtype}, got "
                f"{x.dtype} and {weight.dtype}"
            )
    elif x.dtype not in dtypes or weight.dtype != x.dtype:
        raise ValueError(
            f"x and weight must share one dtype of {[str(d) for d in dtypes]}, got {x.dtype} and "
            f"{weight.dtype}"
        )
    if x.device != weight.device:
        raise ValueError(f"x and weight must be on one device, got {x.device} and {weight.device}")
    if x.shape[-1] > 1 and (x.stride(-1) != 1 or weight.stride(-1) != 1):
        raise ValueError(
            f"x and weight must have unit stride on K, got strides {x.stride()} and "
            f"{weight.stride()}"
        )
    if bias is not None and (
        bias.shape != (weight.shape[0],) or bias.device != x.device or bias.stride(0) != 1
    ):
        raise ValueError(
            f"bias must be a contiguous [{weight.shape[0]}] tensor on {x.device}, got "
            f"{tuple(bias.shape)} on {bias.device}"
        )


def _check_scale(name: str, scale: torch.Tensor, rows: int, device: torch.device) -> None:
    if (
        scale.numel() != rows
        or scale.dtype != torch.float32
        or scale.device != device
        or not scale.is_contiguous()
    ):
        raise ValueError(
            f"{name} must hold {rows} contiguous float32 values on {device}, got "
            f"{tuple(scale.shape)} {scale.dtype} on {scale.device}"
        )


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: GemvConfig | None = None,
    static_weight: bool = False,
) -> torch.Tensor:
    """``x @ weight^T + bias`` for ``x`` ``[M, K]`` bf16 / fp16 and ``weight`` ``[N, K]`` of its
    dtype; ``[M, N]`` in x's dtype. ``config`` overrides ``default_config`` (benchmark sweeps);
    ``static_weight``: see "Static weights" in the module docstring."""
    _check_operands(x, weight, bias, _FLOAT_DTYPES)
    if bias is not None and bias.dtype != x.dtype:
        raise ValueError(f"bias must be {x.dtype}, got {bias.dtype}")
    if not use_triton(x.device):
        return gemv_ref(x, weight, bias)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if out.numel() and x.shape[1]:
        _launch(x, weight, out, None, None, bias, config, static_weight)
    elif out.numel():
        out.copy_(gemv_ref(x, weight, bias))  # K == 0: the bias alone
    return out


def _check_batched(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> None:
    _check_operands(x, weight, None, _FLOAT_DTYPES, batched=True)
    if out is None:
        return
    shape = (x.shape[0], x.shape[1], weight.shape[1])
    if out.shape != shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must be {x.dtype} {shape} on {x.device}, got {out.dtype} {tuple(out.shape)} on "
            f"{out.device}"
        )
    if shape[2] > 1 and out.stride(2) != 1:
        raise ValueError(f"out must have unit stride on N, got strides {out.stride()}")


def gemv_batched(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    static_weight: bool = False,
) -> torch.Tensor:
    """``x[b] @ weight[b]^T`` for each ``b``: ``x`` ``[B, M, K]`` bf16 / fp16 and ``weight``
    ``[B, N, K]`` of its dtype, unit stride on K (any other strides); ``[B, M, N]`` in x's dtype,
    written into ``out`` when given (any strides with unit stride on N: a transposed view of the
    caller's rows takes the product in place). One launch, the batch on the grid's third axis.
    ``config`` overrides ``batched_config`` (multiply-and-sum, no K splits); ``static_weight``:
    see "Static weights" in the module docstring."""
    _check_batched(x, weight, out)
    if not use_triton(x.device):
        ref = gemv_batched_ref(x, weight)
        return ref if out is None else out.copy_(ref)
    if out is None:
        out = torch.empty(x.shape[0], x.shape[1], weight.shape[1], dtype=x.dtype, device=x.device)
    if out.numel() and x.shape[2]:
        _launch_batched(x, weight, out, config, static_weight)
    elif out.numel():
        out.zero_()  # K == 0: the empty sum
    return out


def gemv_fp32(
    x: torch.Tensor, weight: torch.Tensor, *, config: GemvConfig | None = None
) -> torch.Tensor:
    """``x @ weight^T`` in fp32 for ``x`` ``[M, K]`` bf16 / fp16 / fp32 and ``weight`` ``[N, K]``
    fp32; ``[M, N]`` fp32. ``config`` overrides ``default_config`` (benchmark sweeps); a
    ``bf16x3`` config needs bf16 x."""
    _check_operands(x, weight, None, _FP32_X_DTYPES, torch.float32)
    if config is not None and config.bf16x3 and x.dtype != torch.bfloat16:
        raise ValueError(f"a bf16x3 config needs bf16 x (exact in bf16 MMAs), got {x.dtype}")
    if not use_triton(x.device):
        return gemv_fp32_ref(x, weight)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    if out.numel() and x.shape[1]:
        _launch(x, weight, out, None, None, None, config, False)
    elif out.numel():
        out.zero_()  # K == 0: the empty sum
    return out


def gemv_fp8(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    weight: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: GemvConfig | None = None,
    static_weight: bool = False,
) -> torch.Tensor:
    """PTPC FP8 ``((a @ weight^T) * a_scale) * w_scale^T + bias``: ``a`` ``[M, K]`` and ``weight``
    ``[N, K]`` FP8 codes, ``a_scale`` M and ``w_scale`` N fp32 values; ``[M, N]`` in
    ``out_dtype``. ``config`` overrides ``default_config`` (benchmark sweeps);
    ``static_weight``: see "Static weights" in the module docstring."""
    _check_operands(a, weight, bias, supported_fp8_dtypes())
    _check_scale("a_scale", a_scale, a.shape[0], a.device)
    _check_scale("w_scale", w_scale, weight.shape[0], a.device)
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(
            f"out_dtype must be one of {[str(d) for d in _OUT_DTYPES]}, got {out_dtype}"
        )
    if bias is not None and not bias.is_floating_point():
        raise ValueError(f"bias must be floating point, got {bias.dtype}")
    triton_fp8 = a.device.type != "cuda" or current_platform.triton_supports_fp8(a.dtype)
    if not (use_triton(a.device) and triton_fp8):
        return gemv_fp8_ref(a, a_scale, weight, w_scale, bias, out_dtype)
    out = torch.empty(a.shape[0], weight.shape[0], dtype=out_dtype, device=a.device)
    if out.numel() and a.shape[1]:
        _launch(a, weight, out, a_scale, w_scale, bias, config, static_weight)
    elif out.numel():
        out.copy_(gemv_fp8_ref(a, a_scale, weight, w_scale, bias, out_dtype))
    return out
