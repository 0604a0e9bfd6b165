"""Causal depthwise short convolution with SiLU over a flattened batch, with per-slot conv state.

Shapes: `x` `[T, C]` (tokens of N sequences back to back), `weight` `[C, W]`, `conv_state`
`[S, C, W - 1]` (the last W - 1 inputs of each slot's sequence, oldest first). Output `[T, C]`:
`y[t] = silu(sum_j weight[:, j] * x[t - (W - 1) + j])`, where inputs before a sequence's first token
come from its slot's state (continued prefill, decode) or are zero (a new sequence). The state is
updated in place. Torch implementation (the KDA short conv is a small share of the step; a Triton
version can replace it behind these functions).
"""

import torch
import torch.nn.functional as F


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    query_start_loc: list[int],
    slots: list[int],
    has_initial_state: list[bool],
) -> torch.Tensor:
    """Prefill chunks of N sequences: `query_start_loc` has N + 1 entries, `slots` and
    `has_initial_state` N."""
    width = weight.shape[1]
    out = torch.empty_like(x)
    for i, slot in enumerate(slots):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end == start:
            continue
        prev = conv_state[slot].t() if has_initial_state[i] else x.new_zeros(width - 1, x.shape[1])
        full = torch.cat([prev.to(x.dtype), x[start:end]])  # [W - 1 + L, C]
        out[start:end] = _conv_silu(full, weight)
        conv_state[slot] = full[-(width - 1) :].t().to(conv_state.dtype)
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
