"""Causal depthwise short convolution with SiLU over a flattened batch, with per-slot conv state.

Shapes: `x` `[T, C]` (tokens of N sequences back to back, any strides), `weight` `[C, W]` fp32,
`conv_state` `[S, C, W - 1]` (the last W - 1 inputs of each slot's sequence, oldest first). Output
`[T, C]` in `x`'s dtype: `y[t] = silu(sum_j weight[:, j] * x[t - (W - 1) + j])`, where inputs
before a sequence's first token come from its slot's state (continued prefill, decode) or are zero
(a new sequence). The state is updated in place: afterwards it holds the last W - 1 inputs of the
sequence's state-then-tokens window, so a sequence shorter than W - 1 keeps part of its old state.

Rounding (Triton kernel and torch reference alike): the state enters the window converted to
`x`'s dtype, products and sums are fp32, the SiLU output is rounded once to `x`'s dtype.

Prefill on the Triton path is two kernels: the conv over (token block, channel block) programs,
then the state update per (sequence, channel block). A conv program finds its first token's
sequence by a binary search of `query_start_loc` on the device (no host sync, no per-sequence
launch). A block inside one sequence and past its first W - 1 tokens (nearly all of a long
prefill) reads only x, as shifted tiles; the others search each token's sequence and read the
inputs before it from the state. Both sum the taps in the same order, with the same rounding.
The update is a separate launch because a short sequence's old state is read by the programs of
its first tokens and rewritten from its last ones, which may be different programs of the first
kernel.
Decode (one token per sequence) stays in torch here; the fused decode kernel has its own conv.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm.triton_utils import next_power_of_2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

if triton is not None:

    @triton.jit
    def _conv_taps_general(
        x_ptr, w_ptr, state_ptr, qsl_ptr, slots_ptr, has_init_ptr, t0, c,
        stride_xt, stride_xc, stride_wc, stride_wj, stride_ss, stride_sc, stride_sj,
        tokens, channels, num_seqs, search_steps,
        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        # A block that starts a sequence, crosses into the next or reaches past T: every token
        # finds its own sequence, and inputs before a sequence come from its slot's state.
        t = t0.to(tl.int64) + tl.arange(0, BLOCK_T)
        t_ok = t < tokens
        c_ok = c < channels
        # Each token's sequence: the last `seq` with query_start_loc[seq] <= t.
        lo = tl.zeros([BLOCK_T], dtype=tl.int32)
        hi = tl.zeros([BLOCK_T], dtype=tl.int32) + num_seqs
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            right = tl.load(qsl_ptr + mid, mask=t_ok, other=0) <= t
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        start = tl.load(qsl_ptr + lo, mask=t_ok, other=0).to(tl.int64)
        slot = tl.load(slots_ptr + lo, mask=t_ok, other=0).to(tl.int64)
        init = tl.load(has_init_ptr + lo, mask=t_ok, other=0) != 0
        tile_ok = t_ok[:, None] & c_ok[None, :]
        x_cols = c[None, :] * stride_xc
        s_base = state_ptr + slot[:, None] * stride_ss + c[None, :] * stride_sc
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(W):
            p = t - (W - 1) + j  # the tap's input position
            in_x = (p >= start)[:, None]
            xv = tl.load(x_ptr + p[:, None] * stride_xt + x_cols, mask=tile_ok & in_x, other=0.0)
            # Before the sequence: its window position p - start + W - 1 in [0, W - 1).
            s_mask = tile_ok & ~in_x & init[:, None]
            sv = tl.load(s_base + (p - start + W - 1)[:, None] * stride_sj, mask=s_mask, other=0.0)
            v = tl.where(in_x, xv, sv.to(x_ptr.dtype.element_ty)).to(tl.float32)
            taps = tl.load(w_ptr + c * stride_wc + j * stride_wj, mask=c_ok, other=0.0)
            acc += v * taps.to(tl.float32)[None, :]
        return acc

    @triton.jit
    def _conv_taps_inner(
        x_ptr, w_ptr, t0, c, stride_xt, stride_xc, stride_wc, stride_wj, channels,
        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        # Every token's window lies in x: no state, no search, no row masks. The 64-bit row
        # offset is taken once; the tile's offsets fit in 32 bits. The W shifted tiles overlap,
        # so all but the first read of a row hit L1 / L2.
        c_ok = (c < channels)[None, :]
        offs = tl.arange(0, BLOCK_T)[:, None] * stride_xt + c[None, :] * stride_xc
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(W):
            rows = x_ptr + (t0 - (W - 1) + j).to(tl.int64) * stride_xt
            v = tl.load(rows + offs, mask=c_ok, other=0.0).to(tl.float32)
            taps = tl.load(w_ptr + c * stride_wc + j * stride_wj, mask=c < channels, other=0.0)
            acc += v * taps.to(tl.float32)[None, :]
        return acc

    @triton.jit
    def _causal_conv1d_prefill_kernel(
        x_ptr, w_ptr, state_ptr, qsl_ptr, slots_ptr, has_init_ptr, out_ptr,
        stride_xt, stride_xc, stride_wc, stride_wj, stride_ss, stride_sc, stride_sj,
        stride_og, stride_ot, stride_oc, group, tokens, channels, num_seqs, search_steps,
        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
        ONE_GROUP_PER_BLOCK: tl.constexpr,
    ):  # fmt: skip
        t0 = tl.program_id(0) * BLOCK_T
        c0 = tl.program_id(1) * BLOCK_C
        c = c0 + tl.arange(0, BLOCK_C)
        # The sequence of the block's first token (one scalar search per program).
        lo = t0 * 0
        hi = lo + num_seqs
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            right = tl.load(qsl_ptr + mid) <= t0
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        start = tl.load(qsl_ptr + lo)
        end = tl.load(qsl_ptr + lo + 1)
        if (t0 - start >= W - 1) & (t0 + BLOCK_T <= end):
            acc = _conv_taps_inner(
                x_ptr, w_ptr, t0, c, stride_xt, stride_xc, stride_wc, stride_wj, channels,
                W, BLOCK_T, BLOCK_C,
            )  # fmt: skip
        else:
            acc = _conv_taps_general(
                x_ptr, w_ptr, state_ptr, qsl_ptr, slots_ptr, has_init_ptr, t0, c,
                stride_xt, stride_xc, stride_wc, stride_wj, stride_ss, stride_sc, stride_sj,
                tokens, channels, num_seqs, search_steps, W, BLOCK_T, BLOCK_C,
            )  # fmt: skip
        y = acc * tl.sigmoid(acc)
        rows = tl.arange(0, BLOCK_T)
        ok = ((t0 + rows) < tokens)[:, None] & (c < channels)[None, :]
        o_rows = out_ptr + t0.to(tl.int64) * stride_ot
        if ONE_GROUP_PER_BLOCK:
            # The block's channels lie in one group: its offset is a scalar.
            g = c0 // group
            o_rows += g.to(tl.int64) * stride_og + (c0 - g * group).to(tl.int64) * stride_oc
            o_cols = tl.arange(0, BLOCK_C) * stride_oc
        else:
            o_cols = (c // group).to(tl.int64) * stride_og + (c % group) * stride_oc
        o_ptrs = o_rows + rows[:, None] * stride_ot + o_cols[None, :]
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _conv_state_update_kernel(
        x_ptr, state_ptr, qsl_ptr, slots_ptr, has_init_ptr,
        stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, channels,
        W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        n = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        k = tl.arange(0, BLOCK_W)  # new window position
        start = tl.load(qsl_ptr + n).to(tl.int64)
        end = tl.load(qsl_ptr + n + 1).to(tl.int64)
        slot = tl.load(slots_ptr + n).to(tl.int64)
        length = end - start
        # New position k is position length + k of the old window followed by the tokens. The
        # scalar conditions (an empty sequence writes nothing, a new one reads zeros) become
        # bounds on k and src: Triton's interpreter rejects a scalar bool in a block mask.
        src = length + k
        from_x = (src >= W - 1)[None, :]
        ok = (c < channels)[:, None] & (k < tl.minimum(length, 1) * (W - 1))[None, :]
        old_end = (tl.load(has_init_ptr + n) != 0).to(tl.int64) * (W - 1)
        rows = state_ptr + slot * stride_ss + c[:, None] * stride_sc
        xv = tl.load(
            x_ptr + (end - (W - 1) + k)[None, :] * stride_xt + c[:, None] * stride_xc,
            mask=ok & from_x, other=0.0,
        )  # fmt: skip
        old = tl.load(rows + src[None, :] * stride_sj, mask=ok & (src < old_end)[None, :],
                      other=0.0)  # fmt: skip
        new = tl.where(from_x, xv, old.to(x_ptr.dtype.element_ty))
        # Old positions are read by other threads of this program than the ones rewriting them.
        tl.debug_barrier()
        tl.store(rows + k[None, :] * stride_sj, new.to(state_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class Conv1dPrefillConfig:
    """Launch parameters of the prefill conv kernel: `block_t` tokens by `block_c` channels per
    program (powers of two), `num_warps` warps."""

    block_t: int
    block_c: int
    num_warps: int


# 16 KiB of bf16 input per tap and program, 64 fp32 accumulators a thread. The fastest of the 7
# configs of `benchmarks/kernels/benchmark_causal_conv1d.py` on an H200 (2026-12-01, 8192 tokens in
# 1 and 8 sequences: 226 / 267 us, 42% / 36% of copy; docs/performance.md).
DEFAULT_PREFILL_CONFIG = Conv1dPrefillConfig(block_t=32, block_c=256, num_warps=4)
# The state update's channels per program (one program per sequence and channel block).
_STATE_BLOCK_C = 128


def causal_conv1d_prefill_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Torch reference of `causal_conv1d_prefill`, one sequence at a time (reads the metadata
    back to the host)."""
    width = weight.shape[1]
    starts = query_start_loc.tolist()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for i, (slot, has_init) in enumerate(
        zip(slots.tolist(), has_initial_state.tolist(), strict=True)
    ):
        start, end = starts[i], starts[i + 1]
        if end == start:
            continue
        prev = conv_state[slot].t() if has_init else x.new_zeros(width - 1, x.shape[1])
        full = torch.cat([prev.to(x.dtype), x[start:end]])  # [W - 1 + L, C]
        out[start:end] = _conv_silu(full, weight)
        conv_state[slot] = full[-(width - 1) :].t().to(conv_state.dtype)
    return out


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    out: torch.Tensor | None = None,
    config: Conv1dPrefillConfig | None = None,
) -> torch.Tensor:
    """Prefill chunks of N sequences, described by device tensors: `query_start_loc` `[N + 1]`
    (int32 or int64, from 0, ending at T), `slots` `[N]` (int), `has_initial_state` `[N]`
    (bool). Returns `[T, C]`, or writes into `out` (any strides, `x`'s dtype) and returns it:
    `out` `[T, C]`, or `[G, T, C // G]` for channels in G groups (q | k | v), each group then
    its own `[T, C // G]` tensor (contiguous for a contiguous `out`). `config`: the conv kernel's
    launch (default `DEFAULT_PREFILL_CONFIG`)."""
    tokens, channels = x.shape
    width = weight.shape[1]
    n = slots.shape[0]
    if weight.shape != (channels, width) or width < 2:
        raise ValueError(f"weight must be [{channels}, W >= 2], got {tuple(weight.shape)}")
    if conv_state.dim() != 3 or conv_state.shape[1:] != (channels, width - 1):
        raise ValueError(
            f"conv_state must be [S, {channels}, {width - 1}], got {tuple(conv_state.shape)}"
        )
    if query_start_loc.shape != (n + 1,) or has_initial_state.shape != (n,):
        raise ValueError(
            f"query_start_loc must be [{n + 1}] and has_initial_state [{n}] for {n} slots, got "
            f"{tuple(query_start_loc.shape)} and {tuple(has_initial_state.shape)}"
        )
    for name, t in (("query_start_loc", query_start_loc), ("slots", slots)):
        if t.dtype not in (torch.int32, torch.int64) or t.device != x.device:
            raise ValueError(f"{name} must be int32 or int64 on {x.device}, got {t.dtype}")
    if has_initial_state.dtype != torch.bool or has_initial_state.device != x.device:
        raise ValueError(f"has_initial_state must be bool on {x.device}")
    config = config or DEFAULT_PREFILL_CONFIG
    sizes = (("block_t", config.block_t), ("block_c", config.block_c))
    for name, size in (*sizes, ("num_warps", config.num_warps)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"config.{name} must be a power of two, got {size}")
    if out is None:
        out = torch.empty(tokens, channels, dtype=x.dtype, device=x.device)
    # One layout for both forms: [G, T, C // G] (a [T, C] `out` is one group).
    out3 = out.unsqueeze(0) if out.dim() == 2 else out
    if out.dtype != x.dtype or out3.dim() != 3 or out3.shape[1] != tokens or (
        out3.shape[0] * out3.shape[2] != channels
    ):  # fmt: skip
        raise ValueError(
            f"out must be [{tokens}, {channels}] or [G, {tokens}, {channels} // G] of {x.dtype}, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    if tokens == 0 or n == 0:
        return out
    if not use_triton(x.device):
        ref = causal_conv1d_prefill_ref(
            x, weight, conv_state, query_start_loc, slots, has_initial_state
        )
        out3.copy_(ref.view(tokens, out3.shape[0], -1).transpose(0, 1))
        return out
    block_t, block_c = config.block_t, config.block_c
    groups, group = out3.shape[0], out3.shape[2]
    _causal_conv1d_prefill_kernel[(triton.cdiv(tokens, block_t), triton.cdiv(channels, block_c))](
        x, weight, conv_state, query_start_loc, slots, has_initial_state, out3,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        out3.stride(0), out3.stride(1), out3.stride(2), group,
        tokens, channels, n, (n - 1).bit_length(),
        W=width, BLOCK_T=block_t, BLOCK_C=block_c,
        ONE_GROUP_PER_BLOCK=groups == 1 or group % block_c == 0, num_warps=config.num_warps,
    )  # fmt: skip
    _conv_state_update_kernel[(n, triton.cdiv(channels, _STATE_BLOCK_C))](
        x, conv_state, query_start_loc, slots, has_initial_state,
        x.stride(0), x.stride(1), conv_state.stride(0), conv_state.stride(1),
        conv_state.stride(2), channels,
        W=width, BLOCK_W=next_power_of_2(width - 1), BLOCK_C=_STATE_BLOCK_C, num_warps=4,
    )  # fmt: skip
    return out


def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One token for each of N sequences: `x` `[N, C]`, `slots` `[N]`; output in `out_dtype`
    (default `x`'s)."""
    full = torch.cat([conv_state[slots].to(x.dtype), x.unsqueeze(-1)], dim=-1)  # [N, C, W]
    conv_state[slots] = full[..., 1:].to(conv_state.dtype)
    return F.silu((full.float() * weight.float()).sum(-1)).to(out_dtype or x.dtype)


def _conv_silu(full: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # full [W - 1 + L, C] -> windows [L, C, W]
    windows = full.float().unfold(0, weight.shape[1], 1)
    return F.silu((windows * weight.float()).sum(-1)).to(full.dtype)
