"""Kimi MLP / MoE blocks against transformers' Kimi-Linear MoE (pure torch), the router against
transformers' router with expert groups, SiTU against its formula, and the latent-MoE path."""

import dataclasses

import pytest
import torch

from vllm.model_executor.layers.activation import SituAndMul, get_act_and_mul
from vllm.model_executor.layers.fused_moe.router import grouped_topk
from vllm.models.kimi_k3.amd.linear import KimiMLP, KimiMoE
from vllm.transformers_utils.configs import KimiLinearConfig

H, E, TOPK, I_MOE = 48, 16, 4, 32
HF = None  # transformers' modeling_kimi_linear, set by the fixture below


@pytest.fixture(autouse=True)
def _hf(hf_kimi_linear):
    global HF
    HF = hf_kimi_linear


def hf_moe(groups=1, topk_group=1, seed=0):
    cfg = HF.KimiLinearConfig(
        hidden_size=H, num_hidden_layers=1, num_experts=E, num_experts_per_token=TOPK,
        moe_intermediate_size=I_MOE, num_shared_experts=2, num_expert_group=groups,
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
    w, ids = grouped_topk(
        logits, hf.gate.e_score_correction_bias, TOPK, groups, topk_group, True, 2.5
    )
    order, hf_order = ids.sort(dim=1)[1], hf_ids.sort(dim=1)[1]
    assert torch.equal(ids.gather(1, order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(w.gather(1, order), hf_w.gather(1, hf_order))


def test_moe_block_matches_transformers():
    hf = hf_moe()
    ours = KimiMoE(our_config(), params_dtype=torch.float32, prefix="block_sparse_moe")
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
    with pytest.raises(ValueError, match="expert 16 out of range"):
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
        x @ t["gate.weight"].t(), t["gate.e_score_correction_bias"], TOPK,
        renormalize=True, routed_scaling_factor=2.5,
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
