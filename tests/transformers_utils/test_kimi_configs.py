"""Kimi-Linear / Kimi-K3 configs: published values parse, derived facts hold, bad fields named."""

import json
import logging

import pytest

from vllm.transformers_utils.configs import KimiK3Config, KimiLinearConfig, load_model_config

KIMI_LINEAR_48B = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 163840,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 1024, "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True, "routed_scaling_factor": 2.446, "use_grouped_topk": True,
    "num_expert_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "torch_dtype": "bfloat16",
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4,
    },
}  # fmt: skip

K3_TEXT = dict(
    KIMI_LINEAR_48B,
    hidden_size=7168, num_hidden_layers=93, num_attention_heads=64, q_lora_rank=1536,
    mla_use_output_gate=True, num_experts=896, num_experts_per_token=16, num_shared_experts=2,
    moe_intermediate_size=3072, routed_expert_hidden_size=3584, latent_moe_use_norm=True,
    routed_scaling_factor=1.0, hidden_act="situ", activation_situ_beta=4.0,
    activation_situ_linear_beta=25.0, attn_res_block_size=12,
    linear_attn_config={
        "kda_layers": [i for i in range(1, 94) if i % 4 and i != 93],
        "full_attn_layers": [*range(4, 93, 4), 93],
        "num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
        "gate_lower_bound": -5.0, "use_full_rank_gate": True,
    },
)  # fmt: skip


def test_kimi_linear_published_config():
    cfg = KimiLinearConfig.from_dict(KIMI_LINEAR_48B)
    kda = [i for i in range(27) if cfg.is_kda_layer(i)]
    assert len(kda) == 20 and not cfg.is_kda_layer(3) and cfg.is_kda_layer(0)  # 1-based list
    assert not cfg.is_kda_layer(26)  # layer 27 (1-based) is MLA
    assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1)  # first_k_dense_replace = 1
    assert cfg.kda_num_heads == 32 and cfg.gate_lower_bound is None
    assert not cfg.use_full_rank_gate


def test_kimi_k3_text_config_through_the_wrapper(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "kimi_k3", "text_config": K3_TEXT, "vision_config": {"x": 1}})
    )
    cfg = load_model_config(tmp_path).text_config
    assert sum(cfg.is_kda_layer(i) for i in range(93)) == 69
    assert cfg.use_full_rank_gate and cfg.gate_lower_bound == -5.0 and cfg.hidden_act == "situ"
    assert cfg.attn_res_block_size == 12
    assert KimiK3Config.from_dict({"text_config": K3_TEXT}).vision_config == {}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"hidden_act": "gelu"}, "'hidden_act': 'gelu' is not one of"),
        ({"hidden_act": "situ"}, "'activation_situ_beta'"),
        ({"mla_use_nope": False}, "'mla_use_nope': only NoPE"),
        ({"moe_router_activation_func": "relu"}, "'moe_router_activation_func'"),
        ({"topk_method": "greedy"}, "'topk_method'"),
        ({"num_experts_per_token": 300}, "'num_experts_per_token'"),
        ({"rms_norm_eps": 0}, "'rms_norm_eps'"),
        ({"num_hidden_layers": "27"}, "'num_hidden_layers': must be a positive integer"),
        ({"rope_scaling": {"type": "yarn"}}, "'rope_scaling'"),
        ({"linear_attn_config": {"kda_layers": [1]}}, "'linear_attn_config.full_attn_layers'"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], kda_layers=[28])},
         r"'linear_attn_config.kda_layers': 1-based layer numbers \[28\]"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], kda_layers=[4])},
         "also full-attention"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], gate_lower_bound=-6)},
         "'linear_attn_config.gate_lower_bound'"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], typo=1)},
         "unknown keys"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], kda_layers=[1, 2])},
         r"'linear_attn_config.full_attn_layers': layers \[3, 5, .*\] are in neither list"),
        ({"rms_norm_eps": "1e-5"}, "'rms_norm_eps': must be a positive number"),
        ({"num_expert_group": 0}, "'num_expert_group': must be a positive integer"),
        ({"num_expert_group": 256, "topk_group": 1}, "need >= 2"),
        ({"num_expert_group": 64, "topk_group": 1}, "'topk_group': the kept groups hold fewer"),
        ({"attn_res_block_size": 0}, "'attn_res_block_size': must be a positive integer"),
        ({"attn_res_block_size": -12}, "'attn_res_block_size': must be a positive integer"),
        ({"attn_res_block_size": 2.5}, "'attn_res_block_size': .* got 2.5"),
        ({"attn_res_block_size": "12"}, "'attn_res_block_size': .* got '12'"),
        ({"attn_res_block_size": True}, "'attn_res_block_size': .* got True"),
        ({"hidden_size": True}, "'hidden_size': must be a positive integer, got True"),
        ({"rms_norm_eps": True}, "'rms_norm_eps': must be a positive number, got True"),
        ({"intermediate_size": -1}, "'intermediate_size': must be a positive integer, got -1"),
        # Overflowed inside torch.empty (a TypeError naming no field).
        ({"intermediate_size": 10**30}, f"'intermediate_size': must be at most {2**31 - 1}, got"),
        ({"attn_res_block_size": 2**31}, f"'attn_res_block_size': .* <= {2**31 - 1} when set"),
        ({"eos_token_id": 2**40}, "'eos_token_id'"),
        ({"kv_lora_rank": 0}, "'kv_lora_rank': must be a positive integer, got 0"),
        ({"first_k_dense_replace": -3}, "'first_k_dense_replace': .* non-negative .* got -3"),
        ({"tie_word_embeddings": "false"}, "'tie_word_embeddings': must be true or false"),
        ({"moe_layer_freq": "2"}, "'moe_layer_freq': must be a positive integer, got '2'"),
        ({"max_position_embeddings": 0}, "'max_position_embeddings'"),
        ({"eos_token_id": -1}, "'eos_token_id'"),
        ({"bos_token_id": "1"}, "'bos_token_id'"),
        ({"use_grouped_topk": False, "num_expert_group": 8, "topk_group": 4},
         "'use_grouped_topk'"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], kda_layers=5)},
         "'linear_attn_config.kda_layers': must be a list of integers, got 5"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], num_heads="32")},
         "'linear_attn_config.num_heads': must be a positive integer, got '32'"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"],
                                     short_conv_kernel_size=0)},
         "'linear_attn_config.short_conv_kernel_size': must be a positive integer, got 0"),
        # Accepted before and refused by the kernels at the first request, stopping the engine.
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"],
                                     short_conv_kernel_size=1)},
         r"'linear_attn_config.short_conv_kernel_size': must be in \[2, 4\] .* got 1"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"],
                                     short_conv_kernel_size=5)},
         r"'linear_attn_config.short_conv_kernel_size': must be in \[2, 4\] .* got 5"),
        ({"qk_rope_head_dim": 0}, "'qk_rope_head_dim': must be >= 1 with MLA layers"),
        ({"kv_lora_rank": 65536 - 63}, "'kv_lora_rank': .* must be <= 65536 .* got 65537"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], head_dim=96)},
         "'linear_attn_config.head_dim': must be a power of two <= 256, got 96"),
        ({"linear_attn_config": dict(KIMI_LINEAR_48B["linear_attn_config"], head_dim=512)},
         "'linear_attn_config.head_dim': must be a power of two <= 256, got 512"),
    ],
)  # fmt: skip
def test_bad_fields_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, **change))


