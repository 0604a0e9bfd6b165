"""Fused gated RMSNorm + per-token FP8 quantization for the Kimi-K3 KDA ``o_proj`` epilogue.

One Triton launch on GPU (CUDA and ROCm) with an exact torch reference beside it that runs
everywhere (and is what CPU tensors use unless ``TRITON_INTERPRET=1``):

``rmsnorm_gated_fp8_per_token(x, weight, gate, eps)``
    ``x``, ``gate``: ``[T, H, D]`` bf16 / fp16 / fp32, unit stride on the last dim, any other
    strides (a gate that is a column slice of a wider projection is read in place, never copied);
    ``weight``: ``[D]``, shared by all heads. Per (token, head), in fp32::

        y = (x * weight * sigmoid(gate)) * rsqrt(mean_D(x^2) + eps)

    then the token's ``H * D`` values are quantized with ONE scale (amax across all heads).
    Returns ``q`` ``[T, H * D]`` (FP8, row-major) and ``scale`` ``[T, 1]`` fp32.

The unfused pieces live with the generic layers: the gated RMSNorm reference
(``rmsnorm_gated_ref``) in ``vllm/model_executor/layers/layernorm.py``, and ``per_token_fp8_quant``
(the same quantization for an activation that is already normed) with the numerics policy they
share in ``vllm/model_executor/layers/quantization/utils/fp8_per_token.py``. This module re-exports
both, as the upstream PR's import path.

Numerics: the per-token policy of ``fp8_per_token`` (platform ``fp8_max``, scale floor
``1 / (fp8_max * 512)``, ``q = round(y * (1 / scale))`` with ``1 / scale`` correctly rounded, NaN
scale and codes for a token with a non-finite ``y``), applied to the fp32 ``y``. The fused op never
rounds ``y`` to bf16; the unfused chain does, which is the only difference between the two. Kernel
and reference agree up to the ulps of rsqrt and sigmoid. ``eps`` must be positive. ``x^2`` is summed
in fp32: a head with ``|x|`` above about 1.8e19 (finite in bf16 / fp32) overflows to ``rstd = 0``
and is zeroed (NaN where ``x * weight * sigmoid(gate)`` itself overflows to Inf), in kernel and
reference alike.

Launch shapes: one program per token. Its heads are split into at most three chunks of
power-of-two rows, each a ``[rows, next_pow2(D)]`` register tile, so no head lane is padded for
H = 12, 24, 48, 96 (upstream pads every token to ``next_pow2(H)`` heads: a quarter of the lanes at
H = 12): equal chunks (12 = 4 + 4 + 4) for few tokens, whose per-head maxima cross warps in one
reduction, decreasing powers of two (12 = 8 + 4) for many (``head_chunks``). Each head's max of
``|x * w * sigmoid(g)|`` is reduced alongside its sum of squares, so the token's amax needs no
pass over ``y``. Tokens wider than 8192 padded elements use a two-pass kernel over head chunks.
``D > 512`` uses the torch reference. Padded lanes read clamped, in-bounds addresses under a mask,
so no out-of-bounds address is ever formed.

Host time: the op runs once per KDA layer in eager steps, so its Python is kept short: one combined
check of the common case before the checks that name a bad argument, and the launch through
``vllm.triton_utils.launch`` (Triton's argument binding once per launch key, not per call).
"""

from functools import cache
from typing import NamedTuple

import torch

from vllm.model_executor.layers.layernorm import rmsnorm_gated_ref
from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
    FLOAT_DTYPES,
    check_float_input,
    fp8_outputs,
    fp8_quant_params,
    per_token_fp8_quant,
    per_token_fp8_quant_ref,
    use_triton_fp8,
)
from vllm.triton_utils import next_power_of_2
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
        abs_max,
        fp8_scale_and_inverse,
        nan_if_not_finite,
    )
    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch references
    triton = None

# per_token_fp8_quant and the references are re-exported: this module is the upstream PR's import
# path for both ops.
__all__ = [
    "per_token_fp8_quant",
    "per_token_fp8_quant_ref",
    "rmsnorm_gated_fp8_per_token",
    "rmsnorm_gated_fp8_per_token_ref",
    "rmsnorm_gated_ref",
]

