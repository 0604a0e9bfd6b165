"""Kimi MLA (NoPE) with the paged latent cache against transformers' Kimi-Linear MLA (pure torch):
prefill of several sequences in one batch, then decode steps reading the cache through block
tables; the K3 variant (q_lora, output gate) against its own unfused formula."""

import re

import pytest
import torch
from engine_harness import EngineHarness, SingleLayer
from torch.autograd import DeviceType

import vllm.model_executor.kernels.linear.gemv as gemv_op
import vllm.models.kimi_k3.amd.mla as mla_module
from vllm.config.quantization import parse_quantization_config
from vllm.model_executor.kernels.linear.gemv_config import BATCHED_GEMV_MAX_M, use_bf16_gemv
from vllm.model_executor.layers.fusion.quant_activation import QuantizedActivation
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
from vllm.models.kimi_k3.amd.ops.mla_decode_config import DECODE_COUNTERS
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


def test_one_prefill_quantizes_the_attention_output_for_a_ptpc_o_proj(triton_launches, monkeypatch):
    """A batch that is one prefill, with a PTPC o_proj: the attention output is quantized where
    it lies and handed to o_proj (no copy into the output buffer), the same bits as o_proj
    quantizing the copied buffer itself; one quantization launch either way. Batches of several
    sequences copy as before."""
    ptpc = OnlineQuantizationConfig(
        parse_quantization_config(
            {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
        )
    )
    ours = ours_mla(config(), quant_config=ptpc, prefix="self_attn")
    ours.load_weights(hf_mla().state_dict().items())
    for module in ours.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    inputs = []
    o_proj_forward = ours.o_proj.forward
    monkeypatch.setattr(ours.o_proj, "forward", lambda x: inputs.append(x) or o_proj_forward(x))
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(4))
    outs = []
    with torch.no_grad():
        outs.append(ours(x, harness_for(ours).schedule({0: 7}).mla))
        assert isinstance(inputs[-1], QuantizedActivation)
        assert triton_launches["_per_token_fp8_quant_kernel"] == 1
        ours(x, harness_for(ours).schedule({0: 3, 1: 4}).mla)
        assert isinstance(inputs[-1], torch.Tensor)
        monkeypatch.setattr(KimiMLAAttention, "_o_proj_is_ptpc_fp8", lambda self: False)
        outs.append(ours(x, harness_for(ours).schedule({0: 7}).mla))
        assert isinstance(inputs[-1], torch.Tensor)
    assert triton_launches["_per_token_fp8_quant_kernel"] == 3
    assert torch.equal(outs[0], outs[1])


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


def unfused_entries(layer: KimiMLAAttention, x: torch.Tensor) -> torch.Tensor:
    """Each token's cache entry as the unfused ops made it: the layer's kv_a, `kv_a_layernorm`
    (the rms_norm op), cat."""
    kv_a = getattr(layer, layer.fused_a_name)(x)[0].split(layer.fused_a_sizes, -1)[1]
    return torch.cat([layer.kv_a_layernorm(kv_a[:, :32]), kv_a[:, 32:]], -1)


