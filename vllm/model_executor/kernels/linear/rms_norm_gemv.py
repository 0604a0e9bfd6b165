"""A decoder layer's input RMSNorm (with the residual add before it) and the one-row GEMV of the
linear after it, in one launch: at a batch-1 decode the norm is a launch of its own, ~1.5 us on
the H200 for one 2304-wide row, ahead of an input projection that reads tens of MB.

``fused_add_rms_norm_gemv(x, residual, norm_weight, eps, weight)``
    ``x`` ``[1, H]`` bf16 / fp16 with unit stride on H; ``residual`` None or shaped and typed like
    ``x`` with unit stride on H; ``norm_weight`` ``[H]`` bf16 / fp16 / fp32, contiguous;
    ``weight`` ``[N, H]`` in x's dtype with unit stride on H. Returns ``(out, new_residual)``:
    ``out`` ``[1, N]`` in x's dtype is ``gemv(h, weight)`` of ``h, new_residual =
    fused_add_rms_norm(x, residual, norm_weight, eps)`` (ops/rms_norm.py; without a residual
    ``h = rms_norm(x, ...)`` and ``new_residual`` is ``x`` itself, as the first decoder layer
    takes its embeddings for the stream). ``new_residual`` is a new contiguous tensor where a
    residual is given (the kernel reads ``x`` and ``residual`` in every program, so it must not
    alias them). ``h`` is not returned: the layers that call this read it only through the
    linear. Reference: ``fused_add_rms_norm_gemv_ref``.

``use_rms_norm_gemv(x, residual, norm_weight, weight)`` says whether a layer should call it:
where ``UnquantizedLinearMethod`` would send ``h`` to ``gemv`` (``use_bf16_gemv``) at one row
(a one-token decode, or a one-token prefill, which the unfused layer also sends to ``gemv``),
with ``default_config``'s launch multiply-and-sum in one K split whose warps are the norm
kernel's (``row_tile_warps``; below). On Kimi-Linear that is the KDA input projection (12576 x
2304 at TP 1, ``WIDE_TILE``'s 8 warps; its TP 2-8 shards keep the default tiles); MLA's q | kv_a
keeps its 4-warp tiles (at 8 warps it took 11.75 against 9.72 us on the H200) and so the norm
kernel.

The op takes no bias and applies no quantization: a caller checks that its linear is an
unquantized one without bias (the KDA layer's `_is_plain_linear`).

Kernel: the GEMV's grid, ``cdiv(N, block_n)`` programs of ``default_config(1, N, H, ...)``; in
`WIDE_TILE` at most ``MAX_REGISTERS`` registers a thread (the GEMV's own, so that as many programs
share an SM).
Each program loads its first weight tile (so the weight stream does not wait for the norm's
cross-warp sum), then runs the norm kernel's arithmetic on the whole row (one
``[next_pow2(H)]`` tile: ``s = x + residual`` rounded to x's dtype, the fp32 sum of ``s * s``,
divided by H, plus eps, ``rsqrt``) for the rstd; program 0 alone stores ``s``. It then walks K as
``gemv``'s multiply-and-sum path does at one row: ``[block_n, block_k]`` weight tiles, each times
the matching chunk of ``h = ((s * rstd) * norm_weight)`` rounded to x's dtype, recomputed
elementwise from x, residual and the norm weight (the same value in any layout), summed in fp32
and rounded once to x's dtype.

Numerics: ``h`` is the norm kernel's, bit for bit, where the rstd is: Triton's order for the sum
of squares follows the tile's layout, which follows the tile width, the warps and the alignment of
the row's accesses, so the launch takes the norm kernel's warps (another count is a ValueError),
and ``use_rms_norm_gemv`` asks for rows laid out as the model's (16-byte aligned, row strides
that 16 divides): a direct call outside those conditions is exact to the norm's bound, not
necessarily bit for bit. The GEMV then sums like ``gemv``'s multiply-and-sum (K chunks in order, a
tree within a chunk): under those conditions the fused and unfused forms agree bit for bit (the
sm_90 layouts of both sums are the unfused kernels', and the GPU tests compare the bits at
Kimi-Linear's shape); against the reference both differ only by fp32 summation order (gemv.py's
bound) and the rstd's ulps (rms_norm.py).

Host side: metadata checks only, static shapes, no sync: CUDA-graph capturable. PDL as the other
kernels (vllm/triton_utils/pdl.py): every program waits before touching memory, its first weight
tile included.
"""

