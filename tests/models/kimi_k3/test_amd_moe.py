"""Kimi MLP / MoE blocks against transformers' Kimi-Linear MoE (pure torch), the router against
transformers' router with expert groups, SiTU against its formula, the latent-MoE path, and the
shared expert fused into the routed experts against the separate shared MLP."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import vllm.model_executor.layers.fused_moe.experts as experts_mod
import vllm.model_executor.layers.fused_moe.layer as layer_mod
from vllm.model_executor.layers.activation import SituAndMul, get_act_and_mul
from vllm.model_executor.layers.fused_moe.router import RoutingParams, grouped_topk
from vllm.models.kimi_k3.amd.moe import KimiMLP, KimiMoE, shared_experts_fusable
from vllm.transformers_utils.configs import KimiLinearConfig

pytestmark = pytest.mark.usefixtures("interpreter_moe_blocks")

H, E, TOPK, I_MOE = 48, 16, 4, 32
HF = None  # transformers' modeling_kimi_linear, set by the fixture below


@pytest.fixture(autouse=True)
def _hf(hf_kimi_linear):
    global HF
    HF = hf_kimi_linear


def hf_moe(groups=1, topk_group=1, seed=0, shared=2):
    cfg = HF.KimiLinearConfig(
        hidden_size=H, num_hidden_layers=1, num_experts=E, num_experts_per_token=TOPK,
        moe_intermediate_size=I_MOE, num_shared_experts=shared, num_expert_group=groups,
        topk_group=topk_group, routed_scaling_factor=2.5, moe_renormalize=True,
        hidden_act="silu", linear_attn_config={"kda_layers": [], "full_attn_layers": [1]},
    )  # fmt: skip
    torch.manual_seed(seed)  # transformers' initializers draw from the global generator
    moe = HF.KimiLinearMoE(cfg).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        moe.gate.weight.normal_(0, 0.3, generator=gen)
        moe.gate.e_score_correction_bias.normal_(0, 0.1, generator=gen)
        moe.experts.gate_up_proj.normal_(0, 0.1, generator=gen)
        moe.experts.down_proj.normal_(0, 0.1, generator=gen)
    return moe


def our_config(groups=1, topk_group=1, **changes):
    cfg = KimiLinearConfig.from_dict(
        dict(
            hidden_size=H, num_hidden_layers=1, num_experts=E, num_experts_per_token=TOPK,
            moe_intermediate_size=I_MOE, num_shared_experts=2, num_expert_group=groups,
            topk_group=topk_group, routed_scaling_factor=2.5, moe_renormalize=True,
            hidden_act="silu", rms_norm_eps=1e-5,
            linear_attn_config={"kda_layers": [], "full_attn_layers": [1], "num_heads": 1,
                                "head_dim": 8},
        )
    )  # fmt: skip
    return dataclasses.replace(cfg, **changes)


def checkpoint(moe) -> list[tuple[str, torch.Tensor]]:
    sd = moe.state_dict()
    out = [("gate.weight", sd["gate.weight"]),
           ("gate.e_score_correction_bias", sd["gate.e_score_correction_bias"])]  # fmt: skip
    for e in range(E):
        gate, up = sd["experts.gate_up_proj"][e].chunk(2)
        out += [(f"experts.{e}.w1.weight", gate), (f"experts.{e}.w3.weight", up),
                (f"experts.{e}.w2.weight", sd["experts.down_proj"][e])]  # fmt: skip
    for part in ("gate_proj", "up_proj", "down_proj"):
        out.append((f"shared_experts.{part}.weight", sd[f"shared_experts.{part}.weight"]))
    return out


@pytest.mark.parametrize("groups,topk_group", [(1, 1), (4, 2)])
def test_router_matches_transformers(groups, topk_group):
    hf = hf_moe(groups, topk_group)
    x = torch.randn(37, H, generator=torch.Generator().manual_seed(1))
    _, hf_w, hf_ids = hf.gate(x)
    logits = x @ hf.gate.weight.t()
    routing = RoutingParams(E, TOPK, num_expert_group=groups, topk_group=topk_group,
                            routed_scaling_factor=2.5)  # fmt: skip
    w, ids = grouped_topk(logits, hf.gate.e_score_correction_bias, routing)
    order, hf_order = ids.sort(dim=1)[1], hf_ids.sort(dim=1)[1]
    assert torch.equal(ids.gather(1, order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(w.gather(1, order), hf_w.gather(1, hf_order))


@pytest.mark.parametrize("shared", [1, 2])
def test_moe_block_matches_transformers(shared):
    """One shared expert (Kimi-Linear's) is fused by default, two are not fusable."""
    hf = hf_moe(shared=shared)
    ours = KimiMoE(our_config(num_shared_experts=shared), torch.float32, prefix="block_sparse_moe")
    assert ours.fuses_shared_experts == (shared == 1)
    assert len(ours.load_weights(checkpoint(hf))) == 2 + 3 * E + 3
    x = torch.randn(29, H, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-5)


def test_unexpected_tensor_is_named():
    ours = KimiMoE(our_config(), params_dtype=torch.float32, prefix="layers.3.block_sparse_moe")
    with pytest.raises(ValueError, match="layers.3.block_sparse_moe: unexpected .*'gate.bias'"):
        ours.load_weights([("gate.bias", torch.zeros(E))])
    with pytest.raises(ValueError, match=r"experts\.3\.w1: checkpoint shape \(64, 48\)"):
        ours.load_weights([("experts.3.w1.weight", torch.zeros(2 * I_MOE, H))])
    with pytest.raises(ValueError, match=r"'experts\.16\.w1\.weight' is beyond .* num_experts 16"):
        ours.load_weights([("experts.16.w1.weight", torch.zeros(I_MOE, H))])


def test_latent_moe_is_down_norm_experts_up():
    cfg = our_config(routed_expert_hidden_size=24, latent_moe_use_norm=True, num_shared_experts=0)
    moe = KimiMoE(cfg, params_dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    tensors = [("gate.weight", torch.randn(E, H, generator=gen)),
               ("gate.e_score_correction_bias", torch.zeros(E)),
               ("routed_expert_down_proj.weight", torch.randn(24, H, generator=gen) * 0.2),
               ("routed_expert_up_proj.weight", torch.randn(H, 24, generator=gen) * 0.2),
               ("routed_expert_norm.weight", 1 + torch.randn(24, generator=gen) * 0.1)]  # fmt: skip
    for e in range(E):
        for shard, shape in (("w1", (I_MOE, 24)), ("w3", (I_MOE, 24)), ("w2", (24, I_MOE))):
            tensors.append(
                (f"experts.{e}.{shard}.weight", torch.randn(*shape, generator=gen) * 0.2)
            )
    moe.load_weights(tensors)
    t = dict(tensors)
    x = torch.randn(5, H, generator=gen)
    w, ids = grouped_topk(
        x @ t["gate.weight"].t(), t["gate.e_score_correction_bias"],
        RoutingParams(E, TOPK, routed_scaling_factor=2.5),
    )  # fmt: skip
    z = x @ t["routed_expert_down_proj.weight"].t()
    z = z * torch.rsqrt(z.square().mean(-1, keepdim=True) + 1e-5) * t["routed_expert_norm.weight"]
    expected = torch.zeros(5, 24)
    for n in range(5):
        for j in range(TOPK):
            e = int(ids[n, j])
            gate, up = (
                z[n] @ t[f"experts.{e}.w1.weight"].t(),
                z[n] @ t[f"experts.{e}.w3.weight"].t(),
            )
            expected[n] += (
                w[n, j] * (torch.nn.functional.silu(gate) * up) @ t[f"experts.{e}.w2.weight"].t()
            )
    expected = expected @ t["routed_expert_up_proj.weight"].t()
    with torch.no_grad():
        torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-5)


def test_situ_formula_and_dense_mlp():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 20, generator=gen) * 30  # large values reach the soft caps
    gate, up = x.chunk(2, dim=-1)
    expected = 4 * torch.tanh(gate / 4) * torch.sigmoid(gate) * 25 * torch.tanh(up / 25)
    torch.testing.assert_close(SituAndMul(4.0, 25.0)(x), expected)
    assert isinstance(get_act_and_mul("situ", 4.0, 25.0), SituAndMul)
    with pytest.raises(ValueError, match="needs activation_situ_beta"):
        get_act_and_mul("situ")
    mlp = KimiMLP(our_config(), 40, params_dtype=torch.float32)
    g, u, d = (torch.randn(shape, generator=gen) for shape in ((40, H), (40, H), (H, 40)))
    for name, t in (("gate_proj.weight", g), ("up_proj.weight", u), ("down_proj.weight", d)):
        mlp.load_weight(name, t)
    x = torch.randn(3, H, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(
            mlp(x), (torch.nn.functional.silu(x @ g.t()) * (x @ u.t())) @ d.t()
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_block_decode_needs_no_tensor_values(dtype):
    """Router, routed experts and shared experts of a decode batch on the meta device: any host
    read of a value (a sync on a GPU) or value-dependent shape would fail here."""
    moe = KimiMoE(our_config(groups=4, topk_group=2), params_dtype=dtype).to("meta")
    out = moe(torch.empty(3, H, dtype=dtype, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, H) and out.dtype == dtype


# -- the shared expert fused into the routed experts -------------------------------------------


def fused_config(**changes):
    return our_config(groups=4, topk_group=2, **{"num_shared_experts": 1, **changes})


def random_checkpoint(cfg, seed=0) -> list[tuple[str, torch.Tensor]]:
    """Checkpoint tensors scaled so every GEMM output is O(1) (errors comparable to eps)."""
    gen = torch.Generator().manual_seed(seed)
    h, inter = cfg.hidden_size, cfg.moe_intermediate_size

    def w(rows, cols):
        return torch.randn(rows, cols, generator=gen) / cols**0.5

    out = [("gate.weight", torch.randn(E, h, generator=gen)),
           ("gate.e_score_correction_bias", torch.randn(E, generator=gen) * 0.1)]  # fmt: skip
    for e in range(E):
        out += [(f"experts.{e}.w1.weight", w(inter, h)), (f"experts.{e}.w3.weight", w(inter, h)),
                (f"experts.{e}.w2.weight", w(h, inter))]  # fmt: skip
    out += [("shared_experts.gate_proj.weight", w(inter, h)),
            ("shared_experts.up_proj.weight", w(inter, h)),
            ("shared_experts.down_proj.weight", w(h, inter))]  # fmt: skip
    return out


def fused_and_unfused(dtype, cfg=None):
    cfg = cfg or fused_config()
    tensors = random_checkpoint(cfg)
    fused = KimiMoE(cfg, dtype, prefix="moe", fuse_shared_experts=True)
    unfused = KimiMoE(cfg, dtype, prefix="moe", fuse_shared_experts=False)
    assert fused.load_weights(tensors) == unfused.load_weights(tensors) == {n for n, _ in tensors}
    return fused, unfused, dict(tensors)


def test_fused_layout_holds_the_shared_expert_as_the_last_expert():
    fused, unfused, t = fused_and_unfused(torch.float32)
    assert fused.shared_experts is None and unfused.shared_experts is not None
    assert fused.experts.w13_weight.shape == (E + 1, 2 * I_MOE, H)
    assert fused.experts.w2_weight.shape == (E + 1, H, I_MOE)
    assert (
        unfused.experts.w13_weight.shape[0] == E and unfused.experts.num_fused_shared_experts == 0
    )
    w13, w2 = fused.experts.w13_weight, fused.experts.w2_weight
    assert torch.equal(w13[E, :I_MOE], t["shared_experts.gate_proj.weight"])
    assert torch.equal(w13[E, I_MOE:], t["shared_experts.up_proj.weight"])
    assert torch.equal(w2[E], t["shared_experts.down_proj.weight"])
    assert torch.equal(w13[:E], unfused.experts.w13_weight)
    assert torch.equal(w2[:E], unfused.experts.w2_weight)
    with pytest.raises(ValueError, match="moe: unexpected checkpoint tensor 'shared_experts.bias'"):
        fused.load_weights([("shared_experts.bias", torch.zeros(H))])
    with pytest.raises(ValueError, match=r"experts\.16\.w2: checkpoint shape \(48, 16\)"):
        fused.load_weights([("shared_experts.down_proj.weight", torch.zeros(H, 16))])


def test_which_configs_fuse(monkeypatch):
    assert shared_experts_fusable(fused_config())
    assert not shared_experts_fusable(fused_config(num_shared_experts=2))
    assert not shared_experts_fusable(fused_config(num_shared_experts=0))
    assert not shared_experts_fusable(fused_config(routed_expert_hidden_size=24))
    situ = fused_config(hidden_act="situ", activation_situ_beta=4.0,
                        activation_situ_linear_beta=25.0)  # fmt: skip
    assert shared_experts_fusable(situ)  # the Triton experts fuse SiTU too
    latent = fused_config(routed_expert_hidden_size=24, hidden_act="situ",
                          activation_situ_beta=4.0, activation_situ_linear_beta=25.0)  # fmt: skip
    with pytest.raises(ValueError, match="moe: this config's shared experts cannot be fused"):
        KimiMoE(latent, torch.float32, prefix="moe", fuse_shared_experts=True)
    assert KimiMoE(fused_config()).fuses_shared_experts  # the default where fusable
    monkeypatch.setenv("VLLM_KIMI_FUSE_SHARED_EXPERTS", "0")
    assert not KimiMoE(fused_config()).fuses_shared_experts


def test_a_quantized_shared_expert_is_not_fused():
    from vllm.config.quantization import parse_quantization_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    everything = OnlineQuantizationConfig(parse_quantization_config({"linear": "fp8_per_channel"}))
    o_proj_only = OnlineQuantizationConfig(parse_quantization_config(
        {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    ))  # fmt: skip
    prefix = "model.layers.1.block_sparse_moe"
    assert not shared_experts_fusable(fused_config(), everything, prefix)
    assert shared_experts_fusable(fused_config(), o_proj_only, prefix)
    assert not KimiMoE(fused_config(), quant_config=everything, prefix=prefix).fuses_shared_experts


def test_shared_expert_probe_chooses_kernels_as_the_layer_does(monkeypatch, vllm_records):
    """Whether the shared expert is quantized is asked of a throw-away MLP: built in the default
    dtype (fp32), not the block's, it failed the bf16-only rowwise FP8 GEMM, so forcing that
    kernel refused a bf16 model it runs, and unforced, warned of a fallback for each linear of a
    layer never built; the real layer's selection is the one said, once."""

    import vllm.platforms
    from vllm.config.quantization import parse_quantization_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.platforms import CudaPlatform

    hopper = CudaPlatform()
    hopper.__dict__["device_capability"] = (9, 0)  # cached_property: no GPU needed
    monkeypatch.setattr(vllm.platforms, "current_platform", hopper)
    quant = OnlineQuantizationConfig(parse_quantization_config({"linear": "fp8_per_channel"}))
    prefix = "model.layers.1.block_sparse_moe"
    with torch.device("meta"):
        moe = KimiMoE(fused_config(), torch.bfloat16, quant, prefix)
        monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "RowWiseTorchFP8ScaledMMLinearKernel")
        forced = KimiMoE(fused_config(), torch.bfloat16, quant, prefix)
    rowwise = "RowWiseTorchFP8ScaledMMLinearKernel"
    for block in (moe, forced):
        assert type(block.shared_experts.gate_up_proj.fp8_linear).__name__ == rowwise
    said = [
        r.getMessage()
        for r in vllm_records
        if f"{prefix}.shared_experts.gate_up_proj" in r.getMessage()
    ]
    assert said == [f"Selected {rowwise} for {prefix}.shared_experts.gate_up_proj"] * 2, said


def test_router_appends_the_shared_expert_column():
    fused, unfused, _ = fused_and_unfused(torch.float32)
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(4))
    logits = F.linear(x, fused.gate_weight)
    routing = RoutingParams(E, TOPK, num_expert_group=4, topk_group=2, routed_scaling_factor=2.5)
    assert unfused.routing == routing  # built once, from the config
    assert fused.routing == dataclasses.replace(routing, num_fused_shared_experts=1)
    routed_w, routed_ids = grouped_topk(logits, fused.e_score_correction_bias, routing)
    w, ids = grouped_topk(logits, fused.e_score_correction_bias, fused.routing)
    assert ids.shape == w.shape == (7, TOPK + 1)
    assert torch.equal(ids[:, :TOPK], routed_ids)
    # The kernel's renormalising sum runs over a wider padded block: fp32 summation order only.
    torch.testing.assert_close(w[:, :TOPK], routed_w, rtol=1.3e-6, atol=0)
    assert torch.equal(ids[:, TOPK], torch.full((7,), E)) and torch.equal(w[:, TOPK], torch.ones(7))


def _record_paths(monkeypatch) -> list[str]:
    """The experts implementation each FusedMoE forward selects, by name."""
    chosen = []
    select = layer_mod.select_experts_impl

    def recording(*args):
        impl = select(*args)
        chosen.append(impl.__name__)
        return impl

    monkeypatch.setattr(layer_mod, "select_experts_impl", recording)
    return chosen


# tokens -> the implementation their T * (K + 1) rows select, with the row limits scaled down in
# `_small_limits` so that the interpreter runs small batches: GEMV Triton, grouped Triton, and
# past both the torch paths (gathered / loop on CPU; torch._grouped_mm on an H200, see the GPU
# test below).
FUSED_CASES = [(1, "moe_experts_triton"), (6, "moe_experts_triton"),
               (9, "moe_experts_triton_grouped"), (30, "moe_experts_triton_grouped"),
               (40, "torch")]  # fmt: skip
TORCH_PATHS = ("moe_experts_loop", "moe_experts_gathered", "moe_experts_grouped")


def _assert_path(chosen: list[str], path: str) -> None:
    assert chosen[0] in TORCH_PATHS if path == "torch" else chosen[0] == path


def _small_limits(monkeypatch):
    monkeypatch.setattr(experts_mod, "TRITON_MAX_ROWS", 30)
    monkeypatch.setattr(experts_mod, "TRITON_GROUPED_MAX_ROWS", 150)
    monkeypatch.setattr(experts_mod, "TRITON_GROUPED_MAX_ROWS_ELSEWHERE", 150)


@pytest.mark.parametrize("tokens,path", FUSED_CASES)
def test_fused_equals_unfused_in_fp32(tokens, path, monkeypatch):
    """fp32: every rounding step is exact up to accumulation order, so the fused block (shared
    output summed in the experts' fp32 sum) equals the separate shared MLP plus an add to fp32
    accumulation-order differences: sums of O(1) terms over H=48 / I=32 / K+1=5."""
    _small_limits(monkeypatch)
    chosen = _record_paths(monkeypatch)
    fused, unfused, _ = fused_and_unfused(torch.float32)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        out, expected = fused(x), unfused(x)
    _assert_path(chosen, path)
    torch.testing.assert_close(out, expected, rtol=1.3e-6, atol=1e-5)


def shared_bound(unfused: KimiMoE, x: torch.Tensor) -> torch.Tensor:
    """How far the shared expert's bf16 output S may move when its gate/up GEMM runs in another
    kernel: 2^-8 |S| for the output rounding plus 2^-7 |W2| @ |a| for its activations `a` each
    rounding the other way (see test_fused_is_within_bf16_rounding_of_unfused)."""
    mlp = unfused.shared_experts
    act = mlp.act_and_mul(mlp.gate_up_proj(x)[0]).float()
    shared = mlp(x).float()
    return 2**-8 * shared.abs() + 2**-7 * (act.abs() @ mlp.down_proj.weight.float().abs().t())


@pytest.mark.parametrize("tokens,path", FUSED_CASES)
def test_fused_is_within_bf16_rounding_of_unfused(tokens, path, monkeypatch):
    """bf16: unfused u = rn(rn(R) + S) (the routed sum R and the shared output S each rounded,
    then added), fused f = rn(R + S') with S' the experts kernels' shared output. With half an
    ulp <= 2^-8 |v| in bf16: |f - u| <= 2^-8 (|f| + |R| + |u|) + |S - S'|. S' has the
    references' rounding points but its gate/up GEMM is another kernel than the dense linear's
    (another accumulation order), so each bf16 activation `a` may round the other way (up to
    2^-7 |a| apart), which the down projection carries into S: |S - S'| <= 2^-8 |S| +
    2^-7 |W2| @ |a| (`shared_bound`)."""
    _small_limits(monkeypatch)
    chosen = _record_paths(monkeypatch)
    fused, unfused, _ = fused_and_unfused(torch.bfloat16)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens)).bfloat16()
    with torch.no_grad():
        out, expected = fused(x).float(), unfused(x).float()
        cfg = unfused.config
        routing = RoutingParams(E, TOPK, num_expert_group=cfg.num_expert_group,
                                topk_group=cfg.topk_group,
                                routed_scaling_factor=cfg.routed_scaling_factor)  # fmt: skip
        w, ids = grouped_topk(
            F.linear(x.float(), unfused.gate_weight), unfused.e_score_correction_bias, routing
        )
        routed = unfused.experts(x, w, ids).float()
        bound = 2**-8 * (routed.abs() + out.abs() + expected.abs()) + shared_bound(unfused, x)
    _assert_path(chosen, path)
    assert bool(((out - expected).abs() <= bound).all())
    assert not torch.equal(out, expected)  # the fused sum really skips a rounding


