"""The fused KDA decode kernel (under TRITON_INTERPRET=1 on CPU) against the unfused ops it fuses,
with and without its gated-RMSNorm epilogue, and the states it updates in place."""

import pytest
import torch

from vllm.models.kimi_k3.amd.ops.fused_kda_decode import fused_kda_decode, fused_kda_decode_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_step(n, heads, d, width, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)

    slots = torch.randperm(n + 2, generator=gen)[:n].to(DEVICE)  # a few unused slots
    proj = rnd(n, 4 * heads * d + 8).to(dtype)  # q | k | v | gate, plus padding: strided views
    return dict(
        mixed_qkv=proj[:, : 3 * heads * d],
        conv_weight=rnd(3 * heads * d, width, scale=0.5),
        conv_state=rnd(n + 2, 3 * heads * d, width - 1).to(dtype),
        raw_g=rnd(n, heads * d),
        A_log=torch.log(torch.rand(heads, generator=gen) * 15 + 1).to(DEVICE),
        dt_bias=rnd(heads * d, scale=0.5),
        b=rnd(n, heads + 3)[:, :heads],
        ssm_state=rnd(n + 2, heads, d, d, scale=0.1),
        slots=slots,
        gate=proj[:, 3 * heads * d : 4 * heads * d].view(n, heads, d),
        norm_weight=(1 + 0.1 * rnd(d)).to(dtype),
    )


def clone(step):
    return {k: (v.clone() if k in ("conv_state", "ssm_state") else v) for k, v in step.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "lower-bound"])
@pytest.mark.parametrize("norm", [True, False], ids=["norm", "no-norm"])
@pytest.mark.parametrize("heads,d", [(2, 32), (3, 64), (1, 128)])
def test_fused_decode_matches_unfused_ops(heads, d, norm, lower_bound, dtype):
    step = make_step(4, heads, d, 4, dtype, seed=heads * d)
    if not norm:
        step["gate"] = step["norm_weight"] = None
    ref_step, got_step = clone(step), clone(step)
    ref = fused_kda_decode_ref(**ref_step, lower_bound=lower_bound, eps=1e-5)
    got = fused_kda_decode(**got_step, lower_bound=lower_bound, eps=1e-5)
    assert got.shape == (4, heads, d) and got.dtype == dtype
    # Same fp32 math up to the order of the K-reductions and the ulps of exp/sigmoid/rsqrt; the
    # output is rounded to `dtype` last (bf16: one rounding, 2^-8 relative).
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(got_step["ssm_state"], ref_step["ssm_state"], rtol=1e-5, atol=1e-6)
    assert torch.equal(got_step["conv_state"], ref_step["conv_state"])  # a pure shift: exact
    untouched = torch.ones(step["ssm_state"].shape[0], dtype=torch.bool, device=DEVICE)
    untouched[step["slots"]] = False
    assert torch.equal(got_step["ssm_state"][untouched], step["ssm_state"][untouched])


def test_norm_and_gate_go_together():
    step = make_step(2, 2, 32, 4, torch.float32, seed=0)
    step["gate"] = None
    with pytest.raises(ValueError, match="norm_weight and gate go together"):
        fused_kda_decode(**step, lower_bound=None)
