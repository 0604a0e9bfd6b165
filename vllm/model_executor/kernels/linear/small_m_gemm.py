"""Small-M GEMMs for decode-sized linears: PTPC FP8 and bf16/fp16, Triton kernel + torch reference.

At decode a linear multiplies a few tokens by a large weight, so its cost is reading the weight
once from HBM. Vendor GEMMs tile for large M and leave most of the bandwidth unused there (the
rowwise FP8 `torch._scaled_mm` is slower than the bf16 GEMM it replaces at every M <= 256 on an
H200). These kernels read each weight element once for all M rows, spread N (and K) over every SM,
and do the math on tensor cores with fp32 accumulation.

``fp8_small_m_gemm(xq, x_scale, wq, w_scale, bias=None, out_dtype=torch.bfloat16)``
    ``out[m, n] = (sum_k xq[m, k] * wq[n, k]) * x_scale[m] * w_scale[n] (+ bias[n])``.
    ``xq`` ``[M, K]`` FP8 (the platform's dtype, unit stride on K, any row stride: the codes of a
    ``QuantizedActivation`` as they are), ``x_scale`` ``[M, 1]`` or ``[M]`` fp32, ``wq`` ``[N, K]``
    FP8 of the same dtype with any strides (the PTPC layer's ``[K, N]`` weight view, transposed:
    no copy), ``w_scale`` ``[N, 1]`` or ``[N]`` fp32, ``bias`` ``[N]`` any float dtype. Returns
    ``[M, N]`` in ``out_dtype`` (bf16, fp16 or fp32).
``small_m_gemm(x, weight, bias=None)``
    ``x @ weight.T (+ bias)`` for ``x`` ``[M, K]`` bf16/fp16 (unit stride on K) and ``weight``
    ``[N, K]`` of the same dtype (any strides); ``[M, N]`` in ``x``'s dtype.

Both take ``1 <= M <= MAX_M`` (a ValueError otherwise: larger M belongs to the vendor GEMM) and
have torch references beside them (``*_ref``), which CPU tensors use unless ``TRITON_INTERPRET=1``.

Numerics. The FP8 products are exact in fp32 and are summed in fp32 (Hopper's FP8 tensor-core
accumulation is promoted to fp32 after every instruction: ``max_num_imprecise_acc=0``). The
epilogue is ``(acc * x_scale) * w_scale + bias`` in fp32, rounded once to the output dtype, the
operations of ``dequantized_matmul``; so kernel and reference differ only in the fp32 summation
order, and agree bit for bit whenever the partial sums are exact. A NaN code or scale gives a NaN
output row or column (nothing is clamped).

Launch. Program ``(i, j)`` computes ``out[:, i*BLOCK_N:(i+1)*BLOCK_N]`` over the ``j``-th K range
as ``w_tile [BLOCK_N, BLOCK_K] @ x_tile^T [BLOCK_K, BLOCK_M]``: the weight is the MMA's wide
operand and the few tokens, padded to ``BLOCK_M >= 16`` (the tensor-core minimum), the narrow one.
Padded tokens and columns past N read token 0 / row 0 (in-bounds addresses, never stored); only
the K tail is masked. With ``SPLIT_K > 1`` each program writes its fp32 partial tile to a
workspace and counts its arrival on a per-tile semaphore; the last to arrive sums the partials in
split order (so the result does not depend on which program came last: deterministic), applies
the epilogue and resets the semaphore to zero for the next call. The semaphores are one buffer
per device, zeroed once and left zero by every launch: calls on one device must not run
concurrently on different streams (the engine runs one stream).
"""

from functools import cache
from typing import NamedTuple

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.quantization.utils.fp8_per_token import use_triton_fp8
from vllm.platforms import current_platform, supported_fp8_dtypes
from vllm.triton_utils import next_power_of_2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton use the torch references
    triton = None

__all__ = [
    "BF16_SMALL_M_THRESHOLD",
    "FP8_SMALL_M_THRESHOLD",
    "MAX_M",
    "SmallMGemmConfig",
    "default_config",
    "fp8_small_m_gemm",
    "fp8_small_m_gemm_ref",
    "reserve_semaphores",
    "small_m_gemm",
    "small_m_gemm_fits",
    "small_m_gemm_ref",
    "unquantized_linear",
    "use_fp8_small_m_gemm",
    "use_small_m_gemm",
]

