"""`fused_router_topk`: router logits and grouped top-k in one launch, against the two-launch
composition. On exact data (small integers: every logit exact in any summation order) it must
equal `grouped_topk_triton(F.linear(x.float(), w))` at every launch shape (bit for bit under the
interpreter; on a GPU the weights up to the order of the renormalising sum); on random
data the reference composition's ids, with weights within the logit error carried through the
scoring (module docstring of fused_router.py). Also the semaphore's reset, argument errors, the
dispatch and KimiMoE's use of it, and on a GPU Kimi-Linear's sizes and CUDA-graph replay. Data is
drawn on the CPU, so the interpreter and the GPU see the same values for a seed.

`fused_norm_router_topk` (the residual add and RMSNorm in the router's launch) must equal the
norm kernel (`fused_add_rms_norm`) followed by `fused_router_topk` at the same launch config bit
for bit, in all four outputs, on any data: on a GPU too, where it rests on the norm's sum running
in the norm kernel's layout.
"""

import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.layers.fused_moe import fused_router as fused_mod
from vllm.model_executor.layers.fused_moe.fused_router import (
    FUSED_NORM_MAX_HIDDEN,
    MAX_TOKENS,
    FusedRouterConfig,
    default_config,
    default_norm_config,
    fused_norm_router_topk,
    fused_norm_router_topk_ref,
    fused_router_topk,
    fused_router_topk_ref,
    use_fused_norm_router,
    use_fused_router,
)
from vllm.model_executor.layers.fused_moe.router import (
    RoutingParams,
    grouped_topk,
    grouped_topk_triton,
    router_logits,
)
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm
from vllm.models.kimi_k3.amd.moe import KimiMoE
from vllm.transformers_utils.configs import KimiLinearConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL = "_fused_router_topk_kernel"
# Kimi-Linear-48B's router with its shared expert fused (tests/model_executor/test_fused_moe.py).
KIMI = RoutingParams(256, 8, routed_scaling_factor=2.446, num_fused_shared_experts=1)
# One expert per program with a tail H chunk, several experts per program, one program with
# padded experts (block_n > E): the program count and the arrival order both change.
CONFIGS = [FusedRouterConfig(1, 32, 1), FusedRouterConfig(4, 64, 2), FusedRouterConfig(64, 128, 4)]


def router(experts, top_k=4, groups=1, topk_group=1, renormalize=True, scale=2.5,
           scoring="sigmoid", shared=0) -> RoutingParams:  # fmt: skip
    return RoutingParams(experts, top_k, num_expert_group=groups, topk_group=topk_group,
                         renormalize=renormalize, routed_scaling_factor=scale,
                         scoring_func=scoring, num_fused_shared_experts=shared)  # fmt: skip


def semaphore(device=DEVICE) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int32, device=device)


def random_case(t, e, h, seed, device=DEVICE, dtype=torch.bfloat16, nonzero=None):
    """Gaussian x, gate and bias; `nonzero`: that many nonzero entries of x per token (at random
    places), which shrinks the rigorous logit error bound (`logit_error`) at large H."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=gen)
    if nonzero is not None:
        keep = torch.rand(t, h, generator=gen).argsort(dim=1)[:, :nonzero]
        x = torch.zeros_like(x).scatter_(1, keep, x.gather(1, keep))
    w = torch.randn(e, h, generator=gen) * (nonzero or h) ** -0.5
    bias = torch.randn(e, generator=gen) * 0.1
    return x.to(dtype).to(device), w.to(device), bias.to(device)


def tie_free_case(t, e, h, routing, seed, other_terms=1, with_bias=True, **kwargs):
    """`random_case` (bias None unless `with_bias`) of the first seed from `seed` on (step 1000)
    whose data is tie-free for `assert_close_routing` at `logit_error(x, w, other_terms)`:
    deterministic, fp64 checks on the CPU only."""
    for s in range(seed, seed + 100_000, 1000):
        x, w, bias = random_case(t, e, h, s, **kwargs)
        bias = bias if with_bias else None
        gap = decision_gap(x, w, bias, routing.top_k, routing.num_expert_group,
                           routing.topk_group, routing.scoring_func)  # fmt: skip
        if bool((gap > 4 * logit_error(x, w, other_terms) + 1e-6).all()):
            return x, w, bias
    raise AssertionError("no tie-free seed in 100 tries")


def exact_case(t, e, h, seed, device=DEVICE):
    """Integers in x, multiples of 2^-10 in w: every product and partial sum (below 2^9 for H up
    to 2304) is exact in fp32, so any kernel's logits are the exact ones whatever its summation
    order. Ties are likely: the kernels share one tie rule."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (t, h), generator=gen).to(torch.bfloat16)
    w = torch.randint(-64, 65, (e, h), generator=gen) * 2.0**-10
    bias = torch.randint(-8, 9, (e,), generator=gen) * 2.0**-6
    return x.to(device), w.to(device), bias.to(device)


def logit_error(x, w, other_terms=1):
    """Per token, the largest gap between the fused kernel's logit and another fp32 one: each is
    within (n + 2) 2^-24 sum_h |x_h w_h| of the exact dot product (fused_router.py, gemv.py; for
    cuBLAS too), with n the token's nonzero x entries (adding an exact zero rounds nothing);
    `other_terms` 3 for the other's bf16x3 form (3 products per element)."""
    xd, wd = x.double().cpu(), w.double().cpu()
    n = (xd != 0).sum(dim=1, keepdim=True)
    size = xd.abs() @ wd.abs().t()
    return ((n + 2 + other_terms * n + 2) * 2.0**-24 * size).amax(dim=1)


