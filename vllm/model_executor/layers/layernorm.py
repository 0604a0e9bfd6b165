"""Normalization layers."""

import torch

from vllm.model_executor.model_loader.weight_utils import copy_checked
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import rmsnorm_gated_ref


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
    """`x * rsqrt(mean(x^2) + eps) * weight` in fp32, returned in `x`'s dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)
