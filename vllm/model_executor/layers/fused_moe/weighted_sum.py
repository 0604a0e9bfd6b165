"""The last step of every routed-expert path: each token's K expert outputs, weighted by the router
and summed over the slots in a fixed order in fp32, in one Triton launch.

``moe_weighted_sum(y, topk_weights, dtype, inverse=None)``
    ``y``: ``[T * K, H]`` bf16 / fp16 / fp32 for the kernel, unit stride on the last dim (any row
    stride); the expert output of (token t, slot k) is row ``t * K + k``, or, with ``inverse``
    ``[T * K]`` int32 / int64 with unit stride, row ``inverse[t * K + k]`` (``y`` in the order
    the rows were grouped by expert: ``inverse[r]`` is where row r was sorted to, so nothing has
    to copy ``y`` back to (token, slot) order first). ``topk_weights``: ``[T, K]`` floating
    point (read as fp32), any strides. ``dtype``: the output's, bf16 / fp16 / fp32. Returns
    ``[T, H]`` of ``sum_k topk_weights[t, k] * y[row(t, k)]``. Other floating dtypes (fp64)
    take the reference on every device.

Numerics: the torch reference below (``moe_weighted_sum_ref``) is the statement: products in fp32,
added slot by slot from slot 0 into an fp32 accumulator, one rounding to ``dtype`` last. The
kernel keeps that order (no atomics: deterministic) and is compiled without FMA contraction, so it
equals the reference bit for bit on every device.

Launch shape: grid ``(T, cdiv(H, 512))``, the K rows of a program's 512 columns loaded in one
unrolled loop (K loads in flight). Values of ``inverse`` are not checked (that would read them on
the host): no sync, static shapes, CUDA-graph capturable. On a GPU the kernel runs; on CPU the
reference, unless ``TRITON_INTERPRET=1`` (``vllm.triton_utils.use_triton``).
"""

import torch

from vllm.triton_utils import cdiv, use_triton
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = ["KERNEL_DTYPES", "moe_weighted_sum", "moe_weighted_sum_ref"]

KERNEL_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))
# Hidden outputs per program (a few programs per token at H 2304).
_BLOCK_H = 512


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _moe_weighted_sum_kernel(
        y_ptr, rows_ptr, topk_w_ptr, out_ptr,
        stride_yr, stride_wt, stride_wk, stride_ot, hidden,
        TOPK: tl.constexpr, BLOCK_H: tl.constexpr, HAS_ROWS: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = h < hidden
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for j in tl.static_range(TOPK):
            weight = tl.load(topk_w_ptr + t * stride_wt + j * stride_wk).to(tl.float32)
            if HAS_ROWS:
                row = tl.load(rows_ptr + t * TOPK + j).to(tl.int64)
            else:
                row = t * TOPK + j
            y = tl.load(y_ptr + row * stride_yr + h, mask=h_ok, other=0.0)
            acc += y.to(tl.float32) * weight
        tl.store(out_ptr + t * stride_ot + h, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


# --------------------------------------------------------------------------------------------
# Torch reference
# --------------------------------------------------------------------------------------------


def moe_weighted_sum_ref(
    y: torch.Tensor,
    topk_weights: torch.Tensor,
    dtype: torch.dtype,
    inverse: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * y[row(t, k)]`` in fp32, slot 0 first, cast to ``dtype``."""
    tokens, k = topk_weights.shape
    if inverse is not None:
        y = y.index_select(0, inverse)
    y = y.view(tokens, k, y.shape[-1])
    weights = topk_weights.float()
    acc = torch.zeros(tokens, y.shape[-1], dtype=torch.float32, device=y.device)
    for j in range(k):
        # Two separate ops: the product is rounded to fp32 before the add, as in the kernel.
        acc += y[:, j].float() * weights[:, j, None]
    return acc.to(dtype)


# --------------------------------------------------------------------------------------------
# Validation and public op
# --------------------------------------------------------------------------------------------


def _check(
    y: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype, inverse: torch.Tensor | None
) -> None:
    for name, t in (("y", y), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point torch.Tensor, got {t!r:.60}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    tokens, k = topk_weights.shape
    if y.shape[0] != tokens * k:
        raise ValueError(
            f"y must have T * K = {tokens * k} rows (topk_weights is [{tokens}, {k}]), got "
            f"{y.shape[0]}"
        )
    if y.stride(1) != 1 and y.shape[1] > 1:
        raise ValueError(f"y must have unit stride on its last dim, got strides {y.stride()}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    if topk_weights.device != y.device:
        raise ValueError(f"topk_weights is on {topk_weights.device}, y on {y.device}")
    if inverse is not None:
        if inverse.dtype not in (torch.int32, torch.int64) or inverse.shape != (tokens * k,):
            raise ValueError(
                f"inverse must be [{tokens * k}] int32 / int64, got {tuple(inverse.shape)} "
                f"{inverse.dtype}"
            )
        if inverse.stride(0) != 1 and inverse.shape[0] > 1:
            # The kernel reads it at unit stride.
            raise ValueError(f"inverse must have unit stride, got {inverse.stride()}")
        if inverse.device != y.device:
            raise ValueError(f"inverse is on {inverse.device}, y on {y.device}")


def moe_weighted_sum(
    y: torch.Tensor,
    topk_weights: torch.Tensor,
    dtype: torch.dtype,
    inverse: torch.Tensor | None = None,
) -> torch.Tensor:
    """The router-weighted sum of each token's K expert outputs (module docstring).

    Args:
        y: ``[T * K, H]`` expert outputs, in (token, slot) order or, with ``inverse``, in any
            order.
        topk_weights: ``[T, K]`` router weights.
        dtype: the output's dtype.
        inverse: ``[T * K]``: the row of ``y`` holding (token t, slot k) at ``t * K + k``.

    Returns:
        A new contiguous ``[T, H]`` tensor of ``dtype``.
    """
    _check(y, topk_weights, dtype, inverse)
    kernel_dtypes = y.dtype in KERNEL_DTYPES and dtype in KERNEL_DTYPES
    if not use_triton(y.device) or not kernel_dtypes:
        return moe_weighted_sum_ref(y, topk_weights, dtype, inverse)
    tokens, k = topk_weights.shape
    hidden = y.shape[1]
    out = torch.empty(tokens, hidden, dtype=dtype, device=y.device)
    if tokens == 0 or hidden == 0:
        return out
    launch(
        _moe_weighted_sum_kernel, (tokens, cdiv(hidden, _BLOCK_H), 1),
        (
            # Without rows the kernel never reads `rows_ptr`: y stands in, so that every tensor
            # leads the arguments (vllm.triton_utils.launch).
            y, inverse if inverse is not None else y, topk_weights, out,
            y.stride(0), topk_weights.stride(0), topk_weights.stride(1), out.stride(0), hidden,
        ),
        launch_spec(
            _moe_weighted_sum_kernel, TOPK=k, BLOCK_H=_BLOCK_H, HAS_ROWS=inverse is not None,
            num_warps=4, enable_fp_fusion=False, **pdl_options(use_pdl(y.device)),
        ),
    )  # fmt: skip
    return out
