"""MLA prefill attention of one sequence over its decompressed context.

The last `Lq` positions of a sequence of `ctx` tokens attend causally to its whole context (a new
prompt: `Lq == ctx`; a prefill chunk on top of cached tokens: `Lq < ctx`). Query i sits at position
`ctx - Lq + i` and sees keys `0 .. ctx - Lq + i`. Per head the key is `[k_nope | k_pe]`, `k_pe`
shared by the heads (MLA, NoPE: no rotary embedding).

- `q` `[Lq, H, nope + rope]`, `k_nope` `[ctx, H, nope]`, `k_pe` `[ctx, rope]`, `v` `[ctx, H, Dv]`,
  all in one dtype (fp32, fp16 or bf16) on one device; `Dv` may differ from `nope + rope`.
- Output `[Lq, H, Dv]` in `q`'s dtype (a view of the attention's output, unit last stride).

`mla_prefill_attention`: torch's fused scaled-dot-product attention in the inputs' dtype. The key
`[ctx, H, nope + rope]` is built in one pass, by `mla_prefill_key` or, with q and v, by
`mla_prefill_dense_operands` (one Triton launch: a torch cat of `k_nope` with `k_pe` broadcast
over the heads ran at a fifth of copy bandwidth, 188 us of each MLA layer's prefill at 8192
tokens on the H200). On a GPU the kernel depends on the shape
(`_gpu_path`; H200 figures per MLA layer, docs/performance.md "Twenty-eighth run"):
- a chunk on cached context (`Lq < ctx`): torch's `causal_lower_right` mask (a description,
  never a tensor), which torch runs with its flash kernel;
- a new prompt (`Lq == ctx`) of at most `FLASH_MAX_PROMPT` tokens: cuDNN off for the call, so
  flash where it applies (fp16 / bf16). No plan to build; 0.09 ms at 512 tokens (cuDNN: 0.10),
  0.24 ms at 2048 (cuDNN: 0.12 with a plan already built, 0.45 with per-length-class plans);
- a longer new prompt: cuDNN (1.29 ms at 8192 against flash's 2.76). cuDNN builds an execution
  plan per new shape (75-90 ms a length), so while torch's per-length-class plans are on
  (`vllm.env_override`) q, k and v go in `[S, H, D]` row order, the one layout that path takes:
  q and v are copied into it by the key's launch where they are strided
  (`mla_prefill_dense_operands`; Kimi-Linear's q is a column slice of MLA's fused projection,
  Kimi-K3's q is `q_b_proj`'s contiguous output; v goes at its own width). The path added
  ~0.4 ms a call with the operands already in that order (H200, "Twenty-eighth run"), hidden
  behind the kernel at 8192 tokens (0.04 ms more than the per-shape plans there). With those
  plans off, per-shape plans and v read in place.
The flash kernel and cuDNN's per-shape path need one head dim for q, k and v. For
`Dv < nope + rope`, where `k_nope` and `v` are the two halves of each head's row of one buffer (the
split of `kv_b_proj`'s output, as MLA passes them), the value operand is a view that starts
`nope + rope - Dv` columns before each head's `v` (the last columns of its `k_nope`) and the output
keeps its last `Dv` columns: each output column is `P` times its own value column, so the extra
columns change no kept bit, and nothing is padded or copied. Other layouts zero-pad a copy of `v`.
Memory is O((Lq + ctx) * H * head dim): no score matrix. On the CPU (tests) an explicit boolean
mask `[Lq, ctx]` stands in and `v` is used as it is.

`mla_prefill_attention_ref`: the reference, scores and softmax in fp32 with the caller's mask
`[Lq, ctx]` (True = masked; `causal_masked` builds the causal one), materializing `[H, Lq, ctx]`
fp32 scores.
"""

from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from vllm.env_override import cudnn_sdpa_avoids_recompile
from vllm.triton_utils import cdiv, next_power_of_2, use_triton
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch cat
    triton = None

if TYPE_CHECKING:
    from torch.nn.attention.bias import CausalBias

# Rows (token, head) per program of the operands kernel: 32 rows of the key's 192 bf16 are 12
# KB, with q and v as well (`mla_prefill_dense_operands`) 32 KB at Kimi-Linear's dims.
_KEY_BLOCK_R = 32
# New prompts up to this length run torch's flash kernel (see the module docstring): at 2048
# tokens 0.24 ms a layer on the H200 against 0.45 for cuDNN's per-length-class path (operands
# already copied), at 4096 0.77 against 0.47.
FLASH_MAX_PROMPT = 2048

