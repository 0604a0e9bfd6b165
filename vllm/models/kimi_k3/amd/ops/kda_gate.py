"""KDA decay gate: the per-key-channel log decay `g` from the raw gate projection, in torch.

`raw` `[T, H * K]`, `A_log` `[H]`, `dt_bias` `[H * K]` (fp32). With `x = raw + dt_bias`:
- `lower_bound` set (Kimi-K3: -5): `g = lower_bound * sigmoid(exp(A_log) * x)`, in (lower_bound, 0);
- otherwise: `g = -exp(A_log) * softplus(x)`, softplus linear above 20 (as fla and transformers).
Returns `g` `[T, H, K]` fp32. The GPU paths compute it inside their kernels (fla-core's chunked
cumsum of the decay for prefill rows, `fused_kda_decode` for decode rows); this is their reference,
and the CPU's path.
"""

import torch


def kda_gate(
    raw: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """`g` `[T, H, K]` fp32 (module docstring)."""
    heads = A_log.numel()
    x = (raw.float() + dt_bias.float()).view(raw.shape[0], heads, -1)
    rate = torch.exp(A_log.float()).view(1, heads, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(rate * x)
    return -rate * torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))
