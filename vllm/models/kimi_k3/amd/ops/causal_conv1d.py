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
launch), loads the W - 1 inputs before that token (from x, or from the slot's state, or zeros)
and walks its tokens 4 or 8 rows a step, carrying the last W - 1 inputs in registers, so each
row of x is read once. A step whose rows lie in one sequence (nearly all of a long prefill) loads
them together; one where a sequence starts or T ends goes row by row and reloads the carried
inputs from the new sequence's state. Every row sums its taps in the same order, with the same
rounding. W is at most 4 (`MAX_WIDTH`).
The update is a separate launch because a short sequence's old state is read by the programs of
its first tokens and rewritten from its last ones, which may be different programs of the first
kernel.
Decode (one token per sequence) stays in torch here; the fused decode kernel has its own conv.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm.triton_utils import cdiv, next_power_of_2, use_triton
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

if triton is not None:

    @triton.jit
    def _find_seq(qsl_ptr, t, num_seqs, search_steps):
        # The last sequence with query_start_loc[seq] <= t (empty sequences before t skipped).
        lo = t * 0
        hi = lo + num_seqs
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            right = tl.load(qsl_ptr + mid) <= t
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        return lo

    @triton.jit
    def _input_before(
        x_ptr, state_ptr, p, start, slot, init, c, channels,
        stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W: tl.constexpr,
    ):  # fmt: skip
        # Input position p of a sequence starting at `start`: x's row when p >= start, else its
        # window position p - start + W - 1 (in [0, W - 1)) of the slot's state, or zero for a
        # new sequence; in x's dtype. Before the sequence, x's load reads its first row instead
        # (in bounds, unused) and the state's condition becomes a channel bound: Triton's
        # interpreter rejects a scalar bool in a block mask.
        in_x = p >= start
        x_ptrs = x_ptr + tl.where(in_x, p, start).to(tl.int64) * stride_xt + c * stride_xc
        xv = tl.load(x_ptrs, mask=c < channels, other=0.0)
        s_ptrs = state_ptr + slot.to(tl.int64) * stride_ss + c * stride_sc
        s_end = tl.where(in_x, 0, tl.where(init, channels, 0))
        sv = tl.load(s_ptrs + (p - start + W - 1) * stride_sj, mask=c < s_end, other=0.0)
        return tl.where(in_x, xv, sv.to(x_ptr.dtype.element_ty))

    @triton.jit
    def _carried_inputs(
        x_ptr, state_ptr, t, start, slot, init, c, channels,
        stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W: tl.constexpr,
    ):  # fmt: skip
        # The W - 1 inputs before token t, one row back first (h2 unused below W = 3, h3 below 4).
        h1 = _input_before(
            x_ptr, state_ptr, t - 1, start, slot, init, c, channels,
            stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W,
        )  # fmt: skip
        h2 = h1
        h3 = h1
        if W >= 3:
            h2 = _input_before(
                x_ptr, state_ptr, t - 2, start, slot, init, c, channels,
                stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W,
            )  # fmt: skip
        if W >= 4:
            h3 = _input_before(
                x_ptr, state_ptr, t - 3, start, slot, init, c, channels,
                stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W,
            )  # fmt: skip
        return h1, h2, h3

    @triton.jit
    def _conv_row(x3, x2, x1, x0, w0, w1, w2, w3, W: tl.constexpr):
        # One output row from its inputs x_k (k rows back, in x's dtype): the taps oldest first,
        # summed from zero in fp32 (the reference's order), then SiLU.
        acc = tl.zeros(x0.shape, dtype=tl.float32)
        if W == 4:
            acc += x3.to(tl.float32) * w0
            acc += x2.to(tl.float32) * w1
            acc += x1.to(tl.float32) * w2
            acc += x0.to(tl.float32) * w3
        elif W == 3:
            acc += x2.to(tl.float32) * w0
            acc += x1.to(tl.float32) * w1
            acc += x0.to(tl.float32) * w2
        else:
            acc += x1.to(tl.float32) * w0
            acc += x0.to(tl.float32) * w1
        return acc * tl.sigmoid(acc)

    @triton.jit
    def _four_rows(
        h1, h2, h3, r0, r1, r2, r3, w0, w1, w2, w3, o_rows, stride_ot, c_ok, W: tl.constexpr
    ):  # fmt: skip
        # Rows r0..r3 of one sequence after the carried inputs h1..h3: their outputs at o_rows
        # and the next rows', then the inputs carried past them.
        dtype = o_rows.dtype.element_ty
        tl.store(o_rows, _conv_row(h3, h2, h1, r0, w0, w1, w2, w3, W).to(dtype), mask=c_ok)
        o_rows += stride_ot
        tl.store(o_rows, _conv_row(h2, h1, r0, r1, w0, w1, w2, w3, W).to(dtype), mask=c_ok)
        o_rows += stride_ot
        tl.store(o_rows, _conv_row(h1, r0, r1, r2, w0, w1, w2, w3, W).to(dtype), mask=c_ok)
        o_rows += stride_ot
        tl.store(o_rows, _conv_row(r0, r1, r2, r3, w0, w1, w2, w3, W).to(dtype), mask=c_ok)
        return r3, r2, r1

    # The counts and the metadata's addresses change from step to step (a mixed step's prefill
    # metadata is a slice after its decode rows) and are only read as scalars: Triton's
    # specialization on them (ints equal to 1 or divisible by 16, 16-byte aligned pointers)
    # gained nothing and compiled both kernels again in the first mixed steps on the H100, for
    # 0.5-1.5 s each. x, the state and the output keep theirs: their tiles move in vectors.
    @triton.jit(
        do_not_specialize=["tokens", "num_seqs", "search_steps"],
        do_not_specialize_on_alignment=["qsl_ptr", "slots_ptr", "has_init_ptr"],
    )
    def _causal_conv1d_prefill_kernel(
        x_ptr, w_ptr, state_ptr, qsl_ptr, slots_ptr, has_init_ptr, out_ptr,
        stride_xt, stride_xc, stride_wc, stride_wj, stride_ss, stride_sc, stride_sj,
        stride_og, stride_ot, stride_oc, group, tokens, channels, num_seqs, search_steps,
        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, STEP: tl.constexpr,
        ONE_GROUP_PER_BLOCK: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # A program walks BLOCK_T tokens of BLOCK_C channels STEP (4 or 8) rows at a time,
        # carrying the last W - 1 inputs (h1 one row back, h2, h3) in registers: each row of x is
        # read once, where shifted tiles would read it W times. Rows stay in x's dtype until
        # used (fewer registers, more programs per SM, more loads in flight).
        t0 = tl.program_id(0) * BLOCK_T
        c0 = tl.program_id(1) * BLOCK_C
        c = c0 + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        taps = w_ptr + c * stride_wc
        w0 = tl.load(taps, mask=c_ok, other=0.0).to(tl.float32)
        w1 = tl.load(taps + stride_wj, mask=c_ok, other=0.0).to(tl.float32)
        w2 = w1
        w3 = w1
        if W >= 3:
            w2 = tl.load(taps + 2 * stride_wj, mask=c_ok, other=0.0).to(tl.float32)
        if W >= 4:
            w3 = tl.load(taps + 3 * stride_wj, mask=c_ok, other=0.0).to(tl.float32)
        x_cols = c * stride_xc
        if ONE_GROUP_PER_BLOCK:
            # The block's channels lie in one group: its offset is a scalar.
            g = c0 // group
            o_base = (
                out_ptr + g.to(tl.int64) * stride_og + (c0 - g * group).to(tl.int64) * stride_oc
            )
            o_cols = tl.arange(0, BLOCK_C) * stride_oc
        else:
            o_base = out_ptr
            o_cols = (c // group).to(tl.int64) * stride_og + (c % group) * stride_oc

        # The first token's sequence (one scalar search per program) and the inputs before it.
        seq = _find_seq(qsl_ptr, t0, num_seqs, search_steps)
        next_start = tl.load(qsl_ptr + seq + 1)
        h1, h2, h3 = _carried_inputs(
            x_ptr, state_ptr, t0, tl.load(qsl_ptr + seq), tl.load(slots_ptr + seq),
            tl.load(has_init_ptr + seq) != 0, c, channels,
            stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W,
        )  # fmt: skip
        for i in range(0, tl.minimum(BLOCK_T, tokens - t0), STEP):
            t = t0 + i
            if t + STEP <= next_start:
                # Nearly every step of a long prefill: STEP rows of one sequence, all loaded
                # before the first store (STEP loads in flight a thread).
                rows = x_ptr + t.to(tl.int64) * stride_xt + x_cols
                r0 = tl.load(rows, mask=c_ok, other=0.0)
                r1 = tl.load(rows + stride_xt, mask=c_ok, other=0.0)
                r2 = tl.load(rows + 2 * stride_xt, mask=c_ok, other=0.0)
                r3 = tl.load(rows + 3 * stride_xt, mask=c_ok, other=0.0)
                if STEP == 8:
                    r4 = tl.load(rows + 4 * stride_xt, mask=c_ok, other=0.0)
                    r5 = tl.load(rows + 5 * stride_xt, mask=c_ok, other=0.0)
                    r6 = tl.load(rows + 6 * stride_xt, mask=c_ok, other=0.0)
                    r7 = tl.load(rows + 7 * stride_xt, mask=c_ok, other=0.0)
                o_rows = o_base + t.to(tl.int64) * stride_ot + o_cols
                h1, h2, h3 = _four_rows(
                    h1, h2, h3, r0, r1, r2, r3, w0, w1, w2, w3, o_rows, stride_ot, c_ok, W
                )
                if STEP == 8:
                    h1, h2, h3 = _four_rows(
                        h1, h2, h3, r4, r5, r6, r7, w0, w1, w2, w3, o_rows + 4 * stride_ot,
                        stride_ot, c_ok, W,
                    )  # fmt: skip
            else:
                # A sequence starts among these rows, or T ends there: one row at a time.
                for j in range(STEP):
                    tj = t + j
                    if tj < tokens:
                        if tj == next_start:
                            # A new sequence: the inputs before it come from its slot's state.
                            seq = _find_seq(qsl_ptr, tj, num_seqs, search_steps)
                            next_start = tl.load(qsl_ptr + seq + 1)
                            h1, h2, h3 = _carried_inputs(
                                x_ptr, state_ptr, tj, tj, tl.load(slots_ptr + seq),
                                tl.load(has_init_ptr + seq) != 0, c, channels,
                                stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, W,
                            )  # fmt: skip
                        r = tl.load(x_ptr + tj.to(tl.int64) * stride_xt + x_cols, mask=c_ok,
                                    other=0.0)  # fmt: skip
                        y = _conv_row(h3, h2, h1, r, w0, w1, w2, w3, W)
                        tl.store(o_base + tj.to(tl.int64) * stride_ot + o_cols,
                                 y.to(out_ptr.dtype.element_ty), mask=c_ok)  # fmt: skip
                        h3 = h2
                        h2 = h1
                        h1 = r

    @triton.jit(do_not_specialize_on_alignment=["qsl_ptr", "slots_ptr", "has_init_ptr"])
    def _conv_state_update_kernel(
        x_ptr, state_ptr, qsl_ptr, slots_ptr, has_init_ptr,
        stride_xt, stride_xc, stride_ss, stride_sc, stride_sj, channels,
        W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
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
    program (powers of two), `num_warps` warps, the tokens walked `step` rows at a time (4 or 8,
    at most `block_t`: the row loads a thread has in flight)."""

    block_t: int
    block_c: int
    num_warps: int
    step: int = 4


# Widest conv the kernel carries (its inputs before a row are three named registers).
MAX_WIDTH = 4
# 4 channels (8 bytes of bf16) a thread per row load, 8 rows a step, 64 tokens a program (3 rows
# of the 67 it reads are read by the previous program too). The fastest of the sweep of
# `benchmarks/kernels/benchmark_causal_conv1d.py` on the H200 (T = 8192, one sequence,
# 2026-12-01, docs/performance.md "Eighth run"): 135 us, 70% of copy, against 164 us for 1024
# channels a program and 245 us for the earlier kernel in the engine's prefill profile.
DEFAULT_PREFILL_CONFIG = Conv1dPrefillConfig(block_t=64, block_c=512, num_warps=4, step=8)
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
    (bool), each with unit stride. Returns `[T, C]`, or writes into `out` (any strides, `x`'s
    dtype and device) and returns it:
    `out` `[T, C]`, or `[G, T, C // G]` for channels in G groups (q | k | v), each group then
    its own `[T, C // G]` tensor (contiguous for a contiguous `out`). `config`: the conv kernel's
    launch (default `DEFAULT_PREFILL_CONFIG`)."""
    tokens, channels = x.shape
    width = weight.shape[1]
    n = slots.shape[0]
    if weight.shape != (channels, width) or not 2 <= width <= MAX_WIDTH:
        raise ValueError(
            f"weight must be [{channels}, W] with 2 <= W <= {MAX_WIDTH}, got {tuple(weight.shape)}"
        )
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
    for name, t in (("query_start_loc", query_start_loc), ("slots", slots),
                    ("has_initial_state", has_initial_state)):  # fmt: skip
        # The kernels index the metadata at unit stride.
        if t.stride(0) != 1 and t.shape[0] > 1:
            raise ValueError(f"{name} must have unit stride, got {t.stride()}")
    for name, t in (("weight", weight), ("conv_state", conv_state)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    config = config or DEFAULT_PREFILL_CONFIG
    sizes = (("block_t", config.block_t), ("block_c", config.block_c))
    for name, size in (*sizes, ("num_warps", config.num_warps)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"config.{name} must be a power of two, got {size}")
    if config.step not in (4, 8) or config.step > config.block_t:
        raise ValueError(
            f"config.step must be 4 or 8 and at most block_t ({config.block_t}), got {config.step}"
        )
    if out is None:
        out = torch.empty(tokens, channels, dtype=x.dtype, device=x.device)
    # One layout for both forms: [G, T, C // G] (a [T, C] `out` is one group).
    out3 = out.unsqueeze(0) if out.dim() == 2 else out
    if out.dtype != x.dtype or out3.dim() != 3 or out3.shape[1] != tokens or (
        out3.shape[0] * out3.shape[2] != channels
    ) or out.device != x.device:  # fmt: skip
        raise ValueError(
            f"out must be [{tokens}, {channels}] or [G, {tokens}, {channels} // G] of {x.dtype} "
            f"on {x.device}, got {tuple(out.shape)} {out.dtype} on {out.device}"
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
    pdl = pdl_options(use_pdl(x.device))
    launch(
        _causal_conv1d_prefill_kernel,
        (cdiv(tokens, block_t), cdiv(channels, block_c), 1),
        (
            x, weight, conv_state, query_start_loc, slots, has_initial_state, out3,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
            out3.stride(0), out3.stride(1), out3.stride(2), group,
            tokens, channels, n, (n - 1).bit_length(),
        ),
        launch_spec(
            _causal_conv1d_prefill_kernel, W=width, BLOCK_T=block_t, BLOCK_C=block_c,
            STEP=config.step, ONE_GROUP_PER_BLOCK=groups == 1 or group % block_c == 0,
            num_warps=config.num_warps, **pdl,
        ),
    )  # fmt: skip
    launch(
        _conv_state_update_kernel, (n, cdiv(channels, _STATE_BLOCK_C), 1),
        (
            x, conv_state, query_start_loc, slots, has_initial_state,
            x.stride(0), x.stride(1), conv_state.stride(0), conv_state.stride(1),
            conv_state.stride(2), channels,
        ),
        launch_spec(
            _conv_state_update_kernel, W=width, BLOCK_W=next_power_of_2(width - 1),
            BLOCK_C=_STATE_BLOCK_C, num_warps=4, **pdl,
        ),
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
