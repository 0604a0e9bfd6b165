"""The config-only built-in `kimi-linear-48b-a3b`: its published config validates, the model builds
on the meta device with the expected parameter counts (about 48 B total, 3 B active per token), it
loads only with dummy weights and runs only without a tokenizer; `model_footprint` counts a
loaded model as it counts the same model on meta."""

import dataclasses

import pytest
import torch

from vllm.config.quantization import parse_quantization_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.model_loader.builtin import CONFIG_ONLY_MODELS, resolve_model
from vllm.model_executor.model_loader.loader import build_model, load_model
from vllm.models.kimi_k3.amd.footprint import model_footprint
from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM
from vllm.models.kimi_k3.amd.model import KimiK3ForConditionalGeneration
from vllm.transformers_utils.configs import KimiK3Config, load_model_config

NAME = "kimi-linear-48b-a3b"


def test_config_is_the_published_architecture():
    folder, tiny = resolve_model(NAME)
    assert folder == CONFIG_ONLY_MODELS[NAME] and not tiny
    cfg = load_model_config(folder)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (27, 2304, 163840)
    mla = [i + 1 for i in range(27) if not cfg.is_kda_layer(i)]
    assert mla == [4, 8, 12, 16, 20, 24, 27]
    assert (cfg.num_experts, cfg.num_experts_per_token, cfg.num_shared_experts) == (256, 8, 1)
    assert (cfg.moe_intermediate_size, cfg.intermediate_size, cfg.first_k_dense_replace) == (
        1024,
        9216,
        1,
    )
    assert (cfg.kda_num_heads, cfg.kda_head_dim, cfg.use_full_rank_gate) == (32, 128, False)
    assert cfg.q_lora_rank is None and cfg.kv_lora_rank == 512
    assert cfg.max_position_embeddings == 1048576 and cfg.eos_token_id == 163586


def test_meta_build_counts_48b_total_3b_active():
    model = build_model(load_model_config(resolve_model(NAME)[0]), device="meta")
    assert isinstance(model, KimiLinearForCausalLM) and model.embed_tokens.weight.is_meta
    f = model_footprint(model)
    assert f.total_params == 49_122_681_728
    assert f.active_params_per_token == 3_106_972_544  # LM head included, embedding not
    assert f.lm_head_params == f.embedding_params == 163840 * 2304
    assert (f.num_moe_layers, f.top_k, f.params_per_expert) == (26, 8, 3 * 2304 * 1024)
    assert f.kda_state_bytes_per_seq == 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)
    assert f.mla_bytes_per_token == 7 * (512 + 64) * 2
    # Batch 1: ~6.2 GB of weights (8 experts per layer) plus the KDA state read and written.
    weights = f.decode_bytes([8] * 26, [1]) - 2 * f.kda_state_bytes_per_seq - 2 * 8064
    assert 6.2e9 < weights < 6.3e9
    with pytest.raises(ValueError, match="26 MoE layers"):
        f.decode_bytes([8], [1])


@pytest.mark.parametrize("load_format", ["auto", "safetensors"])
def test_loads_only_with_dummy_weights(load_format):
    with pytest.raises(ValueError, match="load_format='dummy'"):
        EngineArgs(
            model=NAME, load_format=load_format, skip_tokenizer_init=True
        ).create_engine_config()
    with pytest.raises(ValueError, match="config without weights"):
        load_model(NAME, load_format=load_format, device="meta")


def test_needs_skip_tokenizer_init():
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        EngineArgs(model=NAME, load_format="dummy").create_engine_config()
    config = EngineArgs(
        model=NAME, load_format="dummy", skip_tokenizer_init=True, max_model_len="8k",
        device="cpu",
    ).create_engine_config()  # fmt: skip
    assert config.model_config.tokenizer is None and config.model_config.max_model_len == 8000


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "kimi-k3-tiny"])
def test_footprint_of_a_loaded_model_equals_its_meta_count(name):
    loaded = model_footprint(load_model(name, dtype=torch.float32))
    config = load_model_config(resolve_model(name)[0])
    meta = build_model(config, torch.float32, device="meta")
    assert isinstance(meta, KimiK3ForConditionalGeneration) == isinstance(config, KimiK3Config)
    assert model_footprint(meta) == loaded


