"""MLA prefill attention: torch's fused attention (the GPU path, run here on the CPU with its
explicit mask) against the fp32 einsum reference, for new prompts (`Lq == ctx`) and chunks on top of
cached context (`Lq < ctx`); the key kernel, and its launch that also makes a new prompt's q and v
contiguous (under TRITON_INTERPRET=1 on CPU), against torch's cat and copies; the value read in
place against a zero-padded copy; which fused kernel runs which shape; at Kimi-Linear's sizes on a
GPU, without the score matrix, and bit for bit as the cat and pad it replaces."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from vllm.models.kimi_k3.amd.ops import mla_prefill
from vllm.models.kimi_k3.amd.ops.mla_prefill import (
    FLASH_MAX_PROMPT,
    _gpu_path,
    _value_operand,
    causal_masked,
    mla_prefill_attention,
    mla_prefill_attention_ref,
    mla_prefill_dense_operands,
    mla_prefill_key,
)


def make_case(lq, ctx, heads, nope, rope, dv, dtype, gen, device="cpu"):
    def draw(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    q, k_nope, k_pe, v = draw(lq, heads, nope + rope), draw(ctx, heads, nope), draw(ctx, rope), \
        draw(ctx, heads, dv)  # fmt: skip
    positions = torch.arange(ctx, device=device)
    masked = positions[None, :] > positions[ctx - lq :, None]  # key past the query's position
    return (q, k_nope, k_pe, v), masked, (nope + rope) ** -0.5


def truth_of(inputs, scale, masked):
    """The reference on the inputs as given, in fp32 throughout (output not rounded)."""
    return mla_prefill_attention_ref(*[t.float() for t in inputs], scale, masked)


SHAPES = [(64, 64), (24, 80), (1, 33), (17, 17)]  # new prompts, chunks on cached context, 1 token


def test_causal_masked_hides_the_keys_past_each_query():
    """The mask the MLA layer gives the CPU reference: query i of the last lq of ctx positions
    sees keys 0 .. ctx - lq + i."""
    assert causal_masked(3, 5).tolist() == [
        [False] * 3 + [True] * 2,
        [False] * 4 + [True],
        [False] * 5,
    ]
    assert causal_masked(2, 2).tolist() == [[False, True], [False, False]]
    for lq, ctx in SHAPES:
        _, masked, _ = make_case(lq, ctx, 1, 1, 1, 1, torch.float32, torch.Generator())
        assert torch.equal(causal_masked(lq, ctx), masked)


@pytest.mark.parametrize("lq,ctx", SHAPES)
def test_fused_matches_reference_fp32(lq, ctx):
    inputs, masked, scale = make_case(lq, ctx, 4, 32, 16, 24, torch.float32,
                                      torch.Generator().manual_seed(lq * 100 + ctx))  # fmt: skip
    got = mla_prefill_attention(*inputs, scale)
    assert got.shape == (lq, 4, 24) and got.dtype == torch.float32
    torch.testing.assert_close(got, mla_prefill_attention_ref(*inputs, scale, masked),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("lq,ctx", SHAPES)
def test_fused_matches_reference_bf16(lq, ctx):
    """bf16 inputs: both paths compute in fp32 on the CPU and round once to bf16 at the end, so
    each is within one output rounding (half a bf16 ulp, <= 2^-8 relative) of the fp32 truth."""
    inputs, masked, scale = make_case(lq, ctx, 4, 32, 16, 24, torch.bfloat16,
                                      torch.Generator().manual_seed(lq * 100 + ctx))  # fmt: skip
    truth = truth_of(inputs, scale, masked)
    for got in (mla_prefill_attention(*inputs, scale),
                mla_prefill_attention_ref(*inputs, scale, masked)):  # fmt: skip
        assert got.dtype == torch.bfloat16
        assert ((got.float() - truth).abs() <= 2**-8 * truth.abs()).all()


def test_causality_is_bottom_right_aligned():
    """With cached context, the first chunk query sees exactly the cached keys and itself: moving
    a later key changes nothing, moving one it sees changes its output."""
    lq, ctx = 4, 10
    inputs, masked, scale = make_case(lq, ctx, 2, 8, 4, 8, torch.float32,
                                      torch.Generator().manual_seed(5))  # fmt: skip
    base = mla_prefill_attention(*inputs, scale)
    q, k_nope, k_pe, v = inputs
    for key, changes_first in ((ctx - lq + 1, False), (ctx - lq, True)):
        v2 = v.clone()
        v2[key] += 10
        first = mla_prefill_attention(q, k_nope, k_pe, v2, scale)[0]
        assert (not torch.equal(first, base[0])) == changes_first


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: (a[0][:, :, :-1], *a[1:]), "head dim"),
        (lambda a: (a[0], a[1][:, :1], *a[2:]), "heads / context"),
        (lambda a: (a[0][:1].expand(12, -1, -1), *a[1:]), "Lq <= ctx"),
        (lambda a: (*a[:3], a[3].double()), "share a dtype"),
        (lambda a: (*a[:3], a[3].to("meta")), "share a device"),
        (lambda a: (a[0][0], *a[1:]), "expected q"),
    ],
)
def test_validation(change, match):
    inputs, _, scale = make_case(2, 10, 2, 8, 4, 8, torch.float32,
                                 torch.Generator().manual_seed(0))  # fmt: skip
    bad = change(inputs)
    with pytest.raises(ValueError, match=match):
        mla_prefill_attention(*bad, scale)


@pytest.mark.parametrize("ctx,heads,nope,rope", [(5, 32, 128, 64), (37, 3, 24, 12), (1, 1, 8, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_key_kernel_equals_cat(ctx, heads, nope, rope, dtype, triton_launches):
    """The key `[k_nope | k_pe]` of one launch, read from strided views (k_nope in `kv_b_proj`'s
    output before v, k_pe in a cache row after the latent), bit for bit torch's cat; Kimi-Linear's
    dims, and dims off powers of two."""
    gen = torch.Generator().manual_seed(ctx + nope)
    kv = torch.randn(ctx, heads, nope + 16, generator=gen).to(dtype)
    cached = torch.randn(ctx, 40 + rope, generator=gen).to(dtype)
    k_nope, k_pe = kv[..., :nope], cached[:, 40:]
    got = mla_prefill_key(k_nope, k_pe)
    assert triton_launches["_mla_prefill_operands_kernel"] == 1
    assert got.is_contiguous()
    assert torch.equal(got, torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, heads, -1)], dim=-1))


# (One token of one head would be contiguous by torch's rules, whatever its strides.)
@pytest.mark.parametrize(
    "ctx,heads,nope,rope,dv", [(5, 32, 128, 64, 128), (37, 3, 24, 12, 20), (2, 1, 8, 4, 8)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("v_apart", [False, True], ids=["v_after_k_nope", "v_apart"])
def test_dense_operands_in_one_launch(
    ctx, heads, nope, rope, dv, dtype, v_apart, triton_launches, monkeypatch
):
    """A new prompt's q (a column slice of the fused projection, at an odd offset), k_nope and v
    (the halves of `kv_b_proj`'s output, or v in a strided buffer of its own) and k_pe (cache
    rows after the latent), as MLA passes them: one launch makes q, k and v contiguous for
    cuDNN's per-length-class plans (the key's own path is not taken), bit for bit torch's
    copies and cat; Kimi-Linear's dims, and dims off powers of two."""
    gen = torch.Generator().manual_seed(ctx + dv)
    proj = torch.randn(ctx, 7 + heads * (nope + rope) + 3, generator=gen).to(dtype)
    q = proj[:, 7 : 7 + heads * (nope + rope)].view(ctx, heads, nope + rope)
    kv = torch.randn(ctx, heads, nope + dv, generator=gen).to(dtype)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    if v_apart:
        v = torch.randn(ctx, heads + 2, dv + 5, generator=gen).to(dtype)[:, 1 : 1 + heads, 2:-3]
    k_pe = torch.randn(ctx, 40 + rope, generator=gen).to(dtype)[:, 40:]
    monkeypatch.setattr(mla_prefill, "mla_prefill_key", _not_called)
    got = mla_prefill_dense_operands(q, k_nope, k_pe, v)
    assert triton_launches["_mla_prefill_operands_kernel"] == 1
    key = torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, heads, -1)], dim=-1)
    for got_, want in zip(got, (q, key, v), strict=True):
        assert got_.is_contiguous() and got_.shape == want.shape
        assert torch.equal(got_, want)


