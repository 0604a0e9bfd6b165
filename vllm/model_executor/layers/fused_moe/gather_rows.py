"""The row gather that opens the grouped MoE prefill: each routed (token, slot) row's copy of its
token's hidden state, in the expert-sorted order, in one Triton launch.

``gather_rows(x, order, k, config=None)``
    ``x``: ``[T, H]`` with unit stride on the last dim (any row stride); bf16 / fp16 / fp32 for
    the kernel, other dtypes take the reference. ``order``: ``[R]`` int32 / int64 with unit
    stride, on ``x``'s device, flat (token, slot) row numbers (``token * k + slot``), e.g.
    ``group_rows``'s expert-sorted order. Other strides are a ``ValueError`` on every device, as
    in ``moe_weighted_sum``: the engine never passes them, and a quiet fallback to the reference
    would hide a slower path. ``k``: the slots per token, ``>= 1``. Returns a new
    contiguous ``[R, H]`` tensor of ``x``'s dtype whose row r is ``x[order[r] // k]``, bit for bit
    ``gather_rows_ref`` (``x.index_select(0, order // k)``).

Why a kernel: torch's ``index_select`` there is a separate launch for ``order // k`` and a gather
that moved Kimi-Linear's prefill size (8192 tokens, 9 slots, H 2304: 340 MB written, 38 MB of x
read) at 45% of the H200's copy bandwidth, 195 us; this kernel takes 143 us (62%; every launch
shape swept within 1%, benchmarks/kernels/benchmark_gather_rows.py, 2026-12-01). The division is
done on the indices as they are loaded, and each program copies a ``block_rows x block_cols`` tile
with 16-byte vector loads and stores.

Launch shape: a 1-D grid of ``cdiv(R, block_rows) * cdiv(H, block_cols)`` programs, the column
blocks of one row block adjacent (consecutive programs write consecutive output), flat so that no
grid axis limit caps R. Values of ``order`` are not checked (that would read them on the host): no
sync, static shapes, CUDA-graph capturable. On a GPU the kernel runs; on CPU the reference, unless
``TRITON_INTERPRET=1`` (``vllm.triton_utils.use_triton``).
"""

from dataclasses import dataclass
from functools import cache

import torch

from vllm.triton_utils import cdiv, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = [
    "DEFAULT_GATHER_ROWS_CONFIG",
    "KERNEL_DTYPES",
    "GatherRowsConfig",
    "gather_rows",
    "gather_rows_ref",
]

KERNEL_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))


@dataclass(frozen=True)
class GatherRowsConfig:
    """Launch parameters: ``block_rows`` output rows by ``block_cols`` columns per program
    (powers of two), ``num_warps`` warps."""

    block_rows: int
    block_cols: int
    num_warps: int

    def __post_init__(self) -> None:
        for name in ("block_rows", "block_cols", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")


# 8 KB of bf16 per program (64 B, four 16-byte vectors, a thread), so a full SM (16 programs of 4
# warps) keeps ~128 KB of loads in flight, several times what the H200's bandwidth-latency product
# asks of each SM (~4.3 TB/s x ~1 us / 132 SMs = ~33 KB). 256 columns divide H 2304 (9 blocks), so
# no lane is masked at Kimi-Linear's size.
DEFAULT_GATHER_ROWS_CONFIG = GatherRowsConfig(block_rows=16, block_cols=256, num_warps=4)


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------

if triton is not None:
    # num_rows (tokens times top-k) changes with the batch and only bounds the rows: the copies,
    # which run along the hidden columns, and the index load, scalar at the default tiles either
    # way (other tiles load the indices in narrower pieces without it: 16-128 bytes a program).
    # Its specialization compiled the kernel again for nothing.
    @triton.jit(do_not_specialize=["num_rows"])
    def _gather_rows_kernel(
        x_ptr, order_ptr, out_ptr,
        num_rows, hidden, stride_x,
        K: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        pid = tl.program_id(0)
        col_blocks = tl.cdiv(hidden, BLOCK_COLS)
        rows = (pid // col_blocks) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        cols = (pid % col_blocks) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        row_ok = rows < num_rows
        # K is a constexpr, so the division is a multiply and shift, in order's own width.
        src = (tl.load(order_ptr + rows, mask=row_ok, other=0) // K).to(tl.int64)
        mask = row_ok[:, None] & (cols < hidden)[None, :]
        vals = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :], mask=mask)
        dst = rows.to(tl.int64)[:, None] * hidden + cols[None, :]
        tl.store(out_ptr + dst, vals, mask=mask)


@cache
def _spec(k: int, config: GatherRowsConfig, pdl: bool) -> LaunchSpec:
    """Constexprs and options; cached: the spec holds the compiled kernels."""
    return LaunchSpec(
        K=k, BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols,
        num_warps=config.num_warps, **pdl_options(pdl),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Torch reference
# --------------------------------------------------------------------------------------------


def gather_rows_ref(x: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """``x.index_select(0, order // k)``: row r of the result is ``x[order[r] // k]``."""
    return x.index_select(0, order // k)


# --------------------------------------------------------------------------------------------
# Validation and public op
# --------------------------------------------------------------------------------------------


def _check(x: torch.Tensor, order: torch.Tensor, k: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D torch.Tensor [T, H], got {x!r:.60}")
    if not isinstance(order, torch.Tensor) or order.dim() != 1:
        raise ValueError(f"order must be a 1-D torch.Tensor, got {order!r:.60}")
    if order.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"order must be int32 / int64, got {order.dtype}")
    if order.device != x.device:
        raise ValueError(f"order is on {order.device}, x on {x.device}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    # The kernel reads x's rows and order at unit stride.
    if x.stride(1) != 1 and x.shape[1] > 1:
        raise ValueError(f"x must have unit stride on its last dim, got strides {x.stride()}")
    if order.stride(0) != 1 and order.shape[0] > 1:
        raise ValueError(f"order must have unit stride, got {order.stride()}")


def gather_rows(
    x: torch.Tensor, order: torch.Tensor, k: int, config: GatherRowsConfig | None = None
) -> torch.Tensor:
    """Rows ``x[order[r] // k]`` for every r, in one launch (module docstring).

    Args:
        x: ``[T, H]`` rows to copy, unit stride on H.
        order: ``[R]`` flat (token, slot) row numbers, unit stride.
        k: slots per token.
        config: the launch (default ``DEFAULT_GATHER_ROWS_CONFIG``); the result does not depend
            on it.

    Returns:
        A new contiguous ``[R, H]`` tensor of ``x``'s dtype.
    """
    _check(x, order, k)
    if not use_triton(x.device) or x.dtype not in KERNEL_DTYPES:
        return gather_rows_ref(x, order, k)
    config = config or DEFAULT_GATHER_ROWS_CONFIG
    num_rows, hidden = order.shape[0], x.shape[1]
    out = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
    if num_rows == 0 or hidden == 0:
        return out
    grid = cdiv(num_rows, config.block_rows) * cdiv(hidden, config.block_cols)
    launch(
        _gather_rows_kernel, (grid, 1, 1),
        (x, order, out, num_rows, hidden, x.stride(0)),
        _spec(k, config, use_pdl(x.device)),
    )  # fmt: skip
    return out