def decision_gap(x, w, bias, top_k, groups, topk_group, scoring):
    """Per token, in fp64: the smallest gap between values whose order decides the ids (the top
    `topk_group + 1` group scores, then the top `top_k + 1` biased scores of the kept groups)."""
    z = x.double().cpu() @ w.double().cpu().t()
    scores = z.sigmoid() if scoring == "sigmoid" else z.softmax(-1)
    choice = scores if bias is None else scores + bias.double().cpu()
    t, e = choice.shape
    gaps = []
    if groups > 1:
        grouped = choice.view(t, groups, e // groups)
        group_scores = grouped.topk(2, -1)[0].sum(-1)
        ranked = group_scores.sort(-1, descending=True)[0]
        gaps.append(ranked[:, topk_group - 1] - ranked[:, topk_group])
        dropped = group_scores < ranked[:, topk_group - 1 : topk_group]
        choice = grouped.masked_fill(dropped[..., None], float("-inf")).view(t, e)
    ranked = choice.sort(-1, descending=True)[0]
    gaps.append((ranked[:, :top_k] - ranked[:, 1 : top_k + 1]).amin(-1))
    return torch.stack(gaps).amin(0)


def assert_close_routing(out, expected, x, w, bias, routing, d):
    """Same ids, weights within the effect of logit differences up to `d` (per token): sigmoid
    moves log(score) by at most d (its slope 1 - s <= 1), softmax by 2 d (the logit and the
    normaliser), renormalising doubles that (first order; 1% covers the rest), plus fp32 ulps of
    exp, the divisions and the scaling. Asserts first that the data is tie-free for that: no
    deciding gap within 4 d (a score moves by at most 2 d, a group score by twice that)."""
    scoring = routing.scoring_func
    gap = decision_gap(x, w, bias, routing.top_k, routing.num_expert_group,
                       routing.topk_group, scoring)  # fmt: skip
    assert bool((gap > 4 * d + 1e-6).all()), "data not tie-free for this bound: another seed"
    (weights, ids), (ref_weights, ref_ids) = out, expected
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    factor = (2 if scoring == "softmax" else 1) * (2 if routing.renormalize else 1) * 1.01
    rtol = (factor * d + 16 * 2.0**-24).to(weights.device)[:, None]
    assert bool(((weights - ref_weights).abs() <= rtol * ref_weights.abs()).all())


def assert_matches_reference(x, w, bias, routing, config=None):
    """The fused op against the reference composition (F.linear, then grouped_topk_ref)."""
    out = fused_router_topk(x, w, bias, routing, semaphore=sem(x), config=config)
    expected = fused_router_topk_ref(x, w, bias, routing)
    assert_close_routing(out, expected, x, w, bias, routing, logit_error(x, w))


_SEMAPHORES: dict[torch.device, torch.Tensor] = {}


def sem(x: torch.Tensor) -> torch.Tensor:
    """One semaphore per device, reused by every call: each call must leave it at 0."""
    if x.device not in _SEMAPHORES:
        _SEMAPHORES[x.device] = semaphore(x.device)
    assert _SEMAPHORES[x.device].item() == 0
    return _SEMAPHORES[x.device]


# ---------------------------------------------------------------------------------------------
# The kernel under the interpreter (and natively on a GPU)
# ---------------------------------------------------------------------------------------------


ROUTINGS = [router(32), router(32, groups=4, topk_group=2, shared=2, scoring="softmax"),
            router(32, renormalize=False, shared=1)]  # fmt: skip


# Each routing at the default launch and at one of CONFIGS.
@pytest.mark.parametrize(
    "routing,config",
    [*((r, None) for r in ROUTINGS), *zip(ROUTINGS, CONFIGS, strict=True)],
    ids=["sigmoid", "grouped-softmax-shared", "plain", "sigmoid-1x32", "grouped-4x64",
         "plain-64x128"],
)  # fmt: skip
def test_exact_logits_equal_the_two_launches_bit_for_bit(routing, config, triton_launches):
    for t in (1, 3):
        x, w, bias = exact_case(t, 32, 80, seed=t)  # H 80: a tail chunk for block_h 32 / 64
        weights, ids = fused_router_topk(x, w, bias, routing, semaphore=sem(x), config=config)
        ref_weights, ref_ids = grouped_topk_triton(F.linear(x.float(), w), bias, routing)
        assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
        assert sem(x).item() == 0
    assert triton_launches[KERNEL] == 2 and triton_launches["_grouped_topk_kernel"] == 2


@pytest.mark.parametrize("groups,topk_group", [(1, 1), (4, 2)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_matches_the_reference_composition(scoring, with_bias, groups, topk_group):
    for t in (1, 4) if groups == 1 else (2, 3):
        routing = router(32, groups=groups, topk_group=topk_group, scoring=scoring,
                         renormalize=t != 3, shared=t % 2)  # fmt: skip
        x, w, bias = tie_free_case(t, 32, 96, routing, 10 * t + groups, with_bias=with_bias)
        assert_matches_reference(x, w, bias, routing)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_kimi_linear_router_and_other_x_dtypes(dtype, triton_launches):
    x, w, bias = tie_free_case(4, 256, 128, KIMI, seed=3, dtype=dtype)
    assert_matches_reference(x, w, bias, KIMI, config=FusedRouterConfig(32, 128, 4))
    routing = router(20, top_k=3, groups=4, topk_group=2)
    x, w, bias = tie_free_case(2, 20, 72, routing, seed=4, dtype=dtype)  # groups of 5: padding
    assert_matches_reference(x, w, bias, routing, config=FusedRouterConfig(8, 32, 2))
    x, w, bias = tie_free_case(2, 48, 40, router(48, shared=1), seed=5, dtype=dtype)
    wide = torch.cat([x, x], dim=1)[:, :40]  # a row stride of 80
    assert_matches_reference(wide, w, bias, router(48, shared=1))
    assert triton_launches[KERNEL] == 3


def test_top_1_keeps_one_key(triton_launches):
    """`top_k + S == 1`: the selection keeps a single key (Triton 3.6's `tl.topk` fails at k =
    1, so the kernel takes a max there)."""
    routing = router(16, top_k=1)
    x, w, bias = tie_free_case(2, 16, 48, routing, seed=6)
    assert_matches_reference(x, w, bias, routing)
    assert triton_launches[KERNEL] == 1


def test_the_semaphore_is_reset_for_the_next_launch(triton_launches):
    """A kernel that left the count at num_programs would make no program of the next launch
    the last one: its outputs would stay unwritten."""
    counter = semaphore()
    for seed in (1, 2, 3):
        x, w, bias = tie_free_case(2, 16, 64, router(16), seed=seed)
        weights, ids = fused_router_topk(x, w, bias, router(16), semaphore=counter)
        assert counter.item() == 0
        ref_weights, ref_ids = fused_router_topk_ref(x, w, bias, router(16))
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=0.0)
    assert triton_launches[KERNEL] == 3


def test_zero_tokens_launch_nothing(triton_launches):
    x, w, bias = random_case(0, 16, 64, seed=0)
    weights, ids = fused_router_topk(x, w, bias, router(16, shared=1), semaphore=semaphore())
    assert weights.shape == ids.shape == (0, 5)
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int64)
    assert triton_launches[KERNEL] == 0


def test_cpu_without_interpreter_runs_the_reference(monkeypatch, triton_launches):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, bias = random_case(3, 16, 64, seed=6, device="cpu")
    out = fused_router_topk(x, w, bias, router(16), semaphore=semaphore("cpu"))
    ref = fused_router_topk_ref(x, w, bias, router(16))
    assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))
    assert triton_launches[KERNEL] == 0
    assert not use_fused_router(x, w)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(x=lambda x: x[0]), r"x must be \[T, H\]"),
        (dict(x=lambda x: x.to(torch.int32)), "x dtype"),
        (dict(w=lambda w: w.bfloat16()), "gate_weight must be float32"),
        (dict(x=lambda x: x.repeat(MAX_TOKENS, 1)), f"at most {MAX_TOKENS} tokens"),
        (dict(x=lambda x: x.t().contiguous().t()), "unit stride on H"),
        (dict(w=lambda w: w.t().contiguous().t()), "unit stride on H"),
        (dict(s=lambda s: s.long()), "semaphore must be an int32 .1. tensor"),
        (dict(s=lambda s: s.repeat(2)), "semaphore must be an int32 .1. tensor"),
        (dict(s=lambda s: s.view(1, 1)), "semaphore must be an int32 .1. tensor"),
        (dict(s=lambda s: s.to("meta")), "semaphore is on meta"),
        (dict(b=lambda b: b[:-1]), r"e_score_correction_bias must be \[E=16\]"),
        (dict(b=lambda b: b.to("meta")), "e_score_correction_bias is on meta"),
        (dict(w=lambda w: w[:-1]), "gate_weight has 15 experts, routing.num_experts is 16"),
        (dict(r=dict(top_k=17)), "top_k 17"),
        (dict(r=dict(groups=3)), "num_expert_group 3"),
        (dict(r=dict(scoring="relu")), "scoring_func 'relu'"),
        (dict(c=FusedRouterConfig(3, 64)), "block_n must be a positive power of two"),
        (dict(c=FusedRouterConfig(2, 64, 0)), "num_warps must be a positive power of two"),
    ],
)
def test_argument_errors(change, message, triton_launches):
    x, w, bias = random_case(2, 16, 64, seed=7)
    x, w, bias = (change.get(k, lambda v: v)(v) for k, v in (("x", x), ("w", w), ("b", bias)))
    s = change.get("s", lambda v: v)(semaphore())
    with pytest.raises(ValueError, match=message):
        fused_router_topk(x, w, bias, router(16, **change.get("r", {})), semaphore=s,
                          config=change.get("c"))  # fmt: skip
    assert triton_launches[KERNEL] == 0