def _not_called(*args):
    raise AssertionError("the dense operands took the key's own path")


@pytest.mark.parametrize("strided", ["q", "v"])
def test_dense_operands_copy_only_the_strided_one(strided, triton_launches, monkeypatch):
    """Kimi-K3's q is `q_b_proj`'s own contiguous output while v is a half of `kv_b_proj`'s:
    the one launch copies only the strided operand and returns the contiguous one as it is (no
    copy of q's 8192 x H x 192 at a long prompt); the other way round likewise."""
    (q, k_nope, k_pe, v), _, _ = make_case(6, 6, 3, 8, 4, 8, torch.float32,
                                           torch.Generator().manual_seed(3))  # fmt: skip
    if strided == "v":
        kv = torch.randn(6, 3, 8 + 8, generator=torch.Generator().manual_seed(4))
        k_nope, v = kv[..., :8], kv[..., 8:]
    else:
        q = torch.stack([q, -q], dim=1)[:, 0]
    assert not (q if strided == "q" else v).is_contiguous()
    monkeypatch.setattr(mla_prefill, "mla_prefill_key", _not_called)
    got = mla_prefill_dense_operands(q, k_nope, k_pe, v)
    assert triton_launches["_mla_prefill_operands_kernel"] == 1
    assert (got[2] if strided == "q" else got[0]) is (v if strided == "q" else q)
    key = torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, 3, -1)], dim=-1)
    for got_, want in zip(got, (q, key, v), strict=True):
        assert got_.is_contiguous() and torch.equal(got_, want)