# Largest M the kernels take: one [BLOCK_M, BLOCK_K] activation tile per step holds every token.
MAX_M = 64
# Largest M routed to these kernels instead of the vendor GEMM, per weight dtype. To be set from
# the benchmark (benchmarks/kernels/benchmark_small_m_gemm.py prints the crossover per shape):
# the FP8 one replaces rowwise torch._scaled_mm in the CUDA PTPC linear, the bf16 one F.linear in
# unquantized linears and the LM head.
FP8_SMALL_M_THRESHOLD = 32
BF16_SMALL_M_THRESHOLD = 16

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HALF_DTYPES = (torch.bfloat16, torch.float16)
# Split-K semaphores per device: more N tiles than this never need split-K (they fill the GPU).
_SEMAPHORE_SLOTS = 4096
# SM count assumed where there is no GPU (the interpreter then runs the H200's launch shapes).
_NOMINAL_SMS = 132


class SmallMGemmConfig(NamedTuple):
    """Launch shape; BLOCK_M is derived from M (next power of two, at least 16)."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _epilogue(
        acc, rn, rm, M, N,
        out_ptr, stride_om, x_scale_ptr, stride_xs, w_scale_ptr, stride_ws, bias_ptr, stride_b,
        SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        """Scale, add bias and store the fp32 tile ``acc`` [BLOCK_N, BLOCK_M] as out[m, n]."""
        n_ok = rn < N
        m_ok = rm < M
        rn_ld = tl.where(n_ok, rn, 0)
        if SCALED:
            xs = tl.load(x_scale_ptr + tl.where(m_ok, rm, 0) * stride_xs)
            ws = tl.load(w_scale_ptr + rn_ld * stride_ws)
            acc = acc * xs[None, :] * ws[:, None]  # dequantized_matmul's order
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + rn_ld * stride_b).to(tl.float32)[:, None]
        out = out_ptr + rm.to(tl.int64)[None, :] * stride_om + rn[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])

    @triton.jit
    def _small_m_gemm_kernel(
        x_ptr, w_ptr, out_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, ws_ptr, sem_ptr,
        M, N, K, k_per_split,
        stride_xm, stride_wn, stride_wk, stride_om, stride_xs, stride_ws, stride_b,
        SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        # Weight rows past N and tokens past M read row 0 / token 0: in bounds, never stored, and
        # no mask for the loads of the weight (the bytes that matter) beyond the K tail.
        w_rows = w_ptr + tl.where(rn < N, rn, 0).to(tl.int64)[:, None] * stride_wn
        x_rows = x_ptr + tl.where(rm < M, rm, 0).to(tl.int64)[None, :] * stride_xm
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            kk = k0 + rk
            k_ok = kk < K
            kk = tl.where(k_ok, kk, 0)
            w = tl.load(w_rows + kk[None, :] * stride_wk, mask=k_ok[None, :], other=0.0)
            xt = tl.load(x_rows + kk[:, None], mask=k_ok[:, None], other=0.0)
            acc = tl.dot(w, xt, acc, max_num_imprecise_acc=0)
        if SPLIT_K == 1:
            _epilogue(
                acc, rn, rm, M, N, out_ptr, stride_om, x_scale_ptr, stride_xs,
                w_scale_ptr, stride_ws, bias_ptr, stride_b, SCALED, HAS_BIAS,
            )  # fmt: skip
        else:
            tile = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
            n_tiles = tl.num_programs(0)
            tl.store(ws_ptr + (pid_k * n_tiles + pid_n) * (BLOCK_N * BLOCK_M) + tile, acc)
            # Every thread's partial is written before the arrival is counted (release); the last
            # arrival (acquire) reads the partials from L2 (.cg), never from a stale L1 line.
            tl.debug_barrier()
            arrived = tl.atomic_add(sem_ptr + pid_n, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    part = ws_ptr + (s * n_tiles + pid_n) * (BLOCK_N * BLOCK_M) + tile
                    total += tl.load(part, cache_modifier=".cg")
                tl.store(sem_ptr + pid_n, 0)
                _epilogue(
                    total, rn, rm, M, N, out_ptr, stride_om, x_scale_ptr, stride_xs,
                    w_scale_ptr, stride_ws, bias_ptr, stride_b, SCALED, HAS_BIAS,
                )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launch configuration and split-K semaphores
# --------------------------------------------------------------------------------------------


@cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _NOMINAL_SMS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block_m(m: int) -> int:
    return max(16, next_power_of_2(m))


def _even_split(k_tiles: int, split: int) -> int:
    """``split`` lowered so that no K range is empty: ``cdiv(k_tiles, cdiv(k_tiles, split))``."""
    return _cdiv(k_tiles, _cdiv(k_tiles, split))


@cache
def _default_config(block_m: int, n: int, k: int, elem_bytes: int, sms: int) -> SmallMGemmConfig:
    # Wider tiles for more tokens keep the activation re-reads (one per N tile, from L2) small
    # next to the weight; 256 weight bytes per row per step, as in a 16-byte-per-thread load.
    block_n = 32 if block_m <= 16 else 64
    block_k = 256 // elem_bytes
    n_tiles = _cdiv(n, block_n)
    k_tiles = _cdiv(k, block_k)
    # Split K until there are two programs per SM (so the whole weight can be in flight), keeping
    # at least two K steps per program; then even the splits out so none is empty.
    split = 1
    while n_tiles * split < 2 * sms and k_tiles >= 4 * split and n_tiles <= _SEMAPHORE_SLOTS:
        split *= 2
    split = _even_split(k_tiles, split)
    # Shared memory per stage is (BLOCK_N + BLOCK_M) x 256 bytes: fewer stages for wider tiles.
    stages = 4 if block_m * block_n <= 32 * 32 else 3
    return SmallMGemmConfig(block_n, block_k, split, num_warps=4, num_stages=stages)


def default_config(
    m: int, n: int, k: int, dtype: torch.dtype, device: torch.device
) -> SmallMGemmConfig:
    """The launch shape used for an ``[M, K] x [N, K]^T`` product of ``dtype`` operands."""
    return _default_config(_block_m(m), n, k, dtype.itemsize, _num_sms(device))


_SEMAPHORES: dict[torch.device, torch.Tensor] = {}


def reserve_semaphores(device: torch.device) -> torch.Tensor:
    """The split-K semaphores of ``device``, created (zeroed) on first use.

    Call it before capturing a CUDA graph that may launch split-K: a buffer created inside a
    capture would only be zeroed when the graph first replays.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    sem = _SEMAPHORES.get(device)
    if sem is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "small-M GEMM split-K semaphores must be reserved before CUDA-graph capture "
                "(reserve_semaphores, or one eager call)"
            )
        sem = torch.zeros(_SEMAPHORE_SLOTS, dtype=torch.int32, device=device)
        _SEMAPHORES[device] = sem
    return sem