def test_default_config():
    assert default_config(2304) == FusedRouterConfig(2, 1024, 4)  # 128 programs at E 256
    assert default_config(40) == FusedRouterConfig(2, 64, 4)
    assert default_config(300) == FusedRouterConfig(2, 512, 4)
    # Kimi-Linear's decode step: one token, both defaults on the whole-row path
    for config in (default_config(2304), default_norm_config(2304)):
        assert fused_mod._whole_row(1, config, 2304) and not fused_mod._whole_row(2, config, 2304)
    assert not fused_mod._whole_row(1, default_config(8192), 8192)  # 2 x 8192 over the limit
    assert fused_mod._whole_row(1, default_norm_config(8192), 8192)


@pytest.fixture
def whole_row_flags(launch_constexprs):
    """The ``WHOLE_ROW`` constexpr of each fused-router launch, in order."""
    return launch_constexprs(fused_mod, "WHOLE_ROW")


# H 80 pads to 128: with the limit at 256, 2 experts a program fit it, 4 do not.
SMALL_LIMIT_CASES = [
    (1, FusedRouterConfig(2, 32, 1), True),
    (1, FusedRouterConfig(4, 32, 1), False),
    (2, FusedRouterConfig(2, 32, 1), False),
]


@pytest.mark.parametrize("routing", ROUTINGS[:2], ids=["sigmoid", "grouped-softmax-shared"])
def test_one_token_loads_whole_rows_within_the_limit(routing, monkeypatch, whole_row_flags,
                                                     triton_launches):  # fmt: skip
    """Each side of a small ``WHOLE_ROW_MAX_ELEMENTS``, and two tokens, on exact data: the two
    launches' routing bit for bit, through the path the limit selects."""
    monkeypatch.setattr(fused_mod, "WHOLE_ROW_MAX_ELEMENTS", 256)
    for t, config, _ in SMALL_LIMIT_CASES:
        x, w, bias = exact_case(t, 32, 80, seed=20 + t)
        weights, ids = fused_router_topk(x, w, bias, routing, semaphore=sem(x), config=config)
        ref_weights, ref_ids = grouped_topk_triton(F.linear(x.float(), w), bias, routing)
        assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    assert whole_row_flags == [whole for *_, whole in SMALL_LIMIT_CASES]