@pytest.mark.parametrize("layout", ["contiguous", "q_strided_columns"])
def test_dense_operands_elsewhere_copy_and_build_the_key(layout, triton_launches):
    """Operands already contiguous are returned as they are, and a q without a unit last stride
    goes through torch's copy; the key is `mla_prefill_key`'s either way, the values the same."""
    (q, k_nope, k_pe, v), _, _ = make_case(6, 6, 3, 8, 4, 8, torch.float32,
                                           torch.Generator().manual_seed(2))  # fmt: skip
    if layout == "q_strided_columns":
        q = torch.stack([q, -q], dim=-1)[..., 0]
    got = mla_prefill_dense_operands(q, k_nope, k_pe, v)
    assert triton_launches["_mla_prefill_operands_kernel"] == 1  # the key's launch alone
    if layout == "contiguous":
        assert got[0] is q and got[2] is v
    key = torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, 3, -1)], dim=-1)
    for got_, want in zip(got, (q, key, v), strict=True):
        assert got_.is_contiguous() and torch.equal(got_, want)


def test_dense_operands_reject_a_chunk(triton_launches):
    """Rows of q and of the context are one row each only for a new prompt: a chunk on cached
    context (`Lq < ctx`) is a ValueError, before any launch."""
    (q, k_nope, k_pe, v), _, _ = make_case(3, 5, 2, 8, 4, 8, torch.float32,
                                           torch.Generator().manual_seed(1))  # fmt: skip
    with pytest.raises(ValueError, match="Lq == ctx"):
        mla_prefill_dense_operands(q, k_nope, k_pe, v)
    assert triton_launches["_mla_prefill_operands_kernel"] == 0


@pytest.mark.parametrize(
    "k_pe_shape,k_pe_dtype,match",
    [((3, 4), torch.float32, "k_pe \\[ctx, rope\\]"), ((6, 4), torch.bfloat16, "share a dtype"),
     ((6, 2, 4), torch.float32, "k_pe \\[ctx, rope\\]")],
    ids=["fewer_rows", "other_dtype", "three_dims"],
)  # fmt: skip
def test_key_rejects_operands_that_do_not_fit(k_pe_shape, k_pe_dtype, match, triton_launches):
    """A `k_pe` of fewer rows than `k_nope` (the kernel read past its end) or of another dtype
    (the kernel converted it where the cat promotes) is a ValueError, before any launch."""
    k_nope = torch.zeros(6, 2, 8)
    with pytest.raises(ValueError, match=match):
        mla_prefill_key(k_nope, torch.zeros(k_pe_shape, dtype=k_pe_dtype))
    assert triton_launches["_mla_prefill_operands_kernel"] == 0


def padded_value_attention(q, k, v, scale, mask):
    """Attention on v zero-padded to the query's head dim, the output's first Dv columns: what
    the value operands must reproduce."""
    dv = v.shape[-1]
    v = F.pad(v, (0, q.shape[-1] - dv))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=scale,
    )  # fmt: skip
    return out[0, :, :, :dv].transpose(0, 1)


