"""The GEMV's launch shapes, and when the layers send a dense linear to it (kernels in gemv.py).

Launch shape (``GemvConfig``, ``default_config``): grid (M blocks, N blocks, SPLIT_K) with the M
blocks of one N block adjacent in launch order, so that M > BLOCK_M re-reads a weight tile from L2.
The defaults aim at tens of KB of weight loads in flight per SM, the amount HBM latency needs on an
H200 (132 SMs): BLOCK_N 2 channels (or more where N needs it to fit the grid) of BLOCK_K weights per
step, 4096 at one row and 2048 at two (the 1-2 rows this form serves by default; o_proj's K of 4096
is then one step at one row), 4 warps, one pipeline stage, and SPLIT_K > 1 only when the N blocks
alone give fewer than two programs per SM. At one row, a weight that only the one-row bounds below
send here (over ``BF16_GEMV_MAX_WEIGHT_NUMEL``) takes ``WIDE_TILE`` instead from
``WIDE_TILE_MIN_N`` channels. ``USE_DOT`` swaps the broadcast-multiply-and-sum for ``tl.dot``
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
``FP8_GEMV_MAX_WEIGHT_NUMEL`` elements (bf16 at one row of K up to ``BF16_GEMV_M1_MAX_K``: up to
``BF16_GEMV_M1_MAX_WEIGHT_NUMEL``, which admits Kimi-Linear's KDA and MLA input projections);
otherwise the vendor GEMM runs. A ``*_DOT_MAX_M`` of 0 keeps the ``tl.dot`` path off: so for bf16,
while FP8 takes it up to 128 rows (the H200 sweep). The LM head (``ParallelLMHead.compute_logits``)
keeps its own F.linear: cuBLAS already reads it at 96-100% of copy. NVIDIA only: on ROCm neither
path selects it (the bf16 dispatch asks ``current_platform.is_cuda()``, and the rowwise FP8 kernel,
which runs on ROCm too, sends every ROCm call to ``torch._scaled_mm``); the kernel itself reads any
FP8 flavour Triton loads, e4m3fnuz included, but is not validated on ROCm.
"""

from dataclasses import dataclass, replace
from functools import cache

import torch

from vllm.platforms import current_platform
from vllm.triton_utils import cdiv, next_power_of_2, num_sms

__all__ = [
    "BATCHED_GEMV_MAX_M",
    "BF16_DOT_MAX_M",
    "BF16_GEMV_M1_MAX_K",
    "BF16_GEMV_M1_MAX_WEIGHT_NUMEL",
    "BF16_GEMV_MAX_M",
    "BF16_GEMV_MAX_WEIGHT_NUMEL",
    "FP8_DOT_MAX_M",
    "FP8_GEMV_MAX_M",
    "FP8_GEMV_MAX_WEIGHT_NUMEL",
    "MAX_GRID_Y",
    "WIDE_TILE",
    "WIDE_TILE_MIN_N",
    "GemvConfig",
    "auto_split_k",
    "batched_config",
    "bf16_gemv_weight_fits",
    "block_rows",
    "default_config",
    "use_batched_gemv",
    "use_bf16_gemv",
    "use_fp8_gemv",
]