from functools import cache

import torch

from vllm.model_executor.kernels.linear.gemv import gemv_ref
from vllm.model_executor.kernels.linear.gemv_config import (
    MAX_GRID_Y,
    WIDE_TILE,
    GemvConfig,
    default_config,
    use_bf16_gemv,
)
from vllm.model_executor.layers.ops.rms_norm import (
    fused_add_rms_norm_ref,
    rms_norm_ref,
    row_tile_warps,
)
from vllm.platforms import current_platform
from vllm.triton_utils import cdiv, next_power_of_2, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.model_executor.kernels.linear.gemv import _gemv_weight_tile
    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = [
    "MAX_REGISTERS",
    "NORM_GEMV_MAX_HIDDEN",
    "fused_add_rms_norm_gemv",
    "fused_add_rms_norm_gemv_ref",
    "norm_gemv_config",
    "use_rms_norm_gemv",
]

# Every program holds the whole row in registers beside its weight tile (the models' hidden
# sizes are <= 8192).
NORM_GEMV_MAX_HIDDEN = 8192
# Registers a thread, at most (the `maxnreg` launch option): `_gemv_kernel`'s count in
# `WIDE_TILE` on sm_90, so that the fused launch keeps its 6 programs of 8 warps an SM, and
# Kimi-Linear's 786 programs one wave on 132 SMs. Uncapped, the first weight tile live across the
# norm's sum took 48 (5 an SM, a second wave); capped, ptxas spills 24 bytes a thread. On an H100
# (benchmark_rms_norm_gemv.py, docs/performance.md "Fiftieth run"), us a call against the norm
# then the GEMV (22.58): 21.55 capped, 24.55 uncapped, 23.11 with the first tile loaded after the
# sum (32 registers, no spill).
MAX_REGISTERS = 40
_DTYPES = (torch.bfloat16, torch.float16)
_NORM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


