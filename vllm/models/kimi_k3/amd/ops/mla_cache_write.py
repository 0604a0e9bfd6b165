"""MLA's latent cache write: `kv_a_layernorm`, the `[latent | k_pe]` concatenation and the paged
scatter of each new token's cache entry, in one Triton launch (one op where torch took three
kernels: the norm, a cat and an index_put).

``mla_cache_write(kv_a, weight, eps, kv_cache, slot_mapping)``, in place on ``kv_cache``:

- ``kv_a`` ``[T, L + R]`` bf16 / fp16 / fp32: the `kv_a_proj_with_mqa` output, latent ``L``
  (`kv_lora_rank`) then the shared position part ``R`` (`qk_rope_head_dim`); any row stride, unit
  column stride (a column slice of a merged projection's output is read in place);
- ``weight`` ``[L]`` (any of those dtypes, contiguous) and ``eps``: `kv_a_layernorm`'s;
- ``kv_cache`` ``[num_blocks, block_size, L + R]`` bf16 / fp16 / fp32, any block and token
  strides, unit last stride;
- ``slot_mapping`` ``[T]`` int32 / int64, contiguous: token t's entry goes to block
  ``slot // block_size``, offset ``slot % block_size``. A negative slot writes nothing (the
  metadata builder makes none: padded CUDA-graph rows write the reserved block 0, see
  `metadata.py`; the convention only keeps a stray -1 from wrapping around to the last slot, as
  torch's indexing would). Slots past the cache are not checked (that would read the device).

Each written entry is ``[rms_norm(kv_a[t, :L], weight, eps), kv_a[t, L:]]`` converted to the
cache's dtype. Numerics are those of `vllm/model_executor/layers/ops/rms_norm.py`, the op that
`kv_a_layernorm` runs: fp32 sum of squares / L, rsqrt, times the row, times the weight, one
rounding to ``kv_a``'s dtype, and only then the conversion to the cache's dtype (today's
``torch.cat(...).to(cache.dtype)``). The kernel repeats that kernel's expression on the same
register tile (next_pow2(L) lanes, `row_tile_warps` warps). Triton lays the tile out by the
alignment of the row accesses, and the fp32 sum follows the layout: with rows aligned alike (the
model's: 16-byte aligned projection and cache rows) the two reduce in the same order and the
cached latent is bit for bit what the unfused ops wrote (GPU test at Kimi-Linear's layout). The
torch reference (`mla_cache_write_ref`, the unfused ops) sums in torch's order: fp32 results may
differ from the kernel's in the last ulp, rounded bf16 ones rarely by one ulp.

Launch: one program per token (as the norm kernel: the whole row in one tile); zero tokens launch
nothing. No host reads of tensor values: CUDA-graph capturable. On CPU the reference runs unless
``TRITON_INTERPRET=1`` (``vllm.triton_utils.use_triton``).
"""

from functools import cache

import torch

from vllm.model_executor.layers.ops.rms_norm import MAX_HIDDEN, rms_norm_ref, row_tile_warps
from vllm.triton_utils import next_power_of_2, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = ["mla_cache_write", "mla_cache_write_ref"]

_FLOAT_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))
_SLOT_DTYPES = frozenset((torch.int32, torch.int64))