def test_dispatch(monkeypatch):
    x, w, _ = random_case(4, 16, 64, seed=8)
    assert use_fused_router(x[:1], w) and not use_fused_router(x[:0], w)
    assert not use_fused_router(x.repeat(2, 1)[: fused_mod.FUSED_ROUTER_MAX_T + 1], w)
    monkeypatch.setattr(fused_mod, "FUSED_ROUTER_MAX_T", 4)
    assert use_fused_router(x, w)
    assert not use_fused_router(x.t().contiguous().t(), w)
    assert not use_fused_router(x.to("meta"), w.to("meta"))
    monkeypatch.setattr(fused_mod, "FUSED_ROUTER_MAX_T", 2)
    assert not use_fused_router(x[:3], w) and use_fused_router(x[:2], w)


# ---------------------------------------------------------------------------------------------
# KimiMoE: the fused router at decode sizes, the two launches above
# ---------------------------------------------------------------------------------------------


def kimi_moe(device=DEVICE, hidden=48, experts=16, top_k=4, dtype=torch.float32) -> KimiMoE:
    cfg = KimiLinearConfig.from_dict(
        dict(
            hidden_size=hidden, num_hidden_layers=1, num_experts=experts,
            num_experts_per_token=top_k, moe_intermediate_size=32, num_shared_experts=1,
            num_expert_group=1, topk_group=1, routed_scaling_factor=2.5, moe_renormalize=True,
            hidden_act="silu", rms_norm_eps=1e-5,
            linear_attn_config={"kda_layers": [], "full_attn_layers": [1], "num_heads": 1,
                                "head_dim": 8},
        )
    )  # fmt: skip
    with torch.device(device):
        moe = KimiMoE(cfg, dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return moe


def test_kimi_moe_owns_its_semaphore():
    moe = kimi_moe("meta")
    assert moe.router_semaphore.device.type == "meta"
    assert (moe.router_semaphore.dtype, tuple(moe.router_semaphore.shape)) == (torch.int32, (1,))
    assert "router_semaphore" not in moe.state_dict()
    other = kimi_moe("cpu")
    assert other.router_semaphore.item() == 0
    assert other.router_semaphore.data_ptr() != kimi_moe("cpu").router_semaphore.data_ptr()


@pytest.mark.usefixtures("interpreter_moe_blocks")
def test_kimi_moe_routes_decode_batches_in_one_launch(triton_launches, monkeypatch):
    moe = kimi_moe()
    gen = torch.Generator().manual_seed(9)
    limit = fused_mod.FUSED_ROUTER_MAX_T
    x = torch.randn(limit + 1, 48, generator=gen).to(DEVICE)
    with torch.no_grad():
        small = moe(x[:limit])
        assert (triton_launches[KERNEL], triton_launches["_grouped_topk_kernel"]) == (1, 0)
        assert triton_launches["_gemv_kernel"] == 0 and moe.router_semaphore.item() == 0
        moe(x)
        assert (triton_launches[KERNEL], triton_launches["_grouped_topk_kernel"]) == (1, 1)
        monkeypatch.setattr(fused_mod, "FUSED_ROUTER_MAX_T", 0)
        unfused = moe(x[:limit])
    assert triton_launches[KERNEL] == 1
    torch.testing.assert_close(small, unfused, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The residual add and RMSNorm in the router's launch (`fused_norm_router_topk`)
# ---------------------------------------------------------------------------------------------

EPS = 1e-6
# H 80 (a 128-lane norm tile: one warp, `row_tile_warps`) with tail chunks for block_h 32 / 64.
NORM_CONFIGS = [
    FusedRouterConfig(1, 32, 1), FusedRouterConfig(4, 64, 1), FusedRouterConfig(64, 128, 1),
]  # fmt: skip


def norm_case(t, e, h, seed, device=DEVICE, dtype=torch.bfloat16, nonzero=None):
    """A sublayer output x, a residual stream (4x larger, as a model's grows), a norm weight near
    1 and `random_case`'s gate and bias; `nonzero`: x's nonzero entries per token, residual 0."""
    x, w, bias = random_case(t, e, h, seed, device, torch.float32, nonzero)
    gen = torch.Generator().manual_seed(seed + 1)
    residual = torch.randn(t, h, generator=gen) * 4 if nonzero is None else torch.zeros(t, h)
    norm_weight = 1 + 0.1 * torch.randn(h, generator=gen)
    return (x.to(dtype), residual.to(dtype).to(device), norm_weight.to(dtype).to(device), w, bias)


def fused_norm(x, residual, norm_weight, w, bias, routing, config=None):
    return fused_norm_router_topk(
        x, residual, norm_weight, EPS, w, bias, routing, semaphore=sem(x), config=config
    )


def norm_then_router(x, residual, norm_weight, w, bias, routing, config):
    """The unfused sequence: the norm kernel's launch, then the fused router's."""
    h, new_residual = fused_add_rms_norm(x, residual, norm_weight, EPS)
    return h, new_residual, *fused_router_topk(h, w, bias, routing, semaphore=sem(x),
                                               config=config)  # fmt: skip


def assert_fused_norm_equals_unfused(x, residual, norm_weight, w, bias, routing, config=None):
    out = fused_norm(x, residual, norm_weight, w, bias, routing, config)
    expected = norm_then_router(x, residual, norm_weight, w, bias, routing,
                                config or default_norm_config(x.shape[1]))  # fmt: skip
    for name, got, want in zip(("h", "residual", "weights", "ids"), out, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name
    assert sem(x).item() == 0
    return out


@pytest.mark.parametrize(
    "routing,config",
    [*((r, None) for r in ROUTINGS), *zip(ROUTINGS, NORM_CONFIGS, strict=True)],
    ids=["sigmoid", "grouped-softmax-shared", "plain", "sigmoid-1x32", "grouped-4x64",
         "plain-64x128"],
)  # fmt: skip
def test_fused_norm_equals_the_norm_then_the_router_bit_for_bit(routing, config, triton_launches):
    for t in (1, 3):
        assert_fused_norm_equals_unfused(*norm_case(t, 32, 80, seed=t), routing, config)
    # per T, the fused launch, then the unfused sequence's norm and router
    assert triton_launches[KERNEL] == 4 and triton_launches["_rms_norm_kernel"] == 2


@pytest.mark.parametrize(
    "dtype,weight_dtype",
    [(torch.float16, torch.float16), (torch.float32, torch.float32),
     (torch.bfloat16, torch.float32)],
    ids=["fp16", "fp32", "bf16-fp32-weight"],
)  # fmt: skip
def test_fused_norm_other_dtypes_and_row_strides(dtype, weight_dtype, triton_launches):
    x, residual, norm_weight, w, bias = norm_case(2, 48, 64, seed=11, dtype=dtype)  # even H
    norm_weight = norm_weight.to(weight_dtype)
    assert_fused_norm_equals_unfused(x, residual, norm_weight, w, bias, router(48, shared=1))
    wide_x, wide_residual = (torch.cat([t, t], dim=1)[:, :64] for t in (x, residual))
    assert wide_x.stride(0) == 128
    assert_fused_norm_equals_unfused(
        wide_x, wide_residual, norm_weight, w, bias, router(48, shared=1)
    )
    # Kimi-Linear's router: 256 experts, top-8 and the shared expert, 32 programs
    x, residual, norm_weight, w, bias = norm_case(1, 256, 128, seed=12, dtype=dtype)
    assert_fused_norm_equals_unfused(x, residual, norm_weight, w, bias, KIMI,
                                     config=FusedRouterConfig(8, 128, 1))  # fmt: skip
    assert triton_launches[KERNEL] == 6


def test_fused_norm_leaves_its_inputs_and_resets_the_semaphore(triton_launches):
    counter = semaphore()
    for seed in (1, 2, 3):
        case = norm_case(1, 16, 64, seed=seed)
        before = [t.clone() for t in case]
        h, new_residual, weights, ids = fused_norm_router_topk(
            *case[:3], EPS, *case[3:], router(16), semaphore=counter
        )
        assert counter.item() == 0
        assert all(torch.equal(a, b) for a, b in zip(case, before, strict=True))
        assert h.is_contiguous() and new_residual.is_contiguous()
        ref = fused_norm_router_topk_ref(*case[:3], EPS, *case[3:], router(16))
        assert torch.equal(new_residual, ref[1])
        # the reference sums the squares in torch's order: one bf16 ulp of h at most
        torch.testing.assert_close(h.float(), ref[0].float(), rtol=2**-7, atol=0.0)
        assert torch.equal(ids, fused_router_topk_ref(h, *case[3:], router(16))[1])
    assert triton_launches[KERNEL] == 3


def test_fused_norm_zero_tokens_launch_nothing(triton_launches):
    case = norm_case(0, 16, 64, seed=0)
    h, new_residual, weights, ids = fused_norm(*case, router(16, shared=1))
    assert (
        h.shape == new_residual.shape == (0, 64) and h.dtype == new_residual.dtype == case[0].dtype
    )
    assert weights.shape == ids.shape == (0, 5)
    assert triton_launches[KERNEL] == 0


def test_fused_norm_on_cpu_without_interpreter_runs_the_reference(monkeypatch, triton_launches):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    case = norm_case(1, 16, 64, seed=6, device="cpu")
    out = fused_norm_router_topk(*case[:3], EPS, *case[3:], router(16), semaphore=semaphore("cpu"))
    ref = fused_norm_router_topk_ref(*case[:3], EPS, *case[3:], router(16))
    assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))
    assert triton_launches[KERNEL] == triton_launches["_rms_norm_kernel"] == 0
    assert not use_fused_norm_router(case[0], case[1], case[2], case[3])


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(r=lambda r: r.float()), "residual must match x"),
        (dict(r=lambda r: r[:, :-1]), "residual must match x"),
        (dict(r=lambda r: torch.stack([r, r], dim=2)[..., 0]), "residual must have unit stride"),
        (dict(n=lambda n: n[:-1]), r"norm_weight must be \[64\]"),
        (dict(n=lambda n: n.to(torch.int32)), r"norm_weight must be \[64\]"),
        (dict(n=lambda n: torch.stack([n, n], dim=1)[:, 0]), "norm_weight must be contiguous"),
        (dict(n=lambda n: n.to("meta")), "norm_weight is on meta"),
        (dict(c=FusedRouterConfig(2, 64, 2)), "num_warps must be the norm kernel's 1 at H 64"),
        (dict(c=FusedRouterConfig(3, 64, 1)), "block_n must be a positive power of two"),
        (dict(s=lambda s: s.long()), "semaphore must be an int32 .1. tensor"),
        (dict(rt=dict(top_k=17)), "top_k 17"),
    ],
)
def test_fused_norm_argument_errors(change, message, triton_launches):
    x, residual, norm_weight, w, bias = norm_case(2, 16, 64, seed=7)
    residual = change.get("r", lambda v: v)(residual)
    norm_weight = change.get("n", lambda v: v)(norm_weight)
    s = change.get("s", lambda v: v)(semaphore())
    with pytest.raises(ValueError, match=message):
        fused_norm_router_topk(x, residual, norm_weight, EPS, w, bias,
                               router(16, **change.get("rt", {})), semaphore=s,
                               config=change.get("c"))  # fmt: skip
    assert triton_launches[KERNEL] == 0


