"""The Kimi-Linear causal LM against transformers' `KimiLinearForCausalLM` (pure torch, fp32):
a random tiny model saved with `save_pretrained` (the real Kimi checkpoint names) and loaded by
name, prompts of different lengths prefilled in one batch, then decode steps through our caches."""

import pytest
import torch
from engine_harness import EngineHarness as Harness
from hf_kimi_linear import random_hf_model
from safetensors.torch import load_file

from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM
from vllm.transformers_utils.configs import load_model_config

# The CPU tests run again on a GPU with fla-core's kernels (marked `gpu`).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

pytestmark = pytest.mark.usefixtures("interpreter_moe_blocks")


@pytest.fixture(scope="module")
def checkpoint(hf_kimi_linear, tmp_path_factory):
    """(folder, transformers model) of a random tiny Kimi-Linear saved with save_pretrained."""
    model = random_hf_model(hf_kimi_linear)
    folder = tmp_path_factory.mktemp("kimi_linear_tiny")
    model.save_pretrained(folder)
    return folder, model


def load_ours(folder, device="cpu"):
    model = KimiLinearForCausalLM(load_model_config(folder), params_dtype=torch.float32)
    loaded = model.load_weights(load_file(folder / "model.safetensors").items())
    assert "lm_head.weight" in loaded
    model.to(device)
    model.process_weights_after_loading()
    return model


@pytest.mark.parametrize("device", DEVICES)
def test_logits_match_transformers_prefill_and_decode(checkpoint, device):
    folder, hf = checkpoint
    model = load_ours(folder, device)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    steps = 3
    full = [p + torch.randint(3, 128, (steps,), generator=gen).tolist() for p in prompts]
    with torch.no_grad():
        expected = [hf(torch.tensor([f])).logits[0].float() for f in full]
    harness = Harness(model, device=device)
    out = harness.step({i: p for i, p in enumerate(prompts)}).cpu()
    got = list(out.split([len(p) for p in prompts]))
    for s in range(steps):
        order = [1, 2, 0]
        out = harness.step({i: [full[i][len(prompts[i]) + s]] for i in order}).cpu()
        for row, i in enumerate(order):
            got[i] = torch.cat([got[i], out[row : row + 1]])
    # fp32 on both sides; KDA's chunked (transformers) vs recurrent (ours) summation order and
    # the MoE's expert order differ: relative error well under 1e-4. On a GPU fla's chunk
    # kernels round their fp32 dot inputs to TF32 (2^-11 relative): ~1e-3, bound 1e-2.
    bound = 1e-4 if device == "cpu" else 1e-2
    for g, e in zip(got, expected, strict=True):
        assert float((g - e).norm() / e.norm()) < bound


@pytest.mark.parametrize("device", DEVICES)
def test_sequence_alone_or_in_a_batch_decodes_the_same(checkpoint, device):
    folder, _ = checkpoint
    model = load_ours(folder, device)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]

    def greedy(batch_ids, steps=4):
        harness = Harness(model, device=device)
        logits = harness.step({i: prompts[i] for i in batch_ids})
        ends = torch.tensor([len(prompts[i]) for i in batch_ids]).cumsum(0) - 1
        tokens = {
            i: [int(logits[e].argmax())] for i, e in zip(batch_ids, ends.tolist(), strict=True)
        }
        for _ in range(steps - 1):
            logits = harness.step({i: [tokens[i][-1]] for i in batch_ids})
            for row, i in enumerate(batch_ids):
                tokens[i].append(int(logits[row].argmax()))
        return tokens

    together = greedy([0, 1, 2])
    for i in range(3):
        assert greedy([i])[i] == together[i]


def test_loading_errors_name_the_tensor(checkpoint):
    folder, _ = checkpoint
    tensors = load_file(folder / "model.safetensors")
    model = KimiLinearForCausalLM(load_model_config(folder), params_dtype=torch.float32)
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'model.layers.0.extra'"):
        model.load_weights([("model.layers.0.extra", torch.zeros(1))])
    with pytest.raises(ValueError, match="model.embed_tokens.weight: checkpoint shape"):
        model.load_weights([("model.embed_tokens.weight", torch.zeros(3, 64))])
    bad = tensors["model.layers.1.self_attn.kv_b_proj.weight"][:, :-1]
    with pytest.raises(ValueError, match="kv_b_proj"):
        model.load_weights([("model.layers.1.self_attn.kv_b_proj.weight", bad)])


