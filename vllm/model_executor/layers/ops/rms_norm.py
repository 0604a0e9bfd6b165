"""RMSNorm, alone or fused with the residual add before it, in one Triton launch per call.

``rms_norm(x, weight, eps)``
    ``x``: ``[..., D]`` bf16 / fp16 / fp32, unit stride on the last dim (a 2-D ``x`` may have any
    row stride, so a column slice of a wider projection is read in place); ``weight``: ``[D]``,
    any of those dtypes, unit stride. Returns ``x * rsqrt(mean(x^2) + eps) * weight`` computed in
    fp32 and rounded once to ``x``'s dtype, shape of ``x``, contiguous.

``fused_add_rms_norm(x, residual, weight, eps)``
    ``residual``: same shape and dtype as ``x``. Returns ``(rms_norm(s), s)`` with
    ``s = x + residual`` rounded to ``x``'s dtype before it is normed, as the unfused
    ``s = x + residual; norm(s)`` of a pre-norm decoder computes it: ``s`` is the new residual
    stream, bit for bit the same as torch's add (fp32 add, one rounding).

Numerics: the torch references below (``rms_norm_ref``, ``fused_add_rms_norm_ref``) are the
statement, in their order of operations: fp32 sum of squares divided by ``D``, ``rsqrt``, times
the row, times ``weight``, one rounding. Kernel and reference differ only in the fp32 reduction
order and rsqrt's ulps (at most one ulp of a bf16 output); ``s`` is exact.

Launch shape: one program per row, the whole row in one ``[next_pow2(D)]`` register tile with the
padded lanes masked (D up to ``MAX_HIDDEN``). Rows are the flattened leading dims; zero rows launch
nothing. On a GPU the kernel runs; on CPU the reference, unless ``TRITON_INTERPRET=1``
(``vllm.triton_utils.use_triton``). No host reads of tensor values: CUDA-graph capturable.
"""

from functools import cache

import torch

from vllm.triton_utils import next_power_of_2, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = [
    "MAX_HIDDEN",
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "rms_norm",
    "rms_norm_ref",
    "row_tile_warps",
]

# The widest row one register tile holds without spilling badly; the models' norms are <= 8192.
MAX_HIDDEN = 65536
_FLOAT_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
        D, stride_x, stride_res, eps,
        BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Outputs are contiguous [rows, D]; inputs may have any row stride.
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        # The weight is loaded with the row, not after the reduction's barrier: one round trip.
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
            # Rounded to the stream's dtype before norming, as torch's separate add stores it.
            s = (x + r).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * D + cols, s, mask=mask)
            x = s.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        tl.store(out_ptr + row * D + cols, ((x * rstd) * w).to(out_ptr.dtype.element_ty), mask=mask)


def row_tile_warps(block: int) -> int:
    """Warps of the kernel's row tile of ``block`` lanes. Public so that kernels fusing this norm
    (``ops/mla_cache_write.py``) take the same tile, hence the same fp32 reduction order."""
    # 16 lanes per thread (two 16-byte loads of bf16) up to 8 warps: hidden 2304 (block 4096)
    # gets 8, the MLA latent's 512 one.
    return min(max(block // 512, 1), 8)


@cache
def _spec(block: int, has_residual: bool, pdl: bool) -> LaunchSpec:
    """Constexprs and warps for a row tile of ``block`` lanes; cached: the spec holds the compiled
    kernels (``vllm.triton_utils.launch``)."""
    return LaunchSpec(
        BLOCK=block, HAS_RESIDUAL=has_residual, num_warps=row_tile_warps(block),
        **pdl_options(pdl),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Torch reference
# --------------------------------------------------------------------------------------------


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim in fp32, in ``x``'s dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm_ref(s), s)`` with ``s = x + residual`` in ``x``'s dtype."""
    s = x + residual
    return rms_norm_ref(s, weight, eps), s


# --------------------------------------------------------------------------------------------
# Validation and public ops
# --------------------------------------------------------------------------------------------


def _check_row_input(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dim [..., hidden], got a scalar")
    if t.stride(-1) != 1 and t.size(-1) > 1:
        raise ValueError(f"{name} must have unit stride on its last dim, got strides {t.stride()}")


def _check(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    _check_row_input("x", x)
    hidden = x.shape[-1]
    if not 0 < hidden <= MAX_HIDDEN:
        raise ValueError(f"x: hidden size must be in [1, {MAX_HIDDEN}], got {hidden}")
    _check_row_input("weight", weight)
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}] (x's last dim), got {tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}")
    if residual is not None:
        _check_row_input("residual", residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual must match x ({tuple(x.shape)} {x.dtype}), got "
                f"{tuple(residual.shape)} {residual.dtype}"
            )
        if residual.device != x.device:
            raise ValueError(f"residual is on {residual.device}, x on {x.device}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, D]``: a view where the leading dims collapse, else a copy."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kernel's ``(normed, new residual or None)``, shaped like ``x``; ``x`` has rows."""
    x2 = _rows(x)
    rows, hidden = x2.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = None if residual is None else torch.empty_like(out)
    if rows == 0:
        return out, res_out
    res2 = x2 if residual is None else _rows(residual)
    launch(
        _rms_norm_kernel, (rows, 1, 1),
        (
            x2, res2, weight, out, out if res_out is None else res_out,
            hidden, x2.stride(0), res2.stride(0), eps,
        ),
        _spec(next_power_of_2(hidden), residual is not None, use_pdl(x.device)),
    )  # fmt: skip
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of ``x`` ``[..., D]`` with ``weight`` ``[D]`` (module docstring).

    Returns a new contiguous tensor shaped and typed like ``x``.
    """
    _check(x, None, weight)
    if not use_triton(x.device):
        return rms_norm_ref(x, weight, eps)
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` (in ``x``'s dtype) and its RMSNorm, in one launch.

    Args:
        x: ``[..., D]``, e.g. a sublayer's output.
        residual: the residual stream, same shape and dtype as ``x``.
        weight: ``[D]``.
        eps: added to the mean square.

    Returns:
        ``(normed, s)``, both new contiguous tensors shaped and typed like ``x``.
    """
    _check(x, residual, weight)
    if not use_triton(x.device):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    return _launch(x, residual, weight, eps)
