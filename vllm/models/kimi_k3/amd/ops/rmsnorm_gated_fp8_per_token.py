"""Fused gated RMSNorm + per-token FP8 quantization for the Kimi-K3 KDA ``o_proj`` epilogue.

Two public ops, each a single Triton launch on GPU (CUDA and ROCm) with an exact torch reference
beside it that runs everywhere (and is what CPU tensors use unless ``TRITON_INTERPRET=1``):

``rmsnorm_gated_fp8_per_token(x, weight, gate, eps)``
    ``x``, ``gate``: ``[T, H, D]`` bf16 / fp16 / fp32, unit stride on the last dim, any other
    strides (a gate that is a column slice of a wider projection is read in place, never copied);
    ``weight``: ``[D]``, shared by all heads. Per (token, head), in fp32::

        y = x * rsqrt(mean_D(x^2) + eps) * weight * sigmoid(gate)

    then the token's ``H * D`` values are quantized with ONE scale (amax across all heads).
    Returns ``q`` ``[T, H * D]`` (FP8, row-major) and ``scale`` ``[T, 1]`` fp32.

``per_token_fp8_quant(x)``
    The same quantization for an activation that is already normed: ``x`` ``[T, K]``.

Numerics policy (shared by both ops, their Triton kernels and their torch references)
-------------------------------------------------------------------------------------
* ``fp8_max`` comes from the platform (``current_platform.fp8_max``): 448 for e4m3fn, 224 for
  e4m3fnuz (upstream's dynamic-quant maximum, not ``torch.finfo``'s 240).
* ``amax`` is the max of ``|y|`` over the token, computed on the fp32 value ``y`` (the fused op
  never rounds ``y`` to bf16; the unfused chain does, which is the only difference between the two).
* ``scale = max(amax / fp8_max, 1 / (fp8_max * 512))`` in fp32 with correctly rounded division.
  The floor is upstream's minimum scale: an all-zero token gets that finite scale and zero codes.
* ``q = clamp(y * (1 / scale), -fp8_max, fp8_max)`` with ``1 / scale`` correctly rounded once per
  token, then round-to-nearest-even into FP8. (upstream's C++ kernel divides each element instead;
  both are within one rounding of ``y / scale``, multiplying costs less, and the reference does the
  same operations, so kernel and reference agree to the ulps of rsqrt / sigmoid.)
* Non-finite input is never hidden: if any ``y`` of a token is NaN or +-Inf, the token's scale is
  +Inf, its finite values get code 0 and its NaN / Inf values get the NaN code, so the token's
  dequantized values (and its GEMM output row) are NaN. Other tokens are unaffected.

Launch shapes: the fused kernel tiles ``[BLOCK_ROWS, next_pow2(D)]`` where a row is one (token,
head) pair and a program owns ``BLOCK_ROWS // H`` whole tokens, so no head lane is padded except the
remainder of that division (upstream pads every token to ``next_pow2(H)`` heads). Tokens too wide
for one tile (``next_pow2(H) * next_pow2(D) > 8192``) use a two-pass kernel over head chunks, one
token per program. ``D > 512`` uses the torch reference. Padded lanes use clamped indices, so no
out-of-bounds address is ever formed.
"""

import os
from functools import cache, lru_cache
from typing import NamedTuple

import torch

from vllm.platforms import current_platform, supported_fp8_dtypes

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton use the torch references
    triton = None