@pytest.fixture
def preload_flags(launch_constexprs):
    """The ``PRELOAD`` constexpr of each fused-router launch, in order."""
    return launch_constexprs(fused_mod, "PRELOAD")


@pytest.mark.parametrize("norm", [False, True])
def test_static_weights_route_bit_for_bit(norm, preload_flags, triton_launches):
    """A static gate (and norm) weight is loaded before the PDL wait on the one-token path
    (`PRELOAD`), and only there: every output bit for bit the plain launch's."""
    routing = ROUTINGS[1]

    def route(x, residual, norm_weight, w, bias, static: bool):
        if norm:
            return fused_norm_router_topk(
                x, residual, norm_weight, EPS, w, bias, routing, semaphore=sem(x),
                static_weight=static,
            )  # fmt: skip
        return fused_router_topk(x, w, bias, routing, semaphore=sem(x), static_weight=static)

    for t in (1, 3):
        case = norm_case(t, 32, 80, seed=30 + t)
        plain, static = route(*case, False), route(*case, True)
        assert all(torch.equal(a, b) for a, b in zip(plain, static, strict=True))
    assert preload_flags == [False, True, False, False]
    assert triton_launches[KERNEL] == 4


def test_fused_norm_takes_rows_up_to_its_hidden_limit():
    hidden = FUSED_NORM_MAX_HIDDEN + 16
    x, residual = torch.zeros(1, hidden), torch.zeros(1, hidden)
    norm_weight, w = torch.ones(hidden), torch.zeros(4, hidden)
    assert not use_fused_norm_router(x, residual, norm_weight, w)
    with pytest.raises(ValueError, match=rf"H in \[1, {FUSED_NORM_MAX_HIDDEN}\], got {hidden}"):
        fused_norm_router_topk(x, residual, norm_weight, EPS, w, None, router(4, top_k=2),
                               semaphore=semaphore("cpu"))  # fmt: skip


