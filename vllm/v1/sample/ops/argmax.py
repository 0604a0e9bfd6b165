"""Greedy sampling's argmax: the index of each row's largest logit, the first among equal maxima,
as ``torch.argmax(logits, dim=-1)`` returns it, in two short Triton launches.

``argmax(logits, *, target_programs=TARGET_PROGRAMS, max_kernel_rows=MAX_KERNEL_ROWS)``
    ``logits`` ``[N, V]`` bf16 / fp16 / fp32 with unit stride on V (any row stride; another
    stride is copied first), 1 <= V <= ``MAX_VOCAB``. Returns ``[N]`` int64. Reference:
    ``argmax_ref`` (``torch.argmax``), which other dtypes and CPU tensors take (unless
    ``TRITON_INTERPRET=1``: ``use_triton``), and so do more than ``max_kernel_rows`` rows, where
    torch's own reduction is faster. ``target_programs`` sets the chunking (below); the tests and
    the benchmark's sweep set both; the result depends on neither.

Why: torch's argmax of one ``[1, 163840]`` bf16 row took ~9 us on the H200 in the profile of a
batch-1 decode step (twenty-third run) for 320 KB, which cross HBM in well under a microsecond.
Here many programs reduce chunks of the rows at once, then one short launch per row picks the
best chunk: 2.6 us for that row (docs/performance.md, twenty-fourth run).

Order: every value is widened to fp32 exactly (a bf16's bits shifted into place) and mapped to
an int32 key that orders as the floats do: a non-negative float's bits as they are, a negative
one's with its 31 low bits flipped. Both zeros take key 0 (``-0.0 == 0.0`` for torch: the first
of them wins) and every NaN the largest (torch's argmax returns a row's first NaN), both decided
on the bits, where float compares could flush a denormal to zero. The key goes in the high half
of an int64 and ``2^31 - 1 - index`` in the low half, so the int64 maximum of a set of elements
is its largest value at its smallest index: an exact, associative reduction, whose result no
chunking, warp count or reduction order can change.

Launches: ``_argmax_partial_kernel`` on grid ``(N, S)`` (``split_count``): program ``(n, s)``
reduces columns ``[s * chunk, (s + 1) * chunk)`` of row n in ``BLOCK``-wide steps and stores its
packed maximum to an int64 scratch ``[N, S]``. Lanes past the chunk's end load its last column
again (a duplicate of a real element: no sentinel needed). ``S`` aims at ``target_programs``
programs over all rows (1 to ``cdiv(V, BLOCK)`` a row): one ``BLOCK`` a program for the rows
the kernels take, longer chunks only for many rows or a long V.
``_argmax_pick_kernel`` on grid ``(N,)`` takes each row's maximum over its S partials and unpacks
the index. Both kernels start with ``pdl_wait`` (vllm/triton_utils/pdl.py). No host reads of
tensor values: CUDA-graph capturable.
"""

from functools import cache

import torch

from vllm.triton_utils import cdiv, next_power_of_2, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = ["KERNEL_DTYPES", "MAX_KERNEL_ROWS", "MAX_VOCAB", "argmax", "argmax_ref", "split_count"]

