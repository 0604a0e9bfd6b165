"""The fused KDA gate + beta kernel (under TRITON_INTERPRET=1 on CPU) against its torch reference:
both gate forms, softplus's linear and tiny ranges, strided inputs; at Kimi-Linear sizes on a
GPU."""

import pytest
import torch

from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate_beta, kda_gate_beta_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(tokens, heads, key_dim, dtype, seed, device=DEVICE):
    """raw and b as strided column slices of wider projections (b is one in the layer)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    width = heads * key_dim
    raw = (torch.randn(tokens, width + 16, generator=gen, device=device) * 8).to(dtype)
    # Spread x over softplus's regimes: linear (> 20), ordinary, and e^x below fp32's epsilon.
    raw[:, :6] = torch.tensor([25.0, 20.5, 19.5, -18.0, -40.0, -90.0], device=device).to(dtype)
    proj = torch.randn(tokens, heads + 5, generator=gen, device=device).to(dtype) * 4
    return dict(
        raw=raw[:, 3 : 3 + width],
        A_log=torch.log(torch.rand(heads, generator=gen, device=device) * 15 + 1),
        dt_bias=torch.randn(width, generator=gen, device=device) * 0.5,
        b=proj[:, 2 : 2 + heads],
    )


def check(inputs, lower_bound, launches):
    ref_g, ref_beta = kda_gate_beta_ref(**inputs, lower_bound=lower_bound)
    g, beta = kda_gate_beta(**inputs, lower_bound=lower_bound)
    assert launches["_kda_gate_beta_kernel"] == 1  # the kernel, not its reference
    assert g.dtype == beta.dtype == torch.float32
    assert g.shape == ref_g.shape and beta.shape == ref_beta.shape
    # fp32 both ways, different exp / log / sigmoid implementations: ulps, relative even where g
    # is tiny (softplus of very negative x is e^x itself, kept to the ulp).
    rtol = 1e-5
    if lower_bound is not None:
        # g = lb * sigmoid(z), z = e^A_log * x, is ~lb * e^z for z << 0, and a GPU's fast exp
        # rounds its argument: e^A_log off by |A_log| 2^-24 + 2^-22 relative (the rate), z * log2(e)
        # by 2^-24 |z|, so e^z is off by up to |z| (2^-22 + 2^-24 (1 + |A_log|)) relative against
        # torch's correctly rounded exp: 1.45e-5 measured on the H200 at z near -50, where g is
        # ~1e-19 (8331 of 33.5M elements above 1e-5).
        a_log = inputs["A_log"].double().repeat_interleave(g.shape[-1])  # per channel
        z = a_log.exp() * (inputs["raw"].double() + inputs["dt_bias"].double())
        rtol = (2**-21 * z.abs() * (1 + a_log.abs()) + 2**-20).view(g.shape)
    assert bool(((g - ref_g).abs() <= rtol * ref_g.abs() + 1e-30).all())
    torch.testing.assert_close(beta, ref_beta, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "lower-bound"])
@pytest.mark.parametrize("tokens,heads,key_dim", [(5, 2, 16), (37, 3, 64)])
def test_gate_beta_matches_reference(tokens, heads, key_dim, lower_bound, dtype, triton_launches):
    inputs = make_inputs(tokens, heads, key_dim, dtype, seed=tokens + heads)
    check(inputs, lower_bound, triton_launches)


def test_gate_beta_rejects_bad_inputs():
    inputs = make_inputs(4, 2, 16, torch.float32, seed=0)
    for name, value in (
        ("raw", inputs["raw"][:, :31]),
        ("b", inputs["b"][:, :1]),
        ("A_log", inputs["A_log"].double()),
    ):
        with pytest.raises(ValueError):
            kda_gate_beta(**{**inputs, name: value}, lower_bound=None)
    # Named errors where a 3-D raw failed to unpack, no heads divided by zero, integer logits were
    # read as numbers and a tensor on another device reached the kernel.
    for match, name, value in (
        ("raw must be a 2-D floating-point", "raw", inputs["raw"].view(4, 2, 16)),
        ("raw must be a 2-D floating-point", "raw", inputs["raw"].int()),
        ("b must be a 2-D floating-point", "b", inputs["b"].int()),
        ("A_log must hold one value per head", "A_log", inputs["A_log"][:0]),
        ("dt_bias is on meta", "dt_bias", inputs["dt_bias"].to("meta")),
        ("A_log is on meta", "A_log", inputs["A_log"].to("meta")),
    ):
        with pytest.raises(ValueError, match=match):
            kda_gate_beta(**{**inputs, name: value}, lower_bound=None)


@pytest.mark.gpu
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "lower-bound"])
def test_gpu_gate_beta_at_kimi_linear_sizes(lower_bound, triton_launches):
    """T = 8192 tokens, 32 heads of 128, bf16 projections."""
    check(make_inputs(8192, 32, 128, torch.bfloat16, seed=1, device="cuda"), lower_bound,
          triton_launches)  # fmt: skip
