"""The routed-expert computation of a MoE layer, in four interchangeable implementations.

Every implementation takes `x` `[T, H]`, `w13` `[E, 2 * I, H]` (gate | up of each expert), `w2`
`[E, H, I]`, the router's `topk_weights` `[T, K]` (fp32) and `topk_ids` `[T, K]` (int64) and an
`act_and_mul` module mapping `[..., 2 * I]` to `[..., I]`; it returns
`sum_k topk_weights[t, k] * w2[e] @ act_and_mul(w13[e] @ x[t])` with `e = topk_ids[t, k]`, in the
dtype of `x`. The two GEMMs and the activation run in the dtype of `x` (fp32 accumulation inside the
GEMMs); the weighted sum over the K chosen experts runs in fp32, slot by slot in a fixed order
(`moe_weighted_sum`, weighted_sum.py).

  loop      a Python loop over the experts that received tokens. Exact reference; reads the
            per-expert counts on the host, so it syncs once per call and cannot be graph-captured.
  gathered  copies the chosen experts' weights to `[T * K, ...]` and runs two `bmm`s. No host sync
            and only static shapes, on any device and dtype; its weight traffic is three times the
            chosen experts' bytes, so it is meant for decode-size `T * K`.
  grouped   `torch._grouped_mm` over the rows sorted by expert, with int32 group ends computed on
            the device. No host sync where torch runs its CUTLASS kernel: CUDA, bf16, sm90 / sm100
            (elsewhere torch falls back to a per-group loop that copies the ends to the host).
  triton    `moe_experts_triton` (experts_triton.py): two GEMV-style Triton kernels that stream
            each routed row's expert weights once, for decode-size `T * K`; SiluAndMul or
            SituAndMul (fused_activation.py).
  triton_grouped
            `moe_experts_triton_grouped` (experts_triton_grouped.py): rows grouped by expert on
            the device, then Triton GEMM kernels that read each expert's weights once per block
            of its rows, for batches between the two above; SiluAndMul or SituAndMul.

`select_experts_impl` picks one from shapes, dtype, device and the activation's type only, so the
choice is the same in eager mode and inside a CUDA graph.
"""

from collections.abc import Callable

import torch

from vllm.model_executor.layers.fused_moe.experts_triton import (
    check_expert_shapes,
    moe_experts_triton,
    triton_experts_supported,
)
from vllm.model_executor.layers.fused_moe.experts_triton_grouped import moe_experts_triton_grouped
from vllm.model_executor.layers.fused_moe.gather_rows import gather_rows
from vllm.model_executor.layers.fused_moe.group_rows import group_rows
from vllm.model_executor.layers.fused_moe.weighted_sum import moe_weighted_sum
from vllm.platforms import current_platform

# Largest T * K that the gathered path serves. Its weight copy grows with T * K (64 rows of the
# Kimi-Linear experts are ~450 MB), so larger eager batches take the loop.
GATHER_MAX_ROWS = 64

# Largest T * K that the Triton GEMV path serves where Triton runs; larger batches take the
# grouped Triton path (or the grouped GEMM / gathered / loop fallbacks). With the GEMV tiles of
# 2026-12-06, on H100s (`benchmarks/kernels/benchmark_moe.py --paths triton tgrouped`, one process
# per token count, and alloc_probe.py; docs/performance.md "Forty-eighth run", calls 190-191):
# Kimi-Linear-48B's experts (top-8 + the fused shared one) ahead on the GEMV path up to 6 tokens
# (54 rows: 190.8 vs 191.8 us; 4 tokens 150.5 vs 156.5), 1% behind at 7 (63 rows), even at 8;
# Kimi-K3's at TP 8 (top-16, SiTU) ahead by 1.32-1.35x / 1.19x / 1.16-1.18x at 2 / 3 / 4 tokens
# (32 / 48 / 64 rows). The H200 was last compared with earlier kernels (2026-12-01: GEMV ahead
# at 9-18 rows, grouped at 72).
TRITON_MAX_ROWS = 64

# Largest T * K that the grouped Triton path serves where Triton runs (above TRITON_MAX_ROWS);
# larger batches take torch's grouped GEMM. On the H200 (`benchmarks/kernels/benchmark_moe.py
# --paths grouped tgrouped --fused-shared-experts 1`, docs/performance.md "Tenth run") the grouped
# Triton path at its default tiles wins up to 2048 tokens of top-8 + shared (658 vs 884 us at 512,
# 831 vs 1077 at 1024, 1141 vs 1405 at 2048), 1650 vs 1800 at 4096, and ties at 8192 (2725 vs
# 2722, 2636 vs 2719 in a second run): up to an 8192-token prefill chunk of Kimi-Linear. Larger
# sizes are not measured. That holds where it was measured, bf16 on Hopper-class GPUs (the
# devices where `torch._grouped_mm` is sync-free, with the shared memory the prefill tiles
# need); elsewhere the path keeps to decode sizes, up to TRITON_GROUPED_MAX_ROWS_ELSEWHERE.
# Setting both to TRITON_MAX_ROWS turns the path off.
TRITON_GROUPED_MAX_ROWS = 8192 * 9
TRITON_GROUPED_MAX_ROWS_ELSEWHERE = 4096