def test_fused_shared_expert_keeps_the_footprint(monkeypatch):
    """The shared expert fused into FusedMoE as expert 256 still counts as dense decode bytes,
    not as a routed expert: the footprint equals the unfused layout's."""
    config = load_model_config(resolve_model(NAME)[0])
    footprints = {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("VLLM_KIMI_FUSE_SHARED_EXPERTS", fuse)
        model = build_model(config, device="meta")
        moe = model.layers[1].block_sparse_moe
        assert moe.fuses_shared_experts == (fuse == "1")
        assert moe.experts.w13_weight.shape[0] == 256 + int(fuse)
        footprints[fuse] = model_footprint(model)
    assert footprints["1"] == footprints["0"]


def test_tied_embedding_counts_as_the_lm_head():
    """Tied, the one matrix is the LM head's: every step reads all of it and every sampled row
    multiplies by it. It was counted as the embedding, so the decode floor and the active
    parameters both lacked the head (755 MB of the 48B model's ~6.1 GB floor, were it tied)."""
    config = load_model_config(resolve_model("kimi-linear-tiny")[0])
    untied = model_footprint(build_model(config, device="meta"))
    tied_config = dataclasses.replace(config, tie_word_embeddings=True)
    tied = model_footprint(build_model(tied_config, device="meta"))
    head = config.vocab_size * config.hidden_size
    assert untied.lm_head_params == tied.lm_head_params == head
    assert (untied.embedding_params, tied.embedding_params) == (head, 0)
    assert tied.total_params == untied.total_params - head  # one matrix, not two
    assert tied.active_params_per_token == untied.active_params_per_token
    assert tied.dense_decode_bytes == untied.dense_decode_bytes


@pytest.mark.parametrize("by_path", [False, True])
def test_a_tiny_model_with_safetensors_is_refused_before_loading(by_path, monkeypatch):
    """A built-in tiny model has no weight files: "auto" means dummy for it, but an explicit
    "safetensors" is refused with the other arguments (named by path too), not once loading
    has begun."""
    from vllm.model_executor.model_loader import loader

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before load_format was checked")

    model = str(resolve_model("kimi-linear-tiny")[0]) if by_path else "kimi-linear-tiny"
    with pytest.raises(ValueError, match="^load_format 'safetensors': no safetensors checkpoint"):
        EngineArgs(model=model, load_format="safetensors").create_engine_config()
    monkeypatch.setattr(loader, "build_model", no_build)
    with pytest.raises(ValueError, match="^load_format 'safetensors': no safetensors checkpoint"):
        load_model(model, load_format="safetensors", device="meta")
    monkeypatch.undo()
    EngineArgs(model=model).create_engine_config()  # "auto": dummy weights


def test_ptpc_batch_1_floor_counted_by_hand():
    """The batch-1 floor of the PTPC model as loaded, against the published config by hand: the
    27 `o_proj` weights (KDA and MLA alike, 4096 -> 2304) read at one byte each plus an fp32 scale
    per output channel, 255 MB under the bf16 model; the routers, conv taps, A_log and dt_bias
    in fp32, as held; 8 routed experts and the fused shared expert per MoE layer."""
    config = load_model_config(resolve_model(NAME)[0])
    recipe = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    packed = KimiLinearForCausalLM.packed_modules_mapping
    quant = OnlineQuantizationConfig(parse_quantization_config(recipe), packed)
    model = build_model(config, quant_config=quant, device="meta")
    model.process_weights_after_loading()  # quantizes o_proj, derives W_UK / W_UV (shapes only)
    o_proj_weights = [p for n, p in model.named_parameters() if n.endswith("o_proj.weight")]
    assert len(o_proj_weights) == 27 and {p.element_size() for p in o_proj_weights} == {1}
    o_proj = 27 * (4096 * 2304 + 4 * 2304)
    bf16 = (
        20 * (2304 * (3 * 4096 + 128 + 128 + 32) + 2 * 128 * 4096 + 128)  # KDA
        + 7 * (2304 * (32 * 192 + 576) + 512 * 32 * 256 + 512)  # MLA, W_UK / W_UV as kv_b
        + 3 * 2304 * 9216  # layer 0's dense MLP
        + 26 * 9 * 3 * 2304 * 1024  # 8 routed experts and the shared one
        + 27 * 2 * 2304 + 2304  # layer norms, final norm
        + 163840 * 2304 + 2304  # LM head, one embedding row
    )  # fmt: skip
    fp32 = 26 * (256 * 2304 + 256) + 20 * (3 * 4096 * 4 + 32 + 4096)
    weights = 2 * bf16 + 4 * fp32 + o_proj
    assert weights == 5_992_209_920
    kda_state = 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)  # recurrent fp32, conv window bf16
    mla = 7 * (512 + 64) * 2  # 8064 B a token: the one context token read and written
    f = model_footprint(model)
    assert f.decode_bytes([8] * 26, [1]) == weights + 2 * kda_state + 2 * mla
