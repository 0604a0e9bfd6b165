"""Kimi MLA (NoPE) with the paged latent cache against transformers' Kimi-Linear MLA (pure torch):
prefill of several sequences in one batch, then decode steps reading the cache through block
tables; the K3 variant (q_lora, output gate) against its own unfused formula."""

import pytest
import torch
from engine_harness import EngineHarness, SingleLayer

from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
from vllm.transformers_utils.configs import KimiLinearConfig

H, HEADS, BLOCK = 64, 4, 4
HF = None


@pytest.fixture(autouse=True)
def _hf(hf_kimi_linear):
    global HF
    HF = hf_kimi_linear


def config(**changes):
    base = dict(
        hidden_size=H, num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        rms_norm_eps=1e-6,  # transformers' MLA norms use their default 1e-6
        linear_attn_config={"kda_layers": [], "full_attn_layers": [1], "num_heads": 1,
                            "head_dim": 8},
    )  # fmt: skip
    base.update(changes)
    return base


def hf_mla(**changes):
    cfg = HF.KimiLinearConfig(**config(**changes))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)  # transformers' initializers draw from the global generator
    module = HF.KimiLinearAttention(cfg, 0).float()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("layernorm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
    return module


def hf_forward(module, x):
    n = x.shape[0]
    mask = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)
    return module(x.unsqueeze(0), attention_mask=mask)[0].squeeze(0)


def ours_mla(cfg, **kwargs) -> KimiMLAAttention:
    return KimiMLAAttention(KimiLinearConfig.from_dict(cfg), params_dtype=torch.float32, **kwargs)


def harness_for(layer: KimiMLAAttention) -> EngineHarness:
    """Blocks handed out in a scrambled order, so block tables are really used."""
    harness = EngineHarness(SingleLayer(layer, torch.float32), num_blocks=32, block_size=BLOCK)
    order = torch.randperm(31, generator=torch.Generator().manual_seed(3)) + 1
    harness.free_blocks = order.tolist()
    return harness


def test_mla_matches_transformers_prefill_then_decode():
    hf = hf_mla()
    ours = ours_mla(config())
    ours.load_weights(hf.state_dict().items())
    ours.process_weights_after_loading()
    lengths, steps = [6, 3, 9], 3
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n + steps, H, generator=gen) for n in lengths]
    harness = harness_for(ours)
    with torch.no_grad():
        expected = [hf_forward(hf, x) for x in xs]
        meta = harness.schedule({i: n for i, n in enumerate(lengths)}).mla
        out = ours(torch.cat([x[:n] for x, n in zip(xs, lengths, strict=True)]), meta)
        got = list(out.split(lengths))
        for s in range(steps):
            order = [2, 0, 1]  # any order of sequences in the batch
            meta = harness.schedule({i: 1 for i in order}).mla
            assert meta.num_decodes == 3  # the absorbed decode path
            out = ours(torch.stack([xs[i][lengths[i] + s] for i in order]), meta)
            for row, i in enumerate(order):
                got[i] = torch.cat([got[i], out[row : row + 1]])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_k3_variant_q_lora_and_output_gate():
    cfg = KimiLinearConfig.from_dict(config(q_lora_rank=24, mla_use_output_gate=True))
    ours = KimiMLAAttention(cfg, params_dtype=torch.float32, prefix="self_attn")
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "q_a_proj.weight": (24, H), "kv_a_proj_with_mqa.weight": (40, H),
        "g_proj.weight": (HEADS * 16, H), "q_a_layernorm.weight": (24,),
        "q_b_proj.weight": (HEADS * 24, 24), "kv_a_layernorm.weight": (32,),
        "kv_b_proj.weight": (HEADS * 32, 32), "o_proj.weight": (H, HEADS * 16),
    }  # fmt: skip
    t = {k: torch.randn(*s, generator=gen) * 0.2 for k, s in shapes.items()}
    assert ours.load_weights(t.items()) == set(t)
    ours.process_weights_after_loading()
    x = torch.randn(5, H, generator=gen)
    with torch.no_grad():
        got = ours(x, harness_for(ours).schedule({0: 5}).mla)

    def rms(v, w):
        return v * torch.rsqrt(v.square().mean(-1, keepdim=True) + 1e-6) * w

    q = rms(x @ t["q_a_proj.weight"].t(), t["q_a_layernorm.weight"]) @ t["q_b_proj.weight"].t()
    q = q.view(5, HEADS, 24)
    kv_a = x @ t["kv_a_proj_with_mqa.weight"].t()
    kv = (rms(kv_a[:, :32], t["kv_a_layernorm.weight"]) @ t["kv_b_proj.weight"].t()).view(
        5, HEADS, 32
    )
    k = torch.cat([kv[..., :16], kv_a[:, None, 32:].expand(5, HEADS, 8)], -1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * 24**-0.5
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), kv[..., 16:])
    attn = attn * torch.sigmoid((x @ t["g_proj.weight"].t()).view(5, HEADS, 16))
    torch.testing.assert_close(got, attn.reshape(5, -1) @ t["o_proj.weight"].t())
    with pytest.raises(ValueError, match="self_attn: unexpected checkpoint tensor 'q_proj.weight'"):
        ours.load_weights([("q_proj.weight", torch.zeros(1))])
    with pytest.raises(
        ValueError, match=r"self_attn.q_a_layernorm.weight: checkpoint shape \(1,\)"
    ):
        ours.load_weights([("q_a_layernorm.weight", torch.zeros(1))])