# --------------------------------------------------------------------------------------------
# Validation and launch
# --------------------------------------------------------------------------------------------


def _check_2d(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be one of {[str(d) for d in dtypes]}, got {t.dtype}")


def _check_vector(name: str, t: torch.Tensor | None, size: int, device, dtypes) -> None:
    """``t`` is ``[size]`` or ``[size, 1]`` of one of ``dtypes`` on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) not in ((size,), (size, 1)) or t.dtype not in dtypes or t.device != device:
        raise ValueError(
            f"{name} must be a [{size}] or [{size}, 1] tensor of {[str(d) for d in dtypes]} on "
            f"{device}, got {tuple(t.shape)} {t.dtype} on {t.device}"
        )


def _check_operands(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    m, k = x.shape
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x must have 1 to {MAX_M} rows (M), got {m}")
    if k == 0:
        raise ValueError("x must have a non-empty last dim (K)")
    if k > 1 and x.stride(1) != 1:
        raise ValueError(f"x must have unit stride on its last dim, got strides {x.stride()}")
    if w.shape[1] != k or w.dtype != x.dtype or w.device != x.device:
        raise ValueError(
            f"weight must be [N, {k}] {x.dtype} on {x.device}, got {tuple(w.shape)} {w.dtype} on "
            f"{w.device}"
        )
    if w.shape[0] == 0:
        raise ValueError("weight must have at least one row (N)")
    if bias is not None:
        _check_vector("bias", bias, w.shape[0], x.device, _OUT_DTYPES)
        if bias.dim() != 1:
            raise ValueError(f"bias must be 1-D, got shape {tuple(bias.shape)}")


def _check_config(config: SmallMGemmConfig, n: int) -> None:
    block_n, block_k, split_k = config.block_n, config.block_k, config.split_k
    pow2 = all(v > 0 and v & (v - 1) == 0 for v in (block_n, block_k, config.num_warps))
    if not pow2 or block_n < 16 or block_k < 32 or split_k < 1:
        raise ValueError(
            f"config needs power-of-two block_n >= 16, block_k >= 32 and num_warps, and "
            f"split_k >= 1, got {config}"
        )
    if split_k > 1 and _cdiv(n, block_n) > _SEMAPHORE_SLOTS:
        raise ValueError(f"split-K supports at most {_SEMAPHORE_SLOTS} N tiles, got {config}")


def _launch(x, w, out, x_scale, w_scale, bias, config: SmallMGemmConfig | None) -> None:
    m, k = x.shape
    n = w.shape[0]
    if config is None:
        config = default_config(m, n, k, x.dtype, x.device)
    block_m = _block_m(m)
    n_tiles = _cdiv(n, config.block_n)
    k_tiles = _cdiv(k, config.block_k)
    split_k = _even_split(k_tiles, config.split_k)  # no program gets an empty K range
    k_per_split = _cdiv(k_tiles, split_k) * config.block_k
    if split_k > 1:
        ws = torch.empty((split_k, n_tiles, config.block_n, block_m), dtype=torch.float32,
                         device=x.device)  # fmt: skip
        sem = reserve_semaphores(x.device)
    else:
        ws = sem = out  # unused
    scaled = x_scale is not None
    _small_m_gemm_kernel[(n_tiles, split_k)](
        x, w, out,
        x_scale if scaled else out, w_scale if scaled else out,
        bias if bias is not None else out, ws, sem,
        m, n, k, k_per_split,
        x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        x_scale.stride(0) if scaled else 0, w_scale.stride(0) if scaled else 0,
        bias.stride(0) if bias is not None else 0,
        SCALED=scaled, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Torch references
# --------------------------------------------------------------------------------------------


def fp8_small_m_gemm_ref(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``fp8_small_m_gemm`` in torch: the fp32 product of the codes, then the scales and bias."""
    acc = xq.float() @ wq.float().t()
    out = acc * x_scale.reshape(-1, 1) * w_scale.reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def small_m_gemm_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``small_m_gemm`` in torch: fp32 product and bias, rounded once to ``x``'s dtype."""
    out = x.float() @ weight.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------


def fp8_small_m_gemm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: SmallMGemmConfig | None = None,
) -> torch.Tensor:
    """PTPC FP8 ``(xq * x_scale) @ (wq * w_scale)^T + bias`` for M <= ``MAX_M`` (module docstring).

    ``config`` overrides the launch shape (benchmarks and tests); None picks ``default_config``.
    """
    _check_2d("xq", xq, supported_fp8_dtypes())
    _check_2d("wq", wq, supported_fp8_dtypes())
    _check_operands(xq, wq, bias)
    m, n = xq.shape[0], wq.shape[0]
    _check_vector("x_scale", x_scale, m, xq.device, (torch.float32,))
    _check_vector("w_scale", w_scale, n, xq.device, (torch.float32,))
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {[str(d) for d in _OUT_DTYPES]}")
    if config is not None:
        _check_config(config, n)
    if not use_triton_fp8(xq.device, xq.dtype):
        return fp8_small_m_gemm_ref(xq, x_scale, wq, w_scale, bias, out_dtype)
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    _launch(xq, wq, out, x_scale.reshape(m), w_scale.reshape(n), bias, config)
    return out