def test_fused_norm_loads_whole_rows_within_the_limit(monkeypatch, whole_row_flags,
                                                     triton_launches):  # fmt: skip
    """`test_one_token_loads_whole_rows_within_the_limit` with the norm: the norm kernel then
    the router at the same config, bit for bit, on each side of the limit."""
    monkeypatch.setattr(fused_mod, "WHOLE_ROW_MAX_ELEMENTS", 256)
    for t, config, _ in SMALL_LIMIT_CASES:
        assert_fused_norm_equals_unfused(*norm_case(t, 32, 80, seed=30 + t), ROUTINGS[1], config)
    # per case, the fused launch, then the unfused sequence's router
    assert whole_row_flags == [whole for *_, whole in SMALL_LIMIT_CASES for _ in range(2)]


def test_default_norm_config():
    assert default_norm_config(2304) == FusedRouterConfig(1, 1024, 8)  # the norm's 8 warps
    assert default_norm_config(256) == FusedRouterConfig(1, 256, 1)
    assert default_norm_config(80) == FusedRouterConfig(1, 128, 1)


def test_fused_norm_dispatch(monkeypatch):
    x, residual, norm_weight, w, _ = norm_case(2, 16, 64, seed=8)
    one = (x[:1], residual[:1], norm_weight, w)
    assert use_fused_norm_router(*one) and not use_fused_norm_router(x, residual, norm_weight, w)
    assert not use_fused_norm_router(x[:1], residual[:1].float(), norm_weight, w)
    column = torch.randn(64, 2, generator=torch.Generator().manual_seed(0)).to(x.dtype)[:, :1]
    strided = column.t()  # [1, 64], stride 2 on H
    assert not use_fused_norm_router(x[:1], strided, norm_weight, w)
    # A row stride 16 does not divide: the norm kernel would lay its loads out otherwise.
    odd_row = torch.zeros(1, 72, dtype=x.dtype, device=x.device)[:, :64]
    assert not use_fused_norm_router(odd_row, residual[:1], norm_weight, w)
    assert not use_fused_norm_router(x[:1], odd_row, norm_weight, w)
    assert not use_fused_norm_router(x[:1], residual[:1], norm_weight[:-1], w)
    monkeypatch.setattr(fused_mod, "FUSED_NORM_MAX_HIDDEN", 32)
    assert not use_fused_norm_router(*one)
    monkeypatch.setattr(fused_mod, "FUSED_NORM_MAX_HIDDEN", 64)
    monkeypatch.setattr(fused_mod, "FUSED_ROUTER_MAX_T", 2)
    assert use_fused_norm_router(x, residual, norm_weight, w)


def moe_and_norm(dtype, device=DEVICE, hidden=48, experts=16, top_k=4):
    """`kimi_moe` and a post-attention RMSNorm with a weight near 1."""
    moe = kimi_moe(device, hidden, experts, top_k, dtype)
    norm = RMSNorm(hidden, 1e-5, dtype).to(device)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=gen))
    return moe, norm


