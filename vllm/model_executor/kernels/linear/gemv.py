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

Launch shape (``GemvConfig``, ``default_config``): grid (M blocks, N blocks, SPLIT_K) with the M
blocks of one N block adjacent in launch order, so that M > BLOCK_M re-reads a weight tile from L2.
The defaults aim at tens of KB of weight loads in flight per SM, the amount HBM latency needs on an
H200 (132 SMs): a [BLOCK_N, BLOCK_K] tile of 4 KB per step (BLOCK_N 2, or more where N needs it to
fit the grid; BLOCK_K 1024 for 16-bit weights, 2048 for FP8; the 1-2 rows this form serves by
default), 4 warps, Triton's default 3 pipeline stages, and SPLIT_K > 1 only when the N blocks alone
give fewer than two programs per SM. ``USE_DOT`` swaps the broadcast-multiply-and-sum for ``tl.dot``
(weight as the wide operand, M padded to 16), whose time grows slowly with M: the default above
``FP8_GEMV_MAX_M`` (FP8) / ``BF16_GEMV_MAX_M`` (bf16 / fp16) rows (``_dot_config``: BLOCK_N 64
channels, the MMA's 64-row side, [64, 128] weight tiles, 4 stages, split-K up to one program per SM,
fed to the same reduce kernel; FP8 MMAs for FP8 weights), and for fp32 weights at more than
``_FP32_DOT_MIN_M`` rows, where the FMA cost of one reduction per row and N block outgrows the
weight read (the router's 256 x 2304 fp32 gate at T = 64..256); bf16 x takes ``bf16x3`` on bf16
tensor cores above ``_FP32_BF16X3_MIN_M`` rows (``_fp32_config``). ``block_m`` (rows per program;
None: ``min(16, next_power_of_2(M))``, with ``tl.dot`` ``next_power_of_2(M)`` within 16..64) trades
L2 re-reads of the weight for fewer programs. These are starting points measured by
``benchmarks/kernels/benchmark_gemv.py --configs`` / ``--dot-sweep`` and, for fp32 weights,
``benchmarks/kernels/benchmark_router.py --logits-configs``.

Dispatch into the layers (thresholds are module constants, tuned from that benchmark):
``UnquantizedLinearMethod`` (vllm/model_executor/layers/linear.py) calls ``gemv`` for CUDA bf16 /
fp16 inputs of at most ``max(BF16_GEMV_MAX_M, BF16_DOT_MAX_M)`` rows, and
``RowWiseTorchFP8ScaledMMLinearKernel`` (scaled_mm/pytorch.py) calls ``gemv_fp8`` for at most
``max(FP8_GEMV_MAX_M, FP8_DOT_MAX_M)`` rows, for weights of at most ``BF16_GEMV_MAX_WEIGHT_NUMEL`` /
``FP8_GEMV_MAX_WEIGHT_NUMEL`` elements; otherwise the vendor GEMM runs. A ``*_DOT_MAX_M`` of 0 keeps
the ``tl.dot`` path off: so for bf16, while FP8 takes it up to 128 rows (the H200 sweep). The LM
head (``ParallelLMHead.compute_logits``) keeps its own F.linear: cuBLAS already reads it at 96-100%
of copy. NVIDIA only: on ROCm neither path selects it (the rowwise FP8 kernel is CUDA-only, and the
bf16 dispatch asks ``current_platform.is_cuda()``); the kernel itself reads any FP8 flavour Triton
loads, e4m3fnuz included, but is not validated on ROCm.

Launches are static-shape and never read tensor values on the host: CUDA-graph capturable.
"""

from dataclasses import dataclass, replace
from functools import cache

import torch
import torch.nn.functional as F

from vllm.platforms import current_platform, supported_fp8_dtypes
from vllm.triton_utils import next_power_of_2, num_sms, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton use the torch references
    triton = None

__all__ = [
    "BF16_DOT_MAX_M",
    "BF16_GEMV_MAX_M",
    "FP8_DOT_MAX_M",
    "FP8_GEMV_MAX_M",
    "BF16_GEMV_MAX_WEIGHT_NUMEL",
    "FP8_GEMV_MAX_WEIGHT_NUMEL",
    "GemvConfig",
    "auto_split_k",
    "default_config",
    "gemv",
    "gemv_fp32",
    "gemv_fp32_ref",
    "gemv_fp8",
    "gemv_fp8_ref",
    "gemv_ref",
    "use_bf16_gemv",
    "use_fp8_gemv",
]

# What the layers send to the Triton GEMV: at most this many rows (M of the flattened input) and
# a weight of at most *_GEMV_MAX_WEIGHT_NUMEL elements; anything else runs the vendor GEMM
# (F.linear / rowwise torch._scaled_mm). From benchmarks/kernels/benchmark_gemv.py on the H200
# (docs/performance.md, 2026-12-01): the GEMV's time grows with M (each row is its own pass over
# the weight tile), so it wins only at M <= 2 (bf16 and FP8; at M = 4 the FP8 tl.dot path below
# takes o_proj in 7.6 us against the GEMV's 12.2 and _scaled_mm's 13.6); cuBLAS already reads the
# q/k/v-sized (28.7M) and LM-head weights at 76-100% at M = 1, so the large weights stay with it,
# and so does MLA's merged q | kv_a projection (2304 x 6720, 15.5M): cuBLAS 11.3 us against the
# GEMV's 14.9 at M = 1 and 11.2 / 14.7 at M = 2 (benchmark_gemv.py --shapes mla_q_kv_a, H200,
# 2026-12-01, docs/performance.md "Seventh run"). FP8 weights keep the earlier 16M: the FP8
# tl.dot path below was measured on o_proj only, and nothing says cuBLAS wins there.
BF16_GEMV_MAX_M = 2
FP8_GEMV_MAX_M = 2
BF16_GEMV_MAX_WEIGHT_NUMEL = 12 * 2**20
FP8_GEMV_MAX_WEIGHT_NUMEL = 16 * 2**20
# Above those rows and up to these, the layers take the tl.dot ("swap AB") configs of
# default_config instead of the vendor GEMM. benchmark_gemv.py --dot-sweep on the H200
# (2026-12-01, docs/performance.md): FP8 o_proj 7.4-9.7 us at M = 4-64 and 13.0 at 128 against
# _scaled_mm's 13.6-14.1 (1.8x to 1.07x), slower at 256; bf16 within 10% of cuBLAS either way
# (o_proj faster, MLA q_proj slower), so bf16 stays with cuBLAS. Only o_proj was measured in FP8
# (the PTPC recipe's one FP8 linear); recipes that quantize more send their other FP8 weights of
# at most FP8_GEMV_MAX_WEIGHT_NUMEL elements here too.
BF16_DOT_MAX_M = 0
FP8_DOT_MAX_M = 128

_FLOAT_DTYPES = (torch.bfloat16, torch.float16)
_FP32_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAX_BLOCK_M = 16  # rows per program; larger M takes more M blocks (the weight then from L2)
_MAX_DOT_BLOCK_M = 64  # the same with tl.dot: a [BLOCK_N, 64] fp32 acc stays in registers
# Weight bytes per [BLOCK_N, BLOCK_K] step of the default multiply-and-sum configs, in BLOCK_N
# channels. H200, benchmark_gemv.py at M = 1, 2026-12-02 (docs/performance.md "Ninth run"): 2
# channels of 4 KB against the earlier 4 of 8 KB (bf16) / 4 KB (FP8): FP8 o_proj 5.16 against
# 6.26 us, bf16 KDA in_proj 17.81 against 19.04, MLA q_kv_a 11.09 against 14.64; 2 x 2048 bf16
# (8 KB) took 19.74 / 12.89.
_TILE_BYTES = 4096
_TILE_CHANNELS = 2
_REDUCE_BLOCK = 1024  # outputs per program of the split-K reduction
_MAX_GRID_Y = 65535  # CUDA's limit on a grid's second (N blocks) and third (K splits) axes
_FP32_DOT_MIN_M = 8  # fp32 weights: above this many rows the default config takes tl.dot
_FP32_BF16X3_MIN_M = 4  # fp32 weights, bf16 x: above this many rows, tl.dot in bf16x3 form


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _gemv_epilogue(
        acc, m, n, m_ok, n_ok, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, stride_om,
        HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        """Store ``((acc * x_scale[m]) * w_scale[n] + bias[n])`` of an fp32 ``[BLOCK_N, BLOCK_M]``
        tile at ``out[m, n]``, rounded once to out's dtype (the references' order)."""
        if HAS_SCALES:
            acc = acc * tl.load(x_scale_ptr + m, mask=m_ok, other=0.0)[None, :]
            acc = acc * tl.load(w_scale_ptr + n, mask=n_ok, other=0.0)[:, None]
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + m.to(tl.int64)[None, :] * stride_om + n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])

    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr,
        M, N, K, stride_xm, stride_wn, stride_om, k_per_split,
        HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
        EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, FP8_MMA: tl.constexpr,
        BF16X3: tl.constexpr,
    ):  # fmt: skip
        # Program (M block, N block, K split). PARTIAL: write fp32 sums to out_ptr's
        # [SPLIT_K, M, N] buffer for _gemv_split_reduce_kernel instead of the epilogue.
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = m < M
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < N
        k_lo = tl.program_id(2) * k_per_split
        kk = tl.arange(0, BLOCK_K)
        # Padded rows and channels address row 0 under a false mask: no address leaves a tensor.
        w_rows = w_ptr + tl.where(n_ok, n, 0).to(tl.int64)[:, None] * stride_wn
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
            k = k0 + kk
            if EVEN_K:
                w = tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0)
            else:
                w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
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
                # One row at a time: the weight tile is converted once and stays in registers,
                # and no [BLOCK_M, BLOCK_N, BLOCK_K] product is ever live.
                wf = w.to(tl.float32)
                cols = tl.arange(0, BLOCK_M)[None, :]
                for i in tl.static_range(BLOCK_M):
                    row = tl.program_id(0) * BLOCK_M + i
                    x_row = x_ptr + tl.where(row < M, row, 0).to(tl.int64) * stride_xm
                    row_ok = kk * 0 + row < M  # a block (the interpreter takes no scalar mask)
                    x_ok = row_ok if EVEN_K else row_ok & (k < K)
                    xi = tl.load(x_row + k, mask=x_ok, other=0.0).to(tl.float32)
                    part = tl.sum(wf * xi[None, :], axis=1)
                    acc = tl.where(cols == i, acc + part[:, None], acc)
        if PARTIAL:
            part_ptr = out_ptr + tl.program_id(2).to(tl.int64) * M * N
            out = part_ptr + m.to(tl.int64)[None, :] * N + n[:, None]
            tl.store(out, acc, mask=n_ok[:, None] & m_ok[None, :])
        else:
            _gemv_epilogue(
                acc, m, n, m_ok, n_ok, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, stride_om,
                HAS_SCALES, HAS_BIAS,
            )  # fmt: skip

    @triton.jit
    def _gemv_split_reduce_kernel(
        part_ptr, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, M, N, stride_om,
        SPLIT_K: tl.constexpr, HAS_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
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
# Launch configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemvConfig:
    """One launch shape: output channels per program, K chunk per step, warps, K splits
    (1: no second kernel; None: ``auto_split_k``), ``tl.dot`` instead of multiply-and-sum,
    software-pipeline stages, rows per program (None: ``min(16, next_power_of_2(M))``, with
    ``tl.dot`` ``next_power_of_2(M)`` within 16..64), and ``fp8_mma``: with ``tl.dot`` and FP8
    weights, the FP8 codes go into the tensor cores as they are instead of widened to bf16 (see
    the module docstring's numerics), and ``bf16x3``: with ``tl.dot``, fp32 weights and bf16 x,
    each weight tile is split into three bf16 terms for bf16 MMAs instead of FMA products.
    Powers of two except ``split_k`` and ``num_stages``."""

    block_n: int
    block_k: int
    num_warps: int = 4
    split_k: int | None = 1
    use_dot: bool = False
    num_stages: int = 3  # Triton's CUDA default, which the routed-experts GEMV ran at
    block_m: int | None = None
    fp8_mma: bool = False
    bf16x3: bool = False

    def check(self) -> None:
        """ValueError unless the config can be launched."""
        for name in ("block_n", "block_k", "num_warps", "block_m"):
            value = getattr(self, name)
            if value is None:
                continue
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a positive power of two, got {value}")
        if (self.split_k is not None and self.split_k < 1) or self.num_stages < 1:
            raise ValueError(
                f"split_k and num_stages must be >= 1, got {self.split_k}, {self.num_stages}"
            )
        if self.fp8_mma and (not self.use_dot or self.block_k < 32):
            raise ValueError(
                f"fp8_mma needs use_dot and block_k >= 32 (one FP8 wgmma's K), got use_dot="
                f"{self.use_dot}, block_k={self.block_k}"
            )
        if self.bf16x3 and not self.use_dot:
            raise ValueError("bf16x3 needs use_dot")
        if self.use_dot and (self.block_n < 16 or self.block_k < 16):
            raise ValueError(
                f"use_dot needs block_n and block_k >= 16 (tl.dot's minimum), got "
                f"{self.block_n}, {self.block_k}"
            )
        if self.use_dot and self.block_m is not None and self.block_m < 16:
            raise ValueError(f"use_dot needs block_m >= 16 (tl.dot's minimum), got {self.block_m}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _split_k(programs: int, k: int, block_k: int, min_programs: int) -> int:
    """Doubles the K splits until ``programs`` times them reach ``min_programs``; each split
    keeps at least two K chunks, so the reduction never outweighs the weight read."""
    split_k = 1
    while programs * split_k < min_programs and k >= 4 * split_k * block_k:
        split_k *= 2
    return split_k


def _block_m(config: GemvConfig, m: int) -> int:
    if config.block_m is not None:
        return config.block_m
    if config.use_dot:
        return min(_MAX_DOT_BLOCK_M, max(16, next_power_of_2(m)))
    return min(_MAX_BLOCK_M, next_power_of_2(m))


def auto_split_k(m: int, n: int, k: int, config: GemvConfig) -> int:
    """K splits for ``config`` (its own ``split_k`` aside) at ``[m, k] @ [n, k]^T``: the fewest
    that give at least two programs per SM (one with ``tl.dot``, whose programs keep 64 KB of
    loads in flight by their pipeline stages), each split keeping at least two K chunks."""
    programs = _cdiv(n, config.block_n) * _cdiv(m, _block_m(config, m))
    per_sm = 1 if config.use_dot else 2
    return _split_k(programs, k, config.block_k, per_sm * num_sms())


@cache
def default_config(m: int, n: int, k: int, weight_bytes: int, bf16_x: bool = False) -> GemvConfig:
    """The launch shape for ``[m, k] @ [n, k]^T`` with ``weight_bytes`` per weight element
    (module docstring: 4 KB weight tile per step, split-K only when the N blocks give fewer
    than two programs per SM; above ``FP8_GEMV_MAX_M`` (FP8) /
    ``BF16_GEMV_MAX_M`` rows: ``_dot_config``; fp32 weights: ``_fp32_config``, where ``bf16_x``
    (x in bf16) allows ``bf16x3``)."""
    if weight_bytes == 4:
        return _fp32_config(m, n, k, bf16_x)
    if m > (FP8_GEMV_MAX_M if weight_bytes == 1 else BF16_GEMV_MAX_M):
        return _dot_config(m, n, k, weight_bytes)
    # Multiply-and-sum serves 1-2 rows: few to re-read from L2.
    block_n = _fitting_block_n(_TILE_CHANNELS, n)
    block_k = max(64, min(_TILE_BYTES // (block_n * weight_bytes), next_power_of_2(k)))
    config = GemvConfig(block_n, block_k, num_warps=4)
    return replace(config, split_k=auto_split_k(m, n, k, config))


def _fitting_block_n(block_n: int, n: int) -> int:
    """`block_n`, doubled until the N blocks fit a grid's second axis (the LM head's 163840
    channels take 4 where 2 would need 81920 blocks)."""
    while _cdiv(n, block_n) > _MAX_GRID_Y:
        block_n *= 2
    return block_n


def _dot_config(m: int, n: int, k: int, weight_bytes: int) -> GemvConfig:
    # Swap AB: the weight fills the MMA's 64-row side, the rows its narrow side; [64, 128]
    # weight tiles, 4 stages. FP8 codes go into the FP8 MMA: widened to bf16 they took 12.5-28 us
    # on o_proj at M = 4-128 against 7.6-13.4 (the conversion, not the read, bounds it).
    fp8 = weight_bytes == 1
    config = GemvConfig(64, 128, num_warps=4, use_dot=True, num_stages=4, fp8_mma=fp8)
    return replace(config, split_k=auto_split_k(m, n, k, config))


def _fp32_config(m: int, n: int, k: int, bf16_x: bool) -> GemvConfig:
    # Few rows: as many single-pass programs as the N blocks allow before splitting K (a split
    # costs a second launch, comparable to the whole read of the router's 2.4 MB gate): BLOCK_N 2
    # gives 128 programs on its 256 experts. More rows with bf16 x: bf16x3 on [64, 64] weight
    # tiles, M blocks of up to 16 rows to T = 16, 32 to T = 256, then 64 (the router's gate on
    # the H200, benchmark_router.py --logits, 2026-12-01: 7.4 / 7.4 / 7.5 / 7.9 / 10.7 / 19.0 /
    # 84.8 us at T = 4 / 8 / 16 / 64 / 256 / 1024 / 8192, where the FMA GEMV takes 7.5 / 11.8 at T
    # = 4 / 8 (but 4.0 / 5.2 at T = 1 / 2) and cuBLAS's fp32 GEMM 13.2 / 16.9 / 17.2 / 16.0 / 21.5
    # / 49.0 / 252). Other x: tl.dot (FMA, ieee) over [16, 64] weight tiles, M blocks of up to 64
    # rows so that T = 256 re-reads the weight from L2 only 4 times.
    if m > _FP32_BF16X3_MIN_M and bf16_x:
        block_m = 64 if m > 256 else max(16, min(32, next_power_of_2(m)))
        config = GemvConfig(64, 64, use_dot=True, block_m=block_m, bf16x3=True)
        return replace(config, split_k=auto_split_k(m, n, k, config))
    if m <= _FP32_DOT_MIN_M:
        block_k, use_dot, block_m = min(1024, max(64, next_power_of_2(k))), False, None
        block_n = _fitting_block_n(2, n)
    else:
        block_n, block_k, use_dot = 16, 64, True
        block_m = max(16, min(64, next_power_of_2(m)))
    programs = _cdiv(n, block_n) * _cdiv(m, block_m or _MAX_BLOCK_M)
    split_k = _split_k(programs, k, block_k, num_sms())
    return GemvConfig(block_n, block_k, split_k=split_k, use_dot=use_dot, block_m=block_m)


@cache
def _launch_specs(
    config: GemvConfig,
    block_m: int,
    has_scales: bool,
    has_bias: bool,
    even_k: bool,
    fp8_mma: bool,
    bf16x3: bool,
) -> tuple[LaunchSpec, LaunchSpec | None]:
    """Cached ``LaunchSpec`` s (they hold the compiled kernels) of the main and reduce kernels."""
    main = LaunchSpec(
        HAS_SCALES=has_scales, HAS_BIAS=has_bias, PARTIAL=config.split_k > 1, EVEN_K=even_k,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        USE_DOT=config.use_dot, FP8_MMA=fp8_mma, BF16X3=bf16x3, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    if config.split_k == 1:
        return main, None
    reduce = LaunchSpec(
        SPLIT_K=config.split_k, HAS_SCALES=has_scales, HAS_BIAS=has_bias, BLOCK=_REDUCE_BLOCK,
        num_warps=4,
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
    block_m = _block_m(config, m)
    # Whole K chunks in every split: the split's last chunk ends on its boundary.
    k_per_split = _cdiv(_cdiv(k, config.split_k), config.block_k) * config.block_k
    split_k = _cdiv(k, k_per_split)
    if split_k != config.split_k:
        config = replace(config, split_k=split_k)
    has_scales = x_scale is not None
    even_k = k % config.block_k == 0 and k_per_split * split_k == k
    fp8_mma = config.fp8_mma and weight.dtype in supported_fp8_dtypes()
    bf16x3 = config.bf16x3 and weight.dtype == torch.float32
    main, reduce = _launch_specs(
        config, block_m, has_scales, bias is not None, even_k, fp8_mma, bf16x3
    )
    # Unused pointer arguments get `out`: a valid tensor the constexpr flags never let be read.
    xs = x_scale if has_scales else out
    ws = w_scale if has_scales else out
    b = bias if bias is not None else out
    grid = (_cdiv(m, block_m), _cdiv(n, config.block_n), split_k)
    if max(grid[1:]) > _MAX_GRID_Y:
        raise ValueError(
            f"config.block_n {config.block_n} and {split_k} K splits give a grid of {grid[1]} N "
            f"blocks by {split_k} for N = {n}: CUDA's second and third axes hold {_MAX_GRID_Y}"
        )
    target = out
    if reduce is not None:
        target = torch.empty(split_k, m, n, dtype=torch.float32, device=out.device)
    launch(
        _gemv_kernel, grid,
        (x, weight, target, xs, ws, b, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
         k_per_split),
        main,
    )  # fmt: skip
    if reduce is not None:
        launch(
            _gemv_split_reduce_kernel, (_cdiv(m * n, _REDUCE_BLOCK), 1, 1),
            (target, out, xs, ws, b, m, n, out.stride(0)),
            reduce,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Torch references (used on CPU)
# --------------------------------------------------------------------------------------------


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x @ weight^T + bias`` in fp32, rounded once to x's dtype."""
    b = bias.float() if bias is not None else None
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


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
) -> None:
    """Shapes, devices and strides; ``weight_dtype`` None: the weight shares x's dtype."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"x must be [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
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
    if x.shape[1] > 1 and (x.stride(1) != 1 or weight.stride(1) != 1):
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
) -> torch.Tensor:
    """``x @ weight^T + bias`` for ``x`` ``[M, K]`` bf16 / fp16 and ``weight`` ``[N, K]`` of its
    dtype; ``[M, N]`` in x's dtype. ``config`` overrides ``default_config`` (benchmark sweeps)."""
    _check_operands(x, weight, bias, _FLOAT_DTYPES)
    if bias is not None and bias.dtype != x.dtype:
        raise ValueError(f"bias must be {x.dtype}, got {bias.dtype}")
    if not use_triton(x.device):
        return gemv_ref(x, weight, bias)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if out.numel() and x.shape[1]:
        _launch(x, weight, out, None, None, bias, config)
    elif out.numel():
        out.copy_(gemv_ref(x, weight, bias))  # K == 0: the bias alone
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
        _launch(x, weight, out, None, None, None, config)
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
) -> torch.Tensor:
    """PTPC FP8 ``((a @ weight^T) * a_scale) * w_scale^T + bias``: ``a`` ``[M, K]`` and ``weight``
    ``[N, K]`` FP8 codes, ``a_scale`` M and ``w_scale`` N fp32 values; ``[M, N]`` in
    ``out_dtype``. ``config`` overrides ``default_config`` (benchmark sweeps)."""
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
        _launch(a, weight, out, a_scale, w_scale, bias, config)
    elif out.numel():
        out.copy_(gemv_fp8_ref(a, a_scale, weight, w_scale, bias, out_dtype))
    return out