# What the layers send to the Triton GEMV: at most this many rows (M of the flattened input) and
# a weight of at most *_GEMV_MAX_WEIGHT_NUMEL elements (bf16 at one row: the BF16_GEMV_M1_*
# bounds below); anything else runs the vendor GEMM
# (F.linear / rowwise torch._scaled_mm). From benchmarks/kernels/benchmark_gemv.py on the H200
# (docs/performance.md, 2026-12-01): the GEMV's time grows with M (each row is its own pass over
# the weight tile), so it wins only at M <= 2 (bf16 and FP8; at M = 4 the FP8 tl.dot path below
# takes o_proj in 7.6 us against the GEMV's 12.2 and _scaled_mm's 13.6). Above 12M elements
# cuBLAS kept the weights then (MLA's merged q | kv_a projection, 2304 x 6720, 15.5M: 11.3 us
# against the GEMV's 14.9 at M = 1 and 11.2 / 14.7 at M = 2; benchmark_gemv.py --shapes
# mla_q_kv_a, H200, 2026-12-01, docs/performance.md "Seventh run"), and keeps them at two rows;
# the one-row bound is BF16_GEMV_M1_MAX_WEIGHT_NUMEL since. FP8 weights keep the earlier 16M: the
# FP8 tl.dot path below was measured on o_proj only, and nothing says cuBLAS wins there.
BF16_GEMV_MAX_M = 2
FP8_GEMV_MAX_M = 2
BF16_GEMV_MAX_WEIGHT_NUMEL = 12 * 2**20
# At one row larger bf16 weights go to it too, of K up to the measured shapes': on the H200
# (benchmark_gemv.py --shapes qkv mla_q_kv_a, docs/performance.md "Forty-ninth run", call 194)
# the benchmark's KDA input projection shape (2304 -> 12448; the model's is 12576 wide) took
# 15.41 us in WIDE_TILE against cuBLAS's 17.71, and MLA's q | kv_a (15.5M) 9.72 us in the
# default tiles against 11.88; at two rows cuBLAS kept q | kv_a (11.04 against 13.47 us), so the
# 12M bound stays there. Larger K was not timed (the dense first layer's down projection, K 9216,
# and Kimi-K3's latent-MoE up projection, K 3584, stay with cuBLAS; benchmark_gemv.py --shapes
# dense_down times the first).
BF16_GEMV_M1_MAX_WEIGHT_NUMEL = 32 * 2**20
BF16_GEMV_M1_MAX_K = 2304
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
# Rows up to which MLA's absorbed per-head products (`W_UK` [32, 512, 128], `W_UV` [32, 128, 512]
# at decode) take gemv_batched rather than torch.bmm. H200 (benchmark_gemv_batched.py, graph
# replay, docs/performance.md "Nineteenth run"), GEMV against bmm, us: W_UK 2.7 / 3.3 / 3.9 / 5.2
# against 4.0-4.2 at 1 / 2 / 4 / 8 rows, W_UV 2.9 / 3.6 / 4.3 / 6.0 against 4.2-4.4. Two rows
# win too, but under Triton 3.6 the second row's load then waits behind the first row's
# conversion through shared memory (the compile test's load-order check; loading x as a tile of
# equal rows instead fixed that and made one row 1.2-1.65x slower: call 69 against call 68, on
# another machine), and the engine was timed at one.
BATCHED_GEMV_MAX_M = 1

_X_DTYPES = (torch.bfloat16, torch.float16)  # activations of the bf16 / fp16 GEMV
_MAX_BLOCK_M = 16  # rows per program; larger M takes more M blocks (the weight then from L2)
_MAX_DOT_BLOCK_M = 64  # the same with tl.dot: a [BLOCK_N, 64] fp32 acc stays in registers
# Weights per channel and step (BLOCK_K) of the default multiply-and-sum configs at 1 and 2 rows,
# in _TILE_CHANNELS channels, one pipeline stage. H200, benchmark_gemv.py --shapes o_proj (K 4096),
# 2026-12-02 (docs/performance.md "Sixteenth run"), us at M = 1 / 2, with the row loaded beside
# the weight: FP8 4.56 / 5.41 against 5.22 / 5.43 for the earlier 4 KB steps (2048 FP8 codes,
# 1024 bf16 values; 3 stages), bf16 6.65 / 7.67 against 7.71 / 9.38; 4096 at two rows took 5.88
# (FP8) / 7.75 (bf16). Two channels rather than 4 per program come from the ninth run (FP8 o_proj
# 5.16 against 6.26 us at M = 1).
_STEP_ELEMENTS = {1: 4096, 2: 2048}
_TILE_CHANNELS = 2
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second (N blocks) and third (K splits) axes
_FP32_DOT_MIN_M = 8  # fp32 weights: above this many rows the default config takes tl.dot
_FP32_BF16X3_MIN_M = 4  # fp32 weights, bf16 x: above this many rows, tl.dot in bf16x3 form


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