@pytest.mark.parametrize("device", DEVICES)
def test_ptpc_recipe_fused_vs_unfused_and_vs_bf16(checkpoint, monkeypatch, device):
    from vllm.config.quantization import parse_quantization_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.models.kimi_k3.amd.kda import KimiK3DeltaAttention

    folder, _ = checkpoint
    recipe = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    tensors = load_file(folder / "model.safetensors")

    def build(quant):
        config = OnlineQuantizationConfig(parse_quantization_config(recipe)) if quant else None
        model = KimiLinearForCausalLM(load_model_config(folder), torch.float32, config)
        model.load_weights(tensors.items())
        model.to(device)
        model.process_weights_after_loading()
        return model

    fused, unfused, plain = build(True), build(True), build(False)
    o_projs = [type(layer.self_attn.o_proj.quant_method).__name__ for layer in fused.layers]
    assert o_projs == ["Fp8PtpcOnlineLinearMethod"] * 3  # KDA and MLA o_proj, nothing else
    for layer in unfused.layers:
        if isinstance(layer.self_attn, KimiK3DeltaAttention):
            monkeypatch.setattr(layer.self_attn, "o_proj_is_ptpc_fp8", lambda: False)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]]
    logits = {}
    for name, model in (("fused", fused), ("unfused", unfused), ("plain", plain)):
        harness = Harness(model, device=device)
        logits[name] = harness.step({i: p for i, p in enumerate(prompts)}).cpu()

    def kl(p_logits, q_logits):
        p, q = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
        return float((p.exp() * (p - q)).sum(-1).max())

    # Fused and unfused epilogues differ only by rounding the normed activation before the FP8
    # quantization (fp32 here: not at all, so codes match except at rounding ties), and PTPC
    # differs from unquantized o_proj by FP8 rounding (~2^-4 relative per element): small KL.
    assert torch.equal(logits["fused"].argmax(-1), logits["unfused"].argmax(-1))
    assert kl(logits["unfused"], logits["fused"]) < 1e-4
    assert kl(logits["plain"], logits["fused"]) < 1e-2


# ---------------------------------------------------------------------------------------------
# load_model: safetensors (single / sharded), completeness, dummy weights, K3 names
# ---------------------------------------------------------------------------------------------


def test_load_model_single_and_sharded_give_the_same_model(checkpoint, tmp_path):
    from safetensors.torch import save_file

    from vllm.model_executor.model_loader.loader import load_model

    folder, hf = checkpoint
    single = load_model(folder, dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    sharded = load_model(tmp_path, dtype=torch.float32)
    prompts = {0: [5, 6, 7], 1: [8, 9]}
    torch.testing.assert_close(Harness(single).step(prompts), Harness(sharded).step(prompts))

    tensors = load_file(folder / "model.safetensors")
    tensors.pop("model.layers.2.self_attn.q_conv1d.weight")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    save_file(tensors, broken / "model.safetensors")
    missing = r"missing tensors for the parameters: model\.layers\.2\.self_attn\.q_conv1d\.weight$"
    with pytest.raises(ValueError, match=missing):
        load_model(broken, dtype=torch.float32)
    tensors["model.layers.2.self_attn.q_conv1d.weight"] = torch.zeros(64, 1, 4)
    tensors["model.layers.2.self_attn.extra.weight"] = torch.zeros(1)
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'extra.weight'"):
        load_model(broken, dtype=torch.float32)


def test_dummy_weights_are_deterministic_and_sane(checkpoint):
    from vllm.model_executor.model_loader.loader import load_model

    folder, _ = checkpoint
    a = load_model(folder, "dummy", torch.float32, seed=3)
    b = load_model(folder, "dummy", torch.float32, seed=3)
    c = load_model(folder, "dummy", torch.float32, seed=4)
    prompts = {0: [5, 6, 7, 8]}
    la, lb, lc = (Harness(m).step(prompts) for m in (a, b, c))
    assert torch.equal(la, lb) and not torch.equal(la, lc)
    assert torch.isfinite(la).all() and 0.1 < float(la.std()) < 100


def test_kimi_k3_checkpoint_names_map_to_the_text_model():
    from vllm.models.kimi_k3.amd.model import map_k3_checkpoint_name as map_checkpoint_name

    assert map_checkpoint_name("language_model.layers.3.self_attn.o_proj.weight") == (
        "model.layers.3.self_attn.o_proj.weight"
    )
    assert map_checkpoint_name("language_model.model.norm.weight") == "model.norm.weight"
    assert map_checkpoint_name("language_model.lm_head.weight") == "lm_head.weight"
    assert map_checkpoint_name("vision_tower.blocks.0.attn.qkv.weight") is None
    assert map_checkpoint_name("model.layers.0.mlp.gate_proj.weight") == (
        "model.layers.0.mlp.gate_proj.weight"
    )


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "kimi-k3-tiny"])
def test_builtin_tiny_models_run_with_their_tokenizer(name, torch_reference_kernels):
    # torch references: this checks loading, tokenizers and recipes; the interpreted kernels of
    # kimi-linear-tiny's MoE took 90 s here (they have their own tests)
    from vllm.config.quantization import parse_quantization_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
    from vllm.model_executor.model_loader.loader import load_model
    from vllm.transformers_utils.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(BUILTIN_MODELS[name])
    ids = tokenizer.encode("Question: 12 + 30 = ?")
    assert tokenizer.decode(ids) == "Question: 12 + 30 = ?"
    recipe = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    quant = OnlineQuantizationConfig(parse_quantization_config(recipe))
    model = load_model(name, dtype=torch.float32, quant_config=quant)
    text = getattr(model, "language_model", model)
    cfg = text.config
    if name == "kimi-k3-tiny":
        assert type(model).__name__ == "KimiK3ForConditionalGeneration"
        assert (cfg.kda_num_heads, cfg.kda_head_dim) == (12, 128)  # K3's per-GPU KDA shape
        assert cfg.use_full_rank_gate and cfg.q_lora_rank and cfg.routed_expert_hidden_size
        assert cfg.attn_res_block_size == 2 and text.output_attn_res_proj.weight.shape == (1, 512)
    else:  # Kimi-Linear has no AttnRes (and transformers' model, its reference, neither)
        assert cfg.attn_res_block_size is None and not hasattr(text, "output_attn_res_proj")
    assert all(layer.self_attn.o_proj._input_quant_key for layer in text.layers)
    again = load_model(name, dtype=torch.float32, quant_config=quant)
    a = Harness(model).step({0: ids, 1: ids[:5]})
    b = Harness(again).step({0: ids, 1: ids[:5]})
    assert torch.equal(a, b) and torch.isfinite(a).all()  # deterministic built-in weights
    # A prompt's prefix inside a longer prompt gives its logits. Checked without quantization:
    # BLAS may round a row differently by its position in the batch (an ulp), and per-token FP8
    # turns such an ulp at a rounding tie into a whole FP8 step (seen on the H200 host's CPU).
    plain = Harness(load_model(name, dtype=torch.float32)).step({0: ids, 1: ids[:5]})
    assert torch.allclose(plain[len(ids) : len(ids) + 5], plain[:5], rtol=1e-5, atol=1e-5)