def use_fp8_gemv(m: int, weight: torch.Tensor) -> bool:
    """Whether the rowwise FP8 kernel sends ``m`` rows against ``weight`` to ``gemv_fp8``."""
    max_m = max(FP8_GEMV_MAX_M, FP8_DOT_MAX_M)
    return 0 < m <= max_m and weight.numel() <= FP8_GEMV_MAX_WEIGHT_NUMEL


def use_bf16_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``UnquantizedLinearMethod`` sends ``x`` (any leading dims) to ``gemv``: an NVIDIA
    GPU, bf16 / fp16 x and weight of one dtype, unit stride on K, 1..``BF16_GEMV_MAX_M`` rows (or
    ``BF16_DOT_MAX_M``, if more), a weight of at most ``BF16_GEMV_MAX_WEIGHT_NUMEL`` elements."""
    k = weight.shape[-1]
    return (
        weight.numel() <= BF16_GEMV_MAX_WEIGHT_NUMEL
        and x.is_cuda
        and current_platform.is_cuda()
        and x.dtype in _FLOAT_DTYPES
        and weight.dtype == x.dtype
        and x.dim() >= 1
        and x.shape[-1] == k
        and k > 0
        and 0 < x.numel() <= max(BF16_GEMV_MAX_M, BF16_DOT_MAX_M) * k
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
    )