@pytest.mark.usefixtures("interpreter_moe_blocks")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_kimi_moe_norms_in_the_router_launch_at_one_token(
    dtype, triton_launches, monkeypatch, preload_flags
):
    """forward_with_norm at T = 1: one launch for the norm and the router, and the block's output
    and residual stream bit for bit those of the norm's launch, then `forward` (its router at the
    fused norm's launch config, as the contract states it; the interpreter's sums would not tell
    the warps apart anyway). Both launches take the layer's weights as static."""
    config = default_norm_config(48)
    monkeypatch.setattr(fused_mod, "default_config", lambda hidden: config)
    moe, norm = moe_and_norm(dtype)
    x, residual, *_ = norm_case(1, 16, 48, seed=13, dtype=dtype)
    with torch.no_grad():
        out, new_residual = moe.forward_with_norm(x, residual, norm)
        counts = (triton_launches[KERNEL], triton_launches["_rms_norm_kernel"],
                  triton_launches["_grouped_topk_kernel"])  # fmt: skip
        assert counts == (1, 0, 0) and moe.router_semaphore.item() == 0
        h, expected_residual = norm(x, residual)
        expected = moe(h)
    assert triton_launches[KERNEL] == 2 and triton_launches["_rms_norm_kernel"] == 1
    assert torch.equal(new_residual, expected_residual) and torch.equal(out, expected)
    assert preload_flags == [True, True]


@pytest.mark.usefixtures("interpreter_moe_blocks")
def test_kimi_moe_with_norm_falls_back_above_one_token(triton_launches):
    """T = 2 (above FUSED_ROUTER_MAX_T): the norm's own launch, then the two router launches."""
    moe, norm = moe_and_norm(torch.bfloat16)
    x, residual, *_ = norm_case(2, 16, 48, seed=14)
    with torch.no_grad():
        out, new_residual = moe.forward_with_norm(x, residual, norm)
        counts = (triton_launches[KERNEL], triton_launches["_rms_norm_kernel"],
                  triton_launches["_grouped_topk_kernel"])  # fmt: skip
        assert counts == (0, 1, 1)
        h, expected_residual = norm(x, residual)
        assert torch.equal(new_residual, expected_residual) and torch.equal(out, moe(h))
    with pytest.raises(TypeError, match="norm must be an RMSNorm, got Identity"):
        moe.forward_with_norm(x, residual, torch.nn.Identity())


# ---------------------------------------------------------------------------------------------
# GPU: Kimi-Linear's router (H 2304, E 256, top-8 + 1 shared, sigmoid, bias, scaling 2.446)
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 3, 4, 8, 16])
def test_gpu_exact_logits_equal_the_two_launches(t, triton_launches):
    """128 programs (the default) and the swept shapes on exact logits: the layer's two launches'
    ids, and its weights up to the order of the renormalising sum of 8 scores, which the warps
    per program set (the configs differ in warps): 14 2^-24 relative at most."""
    x, w, bias = exact_case(t, 256, 2304, seed=t, device="cuda")
    two_launches = grouped_topk(router_logits(x, w), bias, KIMI)
    for config in (None, *CONFIGS):
        weights, ids = fused_router_topk(x, w, bias, KIMI, semaphore=sem(x), config=config)
        assert torch.equal(ids, two_launches[1])
        torch.testing.assert_close(weights, two_launches[0], rtol=14 * 2**-24, atol=0.0)
    assert triton_launches[KERNEL] == 1 + len(CONFIGS)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 8, 16])
def test_gpu_kimi_sizes_against_the_two_launches(t):
    """Gaussian data, 32 nonzero x entries per token (so that the rigorous logit error bound
    leaves tie-free seeds at H 2304), against the reference and the layer's two launches."""
    x, w, bias = tie_free_case(t, 256, 2304, KIMI, t, other_terms=3, device="cuda", nonzero=32)
    assert_matches_reference(x, w, bias, KIMI)
    out = fused_router_topk(x, w, bias, KIMI, semaphore=sem(x))
    two_launches = grouped_topk(router_logits(x, w), bias, KIMI)
    # router_logits takes bf16x3 above 4 bf16 tokens: 3 products per element.
    assert_close_routing(out, two_launches, x, w, bias, KIMI, logit_error(x, w, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4])
def test_gpu_cuda_graph_replays(t):
    """26 layers' routers in one graph, each with its own gate and semaphore, then the same
    semaphore for all: every replay computes afresh (the semaphore is back at 0 each time)."""
    layers = [random_case(t, 256, 2304, seed=200 + i, device="cuda")[1:] for i in range(26)]
    x = random_case(t, 256, 2304, seed=300 + t, device="cuda")[0]
    for shared_semaphore in (False, True):
        counters = [semaphore("cuda") for _ in layers]
        if shared_semaphore:
            counters = counters[:1] * len(layers)

        def step(x=x, counters=counters):
            return [fused_router_topk(x, w, b, KIMI, semaphore=s)
                    for (w, b), s in zip(layers, counters, strict=True)]  # fmt: skip

        step()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        for seed in (1, 2, 3):
            x.copy_(random_case(t, 256, 2304, seed=seed, device="cuda")[0])
            for weights, ids in captured:
                weights.fill_(-1.0)
                ids.fill_(-1)
            graph.replay()
            torch.cuda.synchronize()
            assert all(c.item() == 0 for c in counters)
            for (weights, ids), (w, b) in zip(captured, layers, strict=True):
                eager_w, eager_ids = fused_router_topk(x, w, b, KIMI, semaphore=semaphore("cuda"))
                assert torch.equal(ids, eager_ids) and torch.equal(weights, eager_w)


