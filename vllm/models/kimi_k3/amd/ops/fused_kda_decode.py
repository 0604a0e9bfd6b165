"""Fused KDA decode step: short-conv update, gates, delta-rule update and output, and an optional
gated-RMSNorm epilogue, in one call of one or two kernels (the fork's counterpart of upstream's
`fused_kda_decode`).

One token for each of N sequences, H local heads, head dim D (= K = V), conv width W:

- `mixed_qkv` `[N, 3 * H * D]` (q | k | v channels, any row stride), `conv_weight` `[3 * H * D, W]`
  fp32, `conv_state` `[S, 3 * H * D, W - 1]` in `mixed_qkv`'s dtype (updated in place at
  `slots`);
- `raw_g` `[N, H * D]` (the `f_b_proj` output, any row stride), `A_log` `[H]`, `dt_bias` `[H * D]`,
  `lower_bound` (None: softplus gate);
- `b` `[N, H]` beta logits (any row stride), `ssm_state` `[S, H, D, D]` fp32 (updated at `slots`);
- with `norm_weight` `[D]` and `gate` `[N, H, D]` (any strides, unit last): the output is
  `o * rsqrt(mean(o^2) + eps) * norm_weight * sigmoid(gate)` computed on the fp32 `o`.
- `raw_g` and / or `gate` may instead be `LowRankProj(a, weight)`: the input `a` `[N, R]` (any
  row stride, unit last: a column view of the in_proj output) and weight `[H * D, R]` of the
  unquantized bias-free linear that makes them (`f_b_proj` on `f_a`, `g_b_proj` on `g_a`), all
  in `mixed_qkv`'s dtype. The kernel then computes the rows it needs (the head's D raw_g
  channels, its own V columns of the gate) instead of loading them, which saves the two small
  linears' launches per layer at small batch (`KdaDecodeConfig.gate_proj`).
Output `[N, H, D]` in `mixed_qkv`'s dtype; with `quantize` (norm required) the per-token FP8
`(codes [N, H * D], scale [N, 1] fp32)` of that output instead, bit for bit what
`per_token_fp8_quant` (whose numerics helpers the epilogue shares) makes of it.

Two launch variants (`KdaDecodeConfig.block_v`; `kda_decode_config` picks one from the shapes;
both live in fused_kda_decode_config.py, re-exported here):

- single (`block_v == D`): program (n, h) owns head h of sequence n: its conv channels, its
  `[D, D]` state and its output row, norm included; one kernel.
- V-split (`block_v < D`): program (n, h, j) owns the state columns `[j * block_v, (j + 1) *
  block_v)`, a `[D, block_v]` tile, and those v channels. Every column needs all of q and k, so
  each program recomputes them from the conv windows without shifting them; the norm needs the
  whole row of o. A second small kernel, after all columns are done, shifts the q/k windows and
  norms (the first kernel then writes o unnormed in an fp32 scratch `[N, H, D]`): program (n, 0)
  norms the whole token, so it can also take the token's amax over all heads and quantize in the
  same launch, and the `KdaDecodeConfig.shift_programs` programs after it share the token's q/k
  windows, each shifting whole tiles of channels (loads, then stores): few fat programs when
  the batch fills the GPU, one per q or k head when it does not. The state is read and written
  once either way; the split trades a second launch and recomputed q/k for programs small
  enough that several share an SM and overlap their loads.

Both compute o as `S_decayed^T q + (k . q) u`, equal to `S_new^T q`, so both reductions read the
same decayed tile.

In-kernel gate projections: every program of head h computes the head's raw_g (D dots of R terms
on the head's [D, R] slice of the f_b weight, which its other programs and tokens read again,
mostly from L2), so the V-split reads that slice D / block_v times per token; each program
computes the gate only for its own V columns: the single kernel norms with it, the V-split stores
it (model dtype) in an `[N, H, D]` buffer that the epilogue kernel, launched after it on the
stream, norms with. Numerics: the layer's linears (`gemv` up to `BF16_GEMV_MAX_M` rows, cuBLAS
above, `F.linear` on CPU) sum the R products in fp32 and round the sum once to the model dtype
(cuBLAS may also be allowed reduced-precision split-K reductions by torch's defaults, roundings
the kernel does not make), and so does the kernel, after which both run the same code on the same
values. Products of bf16 / fp16 factors are exact in fp32, so kernel and linear differ only in the
fp32 summation order of the R-term dots before that shared rounding (fp32 factors: also in the
products' rounding); where the fp32 sums round to the same model-dtype value (always, if every
partial sum is exact, which the tests arrange) the two forms give the same bits.

The torch reference composes the layer's unfused ops (conv decode, gate, recurrent core, norm), so
fused and unfused decode are checked against the same math; it makes a `LowRankProj`'s product as
`LowRankProj.reference` does: fp32 sums, one rounding.
"""