__all__ = [
    "per_token_fp8_quant",
    "per_token_fp8_quant_ref",
    "rmsnorm_gated_fp8_per_token",
    "rmsnorm_gated_fp8_per_token_ref",
    "rmsnorm_gated_ref",
]

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# (fp8_max, min_scale) per FP8 dtype, computed once: the hot path must not call torch.finfo.
_QUANT_PARAMS = {
    dtype: (current_platform.fp8_max(dtype), current_platform.fp8_min_scale(dtype))
    for dtype in supported_fp8_dtypes()
}
_DEFAULT_FP8_DTYPE = current_platform.fp8_dtype()
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_MAX_TILE = 8192  # elements per register tile; bounds registers per program
_MAX_TRITON_D = 512


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _nonfinite_as_inf_abs(y):
        # |y| with NaN mapped to +inf, so a token holding NaN or Inf gets scale +inf.
        return tl.where(y == y, tl.abs(y), float("inf"))

    @triton.jit
    def _scale_from_amax(amax, fp8_max, min_scale):
        return tl.maximum(tl.math.div_rn(amax, fp8_max), min_scale)

    @triton.jit
    def _quantize(y, inv_scale, fp8_max, out_ty: tl.constexpr):
        v = tl.clamp(y * inv_scale, -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)
        return v.to(out_ty)

    @triton.jit
    def _gated_rmsnorm_tile(x, g, w, eps, D: tl.constexpr):
        # x, g: [R, BLOCK_D] fp32 (padded lanes 0); w: [BLOCK_D] fp32. Returns y [R, BLOCK_D].
        var = tl.math.div_rn(tl.sum(x * x, axis=1), D)
        rstd = tl.rsqrt(var + eps)
        return x * rstd[:, None] * w[None, :] * tl.sigmoid(g)

    @triton.jit
    def _rmsnorm_gated_fp8_kernel(
        x_ptr, g_ptr, w_ptr, q_ptr, s_ptr,
        T, stride_xt, stride_xh, stride_gt, stride_gh, stride_qt, stride_st,
        eps, fp8_max, min_scale,
        H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_ROWS: tl.constexpr, TOKENS: tl.constexpr, BLOCK_TOKENS: tl.constexpr,
    ):  # fmt: skip
        # One program owns TOKENS whole tokens: rows r = (local token r // H, head r % H).
        pid = tl.program_id(0)
        rows = tl.arange(0, BLOCK_ROWS)
        local_tok = rows // H
        head = rows - local_tok * H
        tok = pid * TOKENS + local_tok
        row_ok = (local_tok < TOKENS) & (tok < T)
        tok64 = tl.where(row_ok, tok, 0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        if BLOCK_D == D:
            mask = row_ok[:, None]
            col_ok = cols < BLOCK_D
        else:
            col_ok = cols < D
            cols = tl.where(col_ok, cols, 0)
            mask = row_ok[:, None] & col_ok[None, :]

        x = tl.load(x_ptr + (tok64 * stride_xt + head * stride_xh)[:, None] + cols[None, :],
                    mask=mask, other=0.0).to(tl.float32)  # fmt: skip
        g = tl.load(g_ptr + (tok64 * stride_gt + head * stride_gh)[:, None] + cols[None, :],
                    mask=mask, other=0.0).to(tl.float32)  # fmt: skip
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = _gated_rmsnorm_tile(x, g, w, eps, D)
        row_amax = tl.max(tl.where(mask, _nonfinite_as_inf_abs(y), 0.0), axis=1)

        if TOKENS == 1:
            scale = _scale_from_amax(tl.max(row_amax, axis=0), fp8_max, min_scale)
            row_inv = tl.math.div_rn(1.0, scale)
            tl.store(s_ptr + pid.to(tl.int64) * stride_st, scale)
            q = _quantize(y, row_inv, fp8_max, q_ptr.dtype.element_ty)
        else:
            # Segmented max over each token's H rows, then broadcast the token's 1/scale back.
            toks = tl.arange(0, BLOCK_TOKENS)
            member = local_tok[None, :] == toks[:, None]
            tok_amax = tl.max(tl.where(member, row_amax[None, :], 0.0), axis=1)
            scale = _scale_from_amax(tok_amax, fp8_max, min_scale)
            inv = tl.math.div_rn(1.0, scale)
            row_inv = tl.max(tl.where(member, inv[:, None], 0.0), axis=0)
            out_tok = pid * TOKENS + toks
            s_ok = (toks < TOKENS) & (out_tok < T)
            out_tok64 = tl.where(s_ok, out_tok, 0).to(tl.int64)
            tl.store(s_ptr + out_tok64 * stride_st, scale, mask=s_ok)
            q = _quantize(y, row_inv[:, None], fp8_max, q_ptr.dtype.element_ty)

        tl.store(q_ptr + (tok64 * stride_qt + head * D)[:, None] + cols[None, :], q, mask=mask)

    @triton.jit
    def _rmsnorm_gated_fp8_wide_kernel(
        x_ptr, g_ptr, w_ptr, q_ptr, s_ptr,
        stride_xt, stride_xh, stride_gt, stride_gh, stride_qt, stride_st,
        eps, fp8_max, min_scale,
        H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HEADS: tl.constexpr,
    ):  # fmt: skip
        # One token per program; heads in chunks of BLOCK_HEADS. Pass 1 finds the token's amax,
        # pass 2 recomputes y (cheaper than spilling it) and quantizes.
        tok64 = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        cols = tl.where(col_ok, cols, 0)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x_row = x_ptr + tok64 * stride_xt
        g_row = g_ptr + tok64 * stride_gt
        amax = tl.zeros([BLOCK_HEADS], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_HEADS):
            heads = h0 + tl.arange(0, BLOCK_HEADS)
            head_ok = heads < H
            heads = tl.where(head_ok, heads, 0)
            mask = head_ok[:, None] & col_ok[None, :]
            x = tl.load(x_row + (heads * stride_xh)[:, None] + cols[None, :], mask=mask, other=0.0)
            g = tl.load(g_row + (heads * stride_gh)[:, None] + cols[None, :], mask=mask, other=0.0)
            y = _gated_rmsnorm_tile(x.to(tl.float32), g.to(tl.float32), w, eps, D)
            a = tl.max(tl.where(mask, _nonfinite_as_inf_abs(y), 0.0), axis=1)
            amax = tl.maximum(amax, a)
        scale = _scale_from_amax(tl.max(amax, axis=0), fp8_max, min_scale)
        inv = tl.math.div_rn(1.0, scale)
        tl.store(s_ptr + tok64 * stride_st, scale)
        for h0 in range(0, H, BLOCK_HEADS):
            heads = h0 + tl.arange(0, BLOCK_HEADS)
            head_ok = heads < H
            heads = tl.where(head_ok, heads, 0)
            mask = head_ok[:, None] & col_ok[None, :]
            x = tl.load(x_row + (heads * stride_xh)[:, None] + cols[None, :], mask=mask, other=0.0)
            g = tl.load(g_row + (heads * stride_gh)[:, None] + cols[None, :], mask=mask, other=0.0)
            y = _gated_rmsnorm_tile(x.to(tl.float32), g.to(tl.float32), w, eps, D)
            q = _quantize(y, inv, fp8_max, q_ptr.dtype.element_ty)
            q_off = tok64 * stride_qt + (heads * D)[:, None] + cols[None, :]
            tl.store(q_ptr + q_off, q, mask=mask)

    @triton.jit
    def _per_token_fp8_quant_kernel(
        x_ptr, q_ptr, s_ptr,
        T, K, stride_xt, stride_qt, stride_st,
        fp8_max, min_scale,
        BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, SINGLE_PASS: tl.constexpr,
    ):  # fmt: skip
        # BLOCK_T tokens per program. SINGLE_PASS: the whole row fits one [BLOCK_T, BLOCK_K]
        # tile and stays in registers; otherwise pass 1 reduces amax over K chunks, pass 2 re-reads.
        toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok_ok = toks < T
        toks64 = tl.where(tok_ok, toks, 0).to(tl.int64)
        x_rows = x_ptr + toks64[:, None] * stride_xt
        q_rows = q_ptr + toks64[:, None] * stride_qt
        cols = tl.arange(0, BLOCK_K)
        if SINGLE_PASS:
            col_ok = cols < K
            cols = tl.where(col_ok, cols, 0)
            mask = tok_ok[:, None] & col_ok[None, :]
            x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            amax = tl.max(tl.where(mask, _nonfinite_as_inf_abs(x), 0.0), axis=1)
            scale = _scale_from_amax(amax, fp8_max, min_scale)
            inv = tl.math.div_rn(1.0, scale)
            q = _quantize(x, inv[:, None], fp8_max, q_ptr.dtype.element_ty)
            tl.store(q_rows + cols[None, :], q, mask=mask)
        else:
            amax = tl.zeros([BLOCK_T], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + cols
                col_ok = kk < K
                kk = tl.where(col_ok, kk, 0)
                mask = tok_ok[:, None] & col_ok[None, :]
                x = tl.load(x_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
                a = tl.max(tl.where(mask, _nonfinite_as_inf_abs(x), 0.0), axis=1)
                amax = tl.maximum(amax, a)
            scale = _scale_from_amax(amax, fp8_max, min_scale)
            inv = tl.math.div_rn(1.0, scale)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + cols
                col_ok = kk < K
                kk = tl.where(col_ok, kk, 0)
                mask = tok_ok[:, None] & col_ok[None, :]
                x = tl.load(x_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
                q = _quantize(x, inv[:, None], fp8_max, q_ptr.dtype.element_ty)
                tl.store(q_rows + kk[None, :], q, mask=mask)
        tl.store(s_ptr + toks64 * stride_st, scale, mask=tok_ok)


# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@lru_cache(maxsize=1)
def _num_sms() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return 1


class FusedLaunchConfig(NamedTuple):
    """How the fused op is launched for one shape (see the module docstring)."""

    wide: bool  # one token per program, heads in chunks of `block`, two passes
    block: int  # rows (token, head) per program; heads per chunk when `wide`
    tokens_per_program: int
    num_warps: int


@cache
def fused_launch_config(t_bucket: int, heads: int, head_dim: int) -> FusedLaunchConfig:
    """The launch configuration for ``[~t_bucket, heads, head_dim]`` inputs."""
    block_d = _next_pow2(head_dim)
    min_rows = _next_pow2(heads)
    if min_rows * block_d > _MAX_TILE:
        return FusedLaunchConfig(True, max(1, _MAX_TILE // block_d), 1, 8)
    # Grow the tile (more whole tokens per program) while the grid still fills the GPU.
    rows = min_rows
    target_programs = 4 * _num_sms()
    while rows * 2 * block_d <= _MAX_TILE:
        if -(-t_bucket // ((rows * 2) // heads)) < target_programs:
            break
        rows *= 2
    num_warps = max(1, min(8, rows * block_d // 512))
    return FusedLaunchConfig(False, rows, rows // heads, num_warps)


@cache
def _quant_config(t_bucket: int, k: int) -> tuple[int, int, bool, int]:
    """(block_t, block_k, single_pass, num_warps) for per-token quantization of [T, K]."""
    block_k = _next_pow2(k)
    if block_k > _MAX_TILE:
        return 1, _MAX_TILE, False, 8
    block_t = 1
    target_programs = 4 * _num_sms()
    while block_t * 2 * block_k <= _MAX_TILE and -(-t_bucket // (block_t * 2)) >= target_programs:
        block_t *= 2
    num_warps = max(1, min(8, block_t * block_k // 512))
    return block_t, block_k, True, num_warps


# --------------------------------------------------------------------------------------------
# Validation and outputs
# --------------------------------------------------------------------------------------------


def _check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if t.dim() > 0 and t.stride(-1) != 1 and t.size(-1) > 1:
        raise ValueError(f"{name} must have unit stride on its last dim, got strides {t.stride()}")


def _quant_params(quant_dtype: torch.dtype | None) -> tuple[torch.dtype, float, float]:
    if quant_dtype is None:
        quant_dtype = _DEFAULT_FP8_DTYPE
    try:
        fp8_max, min_scale = _QUANT_PARAMS[quant_dtype]
    except KeyError:
        raise ValueError(
            f"quant_dtype must be one of {[str(d) for d in _QUANT_PARAMS]}, got {quant_dtype}"
        ) from None
    return quant_dtype, fp8_max, min_scale


def _outputs(
    out: torch.Tensor | None,
    scale_out: torch.Tensor | None,
    tokens: int,
    width: int,
    quant_dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    if out is None:
        out = torch.empty((tokens, width), dtype=quant_dtype, device=device)
    elif (
        out.shape != (tokens, width)
        or out.dtype != quant_dtype
        or out.device != device
        or (width > 1 and out.stride(1) != 1)
    ):
        raise ValueError(
            f"out must be a [{tokens}, {width}] {quant_dtype} tensor on {device} with unit stride "
            f"on its last dim, got {tuple(out.shape)} {out.dtype} on {out.device} "
            f"strides {out.stride()}"
        )
    if scale_out is None:
        scale_out = torch.empty((tokens, 1), dtype=torch.float32, device=device)
    elif (
        scale_out.shape != (tokens, 1)
        or scale_out.dtype != torch.float32
        or scale_out.device != device
    ):
        raise ValueError(
            f"scale_out must be a [{tokens}, 1] float32 tensor on {device}, got "
            f"{tuple(scale_out.shape)} {scale_out.dtype} on {scale_out.device}"
        )
    return out, scale_out


def _use_triton(device: torch.device, quant_dtype: torch.dtype) -> bool:
    if triton is None:
        return False
    if device.type == "cpu":
        return _INTERPRET
    return device.type == "cuda" and current_platform.triton_supports_fp8(quant_dtype)


def _check_fused_inputs(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """Validate the fused op's inputs; return the gate as a [T, H, D] view."""
    _check_float("x", x)
    _check_float("gate", gate)
    _check_float("weight", weight)
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [tokens, heads, head_dim], got shape {tuple(x.shape)}")
    tokens, heads, head_dim = x.shape
    if heads == 0 or head_dim == 0:
        raise ValueError(f"x must have at least one head and head_dim > 0, got {tuple(x.shape)}")
    if gate.dim() == 2:
        if heads != 1:
            raise ValueError(
                f"gate is 2-D {tuple(gate.shape)} but x has {heads} heads: a 2-D gate would give "
                "every head the first head's gate; pass gate as [tokens, heads, head_dim]"
            )
        gate = gate.unsqueeze(1)
    if gate.shape != x.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} must equal x shape {tuple(x.shape)}")
    if weight.shape != (head_dim,):
        raise ValueError(f"weight must have shape ({head_dim},), got {tuple(weight.shape)}")
    if not (x.device == gate.device == weight.device):
        raise ValueError(
            f"x, gate and weight must be on one device, got {x.device}, {gate.device}, "
            f"{weight.device}"
        )
    if not eps >= 0.0:
        raise ValueError(f"eps must be a non-negative float, got {eps}")
    return gate


# --------------------------------------------------------------------------------------------
# Torch references (exact statement of the numerics policy; used on CPU)
# --------------------------------------------------------------------------------------------


def rmsnorm_gated_ref(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """Gated RMSNorm per (token, head) over the last dim, in fp32. Returns fp32 like ``x``."""
    xf = x.float()
    var = xf.square().sum(dim=-1, keepdim=True) / x.shape[-1]
    return xf * torch.rsqrt(var + eps) * weight.float() * torch.sigmoid(gate.float())


def per_token_fp8_quant_ref(
    x: torch.Tensor, quant_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 quantization of ``x`` ``[T, K]`` by the module's numerics policy."""
    quant_dtype, fp8_max, min_scale = _quant_params(quant_dtype)
    xf = x.float()
    amax = torch.where(torch.isnan(xf), torch.inf, xf.abs()).amax(dim=-1, keepdim=True)
    scale = torch.clamp(amax / fp8_max, min=min_scale)
    q = (xf * (1.0 / scale)).clamp(-fp8_max, fp8_max).to(quant_dtype)
    return q, scale


def rmsnorm_gated_fp8_per_token_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    gate: torch.Tensor,
    eps: float,
    quant_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of the fused op: fp32 gated RMSNorm, then per-token quantization."""
    gate = _check_fused_inputs(x, weight, gate, eps)
    tokens, heads, head_dim = x.shape
    y = rmsnorm_gated_ref(x, weight, gate, eps).reshape(tokens, heads * head_dim)
    return per_token_fp8_quant_ref(y, quant_dtype)


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------


def rmsnorm_gated_fp8_per_token(
    x: torch.Tensor,
    weight: torch.Tensor,
    gate: torch.Tensor,
    eps: float,
    quant_dtype: torch.dtype | None = None,
    *,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated RMSNorm over ``head_dim`` then per-token FP8 quantization, in one launch.

    Args:
        x: ``[T, H, D]`` bf16/fp16/fp32, unit stride on the last dim.
        weight: ``[D]``, shared by the heads.
        gate: ``[T, H, D]`` (any strides with unit last stride; ``[T, D]`` only when ``H == 1``).
        eps: added to the mean square before the reciprocal square root.
        quant_dtype: FP8 dtype of ``q`` (default: the platform's).
        out, scale_out: optional preallocated ``[T, H * D]`` FP8 and ``[T, 1]`` fp32 outputs
            (for CUDA-graph capture); ``out`` may have any row stride.

    Returns:
        ``(q, scale)``: ``q`` ``[T, H * D]`` FP8, ``scale`` ``[T, 1]`` fp32; ``q * scale``
        approximates ``y`` (see the module docstring for the exact policy).
    """
    gate = _check_fused_inputs(x, weight, gate, eps)
    quant_dtype, fp8_max, min_scale = _quant_params(quant_dtype)
    tokens, heads, head_dim = x.shape
    out, scale_out = _outputs(out, scale_out, tokens, heads * head_dim, quant_dtype, x.device)
    if tokens == 0:
        return out, scale_out
    if head_dim > _MAX_TRITON_D or not _use_triton(x.device, quant_dtype):
        y = rmsnorm_gated_ref(x, weight, gate, eps).reshape(tokens, heads * head_dim)
        q, scale = per_token_fp8_quant_ref(y, quant_dtype)
        out.copy_(q)
        scale_out.copy_(scale)
        return out, scale_out

    config = fused_launch_config(_next_pow2(tokens), heads, head_dim)
    launch_fused(x, weight, gate, eps, out, scale_out, fp8_max, min_scale, config)
    return out, scale_out


def launch_fused(
    x: torch.Tensor,
    weight: torch.Tensor,
    gate: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    scale_out: torch.Tensor,
    fp8_max: float,
    min_scale: float,
    config: FusedLaunchConfig,
) -> None:
    """Launch the fused kernel with an explicit configuration on validated arguments.

    For ``rmsnorm_gated_fp8_per_token`` and for tuning sweeps (the benchmark's ``--sweep``).
    """
    tokens, heads, head_dim = x.shape
    common = (eps, fp8_max, min_scale)
    if config.wide:
        _rmsnorm_gated_fp8_wide_kernel[(tokens,)](
            x, gate, weight, out, scale_out,
            x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
            out.stride(0), scale_out.stride(0), *common,
            H=heads, D=head_dim, BLOCK_D=_next_pow2(head_dim), BLOCK_HEADS=config.block,
            num_warps=config.num_warps,
        )  # fmt: skip
    else:
        tokens_per_program = config.tokens_per_program
        _rmsnorm_gated_fp8_kernel[(-(-tokens // tokens_per_program),)](
            x, gate, weight, out, scale_out,
            tokens, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
            out.stride(0), scale_out.stride(0), *common,
            H=heads, D=head_dim, BLOCK_D=_next_pow2(head_dim), BLOCK_ROWS=config.block,
            TOKENS=tokens_per_program, BLOCK_TOKENS=_next_pow2(tokens_per_program),
            num_warps=config.num_warps,
        )  # fmt: skip


def per_token_fp8_quant(
    x: torch.Tensor,
    quant_dtype: torch.dtype | None = None,
    *,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token dynamic FP8 quantization of an already-normed activation, in one launch.

    Args:
        x: ``[T, K]`` bf16/fp16/fp32, unit stride on the last dim (any row stride).
        quant_dtype: FP8 dtype of ``q`` (default: the platform's).
        out, scale_out: optional preallocated ``[T, K]`` FP8 and ``[T, 1]`` fp32 outputs.

    Returns:
        ``(q, scale)`` with the numerics of the module docstring.
    """
    _check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {tuple(x.shape)}")
    tokens, width = x.shape
    if width == 0:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    quant_dtype, fp8_max, min_scale = _quant_params(quant_dtype)
    out, scale_out = _outputs(out, scale_out, tokens, width, quant_dtype, x.device)
    if tokens == 0:
        return out, scale_out
    if not _use_triton(x.device, quant_dtype):
        q, scale = per_token_fp8_quant_ref(x, quant_dtype)
        out.copy_(q)
        scale_out.copy_(scale)
        return out, scale_out

    block_t, block_k, single_pass, num_warps = _quant_config(_next_pow2(tokens), width)
    _per_token_fp8_quant_kernel[(-(-tokens // block_t),)](
        x, out, scale_out,
        tokens, width, x.stride(0), out.stride(0), scale_out.stride(0),
        fp8_max, min_scale,
        BLOCK_T=block_t, BLOCK_K=block_k, SINGLE_PASS=single_pass,
        num_warps=num_warps,
    )  # fmt: skip
    return out, scale_out
