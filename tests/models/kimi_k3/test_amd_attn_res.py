"""Kimi-K3's AttnRes (block attention residuals, `attn_res.py`): the model against a per-token loop
written from the formula, properties of the mixture and of the block bookkeeping, loading
(names, completeness, Kimi-K3 packaging, never quantized), dummy weights, TP=2 against TP=1, and
the built-in kimi-k3-tiny decoding.

The checkpoint is transformers' random tiny Kimi-Linear (5 layers: KDA, MLA, KDA, KDA, MLA; MoE
after a dense first layer) plus random AttnRes tensors; transformers has no AttnRes, so the
sublayers are checked by test_amd_model.py and the residual wiring here. The layers' ops run their
torch references (the Triton kernels have their own tests and are launched inside the model by
test_amd_kernel_dispatch.py): under the interpreter this file took ~3 minutes.
"""

import dataclasses
import json
import re

import pytest
import torch
from engine_harness import EngineHarness as Harness
from hf_kimi_linear import random_hf_model
from safetensors.torch import load_file, save_file

from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.model_loader.loader import fill_dummy_weights, load_model
from vllm.models.kimi_k3.amd.attn_res import AttnResState, attn_res_mix
from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM
from vllm.transformers_utils.configs import KimiLinearConfig

HIDDEN, LAYERS, BLOCK_SIZE = 64, 5, 2


@pytest.fixture(autouse=True, scope="module")
def _ops_run_their_torch_references(torch_reference_kernels) -> None:
    """Every test here runs on the torch references (see the module docstring)."""


LAYOUT = dict(
    num_hidden_layers=LAYERS,
    linear_attn_config={"kda_layers": [1, 3, 4], "full_attn_layers": [2, 5], "num_heads": 2,
                        "head_dim": 32, "short_conv_kernel_size": 4},
)  # fmt: skip
PROMPTS = {0: [5, 6, 7, 8, 9], 1: [10, 11, 12], 2: [13, 14, 15, 16, 17, 18, 19]}