# One bf16 row of a weight that only the one-row bounds let in (above BF16_GEMV_MAX_WEIGHT_NUMEL,
# within the BF16_GEMV_M1_* bounds; smaller weights keep the tiles they were timed in, the LM
# head's too) with at least WIDE_TILE_MIN_N output channels: 16 channels of 256-wide steps, 8
# warps, one stage (call 194: the KDA input projection's shape, N 12448, 15.41 us, the best of the
# seven configs timed; at N 6720 the default tiles won, 9.72 against 11.75 us in this one).
WIDE_TILE = GemvConfig(16, 256, num_warps=8, num_stages=1)
WIDE_TILE_MIN_N = 8192


def _split_k(programs: int, k: int, block_k: int, min_programs: int) -> int:
    """Doubles the K splits until ``programs`` times them reach ``min_programs``; each split
    keeps at least two K chunks, so the reduction never outweighs the weight read."""
    split_k = 1
    while programs * split_k < min_programs and k >= 4 * split_k * block_k:
        split_k *= 2
    return split_k


def block_rows(config: GemvConfig, m: int) -> int:
    """Rows per program of ``config`` at ``m`` rows (its ``block_m``, or the default's)."""
    if config.block_m is not None:
        return config.block_m
    if config.use_dot:
        return min(_MAX_DOT_BLOCK_M, max(16, next_power_of_2(m)))
    return min(_MAX_BLOCK_M, next_power_of_2(m))


def auto_split_k(m: int, n: int, k: int, config: GemvConfig) -> int:
    """K splits for ``config`` (its own ``split_k`` aside) at ``[m, k] @ [n, k]^T``: the fewest
    that give at least two programs per SM (one with ``tl.dot``, whose programs keep 64 KB of
    loads in flight by their pipeline stages), each split keeping at least two K chunks."""
    programs = cdiv(n, config.block_n) * cdiv(m, block_rows(config, m))
    per_sm = 1 if config.use_dot else 2
    return _split_k(programs, k, config.block_k, per_sm * num_sms())


@cache
def default_config(m: int, n: int, k: int, weight_bytes: int, bf16_x: bool = False) -> GemvConfig:
    """The launch shape for ``[m, k] @ [n, k]^T`` with ``weight_bytes`` per weight element
    (module docstring): 2 channels of 4096 / 2048 weights per step at 1 / 2 rows, one stage (a
    K beyond one step runs its steps unpipelined), split-K only when the N blocks give fewer
    than two programs per SM; ``WIDE_TILE`` at one bf16 row of a weight only the one-row bounds
    let in, from ``WIDE_TILE_MIN_N`` channels; above ``FP8_GEMV_MAX_M`` (FP8) /
    ``BF16_GEMV_MAX_M`` rows: ``_dot_config``; fp32 weights: ``_fp32_config``, where ``bf16_x``
    (x in bf16) allows ``bf16x3``."""
    if weight_bytes == 4:
        return _fp32_config(m, n, k, bf16_x)
    if m > (FP8_GEMV_MAX_M if weight_bytes == 1 else BF16_GEMV_MAX_M):
        return _dot_config(m, n, k, weight_bytes)
    # Multiply-and-sum serves 1-2 rows: few to re-read from L2.
    one_row_only = BF16_GEMV_MAX_WEIGHT_NUMEL < n * k and bf16_gemv_weight_fits(m, n * k, k)
    if weight_bytes == 2 and n >= WIDE_TILE_MIN_N and one_row_only:
        config = replace(WIDE_TILE, block_n=_fitting_block_n(WIDE_TILE.block_n, n))
        return replace(config, split_k=auto_split_k(m, n, k, config))
    # Wider channel blocks (the LM head's, to fit the grid) keep the step's elements.
    block_n = _fitting_block_n(_TILE_CHANNELS, n)
    step = _STEP_ELEMENTS.get(m, min(_STEP_ELEMENTS.values())) * _TILE_CHANNELS // block_n
    block_k = max(64, min(step, next_power_of_2(k)))
    config = GemvConfig(block_n, block_k, num_warps=4, num_stages=1)
    return replace(config, split_k=auto_split_k(m, n, k, config))