def test_continued_prefill_on_top_of_cached_context():
    """A prefill chunk of several tokens attends to the context already in the cache."""
    hf = hf_mla()
    ours = ours_mla(config())
    ours.load_weights(hf.state_dict().items())
    ours.process_weights_after_loading()
    gen = torch.Generator().manual_seed(1)
    x0, x1 = torch.randn(11, H, generator=gen), torch.randn(6, H, generator=gen)
    harness = harness_for(ours)
    with torch.no_grad():
        expected0, expected1 = hf_forward(hf, x0), hf_forward(hf, x1)
        a = ours(torch.cat([x0[:4], x1[:2]]), harness.schedule({0: 4, 1: 2}).mla)
        # sequence 1 decodes (absorbed path) while sequence 0 continues its prefill (exact path)
        b = ours(torch.cat([x1[2:3], x0[4:9]]), harness.schedule({1: 1, 0: 5}).mla)
        c = ours(torch.cat([x0[9:], x1[3:]]), harness.schedule({0: 2, 1: 3}).mla)
    got0 = torch.cat([a[:4], b[1:], c[:2]])
    got1 = torch.cat([a[4:], b[:1], c[2:]])
    torch.testing.assert_close(got0, expected0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got1, expected1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_lora", [None, 24], ids=["kimi-linear", "k3-q-lora-gate"])
def test_absorbed_decode_equals_exact_decompressing_path(q_lora):
    """The same decode tokens through the absorbed path (num_decodes = N) and as one-token
    prefill chunks through the exact path, on identical caches."""
    cfg = config(q_lora_rank=q_lora, mla_use_output_gate=q_lora is not None)
    gen = torch.Generator().manual_seed(0)
    ours = ours_mla(cfg)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    ours.process_weights_after_loading()
    absorbed, exact = harness_for(ours), harness_for(ours)
    lengths = [7, 2, 13, 4]
    x = torch.randn(sum(lengths), H, generator=gen)
    with torch.no_grad():
        for harness in (absorbed, exact):
            ours.bind_kv_cache(harness.mla_caches[0])
            ours(x, harness.schedule(dict(enumerate(lengths))).mla)
        for _ in range(3):
            x = torch.randn(len(lengths), H, generator=gen)
            ours.bind_kv_cache(absorbed.mla_caches[0])
            meta = absorbed.schedule(dict.fromkeys(range(len(lengths)), 1)).mla
            assert meta.num_decodes == len(lengths)
            got = ours(x, meta)
            ours.bind_kv_cache(exact.mla_caches[0])
            meta = exact.schedule(dict.fromkeys(range(len(lengths)), 1), decodes=False).mla
            assert meta.num_decodes == 0 and len(meta.prefills) == len(lengths)
            expected = ours(x, meta)
            # fp32 both: q.(W_UK c) vs (q W_UK).c and (p c) W_UV vs p (c W_UV) are the same sums
            # reassociated (32 latents, 16 head dims): a few ulps, far under 1e-5.
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