_MAX_TILE = 8192  # elements per register tile; bounds registers per program
_MAX_TRITON_D = 512


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _load_heads(
        x_row, g_row, w_ptr, stride_xh, stride_gh,
        FIRST: tl.constexpr, ROWS: tl.constexpr, LAST: tl.constexpr,
        D: tl.constexpr, BLOCK_D: tl.constexpr, WEIGHT_TILE: tl.constexpr,
    ):  # fmt: skip
        # x and gate of heads FIRST .. LAST - 1 of one token as [ROWS, BLOCK_D] fp32 tiles, and
        # the weight as a tile or a [1, BLOCK_D] row.
        # Padded rows / columns read clamped (in-bounds) addresses under a mask and give 0.
        heads = FIRST + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_D)
        if BLOCK_D != D:
            col_ok = cols < D
            cols = tl.where(col_ok, cols, 0)
        if FIRST + ROWS > LAST:
            head_ok = heads < LAST
            heads = tl.where(head_ok, heads, FIRST)
        x_ptrs = x_row + (heads * stride_xh)[:, None] + cols[None, :]
        g_ptrs = g_row + (heads * stride_gh)[:, None] + cols[None, :]
        # WEIGHT_TILE: the weight is read as a [ROWS, BLOCK_D] tile with row stride 0 (cache
        # hits) so that it gets x's register layout; a [BLOCK_D] load gets its own layout and a
        # shared-memory conversion with barriers, which costs latency when few tokens run, while
        # the tile's extra load instructions cost bandwidth when many do.
        if WEIGHT_TILE:
            w_ptrs = w_ptr + (heads * 0)[:, None] + cols[None, :]
        else:
            w_ptrs = w_ptr + cols
        if (FIRST + ROWS > LAST) or (BLOCK_D != D):
            if FIRST + ROWS <= LAST:
                mask = col_ok[None, :]
            elif BLOCK_D == D:
                mask = head_ok[:, None]
            else:
                mask = head_ok[:, None] & col_ok[None, :]
            x = tl.load(x_ptrs, mask=mask, other=0.0)
            g = tl.load(g_ptrs, mask=mask, other=0.0)
        else:
            x = tl.load(x_ptrs)
            g = tl.load(g_ptrs)
        if WEIGHT_TILE:
            if BLOCK_D != D:
                w = tl.load(w_ptrs, mask=col_ok[None, :], other=0.0)
            else:
                w = tl.load(w_ptrs)
        else:
            if BLOCK_D != D:
                w = tl.load(w_ptrs, mask=col_ok, other=0.0)[None, :]
            else:
                w = tl.load(w_ptrs)[None, :]
        return x.to(tl.float32), g.to(tl.float32), w.to(tl.float32)

    @triton.jit
    def _gated_rmsnorm(x, g, w, eps, D: tl.constexpr):
        # y = (x * w * sigmoid(g)) * rstd, and per row (head) max |y|, +inf if any y is not
        # finite. Rounding is monotonic and rstd > 0, so max_d |fl(z_d * rstd)| equals
        # fl(max_d |z_d| * rstd): each head's max |z| is reduced alongside its sum of squares
        # instead of after it, which takes a reduction off the latency chain. eps > 0
        # (validated), so padded rows (all zero) give y = 0, never 0 * inf.
        z = x * w * tl.sigmoid(g)
        z_max = abs_max(z, 1)
        if (D & (D - 1)) == 0:
            mean_sq = tl.sum(x * x, axis=1) * (1.0 / D)  # exact: 1 / D is a power of two
        else:
            mean_sq = tl.math.div_rn(tl.sum(x * x, axis=1), D)
        rstd = tl.rsqrt(mean_sq + eps)
        y_max = z_max * rstd
        # 0 * inf (a head whose x * w overflowed, so rstd = 0) is NaN: map it to +inf as well.
        return z * rstd[:, None], tl.where(y_max == y_max, y_max, float("inf"))

    @triton.jit
    def _store_heads(
        q_row, y, inv,
        FIRST: tl.constexpr, ROWS: tl.constexpr, LAST: tl.constexpr,
        D: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        # |y * inv| <= fp8_max * (1 + 2^-23) by construction, which rounds to at most fp8_max:
        # no clamp is needed, and NaN stays NaN.
        heads = FIRST + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_D)
        q = (y * inv).to(q_row.dtype.element_ty)
        if (FIRST + ROWS > LAST) or (BLOCK_D != D):
            head_ok = heads < LAST
            col_ok = cols < D
            mask = head_ok[:, None] & col_ok[None, :]
            offs = tl.where(head_ok, heads, FIRST)[:, None] * D + tl.where(col_ok, cols, 0)[None, :]
            tl.store(q_row + offs, q, mask=mask)
        else:
            tl.store(q_row + heads[:, None] * D + cols[None, :], q)

    @triton.jit
    def _rmsnorm_gated_fp8_kernel(
        x_ptr, g_ptr, w_ptr, q_ptr, s_ptr,
        stride_xt, stride_xh, stride_gt, stride_gh, stride_qt, stride_st,
        eps, fp8_max, min_scale,
        D: tl.constexpr, BLOCK_D: tl.constexpr,
        ROWS0: tl.constexpr, ROWS1: tl.constexpr, ROWS2: tl.constexpr,
        END0: tl.constexpr, END1: tl.constexpr, END2: tl.constexpr, WEIGHT_TILE: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # One token per program. Its heads are split into up to three chunks of power-of-two
        # rows (head_chunks: 12 = 4 + 4 + 4 or 8 + 4), so no lane is padded unless the last
        # chunk needs it (15 = 8 + 4 + 4). Every chunk is loaded before any is reduced, so all
        # loads are in flight at once.
        tok = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + tok * stride_xt
        g_row = g_ptr + tok * stride_gt
        q_row = q_ptr + tok * stride_qt
        args = (x_row, g_row, w_ptr, stride_xh, stride_gh)
        x0, g0, w0 = _load_heads(*args, 0, ROWS0, END0, D, BLOCK_D, WEIGHT_TILE)
        if ROWS1 > 0:
            x1, g1, w1 = _load_heads(*args, END0, ROWS1, END1, D, BLOCK_D, WEIGHT_TILE)
        if ROWS2 > 0:
            x2, g2, w2 = _load_heads(*args, END1, ROWS2, END2, D, BLOCK_D, WEIGHT_TILE)
        # Per-head maxima of every chunk first (reductions within a warp), then as few
        # cross-warp reductions as possible: chunks of equal rows share a layout, so their
        # per-head maxima combine elementwise into one vector and one reduction.
        y0, m0 = _gated_rmsnorm(x0, g0, w0, eps, D)
        if ROWS1 > 0:
            y1, m1 = _gated_rmsnorm(x1, g1, w1, eps, D)
        if ROWS2 > 0:
            y2, m2 = _gated_rmsnorm(x2, g2, w2, eps, D)
        if ROWS1 == ROWS0 and ROWS1 > 0:
            m0 = tl.maximum(m0, m1)
        if ROWS2 == ROWS0 and ROWS2 > 0:
            m0 = tl.maximum(m0, m2)
        amax = tl.max(m0, axis=0)
        if ROWS1 != ROWS0 and ROWS1 > 0:
            amax = tl.maximum(amax, tl.max(m1, axis=0))
        if ROWS2 != ROWS0 and ROWS2 > 0:
            amax = tl.maximum(amax, tl.max(m2, axis=0))
        scale, inv = fp8_scale_and_inverse(nan_if_not_finite(amax), fp8_max, min_scale)
        tl.store(s_ptr + tok * stride_st, scale)
        _store_heads(q_row, y0, inv, 0, ROWS0, END0, D, BLOCK_D)
        if ROWS1 > 0:
            _store_heads(q_row, y1, inv, END0, ROWS1, END1, D, BLOCK_D)
        if ROWS2 > 0:
            _store_heads(q_row, y2, inv, END1, ROWS2, END2, D, BLOCK_D)

    @triton.jit
    def _rmsnorm_gated_fp8_wide_kernel(
        x_ptr, g_ptr, w_ptr, q_ptr, s_ptr,
        stride_xt, stride_xh, stride_gt, stride_gh, stride_qt, stride_st,
        eps, fp8_max, min_scale,
        H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HEADS: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Tokens too wide for registers: one token per program, heads in chunks of BLOCK_HEADS.
        # Pass 1 finds the token's amax, pass 2 recomputes y (cheaper than spilling it).
        tok = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + tok * stride_xt
        g_row = g_ptr + tok * stride_gt
        q_row = q_ptr + tok * stride_qt
        args = (x_row, g_row, w_ptr, stride_xh, stride_gh)
        amax = 0.0
        for first in tl.static_range(0, H, BLOCK_HEADS):
            x, g, w = _load_heads(*args, first, BLOCK_HEADS, H, D, BLOCK_D, False)
            _, head_max = _gated_rmsnorm(x, g, w, eps, D)
            amax = tl.maximum(amax, tl.max(head_max, axis=0))
        scale, inv = fp8_scale_and_inverse(nan_if_not_finite(amax), fp8_max, min_scale)
        tl.store(s_ptr + tok * stride_st, scale)
        for first in tl.static_range(0, H, BLOCK_HEADS):
            x, g, w = _load_heads(*args, first, BLOCK_HEADS, H, D, BLOCK_D, False)
            y, _ = _gated_rmsnorm(x, g, w, eps, D)
            _store_heads(q_row, y, inv, first, BLOCK_HEADS, H, D, BLOCK_D)

# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------


HEAD_SPLITS = ("pow2", "equal", "padded")


def head_chunks(
    heads: int, split: str = "pow2"
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Split ``heads`` into three (rows, valid) chunks of power-of-two rows; (0, 0) marks an
    unused one.

    ``pow2``: decreasing powers of two, the third padded if needed (12 = 8 + 4, 15 = 8 + 4 + 4/3).
    ``equal``: up to three chunks of the largest power of two dividing ``heads`` (12 = 4 + 4 + 4),
    which share a register layout so their per-head maxima reduce across warps once; ``pow2``
    when that would need more than three chunks. ``padded``: one ``next_pow2(heads)`` tile.
    """
    if split not in HEAD_SPLITS:
        raise ValueError(f"head split must be one of {HEAD_SPLITS}, got {split!r}")
    if split == "padded":
        return (next_power_of_2(heads), heads), (0, 0), (0, 0)
    rows = heads & -heads
    if split == "equal" and heads // rows <= 3:
        chunks = [(rows, rows)] * (heads // rows)
        return tuple(chunks + [(0, 0)] * (3 - len(chunks)))
    chunks = []
    remaining = heads
    while remaining and len(chunks) < 2:
        rows = 1 << (remaining.bit_length() - 1)
        chunks.append((rows, rows))
        remaining -= rows
    if remaining:
        chunks.append((next_power_of_2(remaining), remaining))
    chunks += [(0, 0)] * (3 - len(chunks))
    return tuple(chunks)


class FusedLaunchConfig(NamedTuple):
    """How the fused op is launched for one shape (see the module docstring)."""

    wide: bool  # two-pass kernel over chunks of `block_heads` heads
    block_heads: int
    num_warps: int
    head_split: str = "pow2"  # see head_chunks
    weight_tile: bool = True  # the weight read in x's register layout (see _load_heads)


@cache
def fused_launch_config(t_bucket: int, heads: int, head_dim: int) -> FusedLaunchConfig:
    """The launch configuration for ``[~t_bucket, heads, head_dim]`` inputs.

    Swept on an H200 (docs/performance.md). Up to 256 tokens the op is latency-bound: about
    4 values per thread, equal head chunks (one cross-warp reduction), no warp split inside a
    head, the weight read as a tile. Up to 4096 tokens, about 16 values per thread. Beyond, it is
    bandwidth-bound: 64 values per thread in flight, power-of-two chunks, the weight as a row.
    """
    block_d = next_power_of_2(head_dim)
    padded = sum(rows for rows, _ in head_chunks(heads)) * block_d
    if padded > _MAX_TILE:
        return FusedLaunchConfig(True, max(1, _MAX_TILE // 2 // block_d), 8)
    if t_bucket > 4096:
        warps = next_power_of_2(max(1, -(-padded // (32 * 64))))
        return FusedLaunchConfig(False, heads, min(8, warps), "pow2", weight_tile=False)
    chunks = head_chunks(heads, "equal")
    rows = chunks[0][0]
    padded = sum(r for r, _ in chunks) * block_d
    if t_bucket <= 256:
        warps = next_power_of_2(max(1, -(-padded // (32 * 4))))
    else:
        warps = 1 << (max(1, padded // (32 * 16)).bit_length() - 1)
    # A warp per head row at most: more would split a head's sums across warps.
    return FusedLaunchConfig(False, heads, max(1, min(16, rows, warps)), "equal")


@cache
def fused_launch_spec(
    config: FusedLaunchConfig, heads: int, head_dim: int, pdl: bool
) -> LaunchSpec:
    """Compile-time arguments of the fused kernel for a config, ``pdl`` whether it launches with
    programmatic dependent launch (cached: the spec also holds the compiled kernels, see
    ``vllm.triton_utils.launch``; no defaults, as a call leaving one out would key its own
    spec)."""
    kwargs = dict(
        D=head_dim, BLOCK_D=next_power_of_2(head_dim), num_warps=config.num_warps,
        **pdl_options(pdl),
    )  # fmt: skip
    if config.wide:
        return LaunchSpec(**kwargs, H=heads, BLOCK_HEADS=config.block_heads)
    (r0, v0), (r1, v1), (r2, v2) = head_chunks(heads, config.head_split)
    return LaunchSpec(
        **kwargs, ROWS0=r0, ROWS1=r1, ROWS2=r2, END0=v0, END1=v0 + v1, END2=v0 + v1 + v2,
        WEIGHT_TILE=config.weight_tile,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _check_fused_inputs(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """Validate the fused op's inputs; return the gate as a [T, H, D] view."""
    # The common case in few tensor attribute reads (this runs once per KDA layer and step); it
    # implies every check below, which name what is wrong when it does not hold.
    if (
        isinstance(x, torch.Tensor)
        and isinstance(gate, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and len(shape := x.shape) == 3
        and shape[1] > 0
        and shape[2] > 0
        and gate.shape == shape
        and weight.shape == (shape[2],)
        and x.stride()[2] == 1  # stride() is cheaper than stride(dim)
        and gate.stride()[2] == 1
        and weight.is_contiguous()
        and x.dtype in FLOAT_DTYPES
        and gate.dtype in FLOAT_DTYPES
        and weight.dtype in FLOAT_DTYPES
        and x.device == gate.device == weight.device
        and eps > 0.0
    ):
        return gate
    check_float_input("x", x)
    check_float_input("gate", gate)
    check_float_input("weight", weight)
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
    if not eps > 0.0:
        # eps == 0 would turn an all-zero head into 0 * rsqrt(0) = NaN.
        raise ValueError(f"eps must be a positive float, got {eps}")
    return gate


# --------------------------------------------------------------------------------------------
# Torch reference (used on CPU)
# --------------------------------------------------------------------------------------------


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
    quant_dtype, fp8_max, min_scale = fp8_quant_params(quant_dtype)
    tokens, heads, head_dim = x.shape
    device = x.device
    out, scale_out = fp8_outputs(out, scale_out, tokens, heads * head_dim, quant_dtype, device)
    if tokens == 0:
        return out, scale_out
    if head_dim > _MAX_TRITON_D or not use_triton_fp8(device, quant_dtype):
        y = rmsnorm_gated_ref(x, weight, gate, eps).reshape(tokens, heads * head_dim)
        q, scale = per_token_fp8_quant_ref(y, quant_dtype)
        out.copy_(q)
        scale_out.copy_(scale)
        return out, scale_out

    wide, spec = _launch_choice(next_power_of_2(tokens), heads, head_dim, use_pdl(device))
    _launch(wide, spec, x, weight, gate, eps, out, scale_out, fp8_max, min_scale)
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

    For tuning sweeps (the benchmark's ``--sweep``); the op itself looks its launch up in one
    cache (``_launch_choice``).
    """
    _, heads, head_dim = x.shape
    spec = fused_launch_spec(config, heads, head_dim, use_pdl(x.device))
    _launch(config.wide, spec, x, weight, gate, eps, out, scale_out, fp8_max, min_scale)


@cache
def _launch_choice(t_bucket: int, heads: int, head_dim: int, pdl: bool) -> tuple[bool, LaunchSpec]:
    """``(wide, spec)`` of the op's launch for a shape: one cache lookup a call instead of the
    config's and the spec's. Keyed by ``pdl`` itself, not the device, so that a caller that
    switches PDL (``use_pdl`` patched or re-read) never gets a spec of the other setting."""
    config = fused_launch_config(t_bucket, heads, head_dim)
    return config.wide, fused_launch_spec(config, heads, head_dim, pdl)


def _launch(
    wide: bool, spec: LaunchSpec, x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor,
    eps: float, out: torch.Tensor, scale_out: torch.Tensor, fp8_max: float, min_scale: float,
) -> None:  # fmt: skip
    """Launch the wide (two-pass) or the one-tile kernel on validated arguments."""
    # The kernel is looked up per call, not cached: tests swap in launch-counting stand-ins.
    kernel = _rmsnorm_gated_fp8_wide_kernel if wide else _rmsnorm_gated_fp8_kernel
    x_strides, g_strides = x.stride(), gate.stride()  # stride() is cheaper than stride(dim)
    launch(
        kernel, (x.shape[0], 1, 1),
        (
            x, gate, weight, out, scale_out,
            x_strides[0], x_strides[1], g_strides[0], g_strides[1], out.stride()[0],
            scale_out.stride()[0], eps, fp8_max, min_scale,
        ),
        spec,
    )  # fmt: skip