@cache
def batched_config(batch: int, m: int, n: int, k: int) -> GemvConfig:
    """The launch shape of ``gemv_batched`` for ``batch`` products ``[m, k] @ [n, k]^T``: the
    default's step of weights per program (8192 at one row, 4096 above; the whole K in one step
    for K up to it, as the MLA absorbs' 128 and 512),
    channels filling the step, halved while the grid holds fewer than two programs per SM (on
    the H200 at one row: W_UK 32 channels of 128, 2.7-3.0 us, W_UV 8 of 512, 3.2 us, against
    torch.bmm's 4.0 / 4.2; the unhalved 64 / 16 channels timed alike, 2.8 / 3.0)."""
    step = _STEP_ELEMENTS.get(m, min(_STEP_ELEMENTS.values())) * _TILE_CHANNELS
    block_k = max(64, min(step, next_power_of_2(k)))
    block_n = max(_TILE_CHANNELS, min(step // block_k, next_power_of_2(n)))
    rows = cdiv(m, min(_MAX_BLOCK_M, next_power_of_2(m)))
    while block_n > _TILE_CHANNELS and batch * cdiv(n, block_n) * rows < 2 * num_sms():
        block_n //= 2
    return GemvConfig(block_n, block_k, num_warps=4, num_stages=1)


def _fitting_block_n(block_n: int, n: int) -> int:
    """`block_n`, doubled until the N blocks fit a grid's second axis (the LM head's 163840
    channels take 4 where 2 would need 81920 blocks)."""
    while cdiv(n, block_n) > MAX_GRID_Y:
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
    programs = cdiv(n, block_n) * cdiv(m, block_m or _MAX_BLOCK_M)
    split_k = _split_k(programs, k, block_k, num_sms())
    return GemvConfig(block_n, block_k, split_k=split_k, use_dot=use_dot, block_m=block_m)


def use_fp8_gemv(m: int, weight: torch.Tensor) -> bool:
    """Whether the rowwise FP8 kernel sends ``m`` rows against ``weight`` to ``gemv_fp8``."""
    max_m = max(FP8_GEMV_MAX_M, FP8_DOT_MAX_M)
    return 0 < m <= max_m and weight.numel() <= FP8_GEMV_MAX_WEIGHT_NUMEL


def use_batched_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` ``[B, M, K]`` against ``weight`` ``[B, N, K]`` goes to ``gemv_batched``
    rather than ``torch.bmm``: an NVIDIA GPU, bf16 / fp16 of one dtype, unit stride on K, 1..
    ``BATCHED_GEMV_MAX_M`` rows."""
    return (
        x.is_cuda
        and current_platform.is_cuda()
        and x.dtype in _X_DTYPES
        and weight.dtype == x.dtype
        and 0 < x.shape[1] <= BATCHED_GEMV_MAX_M
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
    )


def bf16_gemv_weight_fits(rows: int, numel: int, k: int) -> bool:
    """Whether a bf16 / fp16 weight of ``numel`` elements and row length ``k`` is small enough
    for the GEMV at ``rows`` rows (the one-row bound where K is within ``BF16_GEMV_M1_MAX_K``)."""
    one_short_row = rows == 1 and k <= BF16_GEMV_M1_MAX_K
    return numel <= (BF16_GEMV_M1_MAX_WEIGHT_NUMEL if one_short_row else BF16_GEMV_MAX_WEIGHT_NUMEL)


def use_bf16_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``UnquantizedLinearMethod`` sends ``x`` (any leading dims) to ``gemv``: an NVIDIA
    GPU, bf16 / fp16 x and weight of one dtype, unit stride on K, 1..``BF16_GEMV_MAX_M`` rows (or
    ``BF16_DOT_MAX_M``, if more), a weight of at most ``BF16_GEMV_MAX_WEIGHT_NUMEL`` elements
    (``BF16_GEMV_M1_MAX_WEIGHT_NUMEL`` at one row of at most ``BF16_GEMV_M1_MAX_K``)."""
    k = weight.shape[-1]
    return (
        k > 0
        and bf16_gemv_weight_fits(x.numel() // k, weight.numel(), k)
        and x.is_cuda
        and current_platform.is_cuda()
        and x.dtype in _X_DTYPES
        and weight.dtype == x.dtype
        and x.dim() >= 1
        and x.shape[-1] == k
        and 0 < x.numel() <= max(BF16_GEMV_MAX_M, BF16_DOT_MAX_M) * k
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
    )