def test_the_kernel_limits_the_config_checks_are_the_kernels():
    """The bounds the config refuses beyond are those the kernels check at run time (a drifted
    copy would let a config through to fail at the first request again)."""
    from vllm.model_executor.layers.ops.rms_norm import MAX_HIDDEN
    from vllm.models.kimi_k3.amd.ops.causal_conv1d import MAX_WIDTH
    from vllm.transformers_utils.configs import kimi_linear

    assert kimi_linear._CONV_WIDTHS == (2, MAX_WIDTH)
    for width in range(2, MAX_WIDTH + 1):  # every width the kernels take is accepted
        lac = dict(KIMI_LINEAR_48B["linear_attn_config"], short_conv_kernel_size=width)
        KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, linear_attn_config=lac))
    assert kimi_linear._MAX_MLA_CACHE_ROW == MAX_HIDDEN
    widest = dict(KIMI_LINEAR_48B, kv_lora_rank=MAX_HIDDEN - 64, qk_rope_head_dim=64)
    assert KimiLinearConfig.from_dict(widest).kv_lora_rank == MAX_HIDDEN - 64
    # Without MLA layers there is no cache row to bound.
    lac = dict(KIMI_LINEAR_48B["linear_attn_config"])
    lac["kda_layers"] = lac["kda_layers"] + lac["full_attn_layers"]
    lac["full_attn_layers"] = []
    KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, linear_attn_config=lac, qk_rope_head_dim=0))


@pytest.mark.parametrize(
    "name", ["intermediate_size", "max_position_embeddings", "attn_res_block_size", "pad_token_id"]
)
def test_the_int32_bound_itself_is_accepted(name):
    """2**31 - 1 fits the int32 indexing the bound is for: a required, an optional and a token id
    field take it (2**31 is refused, above)."""
    assert getattr(
        KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, **{name: 2**31 - 1})), name
    ) == (2**31 - 1)