def test_value_read_in_place_gives_the_padded_bits():
    """For k_nope and v split from one buffer, the value operand that starts inside k_nope gives
    the output columns of the zero-padded one bit for bit (each column is P times its own value
    column): torch's CPU attention here, the GPU's fused kernels in the GPU test. Other layouts
    get the padded copy."""
    q, k_nope, k_pe, v = make_case(24, 40, 4, 32, 16, 24, torch.float32,
                                   torch.Generator().manual_seed(9))[0]  # fmt: skip
    kv = torch.cat([k_nope, v], dim=-1)
    operand, first = _value_operand(kv[..., :32], kv[..., 32:], 48)
    assert first == 24 and operand.data_ptr() == kv[..., 8:].data_ptr()  # a view, no copy
    assert torch.equal(operand, kv[..., 8:])
    k = mla_prefill_key(k_nope, k_pe)
    mask = torch.ones(24, 40, dtype=torch.bool).tril(40 - 24)
    got = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        operand.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=0.1,
    )[0, :, :, first:].transpose(0, 1)  # fmt: skip
    assert torch.equal(got, padded_value_attention(q, k, v, 0.1, mask))
    # Separate tensors, and k_nope narrower than the padding: zero-padded copies.
    for k_nope_, v_ in ((k_nope, v), (kv[..., 28:32], kv[..., 32:])):
        operand, first = _value_operand(k_nope_, v_, 48)
        assert first == 0 and torch.equal(operand[..., :24], v) and not operand[..., 24:].any()


def test_gpu_path_by_shape_and_cudnn_setting(monkeypatch):
    """Chunks on cached context take torch's lower-right mask; new prompts up to the flash limit
    the flash kernel; longer ones cuDNN, with per-length-class plans exactly when torch's opt-in
    reads "1"."""
    limit = FLASH_MAX_PROMPT
    monkeypatch.setenv("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "1")
    assert _gpu_path(limit, limit + 1) == _gpu_path(1, 9000) == "lower_right"
    assert _gpu_path(1, 1) == _gpu_path(limit, limit) == "flash"
    assert _gpu_path(limit + 1, limit + 1) == _gpu_path(8192, 8192) == "cudnn_classes"
    for value in ("0", "true"):
        monkeypatch.setenv("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", value)
        assert _gpu_path(8192, 8192) == "cudnn_shapes"
        assert _gpu_path(limit, limit) == "flash"


def test_reference_checks_its_mask():
    inputs, masked, scale = make_case(2, 10, 2, 8, 4, 8, torch.float32,
                                      torch.Generator().manual_seed(0))  # fmt: skip
    with pytest.raises(ValueError, match="masked must be bool"):
        mla_prefill_attention_ref(*inputs, scale, masked[:, 1:])


@pytest.mark.gpu
@pytest.mark.parametrize("lq,ctx", [(2048, 2048), (4096, 4096), (512, 4096)])
def test_gpu_kimi_linear_sizes(lq, ctx):
    """32 heads, nope 128, rope 64, v 128 (Kimi-Linear), bf16. The fused kernels keep P in bf16
    at most before P @ V (an error of <= 2^-9 relative per probability, so <= 2^-9 max|v| on the
    output) and round the output once (<= 2^-8 relative): that bounds the error against the fp32
    truth. Beyond the operands they build (k `[ctx, 32, 192]`, v padded to 192 or copied (separate
    k_nope and v here), the output), their memory is a small fraction of the fp32 score matrix
    that the reference materializes. The key kernel gives the bits of torch's cat."""
    device = torch.device("cuda")
    inputs, masked, scale = make_case(lq, ctx, 32, 128, 64, 128, torch.bfloat16,
                                      torch.Generator(device=device).manual_seed(lq + ctx),
                                      device=device)  # fmt: skip
    truth = truth_of(inputs, scale, masked)
    q, k_nope, k_pe, v = inputs
    k = mla_prefill_key(k_nope, k_pe)
    assert torch.equal(k, torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, 32, -1)], dim=-1))
    del k
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    got = mla_prefill_attention(*inputs, scale)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    operands = 2 * (2 * ctx + lq) * 32 * 192  # bf16 k, padded v, padded output
    scores_bytes = 32 * lq * ctx * 4
    assert extra - operands < scores_bytes / 16, (extra, operands, scores_bytes)
    vmax = inputs[3].float().abs().max()
    bound = 2**-9 * vmax + 2**-8 * truth.abs()
    err = (got.float() - truth).abs()
    assert (err <= bound).all(), (err - bound).max()


