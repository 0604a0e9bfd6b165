"""Normalization layers, and the gated RMSNorm reference that fused gated-norm kernels match."""

import torch

from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm, rms_norm
from vllm.model_executor.model_loader.weight_utils import copy_checked


def rmsnorm_gated_ref(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """Gated RMSNorm per row over the last dim, in fp32: `x` and `gate` `[..., D]` (any float
    dtype), `weight` `[D]`. Returns `(x * weight * sigmoid(gate)) * rsqrt(mean(x^2) + eps)` as fp32.

    The exact statement of the fused kernels' math (`rmsnorm_gated_fp8_per_token`, the fused KDA
    decode epilogue), in their order of operations, so kernel and reference differ only in ulps.
    """
    xf = x.float()
    # A tensor divisor keeps the division correctly rounded on CUDA (as the kernels' div_rn).
    var = xf.square().sum(dim=-1, keepdim=True) / xf.new_full((), x.shape[-1])
    return xf * weight.float() * torch.sigmoid(gate.float()) * torch.rsqrt(var + eps)


class _RMSNormBase(torch.nn.Module):
    """The weight `[hidden_size]` (replicated on every TP rank) and eps of an RMSNorm."""

    def __init__(
        self, hidden_size: int, eps: float, dtype: torch.dtype | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.prefix = prefix

    def weight_loader(self, param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy the checkpoint's whole weight; a shape mismatch is a ValueError (`copy_` would
        broadcast a `[1]` tensor silently)."""
        copy_checked(param.data, loaded, f"{self.prefix}.weight")


class RMSNormGated(_RMSNormBase):
    """Gated RMSNorm over the last dim with a sigmoid gate (KDA's `o_norm`).

    `y = x * rsqrt(mean(x^2) + eps) * weight * sigmoid(gate)` in fp32, returned in `x`'s dtype;
    `weight` `[hidden_size]` is shared by all heads. The same math as the fused op's reference.
    """

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return rmsnorm_gated_ref(x, self.weight, gate, self.eps).to(x.dtype)


class RMSNorm(_RMSNormBase):
    """`x * rsqrt(mean(x^2) + eps) * weight` in fp32, returned in `x`'s dtype.

    With `residual` the residual add before the norm is fused in: `s = x + residual` (in `x`'s
    dtype) is normed and returned as the new residual stream, `(norm(s), s)`. One launch either
    way (`vllm/model_executor/layers/ops/rms_norm.py`).
    """

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return fused_add_rms_norm(x, residual, self.weight, self.eps)
