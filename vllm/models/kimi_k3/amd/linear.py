"""Kimi-K3 / Kimi-Linear MLP blocks: the dense `KimiMLP` and the `KimiMoE` block (sigmoid
`noaux_tc` router, routed experts, shared experts, and Kimi-K3's latent MoE with optional norm).

Checkpoint names (upstream-facts D.7): `mlp.gate_proj/up_proj/down_proj`;
`block_sparse_moe.gate.weight`, `.gate.e_score_correction_bias`, `.experts.{e}.w1/w2/w3`,
`.shared_experts.gate_proj/up_proj/down_proj`, `.routed_expert_down_proj`, `.routed_expert_norm`,
`.routed_expert_up_proj`. Decoder layers and the causal LM come with the model issue.
"""

import re
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce
from vllm.model_executor.layers.activation import get_act_and_mul
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.layers.fused_moe.router import grouped_topk
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.transformers_utils.configs import KimiLinearConfig

_EXPERT = re.compile(r"experts\.(\d+)\.(w[123])\.weight")


def _act(config: KimiLinearConfig) -> torch.nn.Module:
    return get_act_and_mul(
        config.hidden_act, config.activation_situ_beta, config.activation_situ_linear_beta
    )


class KimiMLP(torch.nn.Module):
    """`down(act(gate(x)) * up(x))` with gate and up merged into one column-parallel weight."""

    def __init__(
        self,
        config: KimiLinearConfig,
        intermediate_size: int,
        reduce_results: bool = True,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        h = config.hidden_size
        self.gate_up_proj = MergedColumnParallelLinear(
            h, [intermediate_size] * 2, bias=False, params_dtype=params_dtype,
            quant_config=quant_config, prefix=f"{prefix}.gate_up_proj",
        )  # fmt: skip
        self.down_proj = RowParallelLinear(
            intermediate_size, h, bias=False, params_dtype=params_dtype,
            reduce_results=reduce_results, quant_config=quant_config, prefix=f"{prefix}.down_proj",
        )  # fmt: skip
        self.act_and_mul = _act(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)[0]))[0]

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """`gate_proj.weight`, `up_proj.weight` or `down_proj.weight`."""
        if name == "down_proj.weight":
            self.down_proj.weight_loader(self.down_proj.weight, tensor)
        elif name in ("gate_proj.weight", "up_proj.weight"):
            shard = 0 if name.startswith("gate") else 1
            self.gate_up_proj.weight_loader(self.gate_up_proj.weight, tensor, shard)
        else:
            raise ValueError(f"unexpected MLP tensor {name!r}")


class KimiMoE(torch.nn.Module):
    """Routed experts (optionally in a latent space) plus shared experts, one all-reduce."""

    def __init__(
        self,
        config: KimiLinearConfig,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.config = config
        self.prefix = prefix
        h = config.hidden_size
        self.latent = config.routed_expert_hidden_size
        routed_hidden = self.latent or h
        self.gate_weight = torch.nn.Parameter(
            torch.zeros(config.num_experts, h, dtype=torch.float32), requires_grad=False
        )
        self.e_score_correction_bias = torch.nn.Parameter(
            torch.zeros(config.num_experts, dtype=torch.float32), requires_grad=False
        )
        self.experts = FusedMoE(
            config.num_experts, routed_hidden, config.moe_intermediate_size, _act(config),
            params_dtype=params_dtype, reduce_results=False, prefix=f"{prefix}.experts",
        )  # fmt: skip
        if self.latent:
            self.routed_expert_down_proj = ReplicatedLinear(
                h, self.latent, bias=False, params_dtype=params_dtype,
                prefix=f"{prefix}.routed_expert_down_proj",
            )  # fmt: skip
            self.routed_expert_up_proj = ReplicatedLinear(
                self.latent, h, bias=False, params_dtype=params_dtype,
                prefix=f"{prefix}.routed_expert_up_proj",
            )  # fmt: skip
            self.routed_expert_norm = (
                RMSNorm(self.latent, config.rms_norm_eps, params_dtype)
                if config.latent_moe_use_norm
                else None
            )
        self.shared_experts = (
            KimiMLP(
                config,
                config.moe_intermediate_size * config.num_shared_experts,
                reduce_results=False,
                params_dtype=params_dtype,
                quant_config=quant_config,
                prefix=f"{prefix}.shared_experts",
            )  # fmt: skip
            if config.num_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        logits = F.linear(x.float(), self.gate_weight)
        weights, ids = grouped_topk(
            logits, self.e_score_correction_bias, cfg.num_experts_per_token,
            cfg.num_expert_group, cfg.topk_group, cfg.moe_renormalize,
            cfg.routed_scaling_factor, cfg.moe_router_activation_func,
        )  # fmt: skip
        routed_in = x
        if self.latent:
            routed_in = self.routed_expert_down_proj(x)[0]
            if self.routed_expert_norm is not None:
                routed_in = self.routed_expert_norm(routed_in)
        out = self.experts(routed_in, weights, ids)
        if self.latent:
            out = self.routed_expert_up_proj(out)[0]  # linear: commutes with the TP sum below
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if get_tensor_model_parallel_world_size() > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint tensors named relative to `block_sparse_moe.`; raises on an unknown name."""
        loaded = set()
        for name, tensor in weights:
            expert = _EXPERT.fullmatch(name)
            if expert:
                self.experts.weight_loader(tensor, int(expert[1]), expert[2])
            elif name == "gate.weight":
                self.gate_weight.data.copy_(tensor)
            elif name == "gate.e_score_correction_bias":
                self.e_score_correction_bias.data.copy_(tensor)
            elif name.startswith("shared_experts.") and self.shared_experts is not None:
                self.shared_experts.load_weight(name.removeprefix("shared_experts."), tensor)
            elif self.latent and name == "routed_expert_norm.weight" and self.routed_expert_norm:
                self.routed_expert_norm.weight.data.copy_(tensor)
            elif self.latent and name in (
                "routed_expert_down_proj.weight", "routed_expert_up_proj.weight"
            ):  # fmt: skip
                layer = getattr(self, name.split(".")[0])
                layer.weight_loader(layer.weight, tensor)
            else:
                raise ValueError(f"{self.prefix}: unexpected checkpoint tensor {name!r}")
            loaded.add(name)
        return loaded