def test_unknown_model_name_is_reported():
    from vllm.model_executor.model_loader.loader import load_model

    with pytest.raises(ValueError, match="neither a folder nor a built-in model"):
        load_model("kimi-giant-tiny")


@pytest.mark.gpu
def test_gpu_k3_tiny_ptpc_launches_one_epilogue_per_kda_layer():
    """Decode: one fused decode kernel (norm inside) per KDA layer and one quantization of its
    output, by `per_token_fp8_quant` after the single-kernel variant or inside the V-split
    variant's epilogue kernel, no separate norm; prefill: one fused norm+quant per KDA layer.
    MLA o_proj quantizes its own input."""
    from vllm.config.quantization import parse_quantization_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.model_executor.model_loader.loader import load_model

    recipe = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    quant = OnlineQuantizationConfig(parse_quantization_config(recipe))
    model = load_model("kimi-k3-tiny", dtype=torch.bfloat16, quant_config=quant, device="cuda")
    text = model.language_model
    kda_layers = sum(layer.is_kda for layer in text.layers)
    mla_layers = len(text.layers) - kda_layers
    harness = Harness(model, device="cuda")

    def launches(step):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return {k: sum(k in n for n in names) for k in (
            "_rmsnorm_gated_fp8_kernel", "_fused_kda_decode_kernel", "_per_token_fp8_quant_kernel",
            "_kda_decode_epilogue_kernel",
        )}  # fmt: skip

    prefill = launches(lambda: harness.step({0: [5, 6, 7, 8], 1: [9, 10]}))
    assert prefill["_rmsnorm_gated_fp8_kernel"] == kda_layers
    assert prefill["_per_token_fp8_quant_kernel"] == mla_layers
    decode = launches(lambda: harness.step({0: [11], 1: [12]}))
    assert decode["_fused_kda_decode_kernel"] == kda_layers
    assert decode["_rmsnorm_gated_fp8_kernel"] == 0
    # the V-split variant's epilogue kernel quantizes, one launch per KDA layer
    kda_quant = decode["_per_token_fp8_quant_kernel"] - mla_layers
    assert kda_quant + decode["_kda_decode_epilogue_kernel"] == kda_layers