@pytest.mark.gpu
@pytest.mark.parametrize("lq,ctx", [(8192, 8192), (2048, 2048), (512, 4096)])
def test_gpu_same_bits_as_cat_and_pad(lq, ctx):
    """At Kimi-Linear's sizes (a long prompt for cuDNN, a short one for flash, a chunk on cached
    context), k_nope and v split from one `kv_b_proj` output as MLA passes them: the key kernel
    and the value operand (read in place for flash; for cuDNN's per-length-class plans q, k and
    v at their own widths, made contiguous in one launch) give the bits of the cat and of the
    zero-padded value, through the same fused kernel."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(lq)
    q = torch.randn(lq, 32, 192, generator=gen, device=device).to(torch.bfloat16)
    kv = torch.randn(ctx, 32 * 256, generator=gen, device=device).to(torch.bfloat16)
    k_nope, v = kv.view(ctx, 32, 256).split([128, 128], dim=-1)
    cached = torch.randn(ctx, 576, generator=gen, device=device).to(torch.bfloat16)
    k_pe = cached[:, 512:]
    assert _value_operand(k_nope, v, 192)[1] == 64  # the in-place operand
    got = mla_prefill_attention(q, k_nope, k_pe, v, 192**-0.5)
    k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(ctx, 32, 64)], dim=-1)
    assert torch.equal(mla_prefill_key(k_nope, k_pe), k)
    cudnn = _gpu_path(lq, ctx).startswith("cudnn")
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION if cudnn else SDPBackend.FLASH_ATTENTION):
        want = padded_value_attention(q, k, v, 192**-0.5, causal_lower_right(lq, ctx))
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_long_new_prompts_take_torchs_per_length_class_cudnn_plans():
    """A new prompt past the flash limit, as MLA passes it (q a column slice of the fused
    projection, v split from `kv_b_proj`'s output), reaches torch's per-length-class cuDNN path:
    in a fresh process (torch reads the setting once), torch warns that the path is on and not
    that it fell back for the operands' layout. Each check fails where it should: with the
    setting at 0, and with the strided operands passed to torch as they are."""
    code = f"""
import sys, warnings
import torch
import torch.nn.functional as F
from vllm.models.kimi_k3.amd.ops.mla_prefill import mla_prefill_attention, mla_prefill_key
warnings.simplefilter("always")
L = {FLASH_MAX_PROMPT + 1000}
q = torch.randn(L, 32 * 192 + 576, device="cuda", dtype=torch.bfloat16)[:, : 32 * 192]
q = q.view(L, 32, 192)
kv = torch.randn(L, 32, 256, device="cuda", dtype=torch.bfloat16)
k_nope, v = kv.split([128, 128], dim=-1)
k_pe = torch.randn(L, 64, device="cuda", dtype=torch.bfloat16)
with warnings.catch_warnings(record=True) as seen:
    if sys.argv[1] == "op":
        mla_prefill_attention(q, k_nope, k_pe, v, 192**-0.5)
    else:
        k = mla_prefill_key(k_nope, k_pe)
        F.scaled_dot_product_attention(
            *(x.transpose(0, 1).unsqueeze(0) for x in (q, k, kv[..., 64:])), is_causal=True
        )
texts = [str(w.message) for w in seen]
assert any("AVOID_RECOMPILE=1 is currently experimental" in t for t in texts), texts
assert not any("Falling back" in t for t in texts), texts
"""

    def run(setting: str, how: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "TORCH_CUDNN_SDPA_AVOID_RECOMPILE": setting}
        return subprocess.run(
            [sys.executable, "-c", code, how], env=env, capture_output=True, text=True
        )

    passed = run("1", "op")
    assert passed.returncode == 0, passed.stderr[-2000:]
    # The last line is the failed assertion's message: the warnings the call gave.
    off = run("0", "op").stderr.splitlines()[-1]
    assert off.startswith("AssertionError") and "experimental" not in off, off
    raw = run("1", "raw").stderr.splitlines()[-1]
    assert raw.startswith("AssertionError") and "Falling back" in raw, raw
