"""What a Kimi model holds and what one decode step must move: parameter counts (total and active
per token) and the bytes of the decode floor, read off a built model (on any device, `meta`
included) rather than recomputed from the config, so quantized layers and TP shards count as they
are stored on this rank.

Bytes a decode step of B sequences must read or write at least, each once:
- every weight the step uses whatever the batch ("dense": attention, dense MLP, routers, shared
  experts, norms, the LM head), with MLA's absorbed `W_UK`/`W_UV` in place of `kv_b_proj`, which
  only prefill reads;
- one embedding row per sequence;
- the routed experts the router chose, each distinct expert of a layer once;
- each sequence's KDA state (conv window and recurrent state), read and written;
- the MLA latent cache: every context token read, the new token's entry written.
Activations are left out: a few MB against GBs of weights.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
from vllm.v1.kv_cache_interface import KDAStateSpec, MLAAttentionSpec


@dataclass(frozen=True)
class ModelFootprint:
    total_params: int
    # 0 when tied to the LM head: the tied matrix is then the head's, which multiplies every
    # sampled row by all of it and reads all of it each step (the lookup reads one row).
    embedding_params: int
    lm_head_params: int
    lm_head_bytes: int  # in dense_decode_bytes: a step reads them only where a row samples
    routed_expert_params: int  # every routed expert of every MoE layer
    num_moe_layers: int
    top_k: int
    params_per_expert: int  # one routed expert (gate, up, down) of one layer
    dense_decode_bytes: int
    embedding_row_bytes: int
    expert_bytes: int  # one routed expert of one layer
    kda_state_bytes_per_seq: int  # over all KDA layers
    mla_bytes_per_token: int  # over all MLA layers

    @property
    def active_params_per_token(self) -> int:
        """Parameters one token's forward multiplies by, the LM head included (the embedding
        is a row lookup, not counted)."""
        routed_active = self.num_moe_layers * self.top_k * self.params_per_expert
        not_per_token = self.embedding_params + self.routed_expert_params
        return self.total_params - not_per_token + routed_active

    @property
    def active_params_without_lm_head(self) -> int:
        """Active parameters of the body: what every prefill token multiplies by (the LM head
        runs only on rows that sample)."""
        return self.active_params_per_token - self.lm_head_params

    def decode_bytes(self, distinct_experts: Sequence[int], context_lens: Sequence[int]) -> int:
        """Floor bytes of one decode step: `distinct_experts` per MoE layer, `context_lens` per
        sequence (tokens in its cache after the step, the new one included)."""
        if len(distinct_experts) != self.num_moe_layers:
            raise ValueError(
                f"distinct_experts has {len(distinct_experts)} layers, the model "
                f"{self.num_moe_layers} MoE layers"
            )
        batch = len(context_lens)
        return (
            self.dense_decode_bytes
            + batch * self.embedding_row_bytes
            + sum(distinct_experts) * self.expert_bytes
            + 2 * batch * self.kda_state_bytes_per_seq
            + (sum(context_lens) + batch) * self.mla_bytes_per_token
        )


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def model_footprint(model: torch.nn.Module) -> ModelFootprint:
    """The footprint of a `KimiLinearForCausalLM` (this rank's shards) or of a model holding one
    as `language_model`."""
    text = getattr(model, "language_model", model)
    embedding = text.embed_tokens.weight
    lm_head = text.lm_head.weight
    tied = lm_head is embedding
    # Parameters and derived buffers that decode never reads whole: an untied embedding (one row
    # per sequence), routed experts (only the chosen ones), and kv_b_proj where MLA decodes
    # through W_UK / W_UV.
    not_dense: set[int] = set() if tied else {id(embedding)}
    routed_params = expert_bytes = params_per_expert = moe_layers = 0
    absorbed_bytes = fused_shared_bytes = 0
    for module in text.modules():
        if isinstance(module, FusedMoE):
            moe_layers += 1
            weights = (module.w13_weight, module.w2_weight)
            # Experts from num_experts on are fused shared experts: read every step, so dense.
            routed = module.num_experts
            routed_params += sum(w[:routed].numel() for w in weights)
            params_per_expert = sum(w[0].numel() for w in weights)
            expert_bytes = sum(_nbytes(w[0]) for w in weights)
            fused_shared_bytes += sum(_nbytes(w[routed:]) for w in weights)
            not_dense.update(id(w) for w in weights)
        elif isinstance(module, KimiMLAAttention):
            kv_b = list(module.kv_b_proj.parameters())
            not_dense.update(id(p) for p in kv_b)
            if module.w_uk is not None:
                absorbed_bytes += _nbytes(module.w_uk) + _nbytes(module.w_uv)
            else:  # not processed yet (e.g. on meta): the same values in the model dtype
                itemsize = module.kv_a_layernorm.weight.element_size()
                absorbed_bytes += module.kv_b_proj.weight.numel() * itemsize
    params = list(text.parameters())
    dense_bytes = sum(_nbytes(p) for p in params if id(p) not in not_dense)
    kda = mla = 0
    for spec in text.get_kv_cache_spec().values():
        if isinstance(spec, KDAStateSpec):
            kda += spec.bytes_per_slot
        elif isinstance(spec, MLAAttentionSpec):
            mla += spec.bytes_per_token
    return ModelFootprint(
        total_params=sum(p.numel() for p in params),
        embedding_params=0 if tied else embedding.numel(),
        lm_head_params=lm_head.numel(),
        lm_head_bytes=_nbytes(lm_head),
        routed_expert_params=routed_params,
        num_moe_layers=moe_layers,
        top_k=text.config.num_experts_per_token,
        params_per_expert=params_per_expert,
        dense_decode_bytes=dense_bytes + fused_shared_bytes + absorbed_bytes,
        embedding_row_bytes=_nbytes(embedding[0]),
        expert_bytes=expert_bytes,
        kda_state_bytes_per_seq=kda,
        mla_bytes_per_token=mla,
    )
