"""Kimi-K3 / Kimi-Linear text model: the dense `KimiMLP`, the `KimiMoE` block (sigmoid `noaux_tc`
router, routed and shared experts, Kimi-K3's latent MoE with optional norm), decoder layers and
`KimiLinearForCausalLM`.

Shared-expert fusion (`fuses_shared_experts`): a MoE block with exactly one shared expert of the
routed experts' size (Kimi-Linear) holds it in `FusedMoE` as expert `num_experts`, and the router
appends it to every token with weight 1.0, so the routed kernels compute it too: no separate
gate_up GEMM, activation, down GEMM and add per layer. Numerics: the shared output joins the
routed ones in the experts' fp32 weighted sum, rounded once; unfused, the routed sum and the
shared output are each rounded to the model dtype and added there. In fp32 the two agree up to
accumulation order; in bf16 within about one rounding of the routed sum (the fused one is the
more accurate). `VLLM_KIMI_FUSE_SHARED_EXPERTS=0` keeps the separate shared MLP.

Checkpoint names (upstream-facts D.7): `mlp.gate_proj/up_proj/down_proj`;
`block_sparse_moe.gate.weight`, `.gate.e_score_correction_bias`, `.experts.{e}.w1/w2/w3`,
`.shared_experts.gate_proj/up_proj/down_proj`, `.routed_expert_down_proj`, `.routed_expert_norm`,
`.routed_expert_up_proj`. Also the decoder layer and `KimiLinearForCausalLM`, with Kimi-K3's
block attention residuals when `attn_res_block_size` is set (`attn_res.py`): per layer
`self_attention_res_norm/_proj`, `mlp_res_norm/_proj`, and model-level `output_attn_res_norm/_proj`.
"""

import logging
import re
from collections.abc import Iterable

import torch

from vllm import envs
from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce
from vllm.logger import quiet_below
from vllm.model_executor.layers.activation import SiluAndMul, get_act_and_mul
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
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import check_floating, copy_checked
from vllm.models.kimi_k3.amd.attn_res import AttnResState
from vllm.models.kimi_k3.amd.checkpoint_names import text_checkpoint_tensors
from vllm.models.kimi_k3.amd.kda import KDAStatePool, KimiK3DeltaAttention
from vllm.models.kimi_k3.amd.metadata import KimiMetadata
from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
from vllm.transformers_utils.configs import KimiLinearConfig
from vllm.v1.kv_cache_interface import KDAStateSpec, KVCacheSpec, MLAAttentionSpec