ExpertsImpl = Callable[..., torch.Tensor]


def moe_experts_loop(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: torch.nn.Module,
) -> torch.Tensor:
    """Reference: loop over the experts that received tokens (one host sync per call)."""
    check_expert_shapes(x, w13, w2, topk_weights, topk_ids)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    order = flat_ids.argsort()
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    token_of = order // topk_ids.shape[1]
    weight_of = topk_weights.reshape(-1)[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        tokens = token_of[start : start + count]
        h = act_and_mul(x[tokens] @ w13[expert].t())
        y = (h @ w2[expert].t()).float() * weight_of[start : start + count, None]
        out.index_add_(0, tokens, y)
        start += count
    return out.to(x.dtype)


def moe_experts_gathered(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: torch.nn.Module,
) -> torch.Tensor:
    """Sync-free on any device: gather the chosen experts' weights per (token, slot) and `bmm`."""
    check_expert_shapes(x, w13, w2, topk_weights, topk_ids)
    tokens, k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)
    # expand, not repeat_interleave: some torch versions build a repeats tensor and sum it on
    # the host.
    rows = x.unsqueeze(1).expand(tokens, k, x.shape[1]).reshape(tokens * k, x.shape[1], 1)
    h = torch.bmm(w13.index_select(0, flat_ids), rows).squeeze(-1)  # [T * K, 2 * I]
    a = act_and_mul(h).unsqueeze(-1)  # [T * K, I, 1]
    y = torch.bmm(w2.index_select(0, flat_ids), a).squeeze(-1)  # [T * K, H]
    return moe_weighted_sum(y, topk_weights, x.dtype)


def moe_experts_grouped(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: torch.nn.Module,
) -> torch.Tensor:
    """`torch._grouped_mm` on rows sorted by expert; the group ends never leave the device.

    `_grouped_mm(a [M, K], b [G, K, N], offs)` multiplies rows `offs[g-1]:offs[g]` of `a` by
    `b[g]`; `offs` is int32, the cumulative row ends of the groups. `b` is the transposed view of
    the `[E, N, K]` weights (column-major in its last two dims, as the kernel prefers), so nothing
    is copied. The kernel needs 16-byte aligned row strides: H and I multiples of 8 for bf16.

    Around the GEMMs, each pass over `[T * K, ...]` rows costs about as much as a GEMM's output at
    prefill sizes, so there are only three: the gather of x's rows, `act_and_mul` (one Triton
    launch for SiluAndMul) and the weighted sum, which reads `y` in sorted order through the
    inverse permutation instead of a copy back to (token, slot) order.
    """
    check_expert_shapes(x, w13, w2, topk_weights, topk_ids)
    # Stable (rows of one expert keep token order, the loop's accumulation order), with the
    # group ends and the inverse permutation, in one or two launches where Triton runs.
    order, inverse, _, offs = group_rows(topk_ids, w13.shape[0], block_m=16)
    # One launch where Triton runs (1.37x faster than index_select and its division's launch on
    # the H200); index_select elsewhere, meta tensors included.
    rows = gather_rows(x, order, topk_ids.shape[1])
    h = torch._grouped_mm(rows, w13.transpose(1, 2), offs=offs)
    y = torch._grouped_mm(act_and_mul(h), w2.transpose(1, 2), offs=offs)
    # The sum reads y where it lies (row r of (token, slot) order at inverse[r]).
    return moe_weighted_sum(y, topk_weights, x.dtype, inverse=inverse)


def grouped_mm_is_sync_free(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch._grouped_mm` runs its device-only CUTLASS kernel for `dtype` on `device`.

    torch takes that kernel for bf16 on CUDA compute capability 9.x and 10.x only; other CUDA
    devices and dtypes use a fallback that reads the group ends on the host.
    """
    if device.type != "cuda" or dtype != torch.bfloat16 or not current_platform.is_cuda():
        return False
    return current_platform.device_capability[0] in (9, 10)


def select_experts_impl(
    device: torch.device,
    dtype: torch.dtype,
    num_rows: int,
    hidden: int,
    intermediate: int,
    act_and_mul: torch.nn.Module,
) -> ExpertsImpl:
    """The implementation for `num_rows = T * K` routed rows of `dtype` on `device`.

    Depends only on static facts (device, dtype, shapes, the activation's type), never on tensor
    values. On CPU the Triton path is taken only under `TRITON_INTERPRET=1` (`use_triton`).
    """
    if triton_experts_supported(device, dtype, act_and_mul):
        if num_rows <= TRITON_MAX_ROWS:
            return moe_experts_triton
        measured = grouped_mm_is_sync_free(device, dtype)
        if num_rows <= (TRITON_GROUPED_MAX_ROWS if measured else TRITON_GROUPED_MAX_ROWS_ELSEWHERE):
            return moe_experts_triton_grouped
    aligned = hidden % 8 == 0 and intermediate % 8 == 0
    if aligned and grouped_mm_is_sync_free(device, dtype):
        return moe_experts_grouped
    if num_rows <= GATHER_MAX_ROWS:
        return moe_experts_gathered
    return moe_experts_loop