def _tp_model_worker(rank, folder, prompts, load_format):
    from vllm.model_executor.model_loader.loader import load_model

    model = load_model(folder, load_format, dtype=torch.float32)  # full tensors, sharded on load
    harness = Harness(model)
    first = harness.step(prompts)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return torch.cat([first, harness.step({i: [40 + i] for i in prompts})]), params


def _shard_of(module, leaf: str, full: torch.Tensor, local: torch.Tensor, rank: int):
    """Rank `rank`'s part (of 2) of the TP=1 parameter `full`, by how its layer shards it."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    if full.shape == local.shape:
        return full  # replicated
    if isinstance(module, ColumnParallelLinear) and leaf == "weight":
        parts = full.split(module.output_sizes)
        return torch.cat([
            p if i in module.replicated_shards else p.chunk(2)[rank] for i, p in enumerate(parts)
        ])  # fmt: skip
    if leaf == "conv1d_weight":  # q | k | v
        return torch.cat([p.chunk(2)[rank] for p in full.chunk(3)])
    if leaf == "w13_weight":  # gate | up of each expert
        return torch.cat([p.chunk(2, dim=1)[rank] for p in full.chunk(2, dim=1)], dim=1)
    dim = next(d for d in range(full.dim()) if full.shape[d] != local.shape[d])
    return full.chunk(2, dim=dim)[rank]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo test runs on CPU")
@pytest.mark.parametrize("load_format", ["auto", "dummy"])
def test_tp2_model_equals_tp1(checkpoint, load_format):
    """Every sharded layer (KDA and MLA heads, MoE and MLP intermediates) at TP=2 over gloo gives
    the TP=1 logits: fp32, partial sums reordered only. Dummy weights are drawn per checkpoint
    tensor, so each TP=2 rank holds exactly its shard of the TP=1 parameters."""
    from gloo_tp2 import run_tp2

    from vllm.model_executor.model_loader.loader import load_model

    folder, _ = checkpoint
    prompts = {0: [5, 6, 7, 8, 9], 1: [10, 11, 12]}
    model = load_model(folder, load_format, dtype=torch.float32)
    harness = Harness(model)
    expected = torch.cat([harness.step(prompts), harness.step({i: [40 + i] for i in prompts})])
    results = run_tp2(_tp_model_worker, folder, prompts, load_format)
    modules = dict(model.named_modules())
    for rank in (0, 1):
        logits, params = results[rank]
        assert float((logits - expected).norm() / expected.norm()) < 1e-5
        for name, full in model.named_parameters():
            owner, leaf = name.rsplit(".", 1)
            shard = _shard_of(modules[owner], leaf, full.detach(), params[name], rank)
            assert torch.equal(params[name], shard), (rank, name)


def test_tied_checkpoint_skips_the_saved_head_copy(checkpoint, tmp_path):
    import json

    from safetensors.torch import save_file

    from vllm.model_executor.model_loader.loader import load_model

    folder, _ = checkpoint
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    embedding = tensors["model.embed_tokens.weight"]
    copied = dict(tensors, **{"lm_head.weight": embedding.clone()})
    save_file(copied, tmp_path / "model.safetensors")
    model = load_model(tmp_path, dtype=torch.float32)  # lm_head.weight present, not an error
    assert model.lm_head.weight is model.embed_tokens.weight
    hidden = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ embedding.t())


def test_kimi_k3_checkpoint_loads_end_to_end(checkpoint, tmp_path):
    """The Kimi-Linear checkpoint re-packaged the Kimi-K3 way (`kimi_k3` config with a
    `text_config`, `language_model.*` names, a vision tensor to skip) gives the same logits."""
    import json

    from safetensors.torch import save_file

    from vllm.model_executor.model_loader.loader import load_model

    folder, _ = checkpoint
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "kimi_k3", "text_config": text, "vision_config": {}})
    )
    tensors = {
        ("language_model." + name.removeprefix("model.")): t
        for name, t in load_file(folder / "model.safetensors").items()
    }
    tensors["vision_tower.patch_embed.weight"] = torch.zeros(2, 2)
    save_file(tensors, tmp_path / "model.safetensors")
    k3 = load_model(tmp_path, dtype=torch.float32)
    assert type(k3).__name__ == "KimiK3ForConditionalGeneration"
    linear = load_model(folder, dtype=torch.float32)
    prompts = {0: [5, 6, 7, 8], 1: [9, 10, 11]}
    torch.testing.assert_close(Harness(k3).step(prompts), Harness(linear).step(prompts))
