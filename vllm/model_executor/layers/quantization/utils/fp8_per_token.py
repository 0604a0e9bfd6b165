"""Per-token dynamic FP8 quantization (PTPC activations) and the numerics FP8 producers share.

``per_token_fp8_quant(x)``
    ``x``: ``[T, K]`` bf16 / fp16 / fp32, unit stride on the last dim, any row stride; or
    ``[T, H, D]`` (unit stride on D, any token and head strides), quantized as the ``[T, H * D]``
    rows it would reshape to, read in place (heads of an attention output with padded head
    rows). Returns
    ``q`` ``[T, K]`` FP8 (row-major) and ``scale`` ``[T, 1]`` fp32, with ``q * scale``
    approximating ``x``. One Triton launch on GPU (CUDA and ROCm); the torch reference
    ``per_token_fp8_quant_ref`` beside it runs everywhere (and is what CPU tensors use unless
    ``TRITON_INTERPRET=1``).

The linear kernels quantize plain activations with it, and the fused gated-RMSNorm + quant op of
the Kimi-K3 KDA epilogue (``vllm/models/kimi_k3/amd/ops/rmsnorm_gated_fp8_per_token.py``) builds on
the helpers here, so fused and unfused producers differ only where rounding must.

Numerics policy (shared by every per-token FP8 producer, its Triton kernel and its torch reference)
----------------------------------------------------------------------------------------------------
* ``fp8_max`` comes from the platform (``current_platform.fp8_max``): 448 for e4m3fn, 224 for
  e4m3fnuz (upstream's dynamic-quant maximum, not ``torch.finfo``'s 240).
* ``amax`` is the max of ``|y|`` over the token, computed on the fp32 value ``y`` that is quantized.
* ``scale = max(amax / fp8_max, 1 / (fp8_max * 512))`` in fp32 with correctly rounded division.
  The floor is upstream's minimum scale: an all-zero token gets that finite scale and zero codes.
* ``q = round(y * (1 / scale))``, ``1 / scale`` correctly rounded once per token, round to nearest
  even into FP8. Upstream's C++ kernel divides each element instead; both are within one rounding
  of ``y / scale``, multiplying costs less, and the reference does the same operations, so kernel
  and reference agree. No clamp is needed: the scale bounds ``|y * (1 / scale)|`` by
  ``fp8_max * (1 + 2^-23)``, which rounds to ``fp8_max``.
* Non-finite input is never hidden: a token whose ``y`` holds a NaN or an Inf gets scale NaN and
  all-NaN codes, so its dequantized values (and its GEMM output row) are NaN. Other tokens are
  unaffected.

Launch shape: ``BLOCK_T`` tokens per program, grown while enough programs remain to fill the GPU.
A row of up to 8192 padded elements stays in registers (one pass); wider rows take two passes over
``K`` chunks (amax, then quantize). Padded lanes read clamped, in-bounds addresses under a mask, so
no out-of-bounds address is ever formed.
"""

from functools import cache

import torch

from vllm.platforms import current_platform, supported_fp8_dtypes
from vllm.triton_utils import HAS_TRITON, next_power_of_2, num_sms, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = [
    "FLOAT_DTYPES",
    "check_float_input",
    "fp8_outputs",
    "fp8_quant_params",
    "per_token_fp8_quant",
    "per_token_fp8_quant_ref",
    "use_triton_fp8",
]

# The activation dtypes the FP8 producers read (a set: membership is tested on the hot path).
FLOAT_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))
# (fp8_max, min_scale) per FP8 dtype, computed once: the hot path must not call torch.finfo.
_QUANT_PARAMS = {
    dtype: (current_platform.fp8_max(dtype), current_platform.fp8_min_scale(dtype))
    for dtype in supported_fp8_dtypes()
}
_DEFAULT_FP8_DTYPE = current_platform.fp8_dtype()
_MAX_TILE = 8192  # elements per register tile; bounds registers per program


