"""Fused KDA decode step: short-conv update, gates, delta-rule update and output, and an optional
gated-RMSNorm epilogue, in one launch (the fork's counterpart of upstream's `fused_kda_decode`).

One token for each of N sequences, H local heads, head dim D (= K = V), conv width W:

- `mixed_qkv` `[N, 3 * H * D]` (q | k | v channels, any row stride), `conv_weight` `[3 * H * D, W]`
  fp32, `conv_state` `[S, 3 * H * D, W - 1]` (updated in place at `slots`);
- `raw_g` `[N, H * D]` (the `f_b_proj` output, any row stride), `A_log` `[H]`, `dt_bias` `[H * D]`,
  `lower_bound` (None: softplus gate);
- `b` `[N, H]` beta logits (any row stride), `ssm_state` `[S, H, D, D]` fp32 (updated at `slots`);
- with `norm_weight` `[D]` and `gate` `[N, H, D]` (any strides, unit last): the output is
  `o * rsqrt(mean(o^2) + eps) * norm_weight * sigmoid(gate)` computed on the fp32 `o`.
Output `[N, H, D]` in `mixed_qkv`'s dtype. Program (n, h) owns head h of sequence n: its conv
channels, its `[D, D]` state and its output row.

The torch reference composes the layer's unfused ops (conv decode, gate, recurrent core, norm), so
fused and unfused decode are checked against the same math.
"""

import torch

from vllm.model_executor.layers.layernorm import rmsnorm_gated_ref
from vllm.models.kimi_k3.amd.ops.causal_conv1d import causal_conv1d_decode
from vllm.models.kimi_k3.amd.ops.kda_core import kda_decode
from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate
from vllm.triton_utils import use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

if triton is not None:

    @triton.jit
    def _conv_channels(
        x_row, w_ptr, state_ptr, stride_wc, stride_sc, chans,
        W: tl.constexpr, BLOCK_W: tl.constexpr,
    ):  # fmt: skip
        # silu(causal conv) of one token for `chans`, and the slot's window shifted by one.
        # Everything is loaded before the barrier and stored after it: a channel can be held by
        # two warps (a [D] vector over more threads than D), which must not race on the window.
        j = tl.arange(0, BLOCK_W)[None, :]
        rows = chans[:, None] * stride_sc
        x = tl.load(x_row + chans)
        old = tl.load(state_ptr + rows + j, mask=j < W - 1, other=0.0)
        nxt = tl.load(state_ptr + rows + j + 1, mask=j + 1 < W - 1, other=0.0)
        taps = tl.load(w_ptr + chans[:, None] * stride_wc + j, mask=j < W, other=0.0)
        window = tl.where(j == W - 1, x[:, None], old).to(tl.float32)
        acc = tl.sum(window * taps, axis=1)
        shifted = tl.where(j + 1 == W - 1, x[:, None], nxt)
        tl.debug_barrier()
        tl.store(state_ptr + rows + j, shifted.to(state_ptr.dtype.element_ty), mask=j < W - 1)
        return acc * tl.sigmoid(acc)

    @triton.jit
    def _l2_normalize(x):
        return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)

    @triton.jit
    def _fused_kda_decode_kernel(
        qkv_ptr, conv_w_ptr, conv_state_ptr, raw_g_ptr, a_log_ptr, dt_bias_ptr, b_ptr,
        ssm_ptr, slots_ptr, gate_ptr, norm_w_ptr, out_ptr,
        stride_qkv, stride_wc, stride_cs, stride_cc, stride_g, stride_b,
        stride_ss, stride_sh, stride_gate_n, stride_gate_h, stride_on, stride_oh,
        lower_bound, eps, q_scale,
        H: tl.constexpr, D: tl.constexpr, W: tl.constexpr, BLOCK_W: tl.constexpr,
        HAS_LOWER_BOUND: tl.constexpr, APPLY_NORM: tl.constexpr,
    ):  # fmt: skip
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        slot = tl.load(slots_ptr + n).to(tl.int64)
        d = tl.arange(0, D)
        x_row = qkv_ptr + n * stride_qkv
        state = conv_state_ptr + slot * stride_cs
        conv = (x_row, conv_w_ptr, state, stride_wc, stride_cc)
        q = _conv_channels(*conv, h * D + d, W, BLOCK_W)
        k = _conv_channels(*conv, (H + h) * D + d, W, BLOCK_W)
        v = _conv_channels(*conv, (2 * H + h) * D + d, W, BLOCK_W)
        q = _l2_normalize(q) * q_scale
        k = _l2_normalize(k)

        x = tl.load(raw_g_ptr + n * stride_g + h * D + d).to(tl.float32)
        x += tl.load(dt_bias_ptr + h * D + d).to(tl.float32)
        rate = tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
        if HAS_LOWER_BOUND:
            g = lower_bound * tl.sigmoid(rate * x)
        else:
            g = -rate * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
        beta = tl.sigmoid(tl.load(b_ptr + n * stride_b + h).to(tl.float32))

        s_ptrs = ssm_ptr + slot * stride_ss + h * stride_sh + d[:, None] * D + d[None, :]
        s = tl.load(s_ptrs) * tl.exp(g)[:, None]  # [K, V]
        u = beta * (v - tl.sum(s * k[:, None], axis=0))
        s += k[:, None] * u[None, :]
        tl.store(s_ptrs, s)
        o = tl.sum(s * q[:, None], axis=0)  # [V]
        if APPLY_NORM:
            rstd = tl.rsqrt(tl.sum(o * o, axis=0) / D + eps)
            z = tl.load(gate_ptr + n * stride_gate_n + h * stride_gate_h + d).to(tl.float32)
            o = o * rstd * tl.load(norm_w_ptr + d).to(tl.float32) * tl.sigmoid(z)
        tl.store(out_ptr + n * stride_on + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))