@pytest.mark.gpu
def test_gpu_kimi_moe_in_a_cuda_graph():
    """KimiMoE at batch 1, bf16, Kimi's router sizes: each replay on new hidden states equals the
    eager block (a router left unrun would keep the previous replay's experts)."""
    moe = kimi_moe("cuda", hidden=2304, experts=256, top_k=8, dtype=torch.bfloat16)
    x = torch.zeros(1, 2304, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        moe(x)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = moe(x)
        outputs = []
        for seed in (1, 2, 3):
            x.copy_(random_case(1, 256, 2304, seed=seed, device="cuda")[0])
            graph.replay()
            torch.cuda.synchronize()
            assert moe.router_semaphore.item() == 0
            assert torch.equal(captured, moe(x))
            outputs.append(captured.clone())
    assert not torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[1], outputs[2])


# ---------------------------------------------------------------------------------------------
# GPU: the norm in the router's launch at Kimi-Linear's sizes (H 2304: the norm's 8 warps)
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("t", [1, 2, 4])
def test_gpu_fused_norm_kimi_sizes_bit_for_bit(t, dtype, triton_launches):
    """Dense rows, several seeds: h, the residual, weights and ids are the norm kernel's and then
    the router's at the same config. fp32 rows show any difference in the sum of squares' order
    (h is not rounded to bf16 after the rstd); bf16 rows are the model's."""
    for seed in range(8):
        assert_fused_norm_equals_unfused(*norm_case(t, 256, 2304, seed, "cuda", dtype), KIMI)
    swept = FusedRouterConfig(4, 512, 8)
    assert_fused_norm_equals_unfused(*norm_case(t, 256, 2304, 99, "cuda", dtype), KIMI, swept)
    assert triton_launches[KERNEL] == 18 and triton_launches["_rms_norm_kernel"] == 9


@pytest.mark.gpu
def test_gpu_fused_norm_routes_as_the_default_router_up_to_summation_order():
    """Against what the layer ran before (the norm, then the router at `default_config`'s 4
    warps): the same h and residual, the same ids and weights within the logit error, on sparse
    rows (32 nonzero entries: a tight enough error bound for tie-free seeds at H 2304)."""
    for seed in range(0, 100_000, 1000):
        x, residual, norm_weight, w, bias = norm_case(1, 256, 2304, seed, "cuda", nonzero=32)
        h, new_residual = fused_add_rms_norm(x, residual, norm_weight, EPS)
        gap = decision_gap(h, w, bias, 8, 1, 1, "sigmoid")
        if bool((gap > 4 * logit_error(h, w) + 1e-6).all()):
            break
    else:
        raise AssertionError("no tie-free seed in 100 tries")
    out = fused_norm(x, residual, norm_weight, w, bias, KIMI)
    assert torch.equal(out[0], h) and torch.equal(out[1], new_residual)
    before = fused_router_topk(h, w, bias, KIMI, semaphore=sem(x))
    assert_close_routing(out[2:], before, h, w, bias, KIMI, logit_error(h, w))


@pytest.mark.gpu
def test_gpu_fused_norm_cuda_graph_replays():
    """26 layers' norms and routers in one graph, each with its own norm weight, gate and
    semaphore: every replay computes afresh from the new rows, as the unfused launches do."""
    layers = [norm_case(1, 256, 2304, seed=400 + i, device="cuda")[2:] for i in range(26)]
    counters = [semaphore("cuda") for _ in layers]
    x, residual = (t.clone() for t in norm_case(1, 256, 2304, seed=500, device="cuda")[:2])

    def step():
        return [fused_norm_router_topk(x, residual, n, EPS, w, b, KIMI, semaphore=s)
                for (n, w, b), s in zip(layers, counters, strict=True)]  # fmt: skip

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for seed in (1, 2, 3):
        new_x, new_residual = norm_case(1, 256, 2304, seed=seed, device="cuda")[:2]
        x.copy_(new_x)
        residual.copy_(new_residual)
        for outputs in captured:
            for out in outputs:
                out.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert all(c.item() == 0 for c in counters)
        for outputs, (n, w, b) in zip(captured, layers, strict=True):
            expected = norm_then_router(x, residual, n, w, b, KIMI, default_norm_config(2304))
            assert all(torch.equal(a, e) for a, e in zip(outputs, expected, strict=True))


@pytest.mark.gpu
def test_gpu_kimi_moe_forward_with_norm_in_a_cuda_graph(monkeypatch):
    """KimiMoE at batch 1, bf16, Kimi-Linear's sizes (256 experts, top-8, the shared expert
    fused): each replay equals the eager norm launch and then `forward`, its router at the fused
    norm's launch config, bit for bit."""
    config = default_norm_config(2304)
    moe, norm = moe_and_norm(torch.bfloat16, "cuda", hidden=2304, experts=256, top_k=8)
    assert moe.fuses_shared_experts
    x, residual = (torch.zeros(1, 2304, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    with torch.no_grad():
        moe.forward_with_norm(x, residual, norm)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured, captured_residual = moe.forward_with_norm(x, residual, norm)
        monkeypatch.setattr(fused_mod, "default_config", lambda hidden: config)
        outputs = []
        for seed in (1, 2, 3):
            new_x, new_residual = norm_case(1, 256, 2304, seed=seed, device="cuda")[:2]
            x.copy_(new_x)
            residual.copy_(new_residual)
            graph.replay()
            torch.cuda.synchronize()
            assert moe.router_semaphore.item() == 0
            h, expected_residual = norm(x, residual)
            assert torch.equal(captured_residual, expected_residual)
            assert torch.equal(captured, moe(h))
            outputs.append(captured.clone())
    assert not torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[1], outputs[2])