from dataclasses import dataclass

import torch

from vllm.model_executor.layers.layernorm import rmsnorm_gated_ref
from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
    fp8_outputs,
    fp8_quant_params,
    per_token_fp8_quant,
    use_triton_fp8,
)
from vllm.models.kimi_k3.amd.ops.causal_conv1d import causal_conv1d_decode
from vllm.models.kimi_k3.amd.ops.fused_kda_decode_config import (
    KdaDecodeConfig,
    gate_proj_tiling,
    kda_decode_config,
    kda_epilogue_programs,
    kda_epilogue_tiling,
)
from vllm.models.kimi_k3.amd.ops.kda_core import kda_decode
from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate
from vllm.triton_utils import num_sms, use_triton
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

if triton is not None:
    from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
        abs_max,
        fp8_scale_and_inverse,
        nan_if_not_finite,
    )

    @triton.jit
    def _window_loads(state_ptr, stride_sc, chans, W: tl.constexpr, BLOCK_W: tl.constexpr):
        # `chans`' conv window in the slot (`[C, BLOCK_W]`: taps 0..W-2, then 0.0; x joins it
        # at tap W - 1) and the same window one tap on (`nxt`: the shift's source, which x joins
        # at W - 2).
        j = tl.arange(0, BLOCK_W)[None, :]
        rows = chans[:, None] * stride_sc
        old = tl.load(state_ptr + rows + j, mask=j < W - 1, other=0.0)
        nxt = tl.load(state_ptr + rows + j + 1, mask=j + 1 < W - 1, other=0.0)
        return old, nxt

    @triton.jit
    def _conv(x, old, taps, W: tl.constexpr, BLOCK_W: tl.constexpr):
        # silu(causal conv) of one token from its loaded window.
        j = tl.arange(0, BLOCK_W)[None, :]
        window = tl.where(j == W - 1, x[:, None], old).to(tl.float32)
        acc = tl.sum(window * taps, axis=1)
        return acc * tl.sigmoid(acc)

    @triton.jit
    def _store_shifted(x, nxt, state_ptr, stride_sc, chans, W: tl.constexpr,
                       BLOCK_W: tl.constexpr):  # fmt: skip
        # The window moved on by one token (the oldest drops out, x enters). Callers store only
        # after a barrier that follows every load of the window: a channel can be held by two
        # warps (a [C] vector over more threads than C), which must not race on it.
        j = tl.arange(0, BLOCK_W)[None, :]
        shifted = tl.where(j + 1 == W - 1, x[:, None], nxt)
        dst = state_ptr + chans[:, None] * stride_sc + j
        tl.store(dst, shifted.to(state_ptr.dtype.element_ty), mask=j < W - 1)

    @triton.jit
    def _shift_window(x_row, state_ptr, stride_sc, chans, W: tl.constexpr, BLOCK_W: tl.constexpr):
        # The epilogue's shift of windows the V blocks only read: loads, barrier, stores.
        j = tl.arange(0, BLOCK_W)[None, :]
        x = tl.load(x_row + chans)
        nxt = tl.load(state_ptr + chans[:, None] * stride_sc + j + 1, mask=j + 1 < W - 1, other=0.0)
        tl.debug_barrier()
        _store_shifted(x, nxt, state_ptr, stride_sc, chans, W, BLOCK_W)

    @triton.jit
    def _l2_normalize(x):
        return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)

    @triton.jit
    def _low_rank_loads(a_row, w_ptr, stride_w, rows, RANK: tl.constexpr, BLOCK_R: tl.constexpr):
        # The input row `[BLOCK_R]` and the weight's `rows` `[rows, BLOCK_R]` of a gate
        # projection, in one piece (0.0 past RANK).
        r = tl.arange(0, BLOCK_R)
        ok = r < RANK
        a = tl.load(a_row + r, mask=ok, other=0.0)
        w = tl.load(w_ptr + rows[:, None] * stride_w + r[None, :], mask=ok[None, :], other=0.0)
        return a, w

    @triton.jit
    def _low_rank_rows(a_row, w_ptr, stride_w, rows, RANK: tl.constexpr, BLOCK_R: tl.constexpr):
        # `weight[rows] @ a` (as `_low_rank`) in [rows, BLOCK_R] chunks, unrolled: the form for
        # the single kernel and for ranks too wide to hold whole (`gate_proj_tiling`), placed
        # after the kernel's sums.
        r = tl.arange(0, BLOCK_R)
        acc = tl.zeros(rows.shape, tl.float32)
        for r0 in tl.static_range(0, RANK, BLOCK_R):
            ok = r0 + r < RANK
            a = tl.load(a_row + r0 + r, mask=ok, other=0.0).to(tl.float32)
            w_ptrs = w_ptr + rows[:, None] * stride_w + r0 + r[None, :]
            w = tl.load(w_ptrs, mask=ok[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * a[None, :], axis=1)
        return acc.to(w_ptr.dtype.element_ty)

    @triton.jit
    def _low_rank(a, w, out_dtype: tl.constexpr):
        # `w @ a` as the unquantized linear makes it: fp32 sums, rounded once to its output dtype
        # (the weight's).
        return tl.sum(w.to(tl.float32) * a.to(tl.float32)[None, :], axis=1).to(out_dtype)

    @triton.jit
    def _fused_kda_decode_kernel(
        qkv_ptr, conv_w_ptr, conv_state_ptr, raw_g_ptr, a_log_ptr, dt_bias_ptr, b_ptr,
        ssm_ptr, slots_ptr, gate_ptr, norm_w_ptr, out_ptr, f_w_ptr, g_a_ptr, g_w_ptr,
        stride_qkv, stride_wc, stride_cs, stride_cc, stride_g, stride_b,
        stride_ss, stride_sh, stride_gate_n, stride_gate_h, stride_on, stride_oh,
        stride_fw, stride_ga, stride_gw,
        heads, lower_bound, eps, q_scale,
        D: tl.constexpr, W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_V: tl.constexpr,
        SPLIT: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, APPLY_NORM: tl.constexpr,
        RANK_F: tl.constexpr, RANK_G: tl.constexpr, BLOCK_R: tl.constexpr,
        WHOLE_RANK: tl.constexpr, EVICT: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # WHOLE_RANK (V-split only): the gate projections' tiles are loaded whole, with the rest;
        # otherwise in BLOCK_R chunks after the sums (`gate_proj_tiling`).
        # EVICT: the state tile's cache eviction policy ("evict_first" or "", the default).
        # RANK_F > 0: `raw_g_ptr` is f_a [N, RANK_F] and raw_g is f_w @ f_a. RANK_G > 0: the gate
        # is g_w @ g_a; `gate_ptr` is then, for the split, the [N, H, D] buffer the V blocks
        # write it to for the epilogue (the single kernel does not read it).
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        slot = tl.load(slots_ptr + n).to(tl.int64)
        d = tl.arange(0, D)
        j = tl.arange(0, BLOCK_W)[None, :]
        cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)  # this program's V columns
        qc, kc, vc = h * D + d, (heads + h) * D + d, (2 * heads + h) * D + cols
        x_row = qkv_ptr + n * stride_qkv
        gate_row = gate_ptr + n * stride_gate_n + h * stride_gate_h

        # The V-split issues every load before any sum or barrier, those that do not need the
        # slot first: a load after a cross-warp sum waits for it (a barrier), one round trip
        # more on the program's critical path, which is the launch's at small batch. The single
        # kernel (heads under 64 wide, never the engine's at Kimi sizes) keeps its state tile
        # and gate projections after the sums: loaded with the rest, its state tile took
        # another layout (sm_90 TTGIR), hence another order of its sums, with the projections
        # than without.
        xq, xk, xv = tl.load(x_row + qc), tl.load(x_row + kc), tl.load(x_row + vc)
        taps_q = tl.load(conv_w_ptr + qc[:, None] * stride_wc + j, mask=j < W, other=0.0)
        taps_k = tl.load(conv_w_ptr + kc[:, None] * stride_wc + j, mask=j < W, other=0.0)
        taps_v = tl.load(conv_w_ptr + vc[:, None] * stride_wc + j, mask=j < W, other=0.0)
        # The gate projections' inputs, when loaded whole (else below, in chunks).
        if RANK_F:
            if WHOLE_RANK:
                f_a, f_w = _low_rank_loads(raw_g_ptr + n * stride_g, f_w_ptr, stride_fw, qc,
                                           RANK_F, BLOCK_R)  # fmt: skip
        else:
            raw_g = tl.load(raw_g_ptr + n * stride_g + qc)
        dt_bias = tl.load(dt_bias_ptr + qc)
        if RANK_G:
            if WHOLE_RANK:
                g_a, g_w = _low_rank_loads(g_a_ptr + n * stride_ga, g_w_ptr, stride_gw,
                                           h * D + cols, RANK_G, BLOCK_R)  # fmt: skip
        elif APPLY_NORM and not SPLIT:
            z = tl.load(gate_row + cols)
        if APPLY_NORM and not SPLIT:
            norm_w = tl.load(norm_w_ptr + d)
        a_log = tl.load(a_log_ptr + h)
        b = tl.load(b_ptr + n * stride_b + h)
        state = conv_state_ptr + slot * stride_cs
        old_q, next_q = _window_loads(state, stride_cc, qc, W, BLOCK_W)
        old_k, next_k = _window_loads(state, stride_cc, kc, W, BLOCK_W)
        old_v, next_v = _window_loads(state, stride_cc, vc, W, BLOCK_W)
        s_ptrs = ssm_ptr + slot * stride_ss + h * stride_sh + d[:, None] * D + cols[None, :]
        if SPLIT:
            s = tl.load(s_ptrs, eviction_policy=EVICT)  # [K, BLOCK_V]

        # Split: every V block needs all of q and k but owns only its v channels, so q/k windows
        # are only read here (the epilogue kernel shifts them once all blocks have read them).
        # The barrier keeps each window's stores behind every warp's loads of it
        # (`_store_shifted`).
        tl.debug_barrier()
        if not SPLIT:
            _store_shifted(xq, next_q, state, stride_cc, qc, W, BLOCK_W)
            _store_shifted(xk, next_k, state, stride_cc, kc, W, BLOCK_W)
        _store_shifted(xv, next_v, state, stride_cc, vc, W, BLOCK_W)
        q = _l2_normalize(_conv(xq, old_q, taps_q, W, BLOCK_W)) * q_scale
        k = _l2_normalize(_conv(xk, old_k, taps_k, W, BLOCK_W))
        v = _conv(xv, old_v, taps_v, W, BLOCK_W)
        if RANK_F:
            if WHOLE_RANK:
                raw_g = _low_rank(f_a, f_w, f_w_ptr.dtype.element_ty)
            else:
                raw_g = _low_rank_rows(raw_g_ptr + n * stride_g, f_w_ptr, stride_fw, qc, RANK_F,
                                       BLOCK_R)  # fmt: skip
        x = raw_g.to(tl.float32) + dt_bias.to(tl.float32)
        if RANK_G:
            if WHOLE_RANK:
                z = _low_rank(g_a, g_w, g_w_ptr.dtype.element_ty)
            else:
                z = _low_rank_rows(g_a_ptr + n * stride_ga, g_w_ptr, stride_gw, h * D + cols,
                                   RANK_G, BLOCK_R)  # fmt: skip
            if SPLIT:
                tl.store(gate_row + cols, z)
        rate = tl.exp(a_log.to(tl.float32))
        if HAS_LOWER_BOUND:
            g = lower_bound * tl.sigmoid(rate * x)
        else:
            g = -rate * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
        beta = tl.sigmoid(b.to(tl.float32))

        if not SPLIT:
            # The single kernel's tile is loaded here, after the gate projections: loaded with
            # the rest, Triton gave it their layout, which changes the order of its sums.
            s = tl.load(s_ptrs, eviction_policy=EVICT)
        s = s * tl.exp(g)[:, None]
        # o = (S + k u^T)^T q = S^T q + (k . q) u: both reductions read the decayed tile, so
        # they run together and o does not wait for the update.
        u = beta * (v - tl.sum(s * k[:, None], axis=0))
        o = tl.sum(s * q[:, None], axis=0) + tl.sum(k * q, axis=0) * u  # [BLOCK_V]
        tl.store(s_ptrs, s + k[:, None] * u[None, :], eviction_policy=EVICT)
        if APPLY_NORM and not SPLIT:
            rstd = tl.rsqrt(tl.sum(o * o, axis=0) / D + eps)
            o = o * rstd * norm_w.to(tl.float32) * tl.sigmoid(z.to(tl.float32))
        # Split with the norm: `out_ptr` is the fp32 [N, H, D] scratch the epilogue norms.
        tl.store(out_ptr + n * stride_on + h * stride_oh + cols, o.to(out_ptr.dtype.element_ty))

    @triton.jit
    def _token_norm(o_row, gate_row, stride_gate_h, norm_w_ptr, eps, h0, heads,
                    D: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
        # Gated norm (fp32) of heads [h0, h0 + BLOCK_H) of one token: the one code path of both
        # epilogue outputs, so the quantized one quantizes exactly the values (same sums, same
        # bits) that the model-dtype output holds.
        hs = h0 + tl.arange(0, BLOCK_H)
        ok = hs < heads
        hs = tl.where(ok, hs, 0)
        d = tl.arange(0, D)
        o = tl.load(o_row + hs[:, None] * D + d[None, :])
        z = tl.load(gate_row + hs[:, None] * stride_gate_h + d[None, :]).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(o * o, axis=1) / D + eps)
        y = o * rstd[:, None] * tl.load(norm_w_ptr + d).to(tl.float32)[None, :] * tl.sigmoid(z)
        return hs, ok, y

    @triton.jit
    def _kda_decode_epilogue_kernel(
        qkv_ptr, conv_state_ptr, slots_ptr, o_ptr, gate_ptr, norm_w_ptr, out_ptr, scale_ptr,
        stride_qkv, stride_cs, stride_cc, stride_gate_n, stride_gate_h, stride_on,
        heads, span, eps, fp8_max, min_scale,
        D: tl.constexpr, W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
        BLOCK_H: tl.constexpr, ONE_CHUNK: tl.constexpr, APPLY_NORM: tl.constexpr,
        QUANT: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # After the V-split kernel. The shift programs of token n each move on the q/k conv
        # windows (which all V blocks read) of `span` channels of the 2 * heads * D q | k
        # channels, `BLOCK_C` at a time. With the norm, program (n, 0) owns the whole token: it
        # norms every head (a [D] row of o each) and, with QUANT, takes the token's amax over all
        # heads and writes FP8 codes `[N, H * D]` and the scale `[N, 1]` instead of the
        # model-dtype row. It is column 0 because blocks are dispatched in order, program_id(0)
        # fastest: the token programs, the epilogue's longest, start first instead of last.
        n = tl.program_id(0).to(tl.int64)
        if APPLY_NORM:
            first = (tl.program_id(1) - 1) * span
        else:
            first = tl.program_id(1) * span
        if first >= 0:
            slot = tl.load(slots_ptr + n).to(tl.int64)
            x_row = qkv_ptr + n * stride_qkv
            state = conv_state_ptr + slot * stride_cs
            # BLOCK_C divides 2 * heads * D and `span`: every tile is whole, none needs a mask.
            for c0 in range(first, tl.minimum(first + span, 2 * heads * D), BLOCK_C):
                _shift_window(x_row, state, stride_cc, c0 + tl.arange(0, BLOCK_C), W, BLOCK_W)
        elif APPLY_NORM:
            o_row = o_ptr + n * heads * D
            gate_row = gate_ptr + n * stride_gate_n
            out_row = out_ptr + n * stride_on
            model_dtype = qkv_ptr.dtype.element_ty
            cols = tl.arange(0, D)[None, :]
            norm = (o_row, gate_row, stride_gate_h, norm_w_ptr, eps)
            if not QUANT:
                for h0 in range(0, heads, BLOCK_H):
                    hs, ok, y = _token_norm(*norm, h0, heads, D, BLOCK_H)
                    tl.store(out_row + hs[:, None] * D + cols, y.to(model_dtype), mask=ok[:, None])
            elif ONE_CHUNK:
                hs, ok, y = _token_norm(*norm, 0, heads, D, BLOCK_H)
                y = tl.where(ok[:, None], y.to(model_dtype).to(tl.float32), 0.0)
                amax = nan_if_not_finite(abs_max(y))
                scale, inv = fp8_scale_and_inverse(amax, fp8_max, min_scale)
                q = (y * inv).to(out_ptr.dtype.element_ty)
                tl.store(out_row + hs[:, None] * D + cols, q, mask=ok[:, None])
                tl.store(scale_ptr + n, scale)
            else:
                amax = tl.full((), 0.0, tl.float32)
                for h0 in range(0, heads, BLOCK_H):
                    hs, ok, y = _token_norm(*norm, h0, heads, D, BLOCK_H)
                    y = tl.where(ok[:, None], y.to(model_dtype).to(tl.float32), 0.0)
                    amax = tl.maximum(amax, abs_max(y))
                scale, inv = fp8_scale_and_inverse(nan_if_not_finite(amax), fp8_max, min_scale)
                for h0 in range(0, heads, BLOCK_H):
                    hs, ok, y = _token_norm(*norm, h0, heads, D, BLOCK_H)
                    q = (y.to(model_dtype).to(tl.float32) * inv).to(out_ptr.dtype.element_ty)
                    tl.store(out_row + hs[:, None] * D + cols, q, mask=ok[:, None])
                tl.store(scale_ptr + n, scale)


@dataclass(frozen=True)
class LowRankProj:
    """`a @ weight^T`, the output of an unquantized bias-free linear (`f_b_proj`, `g_b_proj`),
    passed to `fused_kda_decode` as its input `a` `[N, R]` and weight `[H * D, R]` for the kernel
    to compute (module docstring)."""

    a: torch.Tensor
    weight: torch.Tensor

    def reference(self) -> torch.Tensor:
        """`[N, H * D]` as the layer's linear makes it: fp32 sums, rounded once to a's dtype."""
        return (self.a.float() @ self.weight.float().t()).to(self.a.dtype)


def fused_kda_decode_ref(
    mixed_qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    raw_g: torch.Tensor | LowRankProj,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    b: torch.Tensor,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    gate: torch.Tensor | LowRankProj | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """The unfused decode ops in sequence (see the module docstring); updates the states."""
    n, heads = b.shape
    d = ssm_state.shape[-1]
    if isinstance(raw_g, LowRankProj):
        raw_g = raw_g.reference()
    if isinstance(gate, LowRankProj):
        gate = gate.reference().view(n, heads, d)
    # q, k, v and o stay fp32, as in the kernel.
    conv = causal_conv1d_decode(mixed_qkv, conv_weight, conv_state, slots, torch.float32)
    q, k, v = (t.reshape(n, heads, d) for t in conv.split(heads * d, dim=-1))
    g = kda_gate(raw_g, A_log, dt_bias, lower_bound)
    o = kda_decode(q, k, v, g, torch.sigmoid(b.float()), ssm_state, slots)
    if norm_weight is not None:
        o = rmsnorm_gated_ref(o, norm_weight, gate, eps)
    return o.to(mixed_qkv.dtype)


# The epilogue's token program norms (and quantizes) at most this many elements of a token at a
# time: its heads in chunks of `_EPILOGUE_TILE // D`. Its warps serve the window shifts as well.
_EPILOGUE_TILE = 4096
_EPILOGUE_WARPS = 4


def _check_low_rank(name: str, proj: LowRankProj, n: int, rows: int, like: torch.Tensor) -> int:
    """Validates a `LowRankProj` standing for an `[n, rows]` output in `like`'s dtype; its R."""
    a, w = proj.a, proj.weight
    if a.dim() != 2 or w.dim() != 2 or a.shape[0] != n or w.shape[0] != rows:
        raise ValueError(
            f"{name}: a must be [{n}, R] and weight [{rows}, R], got {tuple(a.shape)} and "
            f"{tuple(w.shape)}"
        )
    if a.shape[1] != w.shape[1] or a.shape[1] == 0:
        raise ValueError(
            f"{name}: a and weight must share R >= 1, got {a.shape[1]} and {w.shape[1]}"
        )
    if a.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{name}: a and weight must have unit stride on R")
    if {a.dtype, w.dtype} != {like.dtype} or {a.device, w.device} != {like.device}:
        raise ValueError(
            f"{name}: a and weight must be {like.dtype} on {like.device} (the linear's input and "
            f"output dtype is the model's), got {a.dtype} and {w.dtype}"
        )
    return a.shape[1]


def fused_kda_decode(
    mixed_qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    raw_g: torch.Tensor | LowRankProj,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    b: torch.Tensor,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    gate: torch.Tensor | LowRankProj | None = None,
    eps: float = 1e-5,
    config: KdaDecodeConfig | None = None,
    quantize: bool = False,
    quant_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One decode step of N sequences; see the module docstring for shapes. `config` overrides
    the default launch (`kda_decode_config`; benchmarks and tests).

    `quantize` (with the norm): returns `(codes [N, H * D] FP8, scale [N, 1] fp32)`, exactly
    `per_token_fp8_quant(output.reshape(N, H * D), quant_dtype)` of the model-dtype output, the
    quantization done in the V-split variant's epilogue kernel (no extra launch); the single
    variant and the reference quantize their output with `per_token_fp8_quant`.

    `raw_g` / `gate` as `LowRankProj`: the kernel computes them (module docstring), whatever
    `config.gate_proj` says (that is the callers' choice).
    """
    n, heads = b.shape
    _, _, d, d_v = ssm_state.shape
    width = conv_weight.shape[1]
    if d != d_v or d & (d - 1) or d > 256:
        raise ValueError(f"ssm_state must be [S, H, D, D] with D a power of two <= 256, got {d}")
    if mixed_qkv.shape != (n, 3 * heads * d) or mixed_qkv.stride(-1) != 1:
        raise ValueError(
            f"mixed_qkv must be [{n}, {3 * heads * d}] with unit last stride, "
            f"got {tuple(mixed_qkv.shape)}"
        )
    if conv_weight.shape != (3 * heads * d, width) or conv_state.shape[1:] != (
        3 * heads * d, width - 1
    ):  # fmt: skip
        raise ValueError("conv_weight must be [3HD, W] and conv_state [S, 3HD, W - 1]")
    if slots.shape != (n,) or dt_bias.shape != (heads * d,):
        raise ValueError("slots must be [N] and dt_bias [H * D]")
    rank_f = rank_g = 0
    if isinstance(raw_g, LowRankProj):
        rank_f = _check_low_rank("raw_g", raw_g, n, heads * d, mixed_qkv)
    elif raw_g.shape != (n, heads * d) or raw_g.stride(-1) != 1:
        raise ValueError(f"raw_g must be [{n}, {heads * d}] with unit last stride")
    if isinstance(gate, LowRankProj):
        rank_g = _check_low_rank("gate", gate, n, heads * d, mixed_qkv)
    elif gate is not None and (gate.shape != (n, heads, d) or gate.stride(-1) != 1):
        raise ValueError(f"gate must be [{n}, {heads}, {d}] with unit last stride")
    if slots.device != mixed_qkv.device or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError("slots must be an integer tensor on the inputs' device")
    # The kernels read slots, A_log and the norm weight at unit stride, D or H entries of them.
    if slots.stride(0) != 1 and n > 1:
        raise ValueError(f"slots must have unit stride, got {slots.stride()}")
    if A_log.shape != (heads,) or not A_log.is_contiguous():
        raise ValueError(f"A_log must be a contiguous [{heads}], got {tuple(A_log.shape)}")
    if norm_weight is not None and norm_weight.shape != (d,):
        raise ValueError(f"norm_weight must be [{d}], got {tuple(norm_weight.shape)}")
    if conv_weight.stride(1) != 1 or not dt_bias.is_contiguous():
        raise ValueError("conv_weight and dt_bias must be contiguous in their last dim")
    if norm_weight is not None and not norm_weight.is_contiguous():
        raise ValueError("norm_weight must be contiguous")
    if conv_state.stride(2) != 1 or ssm_state.stride(3) != 1 or ssm_state.stride(2) != d:
        raise ValueError("conv_state and ssm_state must be contiguous in their last dims")
    if b.stride(-1) != 1:
        raise ValueError("b must have unit stride on its last dim")
    # The kernel convolves the stored window as it is, where the reference (and the prefill
    # conv) round it to mixed_qkv's dtype first; and it keeps the recurrence in the state's dtype.
    if conv_state.dtype != mixed_qkv.dtype:
        raise ValueError(
            f"conv_state must have mixed_qkv's dtype {mixed_qkv.dtype}, got {conv_state.dtype}"
        )
    if ssm_state.dtype != torch.float32:
        raise ValueError(f"ssm_state must be float32, got {ssm_state.dtype}")
    if (norm_weight is None) != (gate is None):
        raise ValueError("norm_weight and gate go together: both for the norm epilogue, or none")
    if quantize and norm_weight is None:
        raise ValueError("quantize needs the norm epilogue (norm_weight and gate)")
    quant_dtype, fp8_max, min_scale = fp8_quant_params(quant_dtype)
    if n == 0 or not use_triton(mixed_qkv.device):
        out = mixed_qkv.new_empty(0, heads, d)
        if n:
            out = fused_kda_decode_ref(
                mixed_qkv, conv_weight, conv_state, raw_g, A_log, dt_bias, lower_bound, b,
                ssm_state, slots, norm_weight, gate, eps,
            )  # fmt: skip
        return per_token_fp8_quant(out.reshape(n, heads * d), quant_dtype) if quantize else out
    if config is None:
        config = kda_decode_config(n, heads, d, num_sms(mixed_qkv.device))
    block_v = config.block_v
    if block_v < 1 or block_v > d or block_v & (block_v - 1):
        raise ValueError(f"config.block_v must be a power of two <= D = {d}, got {block_v}")
    shift_programs = config.shift_programs
    if shift_programs is None:
        shift_programs = kda_epilogue_programs(n, heads, d, num_sms(mixed_qkv.device))
    if type(shift_programs) is not int or shift_programs < 1:
        raise ValueError(f"config.shift_programs must be an int >= 1, got {shift_programs!r}")
    split = block_v < d
    apply_norm = norm_weight is not None
    fused_quant = quantize and split and use_triton_fp8(mixed_qkv.device, quant_dtype)
    out = torch.empty(n, heads, d, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    # Split with the norm: the V blocks write o unnormed in fp32, the epilogue norms whole rows.
    core_out = (
        torch.empty(n, heads, d, dtype=torch.float32, device=out.device)
        if split and apply_norm
        else out
    )
    if rank_g and split:
        # The V blocks' gate channels, for the epilogue's norm.
        gate_arg = torch.empty(n, heads, d, dtype=mixed_qkv.dtype, device=out.device)
    else:
        gate_arg = gate if apply_norm and not rank_g else out
    norm_w_arg = norm_weight if apply_norm else A_log
    # Unused pointers get a stand-in tensor, as above.
    raw_g_arg, f_w_arg = (raw_g.a, raw_g.weight) if rank_f else (raw_g, raw_g)
    g_a_arg, g_w_arg = (gate.a, gate.weight) if rank_g else (raw_g_arg, raw_g_arg)
    block_r, whole_rank = gate_proj_tiling(max(rank_f, rank_g), d, block_v)
    block_w = triton.next_power_of_2(width)
    pdl = pdl_options(use_pdl(out.device))
    _fused_kda_decode_kernel[(n, heads, d // block_v)](
        mixed_qkv, conv_weight, conv_state, raw_g_arg, A_log, dt_bias, b,
        ssm_state, slots, gate_arg, norm_w_arg, core_out, f_w_arg, g_a_arg, g_w_arg,
        mixed_qkv.stride(0), conv_weight.stride(0), conv_state.stride(0), conv_state.stride(1),
        raw_g_arg.stride(0), b.stride(0), ssm_state.stride(0), ssm_state.stride(1),
        gate_arg.stride(0), gate_arg.stride(1), core_out.stride(0), core_out.stride(1),
        f_w_arg.stride(0), g_a_arg.stride(0), g_w_arg.stride(0),
        heads, lower_bound if lower_bound is not None else 0.0, eps, d**-0.5,
        D=d, W=width, BLOCK_W=block_w, BLOCK_V=block_v, SPLIT=split,
        HAS_LOWER_BOUND=lower_bound is not None, APPLY_NORM=apply_norm,
        RANK_F=rank_f, RANK_G=rank_g, BLOCK_R=block_r, WHOLE_RANK=whole_rank,
        EVICT="evict_first" if config.evict_state else "", num_warps=config.num_warps, **pdl,
    )  # fmt: skip
    if not split:
        return per_token_fp8_quant(out.reshape(n, heads * d), quant_dtype) if quantize else out
    if fused_quant:
        dest, scale = fp8_outputs(None, None, n, heads * d, quant_dtype, out.device)
    else:
        dest, scale = out.view(n, heads * d), out  # `out` stands in for the unused scale
    block_h = min(triton.next_power_of_2(heads), max(1, _EPILOGUE_TILE // d))
    block_c, span, shifts = kda_epilogue_tiling(2 * heads * d, shift_programs, block_w)
    _kda_decode_epilogue_kernel[(n, shifts + int(apply_norm))](
        mixed_qkv, conv_state, slots, core_out, gate_arg, norm_w_arg, dest, scale,
        mixed_qkv.stride(0), conv_state.stride(0), conv_state.stride(1),
        gate_arg.stride(0), gate_arg.stride(1), dest.stride(0),
        heads, span, eps, fp8_max, min_scale,
        D=d, W=width, BLOCK_W=block_w, BLOCK_C=block_c, BLOCK_H=block_h,
        ONE_CHUNK=block_h >= heads,
        APPLY_NORM=apply_norm, QUANT=fused_quant, num_warps=_EPILOGUE_WARPS, **pdl,
    )  # fmt: skip
    if fused_quant:
        return dest, scale
    return per_token_fp8_quant(dest, quant_dtype) if quantize else out
