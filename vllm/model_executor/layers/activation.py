"""Gated activations of MLPs: `act(gate) * up` over a `[..., 2 * I]` input (gate | up halves)."""

import torch

from vllm.model_executor.layers.ops.silu_and_mul import silu_and_mul


class SiluAndMul(torch.nn.Module):
    """`silu(gate) * up`: one Triton launch where Triton runs, rounded as torch's `F.silu(gate) *
    up` (vllm/model_executor/layers/ops/silu_and_mul.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


class SituAndMul(torch.nn.Module):
    """Kimi-K3's SiTU: `beta * tanh(gate / beta) * sigmoid(gate) * linear_beta * tanh(up /
    linear_beta)`, computed in fp32 (soft-capped SiLU gate times a soft-capped up)."""

    def __init__(self, beta: float, linear_beta: float) -> None:
        super().__init__()
        self.beta = beta
        self.linear_beta = linear_beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.float().chunk(2, dim=-1)
        gate = self.beta * torch.tanh(gate / self.beta) * torch.sigmoid(gate)
        up = self.linear_beta * torch.tanh(up / self.linear_beta)
        return (gate * up).to(x.dtype)


def get_act_and_mul(
    name: str, situ_beta: float | None = None, situ_linear_beta: float | None = None
) -> torch.nn.Module:
    """The gated activation a config's `hidden_act` names ("silu" or "situ")."""
    if name == "silu":
        return SiluAndMul()
    if name == "situ":
        if situ_beta is None or situ_linear_beta is None:
            raise ValueError("hidden_act 'situ' needs activation_situ_beta and _linear_beta")
        return SituAndMul(situ_beta, situ_linear_beta)
    raise ValueError(f"hidden_act {name!r} is not 'silu' or 'situ'")