if triton is not None:

    @triton.jit
    def _mla_cache_write_kernel(
        kv_a_ptr, w_ptr, slot_ptr, cache_ptr,
        L, R, stride_kv, stride_cb, stride_ct, block_size, eps,
        BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        src = kv_a_ptr + t * stride_kv
        cols = tl.arange(0, BLOCK_L)
        mask = cols < L
        pe_cols = tl.arange(0, BLOCK_R)
        pe_mask = pe_cols < R
        # Every load is issued before the slot is known (one round trip, not one per
        # dependence); a padded token (slot < 0) reads its row and stores nothing.
        slot = tl.load(slot_ptr + t).to(tl.int64)
        x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        pe = tl.load(src + L + pe_cols, mask=pe_mask, other=0.0)
        if slot >= 0:
            dst = cache_ptr + (slot // block_size) * stride_cb + (slot % block_size) * stride_ct
            # `_rms_norm_kernel`'s expression, operation for operation (see the docstring).
            rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / L + eps)
            normed = ((x * rstd) * w).to(kv_a_ptr.dtype.element_ty)
            tl.store(dst + cols, normed.to(cache_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + L + pe_cols, pe.to(cache_ptr.dtype.element_ty), mask=pe_mask)


@cache
def _spec(block_l: int, block_r: int, pdl: bool) -> LaunchSpec:
    """Cached: the spec holds the compiled kernels (``vllm.triton_utils.launch``)."""
    return LaunchSpec(
        BLOCK_L=block_l, BLOCK_R=block_r, num_warps=row_tile_warps(block_l), **pdl_options(pdl)
    )


def mla_cache_write_ref(
    kv_a: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The unfused ops: norm, cat, and an indexed write of the tokens with a slot >= 0. The mask
    reads the device (a host sync): a reference for CPU and tests, not for captured graphs."""
    latent = weight.shape[0]
    entries = torch.cat([rms_norm_ref(kv_a[:, :latent], weight, eps), kv_a[:, latent:]], -1)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = kv_cache.shape[1]
    kv_cache[slots // block_size, slots % block_size] = entries[keep].to(kv_cache.dtype)


def _check(
    kv_a: torch.Tensor, weight: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    for name, t, dims in (("kv_a", kv_a, 2), ("weight", weight, 1), ("kv_cache", kv_cache, 3)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            raise ValueError(f"{name} must be a {dims}-D tensor, got {_describe(t)}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} must have unit stride on its last dim, got {t.stride()}")
    width, latent = kv_a.shape[1], weight.shape[0]
    if not 0 < latent < width <= MAX_HIDDEN:
        raise ValueError(
            f"kv_a [T, L + R] and weight [L] need 0 < L < L + R <= {MAX_HIDDEN}, got "
            f"kv_a {tuple(kv_a.shape)} and weight {tuple(weight.shape)}"
        )
    if kv_cache.shape[2] != width:
        raise ValueError(
            f"kv_cache must be [num_blocks, block_size, {width}] (kv_a's width), got "
            f"{tuple(kv_cache.shape)}"
        )
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.shape != (kv_a.shape[0],):
        raise ValueError(f"slot_mapping must be [{kv_a.shape[0]}], got {_describe(slot_mapping)}")
    if slot_mapping.dtype not in _SLOT_DTYPES or not slot_mapping.is_contiguous():
        raise ValueError(
            f"slot_mapping must be contiguous int32 or int64, got {slot_mapping.dtype} with "
            f"strides {slot_mapping.stride()}"
        )
    for name, t in (("weight", weight), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        if t.device != kv_a.device:
            raise ValueError(f"{name} is on {t.device}, kv_a on {kv_a.device}")


def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def mla_cache_write(
    kv_a: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's normed latent and `k_pe` from `kv_a` into `kv_cache` at its slot, in
    place (module docstring: shapes, dtypes, negative slots, numerics)."""
    _check(kv_a, weight, kv_cache, slot_mapping)
    if not use_triton(kv_a.device):
        mla_cache_write_ref(kv_a, weight, eps, kv_cache, slot_mapping)
        return
    tokens, width = kv_a.shape
    if tokens == 0:
        return
    latent = weight.shape[0]
    launch(
        _mla_cache_write_kernel, (tokens, 1, 1),
        (
            kv_a, weight, slot_mapping, kv_cache, latent, width - latent, kv_a.stride(0),
            kv_cache.stride(0), kv_cache.stride(1), kv_cache.shape[1], eps,
        ),
        _spec(next_power_of_2(latent), next_power_of_2(width - latent), use_pdl(kv_a.device)),
    )  # fmt: skip