def attn_res_tensors(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random AttnRes checkpoint tensors. Pseudo-queries of norm ~2 give logits spread ~2 over
    the sources, so mixtures are far from uniform and far from one-hot."""

    def norm():
        return 1 + 0.1 * torch.randn(HIDDEN, generator=gen)

    def proj():
        return 2 * torch.randn(1, HIDDEN, generator=gen) / HIDDEN**0.5

    out = {"model.output_attn_res_norm.weight": norm(), "model.output_attn_res_proj.weight": proj()}
    for i in range(LAYERS):
        for sub in ("self_attention", "mlp"):
            out[f"model.layers.{i}.{sub}_res_norm.weight"] = norm()
            out[f"model.layers.{i}.{sub}_res_proj.weight"] = proj()
    return out


def write_checkpoint(folder, config: dict, tensors: dict[str, torch.Tensor], k3: bool = False):
    """A checkpoint folder; `k3`: packaged the Kimi-K3 way (`kimi_k3` config, `language_model.*`
    names with the text model's `model.` dropped, as D.7)."""
    folder.mkdir(exist_ok=True)
    if k3:
        config = {"model_type": "kimi_k3", "text_config": config, "vision_config": {}}
        tensors = {"language_model." + k.removeprefix("model."): v for k, v in tensors.items()}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def checkpoint(hf_kimi_linear, tmp_path_factory):
    """(config dict, tensors) of the AttnRes checkpoint, and its folder, Kimi-Linear packaged."""
    hf = random_hf_model(hf_kimi_linear, **LAYOUT)
    base = tmp_path_factory.mktemp("attn_res")
    hf.save_pretrained(base / "hf")
    config = json.loads((base / "hf" / "config.json").read_text())
    config["attn_res_block_size"] = BLOCK_SIZE
    tensors = load_file(base / "hf" / "model.safetensors")
    tensors.update(attn_res_tensors(torch.Generator().manual_seed(0)))
    return config, tensors, write_checkpoint(base / "linear", config, tensors)


def build(config: dict, tensors: dict[str, torch.Tensor], **changes) -> KimiLinearForCausalLM:
    """The model of `config` with `changes`, fp32; without AttnRes its tensors are left out."""
    cfg = dataclasses.replace(KimiLinearConfig.from_dict(config), **changes)
    model = KimiLinearForCausalLM(cfg, params_dtype=torch.float32)
    has_attn_res = cfg.attn_res_block_size is not None
    model.load_weights((k, v) for k, v in tensors.items() if has_attn_res or "_res_" not in k)
    model.process_weights_after_loading()
    return model.eval()


# ---------------------------------------------------------------------------------------------
# The model against the formula
# ---------------------------------------------------------------------------------------------


def reference_mix(sources: list[torch.Tensor], norm, proj) -> torch.Tensor:
    """The mixture straight from the formula, one token and one source at a time."""
    out = torch.empty_like(sources[0])
    for t in range(out.shape[0]):
        logits = []
        for s in sources:
            normed = s[t] / torch.sqrt(s[t].square().mean() + norm.eps) * norm.weight
            logits.append(torch.dot(normed, proj.weight[0]))
        alpha = torch.softmax(torch.stack(logits), dim=0)
        out[t] = sum(a * s[t] for a, s in zip(alpha, sources, strict=True))
    return out


def reference_forward(model: KimiLinearForCausalLM, ids: torch.Tensor, metadata) -> torch.Tensor:
    """Hidden states under AttnRes with a list of blocks and a partial sum (None when empty),
    running the model's own sublayers."""
    block_size = model.config.attn_res_block_size
    blocks, partial = [], model.embed_tokens(ids)
    for i, layer in enumerate(model.layers):
        if i % block_size == 0:
            blocks, partial = blocks + [partial], None
        sources = blocks + ([] if partial is None else [partial])
        h = reference_mix(sources, layer.self_attention_res_norm, layer.self_attention_res_proj)
        h = layer.input_layernorm(h)
        out = layer.self_attn(h, metadata.kda if layer.is_kda else metadata.mla)
        partial = out if partial is None else partial + out
        h = layer.post_attention_layernorm(
            reference_mix(blocks + [partial], layer.mlp_res_norm, layer.mlp_res_proj)
        )
        ffn = layer.block_sparse_moe if hasattr(layer, "block_sparse_moe") else layer.mlp
        partial = partial + ffn(h)
    final = reference_mix(
        blocks + [partial], model.output_attn_res_norm, model.output_attn_res_proj
    )
    return model.norm(final)


class Reference(torch.nn.Module):
    """`reference_forward` in the shape Harness drives (it finds the layers at language_model)."""

    def __init__(self, model: KimiLinearForCausalLM) -> None:
        super().__init__()
        self.language_model = model

    def forward(self, ids, metadata):
        return reference_forward(self.language_model, ids, metadata)

    def get_kv_cache_spec(self):
        return self.language_model.get_kv_cache_spec()

    def bind_kv_caches(self, kda_pools, mla_caches):
        self.language_model.bind_kv_caches(kda_pools, mla_caches)

    def compute_logits(self, hidden):
        return self.language_model.compute_logits(hidden)


def prefill_then_decode(model, steps: int = 2) -> torch.Tensor:
    """Logits of a 3-prompt prefill then `steps` decode steps, concatenated."""
    harness = Harness(model)
    out = [harness.step(PROMPTS)]
    for s in range(steps):
        out.append(harness.step({i: [40 + i + s] for i in PROMPTS}))
    return torch.cat(out)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("block_size", [1, 2, 3, LAYERS + 1])
def test_model_matches_per_token_reference(checkpoint, block_size):
    """Blocks of 1, 2, 3 layers (5, 3, 2 completed blocks) and one larger than the model (only
    the embeddings ever form a block)."""
    config, tensors, _ = checkpoint
    model = build(config, tensors, attn_res_block_size=block_size)
    got = prefill_then_decode(model)
    expected = prefill_then_decode(Reference(model))
    # fp32 on both sides, the same sublayers; the mixture differs only in summation order
    # (logits as rsqrt(mean x^2) * <x, w*q> vs normalise-then-dot, one einsum vs a loop):
    # rounding ~1e-7 per op, grown through 5 layers and the LM head to 1e-6..2.5e-6 measured
    # (fp32, CPU); a wrong source, boundary or normalisation gives > 1e-3.
    assert rel_err(got, expected) < 1e-5
    # AttnRes changes the model: the same weights with the standard residual differ a lot.
    plain = prefill_then_decode(build(config, tensors, attn_res_block_size=None))
    assert rel_err(plain, expected) > 0.05


def test_decode_equals_prefill_of_the_whole_sequence(checkpoint):
    """AttnRes state lives within one token's forward: decoding token by token gives the
    logits a one-shot prefill of the same sequence gives."""
    config, tensors, _ = checkpoint
    model = build(config, tensors)
    tokens = [5, 6, 7, 8, 9, 10, 11]
    harness = Harness(model)
    stepwise = [harness.step({0: tokens[:3]})]
    stepwise += [harness.step({0: [t]}) for t in tokens[3:]]
    one_shot = Harness(model).step({0: tokens})
    # KDA's chunked prefill vs per-token recurrence: summation order only (fp32, 3.5e-6
    # measured).
    assert rel_err(torch.cat(stepwise), one_shot) < 1e-5


# ---------------------------------------------------------------------------------------------
# The mixture and the block bookkeeping
# ---------------------------------------------------------------------------------------------


def test_zero_pseudo_query_mixes_uniformly():
    gen = torch.Generator().manual_seed(0)
    sources = torch.randn(4, 9, HIDDEN, generator=gen) * torch.rand(4, 9, 1, generator=gen) * 5
    norm_weight = 1 + torch.randn(HIDDEN, generator=gen)
    out = attn_res_mix(sources, norm_weight, torch.zeros(1, HIDDEN), 1e-5)
    torch.testing.assert_close(out, sources.mean(dim=0), rtol=1e-6, atol=1e-6)


def test_mixture_properties():
    gen = torch.Generator().manual_seed(1)
    sources = torch.randn(3, 5, HIDDEN, generator=gen)
    norm_weight = 1 + 0.1 * torch.randn(HIDDEN, generator=gen)
    query = torch.randn(1, HIDDEN, generator=gen)
    out = attn_res_mix(sources, norm_weight, query, 1e-6)
    # A single source is passed through exactly.
    assert torch.equal(attn_res_mix(sources[:1], norm_weight, query, 1e-6), sources[0])
    # The logits see normalised sources: scaling one source by c > 0 keeps its weight, so the
    # mixture moves by exactly (c - 1) * alpha * source.
    scaled = sources.clone()
    scaled[1] *= 3.0
    logits = torch.stack(
        [(s / s.square().mean(-1, keepdim=True).add(1e-6).sqrt() * norm_weight) @ query[0]
         for s in sources]
    )  # fmt: skip
    alpha = logits.softmax(0)
    torch.testing.assert_close(
        attn_res_mix(scaled, norm_weight, query, 1e-6),
        out + 2.0 * alpha[1, :, None] * sources[1],
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip
    # A pseudo-query aligned with one source and large makes the mixture that source.
    sharp = 200 * sources[2, 0][None] / sources[2, 0].norm()
    assert torch.allclose(attn_res_mix(sources[:, :1], torch.ones(HIDDEN), sharp, 1e-6)[0],
                          sources[2, 0], atol=1e-4)  # fmt: skip
    # bf16 sources: computed in fp32, returned in bf16.
    assert attn_res_mix(sources.bfloat16(), norm_weight, query, 1e-6).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "args,message",
    [
        ((torch.zeros(5, HIDDEN), torch.ones(HIDDEN), torch.ones(1, HIDDEN), 1e-6), "sources"),
        ((torch.zeros(0, 5, HIDDEN), torch.ones(HIDDEN), torch.ones(1, HIDDEN), 1e-6), "sources"),
        ((torch.zeros(2, 5, HIDDEN), torch.ones(8), torch.ones(1, HIDDEN), 1e-6), "norm_weight"),
        ((torch.zeros(2, 5, HIDDEN), torch.ones(HIDDEN), torch.ones(HIDDEN), 1e-6), "proj_weight"),
        ((torch.zeros(2, 5, HIDDEN), torch.ones(HIDDEN), torch.ones(1, HIDDEN), 0.0), "eps"),
    ],
)
def test_mixture_rejects_bad_inputs(args, message):
    with pytest.raises(ValueError, match=f"^{message}:"):
        attn_res_mix(*args)


def test_state_blocks_and_prefix():
    """Blocks of 2 over 5 layers: layers 0, 2, 4 close blocks 0 (embeddings), 1, 2."""
    emb = torch.full((3, 4), 1.0)
    state = AttnResState(emb, num_layers=5, block_size=2)
    seen = []
    for i in range(5):
        state.begin_layer(i)
        for sub in (10, 100):  # stands for the attention and MLP outputs
            seen.append(state.sources().shape[0])
            state.add(torch.full((3, 4), float(sub * (i + 1))))
    seen.append(state.sources().shape[0])
    assert seen == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4]
    blocks = state.sources()[:, 0, 0].tolist()
    assert blocks == [1.0, 110 * (1 + 2), 110 * (3 + 4), 110 * 5]
    with pytest.raises(ValueError, match="^layer_idx: layer 2 closes block 1"):
        AttnResState(emb, 5, 2).begin_layer(2)
    with pytest.raises(ValueError, match="^delta:"):
        state.add(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="^block_size:"):
        AttnResState(emb, 5, 0)


# ---------------------------------------------------------------------------------------------
# Loading, quantization, dummy weights
# ---------------------------------------------------------------------------------------------


def test_attn_res_tensors_load_from_both_packagings(checkpoint, tmp_path):
    config, tensors, folder = checkpoint
    linear = load_model(folder, dtype=torch.float32)
    k3 = load_model(
        write_checkpoint(tmp_path / "k3", config, tensors, k3=True), dtype=torch.float32
    )
    assert type(k3).__name__ == "KimiK3ForConditionalGeneration"
    for model in (linear, k3.language_model):
        params = dict(model.named_parameters())
        for name, tensor in tensors.items():
            if "res_" in name:
                assert torch.equal(params[name.removeprefix("model.")], tensor), name
    torch.testing.assert_close(Harness(k3).step(PROMPTS), Harness(linear).step(PROMPTS))


@pytest.mark.parametrize(
    "dropped,k3,reported",
    [
        ("model.layers.3.mlp_res_proj.weight", False, "model.layers.3.mlp_res_proj.weight"),
        ("model.layers.0.self_attention_res_norm.weight", False,
         "model.layers.0.self_attention_res_norm.weight"),
        ("model.output_attn_res_norm.weight", False, "model.output_attn_res_norm.weight"),
        # Kimi-K3 packaging: reported by the K3 checkpoint's own names
        ("model.output_attn_res_proj.weight", True, "language_model.output_attn_res_proj.weight"),
        ("model.layers.4.mlp_res_norm.weight", True, "language_model.layers.4.mlp_res_norm.weight"),
    ],
)  # fmt: skip
def test_missing_attn_res_tensor_is_named(checkpoint, tmp_path, dropped, k3, reported):
    config, tensors, _ = checkpoint
    kept = {k: v for k, v in tensors.items() if k != dropped}
    folder = write_checkpoint(tmp_path / "broken", config, kept, k3=k3)
    with pytest.raises(
        ValueError, match=f"missing tensors for the parameters: {re.escape(reported)}$"
    ):
        load_model(folder, dtype=torch.float32)


def test_unexpected_or_misshapen_attn_res_tensors_are_named(checkpoint):
    config, tensors, _ = checkpoint
    plain = build(config, tensors, attn_res_block_size=None)  # no AttnRes: its tensors are extra
    assert not any("res_" in name for name, _ in plain.named_parameters())
    # The config field they need is named (the layer's said "unexpected checkpoint tensors
    # under model.layers.1.mlp_res_proj").
    no_field = "AttnRes weights, but the config sets no attn_res_block_size"
    with pytest.raises(ValueError, match=f"tensor 'model.output_attn_res_proj.weight': {no_field}"):
        plain.load_weights([("model.output_attn_res_proj.weight", torch.zeros(1, HIDDEN))])
    with pytest.raises(ValueError, match=f"'model.layers.1.mlp_res_proj.weight': {no_field}"):
        plain.load_weights([("model.layers.1.mlp_res_proj.weight", torch.zeros(1, HIDDEN))])
    model = build(config, tensors)
    with pytest.raises(ValueError, match=r"model.layers.2.self_attention_res_proj.weight: check"):
        model.load_weights([("model.layers.2.self_attention_res_proj.weight", torch.zeros(2, 64))])
    with pytest.raises(
        ValueError, match="unexpected checkpoint tensor 'model.layers.0.mlp_res_nor"
    ):
        model.load_weights([("model.layers.0.mlp_res_norm.bias", torch.zeros(HIDDEN))])


def test_attn_res_projections_are_never_quantized(checkpoint):
    from vllm.config.quantization import parse_quantization_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    config, _, _ = checkpoint
    quant = OnlineQuantizationConfig(parse_quantization_config({"linear": "fp8_per_channel"}))
    model = KimiLinearForCausalLM(KimiLinearConfig.from_dict(config), torch.float32, quant)
    projections = [m for name, m in model.named_modules() if name.endswith("res_proj")]
    assert len(projections) == 2 * LAYERS + 1
    assert all(type(m.quant_method) is UnquantizedLinearMethod for m in projections)
    assert not isinstance(model.layers[0].self_attn.o_proj.quant_method, UnquantizedLinearMethod)


def test_dummy_attn_res_weights_are_realistic(checkpoint):
    config, _, _ = checkpoint
    model = KimiLinearForCausalLM(KimiLinearConfig.from_dict(config), torch.float32)
    fill_dummy_weights(model, seed=0)
    for name, p in model.named_parameters():
        if name.endswith("res_norm.weight"):
            assert abs(float(p.mean()) - 1) < 0.05 and 0.01 < float(p.std()) < 0.2, name
        elif name.endswith("res_proj.weight"):
            # ~1/sqrt(hidden): logits of unit-RMS sources spread ~1, mixtures neither uniform
            # nor one-hot
            assert 0.5 < float(p.std()) * HIDDEN**0.5 < 2, name


# ---------------------------------------------------------------------------------------------
# Tensor parallel and the built-in kimi-k3-tiny
# ---------------------------------------------------------------------------------------------


def _tp_worker(rank, folder):
    return prefill_then_decode(load_model(folder, dtype=torch.float32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo test runs on CPU")
def test_tp2_equals_tp1_with_attn_res(checkpoint, tmp_path):
    """The Kimi-K3-packaged AttnRes checkpoint at TP=2 (gloo) gives the TP=1 logits: the
    AttnRes weights are whole on both ranks and mix the replicated residual stream."""
    from gloo_tp2 import run_tp2

    config, tensors, _ = checkpoint
    folder = write_checkpoint(tmp_path / "k3", config, tensors, k3=True)
    expected = prefill_then_decode(load_model(folder, dtype=torch.float32))
    results = run_tp2(_tp_worker, folder)
    for rank in (0, 1):
        # fp32; TP only reorders partial sums
        assert rel_err(results[rank], expected) < 1e-5


def test_kimi_k3_tiny_generates_with_attn_res():
    """Greedy decoding on the built-in kimi-k3-tiny (AttnRes blocks of 2): the decode steps give
    the logits a one-shot prefill of the generated sequence gives, and the final mixture is
    in use (its pseudo-query moves the logits)."""
    model = load_model("kimi-k3-tiny", dtype=torch.float32)
    text = model.language_model
    assert text.config.attn_res_block_size == 2
    tokens = [72, 101, 108, 108, 111]
    harness = Harness(model)
    logits = harness.step({0: tokens})[-1:]
    decoded = []
    for _ in range(4):
        tokens.append(int(logits[-1].argmax()))
        decoded.append(logits[-1])
        logits = harness.step({0: [tokens[-1]]})
    one_shot = Harness(model).step({0: tokens[:-1]})[4:]
    assert rel_err(torch.stack(decoded), one_shot) < 1e-5
    with torch.no_grad():
        text.output_attn_res_proj.weight.zero_()
    assert rel_err(Harness(model).step({0: tokens[:-1]})[4:], one_shot) > 0.01
