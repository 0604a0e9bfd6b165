"""Kimi-K3 / Kimi-Linear feed-forward blocks: the dense `KimiMLP` and the `KimiMoE` block (sigmoid
`noaux_tc` router, routed and shared experts, Kimi-K3's latent MoE with optional norm).

Shared-expert fusion (`fuses_shared_experts`): a MoE block with exactly one shared expert of the
routed experts' size (Kimi-Linear) holds it in `FusedMoE` as expert `num_experts`, and the router
appends it to every token with weight 1.0, so the routed kernels compute it too: no separate
gate_up GEMM, activation, down GEMM and add per layer. Numerics: the shared output joins the
routed ones in the experts' fp32 weighted sum, rounded once; unfused, the routed sum and the
shared output are each rounded to the model dtype and added there. In fp32 the two agree up to
accumulation order; in bf16 within about one rounding of the routed sum (the fused one is the
more accurate). `VLLM_KIMI_FUSE_SHARED_EXPERTS=0` keeps the separate shared MLP.
"""

import logging
import re
from collections.abc import Iterable

import torch

from vllm import envs
from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce
from vllm.logger import quiet_below
from vllm.model_executor.layers.activation import get_act_and_mul
from vllm.model_executor.layers.fused_moe.fused_activation import fused_activation
from vllm.model_executor.layers.fused_moe.fused_router import (
    fused_norm_router_topk,
    fused_router_topk,
    use_fused_norm_router,
    use_fused_router,
)
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.layers.fused_moe.router import RoutingParams, grouped_topk, router_logits
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.model_loader.weight_utils import copy_checked
from vllm.transformers_utils.configs import KimiLinearConfig

_EXPERT = re.compile(r"experts\.(\d+)\.(w[123])\.weight")
# A fused shared expert's checkpoint tensors -> its FusedMoE shard names.
_SHARED_SHARDS = {"gate_proj.weight": "w1", "up_proj.weight": "w3", "down_proj.weight": "w2"}


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


def shared_experts_fusable(
    config: KimiLinearConfig,
    quant_config: QuantizationConfig | None = None,
    prefix: str = "",
    params_dtype: torch.dtype | None = None,
) -> bool:
    """Whether the MoE block at `prefix` can run its shared expert as one more routed expert:
    no latent MoE (the shared expert reads the hidden states, the routed ones the latent), one
    shared expert of the routed size, an activation the Triton experts fuse, and a shared MLP
    that `quant_config` leaves unquantized (the routed experts are never quantized).

    The answer comes from a throw-away shared MLP built as the block builds it (`params_dtype`
    included: a quantized linear's kernel depends on it, and one the real layer could run must
    not fail here), silently: the real layer, if built, says its own kernel choice."""
    if config.routed_expert_hidden_size or config.num_shared_experts != 1:
        return False
    if fused_activation(_act(config)) is None:
        return False
    if quant_config is None:
        return True
    # Only the linears' quant methods are wanted: allocate nothing.
    with torch.device("meta"), quiet_below(logging.ERROR):
        mlp = KimiMLP(config, config.moe_intermediate_size, reduce_results=False,
                      params_dtype=params_dtype, quant_config=quant_config,
                      prefix=f"{prefix}.shared_experts")  # fmt: skip
    return all(
        type(layer.quant_method) is UnquantizedLinearMethod
        for layer in (mlp.gate_up_proj, mlp.down_proj)
    )