def test_wrapper_prefixes_text_config_errors(tmp_path):
    with pytest.raises(ValueError, match="'text_config.hidden_act'"):
        KimiK3Config.from_dict({"text_config": dict(K3_TEXT, hidden_act="gelu")})
    with pytest.raises(ValueError, match="'text_config.attn_res_block_size'"):
        KimiK3Config.from_dict({"text_config": dict(K3_TEXT, attn_res_block_size=0)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="'model_type': 'llama'"):
        load_model_config(tmp_path)
    with pytest.raises(ValueError, match="cannot read model config"):
        load_model_config(tmp_path / "missing.json")


def test_engine_fields_are_kept_and_reachable_from_the_k3_wrapper():
    ids = {"eos_token_id": 163586, "bos_token_id": 163584, "pad_token_id": 163839}
    cfg = KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, max_position_embeddings=4096, **ids))
    assert (cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id) == tuple(ids.values())
    assert cfg.max_position_embeddings == 4096
    assert KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, eos_token_id=[1, 2])).eos_token_id == [
        1,
        2,
    ]
    # top-level ids (Kimi-K3's packaging) reach text_config; text_config's own are read too
    k3 = KimiK3Config.from_dict({"text_config": K3_TEXT, "max_position_embeddings": 8192, **ids})
    assert (k3.eos_token_id, k3.bos_token_id, k3.pad_token_id) == tuple(ids.values())
    assert k3.text_config.eos_token_id == 163586 and k3.max_position_embeddings == 8192
    inner = KimiK3Config.from_dict({"text_config": dict(K3_TEXT, eos_token_id=7)})
    assert inner.eos_token_id == 7
    with pytest.raises(ValueError, match="'eos_token_id': top level 1 disagrees"):
        KimiK3Config.from_dict({"text_config": dict(K3_TEXT, eos_token_id=7), "eos_token_id": 1})


def test_unread_fields_are_not_carried():
    cfg = KimiLinearConfig.from_dict(KIMI_LINEAR_48B)
    assert not hasattr(cfg, "num_key_value_heads") and not hasattr(cfg, "torch_dtype")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("where", ["none", "top", "text_config"])
def test_a_checkpoints_own_quantization_config_is_warned_about(tmp_path, where):
    quant = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"}
    config = {"model_type": "kimi_k3", "text_config": dict(K3_TEXT)}
    if where == "top":
        config["quantization_config"] = quant
    elif where == "text_config":
        config["text_config"]["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(config))
    records = _Records()
    logger = logging.getLogger("vllm.transformers_utils.configs.kimi_linear")
    logger.addHandler(records)
    try:
        load_model_config(tmp_path)  # the loader's reading: no warning
        assert not records.messages
        load_model_config(tmp_path, warn_checkpoint_quantization=True)
    finally:
        logger.removeHandler(records)
    warned = [m for m in records.messages if "quantization_config" in m]
    if where == "none":
        assert not warned
    else:
        assert len(warned) == 1
        assert "'compressed-tensors'" in warned[0] and "refused" in warned[0]


def test_model_max_length_bounds_the_context_as_upstream(tmp_path):
    """transformers' Kimi-Linear config keeps `max_position_embeddings` as `model_max_length`
    (its attribute map), so its `save_pretrained`, like the published config, writes only that
    name; upstream vLLM's context limit is the smaller of the two keys present. Read as absent,
    a 4096-token checkpoint was served up to the 1,048,576 default."""
    from hf_kimi_linear import TINY
    from transformers import KimiLinearConfig as HFKimiLinearConfig

    HFKimiLinearConfig(**TINY, max_position_embeddings=4096).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_max_length"] == 4096 and "max_position_embeddings" not in saved
    assert load_model_config(tmp_path).max_position_embeddings == 4096
    both = dict(KIMI_LINEAR_48B, max_position_embeddings=8192, model_max_length=4096)
    assert KimiLinearConfig.from_dict(both).max_position_embeddings == 4096
    both = dict(KIMI_LINEAR_48B, max_position_embeddings=2048, model_max_length=4096)
    assert KimiLinearConfig.from_dict(both).max_position_embeddings == 2048
    with pytest.raises(ValueError, match="'model_max_length': must be a positive integer"):
        KimiLinearConfig.from_dict(dict(KIMI_LINEAR_48B, model_max_length="4k"))
    # transformers' "no limit" (int(1e30)) leaves max_position_embeddings the limit.
    unlimited = dict(KIMI_LINEAR_48B, max_position_embeddings=8192, model_max_length=int(1e30))
    assert KimiLinearConfig.from_dict(unlimited).max_position_embeddings == 8192


def test_undecodable_config_is_named(tmp_path):
    """A config.json that is not UTF-8 is a ValueError naming the file, like malformed JSON (was
    the codec's bare message, naming no file)."""
    (tmp_path / "config.json").write_bytes(b'\xff{"model_type": "kimi_linear"}')
    with pytest.raises(ValueError, match=f"cannot read model config {tmp_path / 'config.json'}"):
        load_model_config(tmp_path)