def test_fused_block_decode_needs_no_tensor_values():
    moe = KimiMoE(fused_config(), params_dtype=torch.bfloat16).to("meta")
    assert moe.fuses_shared_experts
    out = moe(torch.empty(3, H, dtype=torch.bfloat16, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, H)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 64, 256, 1024])
def test_fused_equals_unfused_at_kimi_linear_sizes_on_gpu(tokens):
    """H 2304, I 1024, 256 experts top-8 (groups 1), bf16 on the GPU: the GEMV Triton path (1, 8
    tokens), the grouped Triton path (64, 256) and torch._grouped_mm (1024: 9216 rows)."""
    cfg = dataclasses.replace(
        fused_config(), hidden_size=2304, moe_intermediate_size=1024, num_experts=256,
        num_experts_per_token=8, num_expert_group=1, topk_group=1,
    )  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    fused = KimiMoE(cfg, torch.bfloat16, fuse_shared_experts=True).cuda()
    unfused = KimiMoE(cfg, torch.bfloat16, fuse_shared_experts=False).cuda()
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_(0, p.shape[-1] ** -0.5, generator=gen)
        fused.e_score_correction_bias.mul_(0.1)
        unfused.gate_weight.copy_(fused.gate_weight)
        unfused.e_score_correction_bias.copy_(fused.e_score_correction_bias)
        unfused.experts.w13_weight.copy_(fused.experts.w13_weight[:256])
        unfused.experts.w2_weight.copy_(fused.experts.w2_weight[:256])
        unfused.shared_experts.gate_up_proj.weight.copy_(fused.experts.w13_weight[256])
        unfused.shared_experts.down_proj.weight.copy_(fused.experts.w2_weight[256])
        x = torch.randn(tokens, 2304, generator=gen, device="cuda").bfloat16()
        out, expected = fused(x).float(), unfused(x).float()
        w, ids = grouped_topk(F.linear(x.float(), unfused.gate_weight),
                              unfused.e_score_correction_bias,
                              RoutingParams(256, 8, routed_scaling_factor=2.5))  # fmt: skip
        routed = unfused.experts(x, w, ids).float()
        bound = 2**-8 * (routed.abs() + out.abs() + expected.abs()) + shared_bound(unfused, x)
    assert bool(((out - expected).abs() <= bound).all()), float((out - expected).abs().max())
