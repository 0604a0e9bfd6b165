"""`--quantization-config` parsing, and the PR recipe's ignore pattern over Kimi-K3's layers."""

import re

import pytest
import torch

from vllm.config.quantization import QuantizationConfigArgs, parse_quantization_config
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.layers.quantization.online.fp8 import Fp8PtpcOnlineLinearMethod
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticChannelSym

# As the PR's command line passes it: shell single quotes, JSON-escaped backslash.
PR_RECIPE = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'

# Kimi-K3 text model: 93 layers, MLA at these 1-based indices, KDA elsewhere (upstream-facts D.1).
MLA_LAYERS = set(range(4, 93, 4)) | {93}
PACKED = {
    "in_proj_qkvgfab": ["q_proj", "k_proj", "v_proj", "g_proj", "f_a_proj", "g_a_proj", "b_proj"],
    "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa", "g_proj"],
    "fused_q_kv_a_proj": ["q_proj", "kv_a_proj_with_mqa", "g_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


def kimi_k3_linear_layers() -> list[tuple[str, type, dict]]:
    """(module path, linear class, extra kwargs) of every linear layer of the text model."""
    layers = []
    for i in range(93):
        p = f"language_model.model.layers.{i}."
        if i + 1 in MLA_LAYERS:
            layers += [
                (p + "self_attn.fused_qkv_a_proj", MergedColumnParallelLinear, {}),
                (p + "self_attn.q_b_proj", ColumnParallelLinear, {}),
                (p + "self_attn.kv_b_proj", ColumnParallelLinear, {}),
            ]
        else:
            layers += [
                (p + "self_attn.in_proj_qkvgfab", MergedColumnParallelLinear, {}),
                (p + "self_attn.f_b_proj", ColumnParallelLinear, {}),
            ]
        layers.append((p + "self_attn.o_proj", RowParallelLinear, {}))
        mlp = p + ("mlp." if i == 0 else "block_sparse_moe.shared_experts.")
        layers += [
            (mlp + "gate_up_proj", MergedColumnParallelLinear, {}),
            (mlp + "down_proj", RowParallelLinear, {}),
        ]
        if i > 0:
            layers += [
                (p + "block_sparse_moe.routed_expert_up_proj", ReplicatedLinear, {}),
                (p + "block_sparse_moe.routed_expert_down_proj", ReplicatedLinear, {}),
            ]
    return layers


def build(cls, prefix, quant_config):
    if cls is MergedColumnParallelLinear:
        return cls(32, [16, 16], bias=False, quant_config=quant_config, prefix=prefix)
    return cls(32, 16, bias=False, quant_config=quant_config, prefix=prefix)


def test_pr_recipe_quantizes_exactly_the_attention_o_proj_layers():
    args = parse_quantization_config(PR_RECIPE)
    assert args.ignore == ["re:(?!.*self_attn\\.o_proj$).*"]
    config = OnlineQuantizationConfig(args, PACKED)
    quantized = []
    for prefix, cls, _ in kimi_k3_linear_layers():
        layer = build(cls, prefix, config)
        if isinstance(layer.quant_method, Fp8PtpcOnlineLinearMethod):
            quantized.append(prefix)
    assert len(quantized) == 93
    assert all(p.endswith(".self_attn.o_proj") for p in quantized)
    mla = [p for p in quantized if int(p.split(".")[3]) + 1 in MLA_LAYERS]
    assert len(mla) == 24  # MLA and KDA o_proj alike: both live under self_attn


def test_low_rank_gate_shard_follows_the_fused_kda_projection():
    """Kimi-Linear's `g_a_proj` is a shard of `in_proj_qkvgfab`: the PR recipe leaves the fused
    layer (and so g_a) unquantized, as it left the separate g_a_proj; an ignore rule that names
    g_a_proj alone would split the fused layer and is refused."""
    from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM

    packed = KimiLinearForCausalLM.packed_modules_mapping
    assert packed == PACKED
    fused = "model.layers.0.self_attn.in_proj_qkvgfab"
    config = OnlineQuantizationConfig(parse_quantization_config(PR_RECIPE), packed)
    method = build(MergedColumnParallelLinear, fused, config).quant_method
    assert type(method).__name__ == "UnquantizedLinearMethod"
    split = parse_quantization_config({"linear": "fp8_per_channel", "ignore": ["re:.*g_a_proj"]})
    with pytest.raises(ValueError, match="split the fused layer"):
        split.should_ignore(fused, packed["in_proj_qkvgfab"])


def test_kimi_linear_mla_projection_follows_its_shards():
    """Kimi-Linear's MLA (no q_lora) holds `q_proj` and `kv_a_proj_with_mqa` in one
    `fused_q_kv_a_proj`: the PR recipe leaves it unquantized, as it left both, and quantizes only
    `o_proj`; a rule naming one of the two alone would split the fused layer and is refused."""
    from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
    from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM
    from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
    from vllm.transformers_utils.configs import load_model_config

    packed = KimiLinearForCausalLM.packed_modules_mapping
    config = OnlineQuantizationConfig(parse_quantization_config(PR_RECIPE), packed)
    model_config = load_model_config(BUILTIN_MODELS["kimi-linear-tiny"])
    prefix = "model.layers.3.self_attn"
    mla = KimiMLAAttention(model_config, torch.bfloat16, config, prefix)
    methods = {
        n: type(m.quant_method).__name__ for n, m in mla.named_children() if n != "kv_a_layernorm"
    }
    assert methods == {
        "fused_q_kv_a_proj": "UnquantizedLinearMethod",
        "kv_b_proj": "UnquantizedLinearMethod",
        "o_proj": "Fp8PtpcOnlineLinearMethod",
    }
    split = parse_quantization_config(
        {"linear": "fp8_per_channel", "ignore": ["re:.*kv_a_proj_with_mqa$"]}
    )
    with pytest.raises(ValueError, match="split the fused layer"):
        split.should_ignore(f"{prefix}.fused_q_kv_a_proj", packed["fused_q_kv_a_proj"])


def test_shorthand_fills_linear():
    args = parse_quantization_config({"linear": "fp8_per_channel", "moe": None})
    assert args.linear.weight == kFp8StaticChannelSym
    assert parse_quantization_config({"linear": {"weight": "fp8_per_channel_static"}}).linear == (
        args.linear
    )


@pytest.mark.parametrize("moe", ["fp8_per_channel", {"weight": "fp8_per_channel_static"}, 3])
def test_moe_field_is_refused_by_name(moe):
    # parsed but never applied: the routed experts silently stayed bf16
    with pytest.raises(ValueError, match="'moe': MoE online FP8 is not implemented"):
        parse_quantization_config({"linear": "fp8_per_channel", "moe": moe})


def test_regex_is_anchored_at_the_start_only():
    args = parse_quantization_config({"linear": "fp8_per_channel", "ignore": ["re:model"]})
    assert args.should_ignore("model.layers.0.mlp.down_proj")  # re.match: a prefix suffices
    assert not args.should_ignore("lm.model.layers.0")


def test_args_built_directly_honour_their_ignore_patterns():
    args = QuantizationConfigArgs(ignore=["re:.*o_proj$", "lm_head"])
    assert args.should_ignore("model.layers.0.self_attn.o_proj")
    assert args.should_ignore("lm_head")
    assert not args.should_ignore("model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match=r"'ignore\[0\]': invalid regex"):
        QuantizationConfigArgs(ignore=["re:("])


def test_plain_patterns_are_exact_or_fnmatch():
    args = parse_quantization_config(
        {"linear": "fp8_per_channel", "ignore": ["lm_head", "model.layers.*.mlp.down_proj"]}
    )
    assert args.should_ignore("lm_head") and not args.should_ignore("lm_head2")
    assert args.should_ignore("model.layers.3.mlp.down_proj")
    assert not args.should_ignore("model.layers.3.mlp.gate_up_proj")


def test_fused_layer_follows_its_shards_and_they_must_agree():
    both = parse_quantization_config({"ignore": ["*.gate_proj", "*.up_proj"]})
    assert both.should_ignore("m.mlp.gate_up_proj", ["gate_proj", "up_proj"])
    one = parse_quantization_config({"ignore": ["*.gate_proj"]})
    with pytest.raises(ValueError, match="split the fused layer"):
        one.should_ignore("m.mlp.gate_up_proj", ["gate_proj", "up_proj"])


@pytest.mark.parametrize(
    "config,message",
    [
        ("{linear: fp8}", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"linear": "fp4_magic"}', "field 'linear': unknown scheme 'fp4_magic'"),
        ('{"linear": 3}', "field 'linear' must be a string or an object"),
        ('{"ignore": ["re:(unclosed"]}', r"field 'ignore\[0\]': invalid regex"),
        ('{"ignore": "re:.*"}', "'ignore' must be a list of strings"),
        ('{"linear": {"weight": "fp8_per_channel_static", "activation": "fp8_per_token"}}',
         "'linear.activation': an activation override is not supported"),
        ('{"linear": {"scale": 1}}', "unknown keys"),
        ('{"targets": {"re:.*": "fp8_per_channel"}}', "field 'targets': is not supported"),
        ('{"kv_cache": "fp8"}', "unknown field 'kv_cache'"),
        ('{"linear": {"weight": null}}', "'linear.weight' must be a scheme name, got None"),
        ('{"linear": {"weight": {"weight": "fp8_per_channel"}}}', "'linear.weight' must be a"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_field(config, message):
    with pytest.raises(ValueError, match=message):
        parse_quantization_config(config)


@pytest.mark.parametrize(
    "config", [{}, {"linear": None}, {"ignore": ["lm_head"]}, {"moe": None, "targets": None}]
)
def test_config_without_a_scheme_is_refused(config):
    """Upstream's online config refuses one that sets none of its schemes (linear, moe,
    targets): it would quantize no layer while the user believes the model quantized."""
    with pytest.raises(ValueError, match="field 'linear' must name a scheme"):
        OnlineQuantizationConfig(parse_quantization_config(config))


def test_linear_scheme_without_online_method_is_rejected():
    with pytest.raises(ValueError, match="no online method"):
        OnlineQuantizationConfig(parse_quantization_config({"linear": "fp8_per_token"}))


def test_unselected_layers_keep_the_default_method():
    config = OnlineQuantizationConfig(
        parse_quantization_config({"linear": "fp8_per_channel", "ignore": ["re:.*"]})
    )
    layer = RowParallelLinear(32, 16, params_dtype=torch.bfloat16, quant_config=config)
    assert type(layer.quant_method).__name__ == "UnquantizedLinearMethod"


def test_ignore_patterns_that_match_no_layer_of_the_built_model_are_reported(vllm_records):
    """K3's checkpoint spells a layer `language_model.layers.0...`, its module is
    `language_model.model.layers.0...`: an exact pattern copied from the checkpoint keeps nothing
    in bf16, and the build says so (naming only the patterns that matched nothing)."""

    from vllm.model_executor.model_loader.builtin import resolve_model
    from vllm.model_executor.model_loader.loader import build_model
    from vllm.models.registry import model_class
    from vllm.transformers_utils.configs import load_model_config

    hf_config = load_model_config(resolve_model("kimi-k3-tiny")[0])
    checkpoint_name = "language_model.layers.0.mlp.down_proj"
    # Besides: two patterns naming one layer (both used, not only the first).
    ignore = [checkpoint_name, "re:.*\\.(gate|up)_proj$", "*.down_proj", "re:.*down_proj$"]
    args = parse_quantization_config({"linear": "fp8_per_channel", "ignore": ignore})
    quant = OnlineQuantizationConfig(args, model_class(hf_config).packed_modules_mapping)
    build_model(hf_config, torch.bfloat16, quant, "meta")
    assert args.unmatched_ignore() == [checkpoint_name]  # (gate|up)_proj: shards of gate_up_proj
    messages = [r.getMessage() for r in vllm_records if "match no linear layer" in r.getMessage()]
    assert len(messages) == 1 and repr(checkpoint_name) in messages[0]
    assert "(gate|up)_proj" not in messages[0]


def test_a_pattern_naming_a_shard_of_an_ignored_fused_layer_counts_as_used():
    """`gate_up_proj` ignored by its own name; the pattern naming its `up_proj` shard also selects
    that layer, so it is no pattern that matches nothing."""
    fused, shard = "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.up_proj"
    args = parse_quantization_config({"linear": "fp8_per_channel", "ignore": [fused, shard, "x"]})
    assert args.should_ignore(fused, ["gate_proj", "up_proj"])
    assert args.unmatched_ignore() == ["x"]


def test_null_activation_is_absent():
    """Upstream refuses only an activation that is set; null is its default (none)."""
    spec = {"weight": "fp8_per_channel_static", "activation": None}
    assert parse_quantization_config({"linear": spec}).linear.weight == kFp8StaticChannelSym


def test_null_targets_is_absent_like_null_moe():
    """Both are upstream fields refused here by name; null means absent for either."""
    assert parse_quantization_config({"linear": "fp8_per_channel", "targets": None}).linear == (
        parse_quantization_config({"linear": "fp8_per_channel", "moe": None}).linear
    )


@pytest.mark.parametrize(
    "model, layer, shards",
    [
        ("kimi-linear-tiny", "layers.0.self_attn", "(q|k|v|g_a|f_a|b)_proj"),  # low-rank gate KDA
        ("kimi-k3-tiny", "layers.0.self_attn", "(q|k|v|g|f_a|b)_proj"),  # full-rank gate KDA
        ("kimi-linear-tiny", "layers.3.self_attn", "(q_proj|kv_a_proj_with_mqa)"),  # MLA, no gate
    ],
)
def test_rule_naming_every_shard_a_fused_layer_holds_ignores_it(model, layer, shards):
    """The model-wide mapping lists the shards a fused layer may hold (g_proj or g_a_proj, MLA's
    gate); a shard this layer lacks must not count as "not ignored": the rule was refused as
    splitting the layer (e.g. {'g_proj': False} for a KDA layer that has no g_proj)."""
    from vllm.model_executor.model_loader.builtin import resolve_model
    from vllm.model_executor.model_loader.loader import build_model
    from vllm.models.registry import model_class
    from vllm.transformers_utils.configs import load_model_config

    hf_config = load_model_config(resolve_model(model)[0])
    pattern = "re:.*\\." + re.escape(layer) + "\\." + shards + "$"
    args = parse_quantization_config({"linear": "fp8_per_channel", "ignore": [pattern]})
    quant = OnlineQuantizationConfig(args, model_class(hf_config).packed_modules_mapping)
    built = build_model(hf_config, torch.bfloat16, quant, "meta")
    methods = {
        m.prefix: type(m.quant_method).__name__
        for m in built.modules()
        if getattr(m, "shard_names", None) and f".{layer}." in m.prefix
    }
    assert methods and set(methods.values()) == {"UnquantizedLinearMethod"}, methods
