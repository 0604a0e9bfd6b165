"""The checkpoint tensors a Kimi-Linear / Kimi-K3 config implies: name -> full (unsharded) shape.

Used for completeness (a missing tensor is named by its checkpoint name, also when it is one part
of a fused parameter) and for dummy weights (drawn per checkpoint tensor, so every TP size loads
the same model). Names are the canonical ones the model's `load_weights` reports: the dense MLP as
`mlp.*` (transformers' `block_sparse_moe.*` spelling is mapped to it on load), `A_log` as `[H]`
(legacy `(1, 1, H, 1)` is accepted on load), no multi-token-prediction layers, no `lm_head` when
tied. Kimi-K3's `language_model.*` names are these mapped by `model.k3_checkpoint_name`. The
models expose them as `checkpoint_tensors(config)`, which the loader reaches through
`vllm.models.registry`.
"""

from vllm.transformers_utils.configs import KimiLinearConfig

Shapes = dict[str, tuple[int, ...]]


def _kda(cfg: KimiLinearConfig, p: str) -> Shapes:
    h, heads, d = cfg.hidden_size, cfg.kda_num_heads, cfg.kda_head_dim
    proj, width = heads * d, cfg.kda_conv_kernel_size
    out = {f"{p}.{x}_proj.weight": (proj, h) for x in ("q", "k", "v")}
    if cfg.use_full_rank_gate:
        out[f"{p}.g_proj.weight"] = (proj, h)
    else:
        out[f"{p}.g_a_proj.weight"] = (d, h)
        out[f"{p}.g_b_proj.weight"] = (proj, d)
    out |= {f"{p}.f_a_proj.weight": (d, h), f"{p}.f_b_proj.weight": (proj, d)}
    out[f"{p}.b_proj.weight"] = (heads, h)
    out |= {f"{p}.{x}_conv1d.weight": (proj, 1, width) for x in ("q", "k", "v")}
    out |= {f"{p}.A_log": (heads,), f"{p}.dt_bias": (proj,), f"{p}.o_norm.weight": (d,)}
    out[f"{p}.o_proj.weight"] = (h, proj)
    return out


def _mla(cfg: KimiLinearConfig, p: str) -> Shapes:
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    out: Shapes = {}
    if cfg.q_lora_rank:
        out[f"{p}.q_a_proj.weight"] = (cfg.q_lora_rank, h)
        out[f"{p}.q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        out[f"{p}.q_b_proj.weight"] = (heads * qk, cfg.q_lora_rank)
    else:
        out[f"{p}.q_proj.weight"] = (heads * qk, h)
    out[f"{p}.kv_a_proj_with_mqa.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h)
    if cfg.mla_use_output_gate:
        out[f"{p}.g_proj.weight"] = (heads * cfg.v_head_dim, h)
    out[f"{p}.kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
    out[f"{p}.kv_b_proj.weight"] = (
        heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
        cfg.kv_lora_rank,
    )
    out[f"{p}.o_proj.weight"] = (h, heads * cfg.v_head_dim)
    return out


def _mlp(h: int, inter: int, p: str) -> Shapes:
    return {
        f"{p}.gate_proj.weight": (inter, h),
        f"{p}.up_proj.weight": (inter, h),
        f"{p}.down_proj.weight": (h, inter),
    }


def _moe(cfg: KimiLinearConfig, p: str) -> Shapes:
    h, e, inter = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    routed = cfg.routed_expert_hidden_size or h
    out: Shapes = {f"{p}.gate.weight": (e, h), f"{p}.gate.e_score_correction_bias": (e,)}
    for i in range(e):
        out[f"{p}.experts.{i}.w1.weight"] = (inter, routed)
        out[f"{p}.experts.{i}.w2.weight"] = (routed, inter)
        out[f"{p}.experts.{i}.w3.weight"] = (inter, routed)
    if cfg.num_shared_experts:
        out |= _mlp(h, inter * cfg.num_shared_experts, f"{p}.shared_experts")
    if cfg.routed_expert_hidden_size:
        out[f"{p}.routed_expert_down_proj.weight"] = (routed, h)
        out[f"{p}.routed_expert_up_proj.weight"] = (h, routed)
        if cfg.latent_moe_use_norm:
            out[f"{p}.routed_expert_norm.weight"] = (routed,)
    return out


def text_checkpoint_tensors(cfg: KimiLinearConfig) -> Shapes:
    """Every checkpoint tensor of the Kimi-Linear text model of `cfg`, by canonical name, with its
    full shape, in checkpoint order (embeddings, layers, norm, head)."""
    h = cfg.hidden_size
    out: Shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    attn_res = cfg.attn_res_block_size is not None
    if attn_res:
        out["model.output_attn_res_norm.weight"] = (h,)
        out["model.output_attn_res_proj.weight"] = (1, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = (h,)
        out[f"{p}.post_attention_layernorm.weight"] = (h,)
        if attn_res:
            for sub in ("self_attention", "mlp"):
                out[f"{p}.{sub}_res_norm.weight"] = (h,)
                out[f"{p}.{sub}_res_proj.weight"] = (1, h)
        attn = _kda if cfg.is_kda_layer(i) else _mla
        out |= attn(cfg, f"{p}.self_attn")
        if cfg.is_moe_layer(i):
            out |= _moe(cfg, f"{p}.block_sparse_moe")
        else:
            out |= _mlp(h, cfg.intermediate_size, f"{p}.mlp")
    return out