def fused_kda_decode_ref(
    mixed_qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    raw_g: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    b: torch.Tensor,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """The unfused decode ops in sequence (see the module docstring); updates the states."""
    n, heads = b.shape
    d = ssm_state.shape[-1]
    # q, k, v and o stay fp32, as in the kernel.
    conv = causal_conv1d_decode(mixed_qkv, conv_weight, conv_state, slots, torch.float32)
    q, k, v = (t.reshape(n, heads, d) for t in conv.split(heads * d, dim=-1))
    g = kda_gate(raw_g, A_log, dt_bias, lower_bound)
    o = kda_decode(q, k, v, g, torch.sigmoid(b.float()), ssm_state, slots)
    if norm_weight is not None:
        o = rmsnorm_gated_ref(o, norm_weight, gate, eps)
    return o.to(mixed_qkv.dtype)


def fused_kda_decode(
    mixed_qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    raw_g: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    b: torch.Tensor,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """One decode step of N sequences in one launch; see the module docstring for shapes."""
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
    if raw_g.shape != (n, heads * d) or slots.shape != (n,) or dt_bias.shape != (heads * d,):
        raise ValueError("raw_g must be [N, H * D], slots [N] and dt_bias [H * D]")
    if slots.device != mixed_qkv.device or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError("slots must be an integer tensor on the inputs' device")
    if conv_weight.stride(1) != 1 or not dt_bias.is_contiguous():
        raise ValueError("conv_weight and dt_bias must be contiguous in their last dim")
    if norm_weight is not None and not norm_weight.is_contiguous():
        raise ValueError("norm_weight must be contiguous")
    if conv_state.stride(2) != 1 or ssm_state.stride(3) != 1 or ssm_state.stride(2) != d:
        raise ValueError("conv_state and ssm_state must be contiguous in their last dims")
    if raw_g.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("raw_g and b must have unit stride on their last dim")
    if (norm_weight is None) != (gate is None):
        raise ValueError("norm_weight and gate go together: both for the norm epilogue, or none")
    if gate is not None and (gate.shape != (n, heads, d) or gate.stride(-1) != 1):
        raise ValueError(f"gate must be [{n}, {heads}, {d}] with unit last stride")
    if n == 0:
        return mixed_qkv.new_empty(0, heads, d)
    if not use_triton(mixed_qkv.device):
        return fused_kda_decode_ref(
            mixed_qkv, conv_weight, conv_state, raw_g, A_log, dt_bias, lower_bound, b,
            ssm_state, slots, norm_weight, gate, eps,
        )  # fmt: skip
    out = torch.empty(n, heads, d, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    apply_norm = norm_weight is not None
    gate_arg = gate if apply_norm else out
    _fused_kda_decode_kernel[(n, heads)](
        mixed_qkv, conv_weight, conv_state, raw_g, A_log, dt_bias, b,
        ssm_state, slots, gate_arg, norm_weight if apply_norm else A_log, out,
        mixed_qkv.stride(0), conv_weight.stride(0), conv_state.stride(0), conv_state.stride(1),
        raw_g.stride(0), b.stride(0), ssm_state.stride(0), ssm_state.stride(1),
        gate_arg.stride(0), gate_arg.stride(1), out.stride(0), out.stride(1),
        lower_bound if lower_bound is not None else 0.0, eps, d**-0.5,
        H=heads, D=d, W=width, BLOCK_W=triton.next_power_of_2(width),
        HAS_LOWER_BOUND=lower_bound is not None, APPLY_NORM=apply_norm,
        num_warps=8 if d >= 128 else 4,
    )  # fmt: skip
    return out