def small_m_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: SmallMGemmConfig | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` in ``x``'s dtype (bf16/fp16) for M <= ``MAX_M``."""
    _check_2d("x", x, _HALF_DTYPES)
    _check_2d("weight", weight, _HALF_DTYPES)
    _check_operands(x, weight, bias)
    if config is not None:
        _check_config(config, weight.shape[0])
    if not use_triton(x.device):
        return small_m_gemm_ref(x, weight, bias)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _launch(x, weight, out, None, None, bias, config)
    return out


# --------------------------------------------------------------------------------------------
# Dispatch: these kernels at small M, the vendor GEMM above (static shapes only: graph-safe)
# --------------------------------------------------------------------------------------------


def use_fp8_small_m_gemm(m: int) -> bool:
    """Whether an M-token PTPC FP8 GEMM takes ``fp8_small_m_gemm`` (else ``torch._scaled_mm``)."""
    return 1 <= m <= min(FP8_SMALL_M_THRESHOLD, MAX_M)


def small_m_gemm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``small_m_gemm`` can stand in for ``F.linear(x, weight)`` and M is small enough:
    bf16/fp16 inference (no autograd), unit stride on K, ``M <= BF16_SMALL_M_THRESHOLD`` rows."""
    if x.dtype not in _HALF_DTYPES or weight.dtype != x.dtype or weight.dim() != 2:
        return False
    if x.dim() == 0 or x.shape[-1] != weight.shape[1] or x.shape[-1] == 0 or x.stride(-1) != 1:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    m = x.numel() // x.shape[-1]
    return 1 <= m <= min(BF16_SMALL_M_THRESHOLD, MAX_M)


def use_small_m_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``unquantized_linear(x, weight)`` takes ``small_m_gemm``: CUDA (not ROCm, where it
    is not measured) and ``small_m_gemm_fits``."""
    return x.is_cuda and current_platform.is_cuda() and small_m_gemm_fits(x, weight)


def unquantized_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by ``small_m_gemm`` where ``use_small_m_gemm`` says so."""
    if not use_small_m_gemm(x, weight) or (bias is not None and bias.dtype != x.dtype):
        return F.linear(x, weight, bias)
    out = small_m_gemm(x.reshape(-1, x.shape[-1]), weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])