if triton is not None:
    # `rows` (context tokens times heads) changes with every prompt chunk and only bounds the
    # rows, never the contiguous columns: its specialization (1, or a multiple of 16) compiled
    # the kernel again for nothing.
    @triton.jit(do_not_specialize=["rows"])
    def _mla_prefill_operands_kernel(
        nope_ptr, pe_ptr, k_ptr, q_ptr, q_out_ptr, v_ptr, v_out_ptr, rows, heads,
        stride_nt, stride_nh, stride_pt, stride_qt, stride_qh, stride_vt, stride_vh,
        NOPE: tl.constexpr, ROPE: tl.constexpr, DV: tl.constexpr, BLOCK_NOPE: tl.constexpr,
        BLOCK_ROPE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
        COPY_Q: tl.constexpr, COPY_V: tl.constexpr, PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # Rows r = t * heads + h of the contiguous outputs: k[t, h] = [k_nope[t, h] | k_pe[t]];
        # with COPY_Q / COPY_V also q[t, h] / v[t, h] copied. Neighbouring rows share t, so
        # k_pe's row is read from L1 / L2 after its first head.
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        r_ok = r < rows
        t = (r // heads).to(tl.int64)
        h = (r % heads).to(tl.int64)
        out_rows = r.to(tl.int64) * (NOPE + ROPE)
        d = tl.arange(0, BLOCK_NOPE)
        ok = r_ok[:, None] & (d < NOPE)[None, :]
        src = nope_ptr + (t * stride_nt + h * stride_nh)[:, None] + d[None, :]
        tl.store(k_ptr + out_rows[:, None] + d[None, :], tl.load(src, mask=ok), mask=ok)
        e = tl.arange(0, BLOCK_ROPE)
        ok_e = r_ok[:, None] & (e < ROPE)[None, :]
        pe = tl.load(pe_ptr + (t * stride_pt)[:, None] + e[None, :], mask=ok_e)
        tl.store(k_ptr + out_rows[:, None] + NOPE + e[None, :], pe, mask=ok_e)
        if COPY_Q:
            q_rows = q_ptr + (t * stride_qt + h * stride_qh)[:, None]
            q_out = q_out_ptr + out_rows[:, None]
            tl.store(q_out + d[None, :], tl.load(q_rows + d[None, :], mask=ok), mask=ok)
            tail = tl.load(q_rows + NOPE + e[None, :], mask=ok_e)
            tl.store(q_out + NOPE + e[None, :], tail, mask=ok_e)
        if COPY_V:
            c = tl.arange(0, BLOCK_V)
            ok_c = r_ok[:, None] & (c < DV)[None, :]
            v_rows = v_ptr + (t * stride_vt + h * stride_vh)[:, None] + c[None, :]
            v_out = v_out_ptr + (r.to(tl.int64) * DV)[:, None] + c[None, :]
            tl.store(v_out, tl.load(v_rows, mask=ok_c), mask=ok_c)


def _launch_operands(
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    k: torch.Tensor,
    q_copy: tuple[torch.Tensor, torch.Tensor] | None = None,
    v_copy: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """One launch of the operands kernel into the contiguous `k`, and with `q_copy` = `(q,
    q_out)` / `v_copy` = `(v, v_out)` the contiguous `q_out` / `v_out` as well."""
    ctx, heads, nope = k_nope.shape
    rope = k_pe.shape[1]
    rows = ctx * heads
    if rows == 0:
        return
    # A copy not asked for is compiled out: `k` stands in for its pointers and strides.
    q, q_out = q_copy if q_copy is not None else (k, k)
    v, v_out = v_copy if v_copy is not None else (k, k)
    dv = v.shape[2] if v_copy is not None else 1
    launch(
        _mla_prefill_operands_kernel, (cdiv(rows, _KEY_BLOCK_R), 1, 1),
        (
            k_nope, k_pe, k, q, q_out, v, v_out, rows, heads,
            k_nope.stride(0), k_nope.stride(1), k_pe.stride(0),
            q.stride(0), q.stride(1), v.stride(0), v.stride(1),
        ),
        launch_spec(
            _mla_prefill_operands_kernel, NOPE=nope, ROPE=rope, DV=dv,
            BLOCK_NOPE=next_power_of_2(nope), BLOCK_ROPE=next_power_of_2(rope),
            BLOCK_V=next_power_of_2(dv), BLOCK_R=_KEY_BLOCK_R, COPY_Q=q_copy is not None,
            COPY_V=v_copy is not None,
            num_warps=4, **pdl_options(use_pdl(k.device)),
        ),
    )  # fmt: skip


def mla_prefill_key(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """`[k_nope | k_pe]` per head: `k_nope` `[ctx, H, nope]`, `k_pe` `[ctx, rope]` (one dtype)
    -> contiguous `[ctx, H, nope + rope]`. One Triton launch where `use_triton` and both have a
    unit last stride, else a torch cat (the same values: both only move them). Mismatched
    operands are a ValueError: the kernel would read `k_pe` rows past its end for a shorter one,
    and convert a `k_pe` of another dtype where the cat promotes."""
    if k_nope.dim() != 3 or k_pe.dim() != 2 or k_pe.shape[0] != k_nope.shape[0]:
        raise ValueError(
            f"expected k_nope [ctx, H, nope] and k_pe [ctx, rope], got {tuple(k_nope.shape)} and "
            f"{tuple(k_pe.shape)}"
        )
    if k_pe.dtype != k_nope.dtype or k_pe.device != k_nope.device:
        raise ValueError(
            f"k_nope and k_pe must share a dtype and device, got {k_nope.dtype} on "
            f"{k_nope.device} and {k_pe.dtype} on {k_pe.device}"
        )
    ctx, heads, nope = k_nope.shape
    rope = k_pe.shape[1]
    if not use_triton(k_nope.device) or k_nope.stride(2) != 1 or k_pe.stride(1) != 1:
        return torch.cat([k_nope, k_pe.unsqueeze(1).expand(ctx, heads, rope)], dim=-1)
    k = torch.empty(ctx, heads, nope + rope, dtype=k_nope.dtype, device=k_nope.device)
    _launch_operands(k_nope, k_pe, k)
    return k


def _check(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 3 or k_nope.dim() != 3 or k_pe.dim() != 2 or v.dim() != 3:
        raise ValueError(
            "expected q [Lq, H, nope + rope], k_nope [ctx, H, nope], k_pe [ctx, rope], v [ctx, H, "
            f"Dv]; got {tuple(q.shape)}, {tuple(k_nope.shape)}, {tuple(k_pe.shape)}, "
            f"{tuple(v.shape)}"
        )
    lq, heads, qk = q.shape
    ctx, nope = k_nope.shape[0], k_nope.shape[2]
    if k_nope.shape[1] != heads or v.shape[:2] != (ctx, heads) or k_pe.shape[0] != ctx:
        raise ValueError(
            f"heads / context disagree: q {tuple(q.shape)}, k_nope {tuple(k_nope.shape)}, "
            f"k_pe {tuple(k_pe.shape)}, v {tuple(v.shape)}"
        )
    if nope + k_pe.shape[1] != qk:
        raise ValueError(f"q's head dim {qk} != nope {nope} + rope {k_pe.shape[1]}")
    if not 1 <= lq <= ctx:
        raise ValueError(f"need 1 <= Lq <= ctx, got Lq={lq}, ctx={ctx}")
    if len({q.dtype, k_nope.dtype, k_pe.dtype, v.dtype}) != 1:
        raise ValueError(
            f"q, k_nope, k_pe, v must share a dtype, got {q.dtype}, {k_nope.dtype}, "
            f"{k_pe.dtype}, {v.dtype}"
        )
    if len({q.device, k_nope.device, k_pe.device, v.device}) != 1:
        raise ValueError(
            f"q, k_nope, k_pe, v must share a device, got {q.device}, {k_nope.device}, "
            f"{k_pe.device}, {v.device}"
        )


def mla_prefill_dense_operands(
    q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous `(q, k, v)` of a new prompt (`Lq == ctx`; shapes as `mla_prefill_attention`'s)
    in the `[S, H, D]` row order that torch's per-length-class cuDNN plans take: q and v copied
    from their strided views (a contiguous one returned as it is), k built as `mla_prefill_key`
    builds it. One Triton launch where `use_triton` and every operand has a unit last stride,
    else `.contiguous()` and the key's own path (also where q and v are contiguous already); the
    same values either way (only moved).
    At Kimi-Linear's 8192 tokens on an H100 the launch takes 182 us (91% of copy bandwidth)
    against 271 us (62%) for torch's copies of the two strided views and the key's launch
    (docs/performance.md, "Forty-fifth run"). A chunk (`Lq < ctx`) is a ValueError."""
    _check(q, k_nope, k_pe, v)
    if q.shape[0] != k_nope.shape[0]:
        raise ValueError(
            f"need a new prompt (Lq == ctx), got Lq={q.shape[0]}, ctx={k_nope.shape[0]}"
        )
    return _dense_operands(q, k_nope, k_pe, v)


def _dense_operands(
    q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`mla_prefill_dense_operands` on checked operands."""
    strides = (q.stride(2), k_nope.stride(2), k_pe.stride(1), v.stride(2))
    copy_q, copy_v = not q.is_contiguous(), not v.is_contiguous()
    if not (copy_q or copy_v) or not use_triton(q.device) or strides != (1, 1, 1, 1):
        return q.contiguous(), mla_prefill_key(k_nope, k_pe), v.contiguous()
    # Kimi-K3's q (q_b_proj's own output) is contiguous already: only v is copied then.
    k = torch.empty_like(q, memory_format=torch.contiguous_format)
    q_out = torch.empty_like(k) if copy_q else q
    v_out = torch.empty_like(v, memory_format=torch.contiguous_format) if copy_v else v
    _launch_operands(
        k_nope, k_pe, k, (q, q_out) if copy_q else None, (v, v_out) if copy_v else None
    )
    return q_out, k, v_out


def _value_operand(k_nope: torch.Tensor, v: torch.Tensor, qk: int) -> tuple[torch.Tensor, int]:
    """The value operand of head dim >= `qk` for the fused GPU kernels, and the column of it
    where `v` starts (see the module docstring)."""
    nope, dv = k_nope.shape[2], v.shape[2]
    pad = qk - dv
    if pad <= 0:
        return v, 0
    # Each head's v right after its k_nope in one buffer (the split of kv_b_proj's output):
    # the operand is the same rows from `pad` columns earlier.
    in_place = (
        nope >= pad
        and v.stride() == k_nope.stride()
        and v.stride(2) == 1
        and v.untyped_storage().data_ptr() == k_nope.untyped_storage().data_ptr()
        and v.data_ptr() == k_nope.data_ptr() + nope * v.element_size()
    )
    if in_place:
        offset = v.storage_offset() - pad
        return v.as_strided((*v.shape[:2], qk), v.stride(), offset), pad
    return F.pad(v, (0, pad)), 0


def causal_masked(lq: int, ctx: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`[lq, ctx]` bool, True where query i (at position `ctx - lq + i`) may not look: key
    positions past its own. The reference's mask; the GPU path describes it instead."""
    return torch.ones(lq, ctx, dtype=torch.bool, device=device).triu_(ctx - lq + 1)


GpuPath = Literal["lower_right", "flash", "cudnn_classes", "cudnn_shapes"]


def _gpu_path(lq: int, ctx: int) -> GpuPath:
    """Which fused GPU attention runs `Lq` new of `ctx` positions (see the module docstring);
    "flash" is any kernel but cuDNN's, "cudnn_classes" its per-length-class plans."""
    if lq < ctx:
        return "lower_right"
    if lq <= FLASH_MAX_PROMPT:
        return "flash"
    return "cudnn_classes" if cudnn_sdpa_avoids_recompile() else "cudnn_shapes"


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: "torch.Tensor | CausalBias | None",
    scale: float,
) -> torch.Tensor:
    """torch's scaled-dot-product attention of `[L, H, D]` rows -> `[Lq, H, v's D]` (a view);
    `mask` None is the upper-left causal mask."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0), attn_mask=mask, is_causal=mask is None, scale=scale,
    )  # fmt: skip
    return out[0].transpose(0, 1)


def mla_prefill_attention(
    q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Fused causal attention of the last `Lq` of `ctx` positions (see the module docstring)."""
    _check(q, k_nope, k_pe, v)
    lq, _, qk = q.shape
    ctx, dv = v.shape[0], v.shape[2]
    if not q.is_cuda:
        k = mla_prefill_key(k_nope, k_pe)
        return _attention(q, k, v, causal_masked(lq, ctx, q.device).logical_not_(), scale)
    # Imported here: the modules pull in torch._dynamo (~1.5 s), which CPU-only processes (the
    # engine's workers on a host without a GPU, the tests' TP ranks) never need.
    from torch.nn.attention.bias import causal_lower_right

    path = _gpu_path(lq, ctx)
    if path == "cudnn_classes":
        return _attention(*_dense_operands(q, k_nope, k_pe, v), None, scale)
    k = mla_prefill_key(k_nope, k_pe)
    operand, first = _value_operand(k_nope, v, qk)
    if path == "flash":
        # cuDNN off for this call only, so torch takes flash where it applies and its other
        # kernels for what flash does not (fp32, Dv > qk); the user's other choices stand. The
        # flag itself, not `sdpa_kernel` (12 us a call on the CI host, per layer and prompt).
        cudnn = torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(False)
        try:
            out = _attention(q, k, operand, None, scale)
        finally:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
    else:
        out = _attention(q, k, operand, causal_lower_right(lq, ctx), scale)
    return out[:, :, first : first + dv]


def mla_prefill_attention_ref(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    masked: torch.Tensor,
) -> torch.Tensor:
    """The fp32 reference; `masked` `[Lq, ctx]` bool, True where a query may not look."""
    _check(q, k_nope, k_pe, v)
    if masked.shape != (q.shape[0], k_nope.shape[0]) or masked.dtype != torch.bool:
        raise ValueError(
            f"masked must be bool [{q.shape[0]}, {k_nope.shape[0]}], got {masked.dtype} "
            f"{tuple(masked.shape)}"
        )
    nope = k_nope.shape[-1]
    qf = q.float()
    scores = torch.einsum("qhd,khd->hqk", qf[..., :nope], k_nope.float())
    scores += torch.einsum("qhd,kd->hqk", qf[..., nope:], k_pe.float())
    probs = (scores * scale).masked_fill(masked, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