@pytest.mark.parametrize("q_lora", [None, 24], ids=["kimi-linear", "k3-q-lora-gate"])
def test_absorbed_decode_equals_exact_decompressing_path(q_lora, triton_launches):
    """The same tokens through the absorbed decode path and as one-token prefill chunks through
    the exact path, on identical caches: decode-only steps (one padded to a captured batch size:
    the padded rows write the dummy block 0), then a mixed step (two decodes, a prefill chunk, a
    one-token prefill). Each step writes every real token's unfused entry at its slot, bit for
    bit, in one launch, and no other cache row."""
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
        decodes = dict.fromkeys(range(len(lengths)), 1)
        steps = [
            (decodes, None, 4),
            (decodes, 6, 4),
            (decodes, None, 4),
            ({2: 1, 0: 1, 1: 3, 3: 1}, None, 2),
        ]
        for new, pad_to, num_decodes in steps:
            tokens = sum(new.values())
            x = torch.randn(pad_to or tokens, H, generator=gen)
            cache = absorbed.mla_caches[0]
            before = cache.clone()
            ours.bind_kv_cache(cache)
            meta = absorbed.schedule(new, pad_to=pad_to).mla
            assert meta.num_decodes == (pad_to or num_decodes)
            launches = dict(triton_launches)
            got = ours(x, meta)
            new_launches = {k: n - launches[k] for k, n in triton_launches.items()}
            # Only K3's q_a_layernorm is a norm of its own; kv_a_layernorm is in the cache write.
            assert new_launches["_mla_cache_write_kernel"] == 1
            assert new_launches["_rms_norm_kernel"] == (1 if q_lora else 0)
            flat, slots = cache.view(-1, 40), meta.slot_mapping
            assert torch.equal(flat[slots[:tokens]], unfused_entries(ours, x[:tokens]))
            untouched = torch.ones(flat.shape[0], dtype=torch.bool)
            untouched[slots] = False
            assert torch.equal(flat[untouched], before.view(-1, 40)[untouched])
            ours.bind_kv_cache(exact.mla_caches[0])
            meta = exact.schedule(new, decodes=False).mla
            assert meta.num_decodes == 0 and len(meta.prefills) == len(new)
            expected = ours(x[:tokens], meta)
            # fp32 both: q.(W_UK c) vs (q W_UK).c and (p c) W_UV vs p (c W_UV) are the same sums
            # reassociated (32 latents, 16 head dims): a few ulps, far under 1e-5.
            torch.testing.assert_close(got[:tokens], expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(cache[1:], exact.mla_caches[0][1:])  # block 0: padded rows'


def test_absorbed_products_take_the_batched_gemv_for_few_rows(
    monkeypatch, triton_launches, launch_constexprs
):
    """Where the dispatch sends them (few rows on a GPU; forced here, under the interpreter),
    both per-head products run as one batched GEMV launch each, with the layer's absorbed
    weights as static ones (gemv.py: their first tiles loaded before the PDL wait), and give
    what torch.bmm gives, W_UV's written straight into the output rows."""
    layer = KimiMLAAttention(KimiLinearConfig.from_dict(config()), params_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    layer.process_weights_after_loading()
    harness = EngineHarness(SingleLayer(layer, torch.bfloat16), num_blocks=32, block_size=BLOCK)
    layer.bind_kv_cache(harness.mla_caches[0])
    x = torch.randn(9, H, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        layer(x, harness.schedule({0: 5, 1: 4}).mla)
        step = harness.schedule({0: 1, 1: 1}).mla
        q = torch.randn(2, HEADS, 24, generator=gen).to(torch.bfloat16)
        preloads = launch_constexprs(gemv_op, "PRELOAD")
        outs = {}
        for gemv in (False, True):
            monkeypatch.setattr(mla_module, "use_batched_gemv", lambda x, w, gemv=gemv: gemv)
            before = triton_launches["_gemv_kernel"]
            outs[gemv] = torch.full((2, HEADS, 16), float("nan"), dtype=torch.bfloat16)
            layer._decode(q, harness.mla_caches[0], step, outs[gemv])
            assert triton_launches["_gemv_kernel"] - before == 2 * gemv
    assert preloads == [True, True]
    # The same fp32 sums (16 and 32 terms) in another order, each rounded once to bf16: at most
    # about one bf16 ulp apart (equal here on the CPU).
    torch.testing.assert_close(outs[True], outs[False], rtol=2**-7, atol=1e-3)


def test_layer_owns_its_decode_counters(monkeypatch):
    """Each layer holds its own zeroed arrival counters for the decode kernel's one-launch merge
    (on the layer's device, not a checkpoint tensor) and hands them to every decode."""
    with torch.device("meta"):
        assert ours_mla(config()).decode_counters.device.type == "meta"
    layer, other = ours_mla(config()), ours_mla(config())
    counters = layer.decode_counters
    assert (counters.dtype, tuple(counters.shape)) == (torch.int32, (DECODE_COUNTERS,))
    assert not counters.any() and "decode_counters" not in layer.state_dict()
    assert counters.data_ptr() != other.decode_counters.data_ptr()
    layer.load_weights(hf_mla().state_dict().items())  # finite weights, not torch.empty's
    layer.process_weights_after_loading()
    harness = harness_for(layer)
    layer.bind_kv_cache(harness.mla_caches[0])
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    seen = []
    decode = mla_module.mla_decode_paged
    monkeypatch.setattr(mla_module, "mla_decode_paged", lambda *a: seen.append(a[-1]) or decode(*a))
    with torch.no_grad():
        layer(x, harness.schedule({0: 5}).mla)
        layer(x[:1], harness.schedule({0: 1}).mla)
    assert len(seen) == 1 and seen[0] is counters


def test_kimi_linear_projections_load_into_one_fused_layer():
    """Without q_lora, the checkpoint's `q_proj`, `kv_a_proj_with_mqa` (and `g_proj`) are the
    shards of `fused_q_kv_a_proj`, one GEMM on x; names of the other variant are refused."""
    gen = torch.Generator().manual_seed(0)
    for gate in (True, False):
        ours = ours_mla(config(mla_use_output_gate=gate), prefix="self_attn")
        t = {
            "q_proj.weight": torch.randn(HEADS * 24, H, generator=gen),
            "kv_a_proj_with_mqa.weight": torch.randn(40, H, generator=gen),
        }
        if gate:
            t["g_proj.weight"] = torch.randn(HEADS * 16, H, generator=gen)
        assert ours.load_weights(t.items()) == set(t)
        assert torch.equal(ours.fused_q_kv_a_proj.weight, torch.cat(list(t.values())))
        assert not hasattr(ours, "q_proj") and not hasattr(ours, "kv_a_proj_with_mqa")
        unknown = ["q_a_proj.weight"] + ([] if gate else ["g_proj.weight"])
        for name in unknown:
            with pytest.raises(ValueError, match=f"unexpected checkpoint tensor '{name}'"):
                ours.load_weights([(name, torch.zeros(1))])


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_gpu_kimi_linear_decode_step_kernels(batch):
    """A decode-only step at Kimi-Linear's sizes (bf16, 32 heads, latent 512, rope 64, 16-token
    blocks) launches the cache write once and no norm, cat, index_put or copy kernel (the W_UV
    product lands in the output rows), and matches the exact path."""
    cfg = config(
        hidden_size=2304, num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    )  # fmt: skip
    layer = KimiMLAAttention(KimiLinearConfig.from_dict(cfg), params_dtype=torch.bfloat16).cuda()
    gen = torch.Generator("cuda").manual_seed(batch)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if not name.endswith("layernorm.weight"):  # norms keep their ones
                p.copy_(torch.randn(p.shape, generator=gen, device="cuda") * 0.02)
    layer.process_weights_after_loading()
    absorbed, exact = (
        EngineHarness(SingleLayer(layer, torch.bfloat16), 64, 16, device="cuda") for _ in range(2)
    )
    prompts = dict.fromkeys(range(batch), 20)
    x = torch.randn(20 * batch, 2304, generator=gen, device="cuda").to(torch.bfloat16)
    decodes = dict.fromkeys(range(batch), 1)
    with torch.no_grad():
        for harness in (absorbed, exact):
            layer.bind_kv_cache(harness.mla_caches[0])
            layer(x, harness.schedule(prompts).mla)
        layer.bind_kv_cache(absorbed.mla_caches[0])
        layer(x[:batch], absorbed.schedule(decodes).mla)  # compiles the decode kernels
        meta = absorbed.schedule(decodes).mla
        step = torch.randn(batch, 2304, generator=gen, device="cuda").to(torch.bfloat16)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = layer(step, meta)
            torch.cuda.synchronize()
        layer.bind_kv_cache(exact.mla_caches[0])
        layer(x[:batch], exact.schedule(decodes, decodes=False).mla)
        expected = layer(step, exact.schedule(decodes, decodes=False).mla)
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert sum("_mla_cache_write_kernel" in n for n in names) == 1, names
    # W_UK and W_UV as batched GEMVs up to BATCHED_GEMV_MAX_M rows (torch.bmm above), plus each
    # bf16 linear that use_bf16_gemv sends to the GEMV (q | kv_a and o_proj at one row).
    absorbs = 2 if batch <= BATCHED_GEMV_MAX_M else 0
    linears = [getattr(layer, layer.fused_a_name).weight, layer.o_proj.weight]
    rows = [torch.empty(batch, w.shape[1], dtype=w.dtype, device="cuda") for w in linears]
    gemv_linears = sum(use_bf16_gemv(x, w) for x, w in zip(rows, linears, strict=True))
    assert gemv_linears == (2 if batch == 1 else 0)  # the rule as measured for these shapes
    assert sum("_gemv_kernel" in n for n in names) == absorbs + gemv_linears, names
    banned = re.compile(r"rms_norm|CatArray|index_put|index_elementwise|[Mm]emcpy|copy_kernel")
    assert not [n for n in names if banned.search(n)], names
    assert torch.equal(absorbed.mla_caches[0][1:], exact.mla_caches[0][1:])
    assert float((got.float() - expected.float()).norm() / expected.float().norm()) < 2e-2