_EXPERT = re.compile(r"experts\.(\d+)\.(w[123])\.weight")
_LAYER = re.compile(r"model\.layers\.(\d+)\.([a-z_]+)\.(.+)")
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
_LAYER_ATTN_RES = (
    "self_attention_res_norm",
    "self_attention_res_proj",
    "mlp_res_norm",
    "mlp_res_proj",
)
_MODEL_ATTN_RES = ("model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight")
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
    shared expert of the routed size, SiLU (the Triton experts' activation), and a shared MLP
    that `quant_config` leaves unquantized (the routed experts are never quantized).

    The answer comes from a throw-away shared MLP built as the block builds it (`params_dtype`
    included: a quantized linear's kernel depends on it, and one the real layer could run must
    not fail here), silently: the real layer, if built, says its own kernel choice."""
    if config.routed_expert_hidden_size or config.num_shared_experts != 1:
        return False
    if type(_act(config)) is not SiluAndMul:
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
            weights, ids = fused_router_topk(
                x, self.gate_weight, bias, self.routing, self.router_semaphore
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
                self.routing, self.router_semaphore,
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


# ---------------------------------------------------------------------------------------------
# Decoder layers and the causal LM
# ---------------------------------------------------------------------------------------------


def _attn_res_proj(
    hidden_size: int, params_dtype: torch.dtype | None, prefix: str
) -> ReplicatedLinear:
    """An AttnRes pseudo-query (weight `[1, hidden]`). Built without a quant config, as
    upstream: --quantization-config never applies to it."""
    return ReplicatedLinear(
        hidden_size, 1, bias=False, params_dtype=params_dtype, quant_config=None, prefix=prefix
    )


class KimiDecoderLayer(torch.nn.Module):
    """Pre-norm residual block: KDA or MLA attention, then a dense MLP or the MoE block.

    `forward` is the standard residual, the stream carried from layer to layer beside the
    sublayer output (as upstream's decoders do) so each add fuses into the next norm; with
    `attn_res_block_size` set the model calls `forward_attn_res` instead, whose sublayers read
    AttnRes mixtures (`attn_res.py`).
    """

    def __init__(
        self,
        config: KimiLinearConfig,
        layer_idx: int,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.is_kda = config.is_kda_layer(layer_idx)
        attn_prefix = f"{prefix}.self_attn"
        if self.is_kda:
            self.self_attn = KimiK3DeltaAttention(
                config.hidden_size, config.kda_num_heads, config.kda_head_dim,
                config.kda_conv_kernel_size, config.use_full_rank_gate, config.gate_lower_bound,
                config.rms_norm_eps, params_dtype, quant_config, attn_prefix,
            )  # fmt: skip
        else:
            self.self_attn = KimiMLAAttention(config, params_dtype, quant_config, attn_prefix)
        self.is_moe = config.is_moe_layer(layer_idx)
        if self.is_moe:
            self.block_sparse_moe = KimiMoE(
                config, params_dtype, quant_config, f"{prefix}.block_sparse_moe"
            )
        else:
            self.mlp = KimiMLP(
                config, config.intermediate_size, params_dtype=params_dtype,
                quant_config=quant_config, prefix=f"{prefix}.mlp",
            )  # fmt: skip
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, params_dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype)
        self.has_attn_res = config.attn_res_block_size is not None
        if self.has_attn_res:
            h = config.hidden_size
            self.self_attention_res_norm = RMSNorm(h, eps, params_dtype)
            self.self_attention_res_proj = _attn_res_proj(
                h, params_dtype, f"{prefix}.self_attention_res_proj"
            )
            self.mlp_res_norm = RMSNorm(h, eps, params_dtype)
            self.mlp_res_proj = _attn_res_proj(h, params_dtype, f"{prefix}.mlp_res_proj")

    def _attention(self, h: torch.Tensor, metadata: KimiMetadata) -> torch.Tensor:
        return self.self_attn(h, metadata.kda if self.is_kda else metadata.mla)

    def _ffn(self, h: torch.Tensor) -> torch.Tensor:
        return (self.block_sparse_moe if self.is_moe else self.mlp)(h)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, metadata: KimiMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(ffn output, residual stream)`; the caller adds the two in the next norm.

        `x` is the previous layer's FFN output and `residual` its stream (None for the first
        layer, whose `x` is the embeddings). Each residual add is fused into the norm after it:
        the stream's values are those of `x + sublayer(norm(x))` computed step by step. A MoE
        layer hands its post-attention norm to the MoE block (`KimiMoE.forward_with_norm`),
        which at decode sizes runs it inside the router's launch.
        """
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        out = self._attention(h, metadata)
        if self.is_moe:
            return self.block_sparse_moe.forward_with_norm(
                out, residual, self.post_attention_layernorm
            )
        h, residual = self.post_attention_layernorm(out, residual)
        return self.mlp(h), residual

    def forward_attn_res(self, state: AttnResState, metadata: KimiMetadata) -> None:
        """Run the layer on the AttnRes stream `state`, adding both sublayer outputs to it."""
        state.begin_layer(self.layer_idx)
        h = state.mix(self.self_attention_res_norm, self.self_attention_res_proj)
        state.add(self._attention(self.input_layernorm(h), metadata))
        h = state.mix(self.mlp_res_norm, self.mlp_res_proj)
        state.add(self._ffn(self.post_attention_layernorm(h)))


class KimiLinearForCausalLM(torch.nn.Module):
    """The Kimi-Linear / Kimi-K3 text model: embeddings, decoder layers, final norm, LM head.

    Embeddings and the LM head are sharded over the vocabulary across TP ranks. With
    `attn_res_block_size` set the layers run on an AttnRes stream and a model-level mixture
    (`output_attn_res_norm/_proj`) feeds the final norm.
    """

    # fused layer -> the checkpoint modules it holds (for `re:` ignore rules on fused layers)
    packed_modules_mapping: dict[str, list[str]] = {
        "in_proj_qkvgfab": [
            "q_proj",
            "k_proj",
            "v_proj",
            "g_proj",
            "f_a_proj",
            "g_a_proj",
            "b_proj",
        ],
        "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa", "g_proj"],
        "fused_q_kv_a_proj": ["q_proj", "kv_a_proj_with_mqa", "g_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(
        self,
        config: KimiLinearConfig,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "model",
    ) -> None:
        super().__init__()
        self.config = config
        dtype = params_dtype or torch.get_default_dtype()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, dtype, f"{prefix}.embed_tokens"
        )
        self.layers = torch.nn.ModuleList(
            KimiDecoderLayer(config, i, dtype, quant_config, f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        if config.attn_res_block_size is not None:
            self.output_attn_res_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
            self.output_attn_res_proj = _attn_res_proj(
                config.hidden_size, dtype, f"{prefix}.output_attn_res_proj"
            )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        # A tied head computes with the embedding's (identically sharded) weight.
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype, "lm_head")
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @staticmethod
    def checkpoint_tensors(config: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
        """Every checkpoint tensor `config` implies: canonical name -> full (unsharded) shape, in
        checkpoint order (see `checkpoint_names`)."""
        return text_checkpoint_tensors(config)

    def forward(self, input_ids: torch.Tensor, metadata: KimiMetadata) -> torch.Tensor:
        """Hidden states `[T, hidden]` of the flattened batch (`[0, hidden]` for no tokens), on
        the caches bound by `bind_kv_caches`."""
        x = self.embed_tokens(input_ids)
        if x.shape[0] == 0:
            return x
        block_size = self.config.attn_res_block_size
        if block_size is None:
            residual = None
            for layer in self.layers:
                x, residual = layer(x, residual, metadata)
            return self.norm(x, residual)[0]  # the config has at least one layer
        state = AttnResState(x, len(self.layers), block_size)
        for layer in self.layers:
            layer.forward_attn_res(state, metadata)
        return self.norm(state.mix(self.output_attn_res_norm, self.output_attn_res_proj))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    # -- caches ---------------------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """Layer index -> this rank's cache spec, in the model dtype (the embedding's)."""
        dtype = self.embed_tokens.weight.dtype
        return {i: layer.self_attn.get_kv_cache_spec(dtype) for i, layer in enumerate(self.layers)}

    def bind_kv_caches(
        self, kda_pools: dict[int, KDAStatePool], mla_caches: dict[int, torch.Tensor]
    ) -> None:
        """Bind each layer's cache to it, once (checked against `get_kv_cache_spec`): a KDA
        layer's state pool, an MLA layer's paged latent cache. Rebinding replaces them; two
        empty dicts release them (after a profiling run on throw-away caches)."""
        if not kda_pools and not mla_caches:
            for layer in self.layers:
                layer.self_attn.release_kv_cache()
            return
        spec = self.get_kv_cache_spec()
        kda = {i for i, s in spec.items() if isinstance(s, KDAStateSpec)}
        if set(kda_pools) != kda:
            raise ValueError(f"kda_pools has layers {sorted(kda_pools)}, the model {sorted(kda)}")
        if set(mla_caches) != set(spec) - kda:
            raise ValueError(
                f"mla_caches has layers {sorted(mla_caches)}, the model {sorted(set(spec) - kda)}"
            )
        device = self.embed_tokens.weight.device
        for i, pool in kda_pools.items():
            if pool.conv_state.dtype != spec[i].conv_dtype or pool.conv_state.device != device:
                raise ValueError(
                    f"kda_pools[{i}]: conv state {pool.conv_state.dtype} on "
                    f"{pool.conv_state.device}, expected {spec[i].conv_dtype} on {device}"
                )
            self.layers[i].self_attn.bind_kv_cache(pool)
        for i, cache in mla_caches.items():
            layer_spec: MLAAttentionSpec = spec[i]
            if cache.dtype != layer_spec.dtype or cache.device != device:
                raise ValueError(
                    f"mla_caches[{i}]: {cache.dtype} on {cache.device}, expected "
                    f"{layer_spec.dtype} on {device}"
                )
            self.layers[i].self_attn.bind_kv_cache(cache)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load Hugging Face checkpoint tensors (`model.layers.{i}....`, `lm_head.weight`); the
        AttnRes ones only when `attn_res_block_size` is set.

        Each tensor is dispatched as it arrives (nothing is held back), so a streamed checkpoint
        needs host memory for one tensor only. Raises ValueError naming an unexpected tensor or one
        that is not 16-bit-or-wider floating point;
        returns the canonical names loaded (`checkpoint_tensors`): transformers'
        `block_sparse_moe.*` spelling of a dense MLP is reported as `mlp.*`."""
        loaded = set()
        for name, tensor in weights:
            match = _LAYER.fullmatch(name)
            if match:
                i = int(match[1])
                if i >= len(self.layers) + self.config.num_nextn_predict_layers:
                    raise ValueError(f"unexpected checkpoint tensor {name!r}: no layer {i}")
                if i >= len(self.layers):
                    continue  # multi-token-prediction layers: not served, whatever their dtype
                check_floating(tensor, name)
                name = self._load_layer_tensor(i, match[2], match[3], tensor)
                loaded.add(name)
                continue
            check_floating(tensor, name)
            if name == "model.embed_tokens.weight":
                self.embed_tokens.weight_loader(self.embed_tokens.weight, tensor)
            elif name == "model.norm.weight":
                copy_checked(self.norm.weight, tensor, name)
            elif name in _MODEL_ATTN_RES and self.config.attn_res_block_size is not None:
                # a norm or an unquantized replicated projection: the whole weight on every rank
                copy_checked(getattr(self, name.split(".")[1]).weight, tensor, name)
            elif name == "lm_head.weight":
                # Tied: the head is the embedding; transformers still saves a copy, skipped.
                if not self.config.tie_word_embeddings:
                    self.lm_head.weight_loader(self.lm_head.weight, tensor)
            else:
                raise ValueError(f"unexpected checkpoint tensor {name!r}")
            loaded.add(name)
        return loaded

    def _load_layer_tensor(self, i: int, part: str, rest: str, tensor: torch.Tensor) -> str:
        """Load `model.layers.{i}.{part}.{rest}`; returns its canonical name."""
        layer = self.layers[i]
        name = f"model.layers.{i}.{part}.{rest}"
        if part in _LAYER_NORMS or (part in _LAYER_ATTN_RES and layer.has_attn_res):
            if rest != "weight":
                raise ValueError(f"unexpected checkpoint tensor {name!r}")
            copy_checked(getattr(layer, part).weight, tensor, name)
        elif part == "self_attn":
            layer.self_attn.load_weights([(rest, tensor)])
        elif part == "block_sparse_moe" and layer.is_moe:
            layer.block_sparse_moe.load_weights([(rest, tensor)])
        elif part in ("mlp", "block_sparse_moe") and not layer.is_moe:
            # transformers' save_pretrained names the dense MLP `block_sparse_moe.*` too
            layer.mlp.load_weight(rest, tensor)
            name = f"model.layers.{i}.mlp.{rest}"
        else:
            raise ValueError(f"unexpected checkpoint tensors under model.layers.{i}.{part}")
        return name

    def process_weights_after_loading(self) -> None:
        """The one walk after loading: every submodule that defines `process_weights_after_loading`
        runs it once, children before their parents (reversed `modules()` order), so MLA derives
        its absorbed weights from a `kv_b_proj` its quant method has already processed; no
        submodule walks its own children."""
        for module in reversed(list(self.modules())):
            if module is not self and hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()