KERNEL_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))
# The index's complement must fit the packed maximum's low 31 bits.
MAX_VOCAB = 2**30
# Columns a partial program reads per step: 4 warps, 16 values a thread.
BLOCK = 2048
_PARTIAL_WARPS = 4
# Programs of the partial launch, all rows together. Up to 102 rows of Kimi's 163840 columns this
# gives one step a program, the fastest of 512-8192 on the H200 at 1, 8 and 64 rows (call 94).
TARGET_PROGRAMS = 8192
# Rows up to which the kernels run; above, torch.argmax, which reads many rows as fast or faster
# (H200, V 163840, bf16, graph replay, call 95: 2.56 against 8.51 us at 1 row, 17.4 against 22.4
# at 64, 25.3 against 29.2 at 96, 33.3 against 33.8 at 128, 61.9 against 57.1 at 256).
MAX_KERNEL_ROWS = 96
# Partials the pick launch reduces per row in one tile.
MAX_SPLITS = 1024


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _packed_max(vals, cols):
        """The int64 maximum of (key of ``vals``, complement of ``cols``) (module docstring)."""
        if vals.dtype == tl.bfloat16:
            # bf16 is fp32's high half: its bits shifted are the fp32 bits, with no conversion
            # (Triton's interpreter flushes bf16 denormals converting them).
            bits = vals.to(tl.int16, bitcast=True).to(tl.int32) << 16
        else:
            bits = vals.to(tl.float32).to(tl.int32, bitcast=True)
        magnitude = bits & 0x7FFFFFFF
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        # On the bits, not as float compares: those may flush denormals to zero.
        key = tl.where(magnitude == 0, 0, key)
        key = tl.where(magnitude > 0x7F800000, 0x7FFFFFFF, key)
        low = (0x7FFFFFFF - cols).to(tl.int64)
        return tl.max((key.to(tl.int64) << 32) | low, axis=0)

    @triton.jit
    def _argmax_partial_kernel(
        logits_ptr, partial_ptr,
        vocab, stride_row, chunk, splits,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        row_ptr = logits_ptr + row * stride_row
        start = split * chunk
        end = tl.minimum(start + chunk, vocab)
        lanes = tl.arange(0, BLOCK)
        cols = tl.minimum(start + lanes, end - 1)
        best = _packed_max(tl.load(row_ptr + cols), cols)
        for step in range(start + BLOCK, end, BLOCK):
            cols = tl.minimum(step + lanes, end - 1)
            best = tl.maximum(best, _packed_max(tl.load(row_ptr + cols), cols))
        tl.store(partial_ptr + row * splits + split, best)

    @triton.jit
    def _argmax_pick_kernel(
        partial_ptr, out_ptr,
        splits,
        BLOCK_S: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        row = tl.program_id(0).to(tl.int64)
        # Lanes past the row's partials read its last one again: a duplicate changes no maximum.
        parts = tl.load(partial_ptr + row * splits + tl.minimum(tl.arange(0, BLOCK_S), splits - 1))
        best = tl.max(parts, axis=0)
        # The low half (truncation keeps it; it is below 2^31) is 2^31 - 1 - index.
        tl.store(out_ptr + row, (0x7FFFFFFF - best.to(tl.int32)).to(tl.int64))


@cache
def _partial_spec(pdl: bool) -> LaunchSpec:
    return LaunchSpec(BLOCK=BLOCK, num_warps=_PARTIAL_WARPS, **pdl_options(pdl))


@cache
def _pick_spec(block_s: int, pdl: bool) -> LaunchSpec:
    return LaunchSpec(BLOCK_S=block_s, num_warps=max(1, min(block_s // 256, 4)), **pdl_options(pdl))


def split_count(rows: int, vocab: int, target_programs: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """``(S, chunk)``: the chunks each of ``rows`` rows of ``vocab`` columns is cut into, and the
    columns of one chunk (a multiple of ``BLOCK``; the last chunk may be shorter)."""
    blocks = cdiv(vocab, BLOCK)
    wanted = min(cdiv(target_programs, rows), blocks, MAX_SPLITS)
    chunk = cdiv(blocks, wanted) * BLOCK
    return cdiv(vocab, chunk), chunk


# --------------------------------------------------------------------------------------------
# Torch reference
# --------------------------------------------------------------------------------------------


def argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)``: ``[N]`` int64, the first index of each row's maximum
    (a NaN counts as the maximum)."""
    return logits.argmax(dim=-1)


# --------------------------------------------------------------------------------------------
# Validation and public op
# --------------------------------------------------------------------------------------------


def _check(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")
    if not 1 <= logits.shape[1] <= MAX_VOCAB:
        raise ValueError(f"logits' V must be in [1, {MAX_VOCAB}], got {logits.shape[1]}")


def argmax(
    logits: torch.Tensor,
    *,
    target_programs: int = TARGET_PROGRAMS,
    max_kernel_rows: int = MAX_KERNEL_ROWS,
) -> torch.Tensor:
    """The first index of each row's largest value of ``logits`` ``[N, V]`` -> ``[N]`` int64
    (module docstring)."""
    _check(logits)
    if not isinstance(target_programs, int) or target_programs < 1:
        raise ValueError(f"target_programs must be a positive int, got {target_programs!r}")
    if not isinstance(max_kernel_rows, int) or max_kernel_rows < 0:
        raise ValueError(f"max_kernel_rows must be a non-negative int, got {max_kernel_rows!r}")
    rows, vocab = logits.shape
    kernel = use_triton(logits.device) and logits.dtype in KERNEL_DTYPES
    if not kernel or rows > max_kernel_rows:
        return argmax_ref(logits)
    if logits.stride(1) != 1 and vocab > 1:
        logits = logits.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    splits, chunk = split_count(rows, vocab, target_programs)
    partial = torch.empty((rows, splits), dtype=torch.int64, device=logits.device)
    pdl = use_pdl(logits.device)
    launch(
        _argmax_partial_kernel, (rows, splits, 1),
        (logits, partial, vocab, logits.stride(0), chunk, splits),
        _partial_spec(pdl),
    )  # fmt: skip
    block_s = next_power_of_2(splits)
    launch(_argmax_pick_kernel, (rows, 1, 1), (partial, out, splits), _pick_spec(block_s, pdl))
    return out