class KimiMoE(torch.nn.Module):
    """Routed experts (optionally in a latent space) plus shared experts, one all-reduce.

    `fuse_shared_experts`: run the shared expert inside the routed experts' kernels (module
    docstring); None follows `VLLM_KIMI_FUSE_SHARED_EXPERTS` where `shared_experts_fusable`,
    True raises where it is not. Both layouts load the same checkpoint tensors.
    """

    def __init__(
        self,
        config: KimiLinearConfig,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        fuse_shared_experts: bool | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.prefix = prefix
        h = config.hidden_size
        self.latent = config.routed_expert_hidden_size
        routed_hidden = self.latent or h
        fusable = shared_experts_fusable(config, quant_config, prefix, params_dtype)
        if fuse_shared_experts and not fusable:
            raise ValueError(f"{prefix}: this config's shared experts cannot be fused")
        if fuse_shared_experts is None:
            fuse_shared_experts = fusable and envs.VLLM_KIMI_FUSE_SHARED_EXPERTS
        self.gate_weight = torch.nn.Parameter(
            torch.zeros(config.num_experts, h, dtype=torch.float32), requires_grad=False
        )
        self.e_score_correction_bias = torch.nn.Parameter(
            torch.zeros(config.num_experts, dtype=torch.float32), requires_grad=False
        )
        # The fused router's arrival counter (fused_router.py): one per layer, so no two
        # launches in flight share one; 0 between launches. Not a checkpoint tensor.
        self.register_buffer(
            "router_semaphore", torch.zeros(1, dtype=torch.int32), persistent=False
        )
        self.experts = FusedMoE(
            config.num_experts, routed_hidden, config.moe_intermediate_size, _act(config),
            params_dtype=params_dtype, reduce_results=False, prefix=f"{prefix}.experts",
            num_fused_shared_experts=1 if fuse_shared_experts else 0,
        )  # fmt: skip
        self.routing = RoutingParams(
            config.num_experts, config.num_experts_per_token,
            num_expert_group=config.num_expert_group, topk_group=config.topk_group,
            renormalize=config.moe_renormalize,
            routed_scaling_factor=config.routed_scaling_factor,
            scoring_func=config.moe_router_activation_func,
            num_fused_shared_experts=self.experts.num_fused_shared_experts,
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
            if config.num_shared_experts and not fuse_shared_experts
            else None
        )

    @property
    def fuses_shared_experts(self) -> bool:
        return self.experts.num_fused_shared_experts > 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.e_score_correction_bias
        if use_fused_router(x, self.gate_weight):
            # The layer's parameters: static (fused_router.py).
            weights, ids = fused_router_topk(
                x, self.gate_weight, bias, self.routing, self.router_semaphore, static_weight=True
            )
        else:
            weights, ids = grouped_topk(router_logits(x, self.gate_weight), bias, self.routing)
        return self._experts_forward(x, weights, ids)

    def forward_with_norm(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(self(h), s)` for `h, s = norm(x, residual)`: the pre-norm block's residual add and
        norm, then the MoE block. Where `use_fused_norm_router` holds (decode sizes) the add
        and norm run inside the router's launch, one launch fewer, with the same `h` and `s` bit
        for bit (fused_router.py); elsewhere the norm's own launch, then `forward`."""
        if not isinstance(norm, RMSNorm):
            raise TypeError(f"norm must be an RMSNorm, got {type(norm).__name__}")
        if use_fused_norm_router(x, residual, norm.weight, self.gate_weight):
            h, residual, weights, ids = fused_norm_router_topk(
                x, residual, norm.weight, norm.eps, self.gate_weight, self.e_score_correction_bias,
                self.routing, self.router_semaphore, static_weight=True,
            )  # fmt: skip
            return self._experts_forward(h, weights, ids), residual
        h, residual = norm(x, residual)
        return self(h), residual

    def _experts_forward(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """The routed and shared experts of the normed `x`, routed by `weights` and `ids`."""
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
                # Slots from num_experts on hold the fused shared expert: a checkpoint with more
                # experts than its config would be written over it.
                if int(expert[1]) >= self.config.num_experts:
                    raise ValueError(
                        f"{self.prefix}: checkpoint tensor {name!r} is beyond the config's "
                        f"num_experts {self.config.num_experts}"
                    )
                self.experts.weight_loader(tensor, int(expert[1]), expert[2])
            elif name == "gate.weight":
                copy_checked(self.gate_weight, tensor, f"{self.prefix}.{name}")
            elif name == "gate.e_score_correction_bias":
                copy_checked(self.e_score_correction_bias, tensor, f"{self.prefix}.{name}")
            elif name.startswith("shared_experts.") and self.shared_experts is not None:
                self.shared_experts.load_weight(name.removeprefix("shared_experts."), tensor)
            elif self.fuses_shared_experts and name.startswith("shared_experts."):
                shard = _SHARED_SHARDS.get(name.removeprefix("shared_experts."))
                if shard is None:
                    raise ValueError(f"{self.prefix}: unexpected checkpoint tensor {name!r}")
                self.experts.weight_loader(tensor, self.config.num_experts, shard)
            elif self.latent and name == "routed_expert_norm.weight" and self.routed_expert_norm:
                copy_checked(self.routed_expert_norm.weight, tensor, f"{self.prefix}.{name}")
            elif self.latent and name in (
                "routed_expert_down_proj.weight", "routed_expert_up_proj.weight"
            ):  # fmt: skip
                layer = getattr(self, name.split(".")[0])
                layer.weight_loader(layer.weight, tensor)
            else:
                raise ValueError(f"{self.prefix}: unexpected checkpoint tensor {name!r}")
            loaded.add(name)
        return loaded