# --------------------------------------------------------------------------------------------
# Triton kernel, and the device helpers the fused producers share
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def abs_max(y, axis: tl.constexpr = None):
        """max |y| in one reduction, +inf when any y is NaN or Inf.

        tl.max drops NaN, so NaN is mapped to +inf first; callers turn an infinite amax into NaN
        (``nan_if_not_finite``).
        """
        return tl.max(tl.where(y == y, tl.abs(y), float("inf")), axis=axis)

    @triton.jit
    def nan_if_not_finite(a):
        """``a`` unchanged when finite, else NaN (inf * 0 and NaN * 0 are NaN)."""
        return a + a * 0.0

    @triton.jit
    def fp8_scale_and_inverse(amax, fp8_max, min_scale):
        """The policy's ``scale`` of a token's amax and its correctly rounded reciprocal."""
        # NaN amax must give a NaN scale: maximum() with min_scale would drop it.
        scale = tl.math.div_rn(amax, fp8_max)
        scale = tl.where(scale < min_scale, min_scale, scale)
        return scale, tl.math.div_rn(1.0, scale)

    @triton.jit
    def _x_cols(cols, stride_xh, HEAD_DIM: tl.constexpr):
        # Column offsets of a row: as they are, or of heads of HEAD_DIM columns stride_xh apart.
        if HEAD_DIM == 0:
            offsets = cols
        else:
            # In int64: a head stride larger than the token stride ([H, T, D] memory) passes
            # 2^31 elements long before the token offsets do. (One return: Triton wants the
            # same type from every return of a function, taken or not.)
            offsets = (cols // HEAD_DIM).to(tl.int64) * stride_xh + cols % HEAD_DIM
        return offsets

    # T only bounds the rows (each tile's loads and stores run along K): its specialization
    # (1, or a multiple of 16) compiled the kernel a second time in a power-of-two bucket of
    # token counts (`_quant_config`) for nothing.
    @triton.jit(do_not_specialize=["T"])
    def _per_token_fp8_quant_kernel(
        x_ptr, q_ptr, s_ptr,
        T, K, stride_xt, stride_xh, stride_qt, stride_st,
        fp8_max, min_scale,
        BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, SINGLE_PASS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # BLOCK_T tokens per program. SINGLE_PASS: the whole row fits one [BLOCK_T, BLOCK_K]
        # tile and stays in registers; otherwise pass 1 reduces amax over K chunks, pass 2 re-reads.
        # HEAD_DIM: 0 for rows of x, else x's rows are heads of HEAD_DIM columns.
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
            x_ptrs = x_rows + _x_cols(cols, stride_xh, HEAD_DIM)[None, :]
            x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
            scale, inv = fp8_scale_and_inverse(nan_if_not_finite(abs_max(x, 1)), fp8_max, min_scale)
            q = (x * inv[:, None]).to(q_ptr.dtype.element_ty)
            tl.store(q_rows + cols[None, :], q, mask=mask)
        else:
            amax = tl.zeros([BLOCK_T], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + cols
                col_ok = kk < K
                kk = tl.where(col_ok, kk, 0)
                mask = tok_ok[:, None] & col_ok[None, :]
                x_ptrs = x_rows + _x_cols(kk, stride_xh, HEAD_DIM)[None, :]
                x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, abs_max(x, 1))
            scale, inv = fp8_scale_and_inverse(nan_if_not_finite(amax), fp8_max, min_scale)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + cols
                col_ok = kk < K
                kk = tl.where(col_ok, kk, 0)
                mask = tok_ok[:, None] & col_ok[None, :]
                x_ptrs = x_rows + _x_cols(kk, stride_xh, HEAD_DIM)[None, :]
                x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
                q = (x * inv[:, None]).to(q_ptr.dtype.element_ty)
                tl.store(q_rows + kk[None, :], q, mask=mask)
        tl.store(s_ptr + toks64 * stride_st, scale, mask=tok_ok)


# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------


@cache
def _quant_config(t_bucket: int, k: int, head_dim: int, pdl: bool) -> tuple[int, LaunchSpec]:
    """(block_t, the kernel's constexprs and num_warps) for per-token quantization of [T, K]
    (rows of heads of `head_dim` columns if nonzero), ``pdl`` as ``use_pdl`` says; cached: the
    spec also holds the compiled kernels (``vllm.triton_utils.launch``). No defaults:
    ``functools.cache`` keys on the arguments as passed, so a call that left one out would get a
    spec of its own."""
    block_k = next_power_of_2(k)
    if block_k > _MAX_TILE:
        return 1, LaunchSpec(
            BLOCK_T=1, BLOCK_K=_MAX_TILE, SINGLE_PASS=False, HEAD_DIM=head_dim, num_warps=8,
            **pdl_options(pdl),
        )  # fmt: skip
    block_t = 1
    target_programs = 4 * num_sms()
    while block_t * 2 * block_k <= _MAX_TILE and -(-t_bucket // (block_t * 2)) >= target_programs:
        block_t *= 2
    warps = max(1, min(8, block_t * block_k // 512))
    return block_t, LaunchSpec(
        BLOCK_T=block_t, BLOCK_K=block_k, SINGLE_PASS=True, HEAD_DIM=head_dim,
        num_warps=1 << (warps.bit_length() - 1), **pdl_options(pdl),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Validation, outputs and dispatch (shared with the fused producers)
# --------------------------------------------------------------------------------------------


def check_float_input(name: str, t: torch.Tensor) -> None:
    """ValueError naming ``name`` unless ``t`` is a bf16 / fp16 / fp32 tensor with unit stride on
    its last dim."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if t.dim() > 0 and t.stride(-1) != 1 and t.size(-1) > 1:
        raise ValueError(f"{name} must have unit stride on its last dim, got strides {t.stride()}")


def fp8_quant_params(quant_dtype: torch.dtype | None) -> tuple[torch.dtype, float, float]:
    """``(quant_dtype, fp8_max, min_scale)``; None is the platform's FP8 dtype. A dtype that is not
    a supported FP8 dtype is a ValueError."""
    if quant_dtype is None:
        quant_dtype = _DEFAULT_FP8_DTYPE
    try:
        fp8_max, min_scale = _QUANT_PARAMS[quant_dtype]
    except KeyError:
        raise ValueError(
            f"quant_dtype must be one of {[str(d) for d in _QUANT_PARAMS]}, got {quant_dtype}"
        ) from None
    return quant_dtype, fp8_max, min_scale


def fp8_outputs(
    out: torch.Tensor | None,
    scale_out: torch.Tensor | None,
    tokens: int,
    width: int,
    quant_dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[tokens, width]`` FP8 codes and ``[tokens, 1]`` fp32 scales to write: the given
    buffers once checked (``out`` may have any row stride that keeps rows apart), else new ones."""
    # Sizes as separate arguments: torch parses them faster than a tuple.
    if out is None:
        out = torch.empty(tokens, width, dtype=quant_dtype, device=device)
    elif (
        out.shape != (tokens, width)
        or out.dtype != quant_dtype
        or out.device != device
        # stride() is cheaper than stride(dim)
        or (width > 1 and out.stride()[1] != 1)
        or (tokens > 1 and out.stride()[0] < width)
    ):
        raise ValueError(
            f"out must be a [{tokens}, {width}] {quant_dtype} tensor on {device} with unit stride "
            f"on its last dim and rows that do not overlap, got {tuple(out.shape)} {out.dtype} "
            f"on {out.device} strides {out.stride()}"
        )
    if scale_out is None:
        scale_out = torch.empty(tokens, 1, dtype=torch.float32, device=device)
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


def use_triton_fp8(device: torch.device, quant_dtype: torch.dtype) -> bool:
    """Whether an FP8-producing op on ``device`` launches its Triton kernel: ``use_triton``, and
    on a GPU only where Triton can emit ``quant_dtype``."""
    if device.type == "cuda":  # use_triton is HAS_TRITON here: one call fewer on the hot path
        return _gpu_triton_fp8(quant_dtype)
    return use_triton(device)


@cache
def _gpu_triton_fp8(quant_dtype: torch.dtype) -> bool:
    """Whether Triton is here and emits `quant_dtype` on this platform's GPU; cached, as the
    platform's answer is fixed for the process and the ops ask on every call."""
    return HAS_TRITON and current_platform.triton_supports_fp8(quant_dtype)


# --------------------------------------------------------------------------------------------
# Torch reference (exact statement of the numerics policy; used on CPU)
# --------------------------------------------------------------------------------------------


def per_token_fp8_quant_ref(
    x: torch.Tensor, quant_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 quantization of ``x`` ``[T, K]`` by the module's numerics policy."""
    quant_dtype, fp8_max, min_scale = fp8_quant_params(quant_dtype)
    xf = x.float()
    # + sum(x * 0): NaN when the token holds NaN or Inf (the non-finite rule).
    amax = xf.abs().amax(dim=-1, keepdim=True) + (xf * 0.0).sum(dim=-1, keepdim=True)
    # A tensor divisor: torch on CUDA turns division by a Python scalar into multiplication by
    # its reciprocal, which is not correctly rounded.
    scale = torch.clamp(amax / amax.new_full((), fp8_max), min=min_scale)
    q = (xf * torch.reciprocal(scale)).to(quant_dtype)
    return q, scale


# --------------------------------------------------------------------------------------------
# Public op
# --------------------------------------------------------------------------------------------


def _as_rows_of_heads(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Checks `per_token_fp8_quant`'s `x` off its common case: `(x, head_dim, stride_xh)`, where
    head_dim 0 means rows of `x` (a 3-D `x` whose heads lie back to back is viewed as 2-D)."""
    check_float_input("x", x)
    if x.dim() not in (2, 3):
        raise ValueError(
            f"x must be [tokens, hidden] or [tokens, heads, head_dim], got {tuple(x.shape)}"
        )
    if x.shape[-1] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must have non-empty rows, got shape {tuple(x.shape)}")
    if x.dim() == 2:
        return x, 0, 0
    heads, head_dim = x.shape[1], x.shape[2]
    if heads == 1 or x.stride(1) == head_dim:
        return x.view(x.shape[0], heads * head_dim), 0, 0
    return x, head_dim, x.stride(1)


def per_token_fp8_quant(
    x: torch.Tensor,
    quant_dtype: torch.dtype | None = None,
    *,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token dynamic FP8 quantization of an activation, in one launch.

    Args:
        x: ``[T, K]`` bf16/fp16/fp32, unit stride on the last dim (any row stride), or
            ``[T, H, D]`` (any token and head strides) read in place as ``[T, H * D]``.
        quant_dtype: FP8 dtype of ``q`` (default: the platform's).
        out, scale_out: optional preallocated ``[T, K]`` FP8 and ``[T, 1]`` fp32 outputs
            (for CUDA-graph capture).

    Returns:
        ``(q, scale)`` with the numerics of the module docstring.
    """
    # The common case in few tensor attribute reads; it implies the checks under it, which name
    # what is wrong when it does not hold.
    if not (
        isinstance(x, torch.Tensor)
        and len(shape := x.shape) == 2
        and shape[1] > 0
        and x.stride()[1] == 1  # stride() is cheaper than stride(dim)
        and x.dtype in FLOAT_DTYPES
    ):
        x, head_dim, stride_xh = _as_rows_of_heads(x)
    else:
        head_dim = stride_xh = 0
    tokens = x.shape[0]
    width = x.shape[1] if head_dim == 0 else x.shape[1] * head_dim
    device = x.device
    quant_dtype, fp8_max, min_scale = fp8_quant_params(quant_dtype)
    out, scale_out = fp8_outputs(out, scale_out, tokens, width, quant_dtype, device)
    if tokens == 0:
        return out, scale_out
    if not use_triton_fp8(device, quant_dtype):
        q, scale = per_token_fp8_quant_ref(x.reshape(tokens, width), quant_dtype)
        out.copy_(q)
        scale_out.copy_(scale)
        return out, scale_out

    block_t, spec = _quant_config(next_power_of_2(tokens), width, head_dim, use_pdl(device))
    launch(
        _per_token_fp8_quant_kernel, (-(-tokens // block_t), 1, 1),
        (
            x, out, scale_out, tokens, width, x.stride()[0], stride_xh, out.stride()[0],
            scale_out.stride()[0], fp8_max, min_scale,
        ),
        spec,
    )  # fmt: skip
    return out, scale_out