if triton is not None:

    @triton.jit
    def _normed_step(acc, w, x_ptr, res_ptr, norm_w_ptr, k0, kk, H, rstd,
                     HAS_RESIDUAL: tl.constexpr):  # fmt: skip
        """``acc`` plus the weight tile ``w`` times the row's chunk of h at columns ``k0 + kk``,
        recomputed elementwise as the norm kernel computes it (exact in any layout: the
        x-dtype values the unfused GEMV would read back; L1 / L2 hits)."""
        k = k0 + kk
        k_ok = k < H
        dtype = x_ptr.dtype.element_ty
        xk = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            rk = tl.load(res_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            xk = (xk + rk).to(dtype).to(tl.float32)
        nw = tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        hk = ((xk * rstd) * nw).to(dtype).to(tl.float32)
        return acc + tl.sum(w.to(tl.float32) * hk[None, :], axis=1)

    @triton.jit
    def _rms_norm_gemv_kernel(
        x_ptr, res_ptr, norm_w_ptr, w_ptr, out_ptr, res_out_ptr,
        N, H, stride_wn, eps,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr = False,
    ):  # fmt: skip
        dtype = out_ptr.dtype.element_ty
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < N
        kk = tl.arange(0, BLOCK_K)
        # Padded channels address row 0 under a false mask: no address leaves the weight.
        w_rows = w_ptr + tl.where(n_ok, n, 0).to(tl.int64)[:, None] * stride_wn
        pdl_wait(PDL)
        # The first weight tile is loaded before the norm's sum, whose cross-warp barrier would
        # otherwise hold the weight stream back by the row's round trip.
        w = _gemv_weight_tile(w_rows, kk, n_ok, H, EVEN_K)

        # `_rms_norm_kernel`'s expression on its tile (BLOCK_D lanes under the same warps): the
        # same fp32 sum of squares, hence the same rstd.
        d = tl.arange(0, BLOCK_D)
        d_ok = d < H
        x = tl.load(x_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
            s = (x + r).to(dtype)
            if tl.program_id(0) == 0:
                tl.store(res_out_ptr + d, s, mask=d_ok)
            x = s.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / H + eps)

        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc = _normed_step(acc, w, x_ptr, res_ptr, norm_w_ptr, 0, kk, H, rstd, HAS_RESIDUAL)
        for k0 in range(BLOCK_K, H, BLOCK_K):
            w = _gemv_weight_tile(w_rows, k0 + kk, n_ok, H, EVEN_K)
            acc = _normed_step(acc, w, x_ptr, res_ptr, norm_w_ptr, k0, kk, H, rstd, HAS_RESIDUAL)
        tl.store(out_ptr + n, acc.to(dtype), mask=n_ok)


def norm_gemv_config(n: int, hidden: int) -> GemvConfig | None:
    """The launch for an ``[N, H]`` weight: ``gemv``'s default at one row where that is
    multiply-and-sum in one K split with the norm kernel's warps for H; else None (no fused
    launch: the layer runs the norm, then the linear)."""
    config = default_config(1, n, hidden, 2)
    warps = row_tile_warps(next_power_of_2(hidden))
    if config.use_dot or config.split_k != 1 or config.num_warps != warps:
        return None
    return config


@cache
def _spec(
    config: GemvConfig,
    block_d: int,
    has_residual: bool,
    even_k: bool,
    pdl: bool,
) -> LaunchSpec:
    """Constexprs and options, with the ``MAX_REGISTERS`` cap on `WIDE_TILE`'s tile on NVIDIA
    (where it was measured; other tiles, for tests and sweeps, hold more per thread, and Triton's
    AMD backend has no such option); cached: the spec holds the compiled kernels."""
    tile = (config.block_n, config.block_k, config.num_warps)
    wide = tile == (WIDE_TILE.block_n, WIDE_TILE.block_k, WIDE_TILE.num_warps)
    wide = wide and not current_platform.is_rocm()
    return LaunchSpec(
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, BLOCK_D=block_d,
        HAS_RESIDUAL=has_residual, EVEN_K=even_k, num_warps=config.num_warps,
        num_stages=config.num_stages, **({"maxnreg": MAX_REGISTERS} if wide else {}),
        **pdl_options(pdl),
    )  # fmt: skip


def fused_add_rms_norm_gemv_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference: the norm's reference, then ``gemv_ref`` of the normed row."""
    if residual is None:
        h, new_residual = rms_norm_ref(x, norm_weight, eps), x
    else:
        h, new_residual = fused_add_rms_norm_ref(x, residual, norm_weight, eps)
    return gemv_ref(h, weight), new_residual


def _args_error(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
) -> str:
    """What makes the operands unfit for the op ("" if nothing): the one list of conditions the
    op's checks and `use_rms_norm_gemv` share."""
    tensors = {"x": x, "residual": residual, "norm_weight": norm_weight, "weight": weight}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and (name != "residual" or t is not None):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
    if x.dim() != 2 or x.shape[0] != 1 or x.dtype not in _DTYPES:
        return f"x must be a [1, H] bf16 / fp16 row, got {tuple(x.shape)} {x.dtype}"
    hidden = x.shape[1]
    if not 0 < hidden <= NORM_GEMV_MAX_HIDDEN:
        return f"H must be in [1, {NORM_GEMV_MAX_HIDDEN}], got {hidden}"
    if weight.dim() != 2 or weight.shape[1] != hidden or weight.dtype != x.dtype:
        return f"weight must be [N, {hidden}] {x.dtype}, got {tuple(weight.shape)} {weight.dtype}"
    if weight.shape[0] == 0:
        return "weight has no output channels"
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        return (
            f"residual must match x ({tuple(x.shape)} {x.dtype}), got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )
    if tuple(norm_weight.shape) != (hidden,) or norm_weight.dtype not in _NORM_DTYPES:
        return (
            f"norm_weight must be [{hidden}] bf16 / fp16 / fp32, got "
            f"{tuple(norm_weight.shape)} {norm_weight.dtype}"
        )
    if hidden > 1 and any(t.stride(-1) != 1 for t in tensors.values() if t is not None):
        return "x, residual, norm_weight and weight must have unit stride on H"
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            return f"{name} is on {t.device}, x on {x.device}"
    return ""


def fused_add_rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    *,
    config: GemvConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gemv(h, weight), new_residual)`` with ``h, new_residual = fused_add_rms_norm(x,
    residual, norm_weight, eps)`` (``rms_norm`` and ``x`` itself without a residual), in one
    launch (module docstring). ``config`` overrides ``norm_gemv_config`` (tests, benchmark
    sweeps): multiply-and-sum in one K split under the norm kernel's warps. The weight is loaded
    after the PDL wait (loaded before it, as gemv.py's static weights, it measured slower:
    docs/performance.md "Fifty-first run" and "Fifty-second run"). ValueError for operands the op
    does not take, or for a launch it cannot make."""
    error = _args_error(x, residual, norm_weight, weight)
    if error:
        raise ValueError(f"fused_add_rms_norm_gemv: {error}")
    n, hidden = weight.shape
    warps = row_tile_warps(next_power_of_2(hidden))
    if config is None:
        config = norm_gemv_config(n, hidden)
        if config is None:
            raise ValueError(
                f"fused_add_rms_norm_gemv: no fused launch for a [{n}, {hidden}] weight (the "
                f"GEMV's default tiles there are not multiply-and-sum in one K split under "
                f"{warps} warps)"
            )
    else:
        config.check()
        if config.use_dot or config.split_k != 1 or config.num_warps != warps:
            raise ValueError(
                f"fused_add_rms_norm_gemv: config must be multiply-and-sum in one K split under "
                f"the norm's {warps} warps at H {hidden}, got {config}"
            )
    if not use_triton(x.device):
        return fused_add_rms_norm_gemv_ref(x, residual, norm_weight, eps, weight)
    grid = cdiv(n, config.block_n)
    if grid > MAX_GRID_Y:  # the 1-D grid's limit is far above; kept to the GEMV's own fit
        raise ValueError(f"fused_add_rms_norm_gemv: {grid} N blocks exceed {MAX_GRID_Y}")
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    res_out = x if residual is None else torch.empty_like(x)
    spec = _spec(
        config, next_power_of_2(hidden), residual is not None, hidden % config.block_k == 0,
        use_pdl(x.device),
    )  # fmt: skip
    launch(
        _rms_norm_gemv_kernel, (grid, 1, 1),
        (x, x if residual is None else residual, norm_weight, weight, out, res_out,
         n, hidden, weight.stride(0), float(eps)),
        spec,
    )  # fmt: skip
    return out, res_out


def use_rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
) -> bool:
    """Whether a layer runs its input norm and the one-row GEMV of ``weight`` after it as
    `fused_add_rms_norm_gemv` (module docstring): the row that ``UnquantizedLinearMethod`` would
    send to ``gemv``, a launch ``norm_gemv_config`` takes, and rows laid out as the model's fresh
    activations (16-byte aligned, row strides that 16 divides), which the norm kernel's loads are
    laid out by: only then do the two order the sum of squares alike."""
    rows = [t for t in (x, residual) if t is not None]
    return (
        not _args_error(x, residual, norm_weight, weight)
        and use_bf16_gemv(x, weight)
        and norm_gemv_config(*weight.shape) is not None
        and all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in rows)
    )
