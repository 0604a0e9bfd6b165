"""The fused gated-RMSNorm + per-token FP8 op of the KDA ``o_proj`` epilogue, and
``per_token_fp8_quant``, against their torch references and against exact fp64 math.

Without a GPU the Triton kernels run under ``TRITON_INTERPRET=1`` (see ``tests/conftest.py``), so
these tests check the kernels themselves, not only the references. With a GPU they run natively;
the ``gpu``-marked tests add large shapes and CUDA-graph capture.

Bounds, and why they hold:
* Triton vs reference: both compute in fp32 with the same operation order; they differ only in the
  ulps of rsqrt / sigmoid / sum order (a few 1e-7 relative). Scale: relative error <= 1e-6. Codes:
  an fp32 difference that small crosses an FP8 rounding midpoint rarely, so codes may differ by one
  step in under 1e-3 of positions, never by more.
* Against exact math (fp64 from the same inputs): round-to-nearest puts every dequantized value
  within half an FP8 step of ``y / scale``; the fp32 computation of ``y`` adds < 1e-6 relative,
  which is < 1e-4 of a half step (an e4m3 half step is >= 2^-5 of the value), hence the 1 + 1e-4.
* Fused vs sequential (norm rounded to bf16, then ``per_token_fp8_quant``): rounding ``y`` to bf16
  moves each value, and so the amax, by at most 2^-8 relative (bf16's unit roundoff: 8 significant
  bits). Scales agree within 2^-8 (+ fp32 rounding) and codes within one FP8 step, because
  2 * 2^-8 is far below the 2^-4 relative size of an e4m3 step.
"""

import pytest
import torch
from counted_kernels import record_launches

import vllm.model_executor.layers.quantization.utils.fp8_per_token as quant_module
import vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token as op_module
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import (
    per_token_fp8_quant,
    per_token_fp8_quant_ref,
    rmsnorm_gated_fp8_per_token,
    rmsnorm_gated_fp8_per_token_ref,
    rmsnorm_gated_ref,
)
from vllm.platforms import current_platform
from vllm.triton_utils.pdl import use_pdl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
X_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-5
# Smallest normal exponent, for the size of an FP8 step in the subnormal range.
FP8_MIN_EXP = {torch.float8_e4m3fn: -6, torch.float8_e4m3fnuz: -7}


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def fp8_ordinal(q: torch.Tensor) -> torch.Tensor:
    """Sign-magnitude FP8 codes as integers: neighbouring values differ by one."""
    bits = q.view(torch.uint8).to(torch.int32)
    magnitude = bits & 0x7F
    return torch.where(bits >= 0x80, -magnitude, magnitude)


def assert_codes_close(q: torch.Tensor, q_ref: torch.Tensor, max_fraction: float = 1e-3) -> None:
    assert q.shape == q_ref.shape and q.dtype == q_ref.dtype
    nan, nan_ref = torch.isnan(q.float()), torch.isnan(q_ref.float())
    assert torch.equal(nan, nan_ref), "NaN codes differ"  # ordinals would alias NaN with +-0 / max
    diff = (fp8_ordinal(q) - fp8_ordinal(q_ref)).abs()[~nan]
    assert int(diff.max()) <= 1, f"codes differ by {int(diff.max())} steps"
    n_diff = int((diff > 0).sum())
    assert n_diff <= max_fraction * q.numel(), f"{n_diff} of {q.numel()} codes differ"


def assert_scale_close(scale: torch.Tensor, scale_ref: torch.Tensor, rtol: float = 1e-6) -> None:
    assert scale.shape == scale_ref.shape and scale.dtype == torch.float32
    rel = ((scale.double() - scale_ref.double()).abs() / scale_ref.double()).max()
    assert float(rel) <= rtol, f"scale relative error {float(rel):.3g} > {rtol}"


def exact_rmsnorm_gated(x, weight, gate, eps) -> torch.Tensor:
    xd = x.double()
    rstd = torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + eps)
    return xd * rstd * weight.double() * torch.sigmoid(gate.double())


def assert_within_half_step(q: torch.Tensor, scale: torch.Tensor, exact: torch.Tensor) -> None:
    """Every dequantized value lies within half an FP8 step of the exact value."""
    scale = scale.double()
    v = exact.double() / scale
    exponent = torch.floor(torch.log2(v.abs())).clamp(min=FP8_MIN_EXP[q.dtype])
    half_step = torch.exp2(exponent - 3) / 2 * scale
    err = (q.double() * scale - exact.double()).abs()
    excess = (err - half_step * (1 + 1e-4)).max()
    assert float(excess) <= 0, f"dequantized error exceeds half an FP8 step by {float(excess):.3g}"


def make_inputs(tokens, heads, head_dim, dtype, *, gate_slice=True, x_strided=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = heads * head_dim
    if x_strided:
        # x as a head-slice of a wider buffer: non-contiguous token and head strides.
        base = torch.randn(tokens, heads + 2, head_dim + 32, generator=gen)
        x = base.to(dtype).to(DEVICE)[:, 1 : heads + 1, :head_dim]
    else:
        x = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    if gate_slice:
        # The gate as a column slice of a wider projection (as KDA's fused in_proj output).
        wide = torch.randn(tokens, 4 * width + 16, generator=gen).to(dtype).to(DEVICE)
        gate = wide[:, 3 * width : 4 * width].view(tokens, heads, head_dim)
    else:
        gate = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    weight = (torch.rand(head_dim, generator=gen) + 0.5).to(dtype).to(DEVICE)
    return x, weight, gate


# ---------------------------------------------------------------------------------------------
# Triton kernel vs torch reference vs exact math
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quant_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads", [1, 3, 8, 12, 32])
@pytest.mark.parametrize("tokens", [0, 1, 3, 17, 129])
def test_fused_matches_reference(tokens, heads, head_dim, dtype, quant_dtype, triton_launches):
    x, weight, gate = make_inputs(tokens, heads, head_dim, dtype, x_strided=tokens % 2 == 1)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS, quant_dtype)
    # the kernel ran (one launch), so the comparison below is kernel vs reference
    fused_launches = (
        triton_launches["_rmsnorm_gated_fp8_kernel"]
        + triton_launches["_rmsnorm_gated_fp8_wide_kernel"]
    )
    assert fused_launches == (1 if tokens else 0)
    assert q.shape == (tokens, heads * head_dim) and q.dtype == quant_dtype
    assert scale.shape == (tokens, 1) and scale.dtype == torch.float32
    if tokens == 0:
        return
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS, quant_dtype)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)
    exact = exact_rmsnorm_gated(x, weight, gate, EPS).reshape(tokens, -1)
    assert_within_half_step(q, scale, exact)
    fp8_max = current_platform.fp8_max(quant_dtype)
    torch.testing.assert_close(
        scale.double().squeeze(1), exact.abs().amax(dim=1) / fp8_max, rtol=1e-6, atol=0
    )


@pytest.mark.parametrize(
    "heads,head_dim",
    [(48, 256), (40, 256), (15, 64), (3, 96), (5, 512), (2, 640)],
    ids=["wide", "wide-padded-chunk", "three-chunks-padded", "non-pow2-D", "D512", "D640-fallback"],
)
def test_fused_other_launch_shapes(heads, head_dim, triton_launches):
    """Wide tokens (two-pass kernel), a padded third head chunk, non-power-of-two D, D=512, and
    the D>512 fallback."""
    x, weight, gate = make_inputs(5, heads, head_dim, torch.bfloat16)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    launched = {k: v for k, v in triton_launches.items() if v}
    if head_dim > 512:
        assert launched == {}  # the torch fallback
    elif heads == 48 or heads == 40:
        assert launched == {"_rmsnorm_gated_fp8_wide_kernel": 1}
    else:
        assert launched == {"_rmsnorm_gated_fp8_kernel": 1}
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)
    assert_within_half_step(q, scale, exact_rmsnorm_gated(x, weight, gate, EPS).reshape(5, -1))


def test_head_chunks_cover_every_head_once():
    for heads in range(1, 97):
        for split in op_module.HEAD_SPLITS:
            chunks = [c for c in op_module.head_chunks(heads, split) if c != (0, 0)]
            assert sum(valid for _, valid in chunks) == heads, (heads, split)
            assert all(rows & (rows - 1) == 0 and valid <= rows for rows, valid in chunks)
    assert op_module.head_chunks(12, "pow2")[:2] == ((8, 8), (4, 4))
    assert op_module.head_chunks(12, "equal") == ((4, 4), (4, 4), (4, 4))
    assert op_module.head_chunks(12, "padded") == ((16, 12), (0, 0), (0, 0))
    assert op_module.head_chunks(5, "equal") == op_module.head_chunks(5, "pow2")  # 5 x 1: pow2
    with pytest.raises(ValueError, match="head split"):
        op_module.head_chunks(12, "halves")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "one-tile"])
def test_launch_fused_launches_the_configs_kernel(monkeypatch, wide):
    """`launch_fused` (the sweeps' entry) launches the kernel its config names."""
    launches = {
        name: record_launches(monkeypatch, op_module, name)
        for name in ("_rmsnorm_gated_fp8_wide_kernel", "_rmsnorm_gated_fp8_kernel")
    }
    x, weight, gate = make_inputs(3, 12, 128, torch.bfloat16)
    q = torch.empty(3, 12 * 128, dtype=current_platform.fp8_dtype(), device=DEVICE)
    scale = torch.empty(3, 1, dtype=torch.float32, device=DEVICE)
    config = op_module.FusedLaunchConfig(wide, 4 if wide else 12, 2)
    fp8_max, min_scale = current_platform.fp8_max(), current_platform.fp8_min_scale()
    op_module.launch_fused(x, weight, gate, EPS, q, scale, fp8_max, min_scale, config)
    assert len(launches["_rmsnorm_gated_fp8_wide_kernel"]) == int(wide)
    assert len(launches["_rmsnorm_gated_fp8_kernel"]) == int(not wide)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter
@pytest.mark.parametrize("weight_tile", [True, False], ids=["weight-tile", "weight-row"])
@pytest.mark.parametrize("head_split", op_module.HEAD_SPLITS)
@pytest.mark.parametrize("heads", [3, 12, 15, 24])
def test_every_launch_variant(heads, head_split, weight_tile):
    """The launch variants a sweep can choose (power-of-two, equal or padded head chunks; the
    weight as a tile or a row) compute the same function, non-finite tokens included."""
    x, weight, gate = make_inputs(9, heads, 128, torch.bfloat16, x_strided=True)
    x[2, 0, 5] = float("nan")
    x[4, heads - 1, 0] = float("inf")
    fp8 = current_platform.fp8_dtype()
    q = torch.empty(9, heads * 128, dtype=fp8, device=DEVICE)
    scale = torch.empty(9, 1, dtype=torch.float32, device=DEVICE)
    config = op_module.FusedLaunchConfig(False, heads, 2, head_split, weight_tile)
    fp8_max, min_scale = current_platform.fp8_max(), current_platform.fp8_min_scale()
    op_module.launch_fused(x, weight, gate, EPS, q, scale, fp8_max, min_scale, config)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert torch.isnan(scale[[2, 4]]).all() and torch.isnan(q[[2, 4]].float()).all()
    finite = [0, 1, 3, 5, 6, 7, 8]
    assert_scale_close(scale[finite], scale_ref[finite])
    assert_codes_close(q, q_ref)


def test_two_dim_gate_accepted_for_one_head():
    x, weight, gate = make_inputs(4, 1, 64, torch.bfloat16)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate[:, 0, :], EPS)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)


@pytest.mark.parametrize("quant_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("width", [64, 1536, 2304, 7168, 20000])
@pytest.mark.parametrize("tokens", [0, 1, 3, 17, 129])
def test_per_token_quant_matches_reference(tokens, width, dtype, quant_dtype, triton_launches):
    gen = torch.Generator().manual_seed(tokens * 7 + width)
    wide = (torch.randn(tokens, width + 64, generator=gen) * 3).to(dtype).to(DEVICE)
    x = wide[:, 32 : 32 + width]  # row stride != width
    q, scale = per_token_fp8_quant(x, quant_dtype)
    assert triton_launches["_per_token_fp8_quant_kernel"] == (1 if tokens else 0)
    assert q.shape == (tokens, width) and scale.shape == (tokens, 1)
    if tokens == 0:
        return
    q_ref, scale_ref = per_token_fp8_quant_ref(x, quant_dtype)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)
    assert_within_half_step(q, scale, x.double())


# ---------------------------------------------------------------------------------------------
# Fused vs sequential (norm rounded to bf16, then per_token_fp8_quant)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [3, 12, 32])
@pytest.mark.parametrize("tokens", [1, 17, 129])
def test_fused_vs_sequential(tokens, heads):
    x, weight, gate = make_inputs(tokens, heads, 128, torch.bfloat16, seed=tokens + heads)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    normed = rmsnorm_gated_ref(x, weight, gate, EPS).to(torch.bfloat16).reshape(tokens, -1)
    q_seq, scale_seq = per_token_fp8_quant(normed)
    assert_scale_close(scale, scale_seq, rtol=2**-8 + 1e-6)
    assert_codes_close(q, q_seq, max_fraction=1.0)  # every code within one step


# ---------------------------------------------------------------------------------------------
# Edge cases: scale spans heads, zero tokens, huge values, non-finite input, every output written
# ---------------------------------------------------------------------------------------------


def test_scale_spans_all_heads():
    tokens, heads, head_dim = 6, 12, 128
    x = torch.full((tokens, heads, head_dim), 0.01, dtype=torch.bfloat16)
    x[:, 5, :] = 4.0  # one loud head; RMSNorm alone would equalize heads, so vary the weight too
    gate = torch.zeros_like(x)
    gate[:, 5, :] = 6.0
    weight = torch.linspace(0.5, 1.5, head_dim, dtype=torch.bfloat16)
    x, gate, weight = x.to(DEVICE), gate.to(DEVICE), weight.to(DEVICE)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    exact = exact_rmsnorm_gated(x, weight, gate, EPS)
    loud_amax = exact[:, 5, :].abs().amax(dim=1)
    fp8_max = current_platform.fp8_max()
    torch.testing.assert_close(scale.double().squeeze(1), loud_amax / fp8_max, rtol=1e-6, atol=0)
    # Quiet heads (sigmoid(0) = 0.5) are quantized with the loud head's scale, not their own.
    quiet = q.view(tokens, heads, head_dim)[:, 0, :].float()
    assert quiet.abs().max() < 0.8 * fp8_max
    assert_within_half_step(q, scale, exact.reshape(tokens, -1))


def test_zero_token_gets_floor_scale_and_zero_codes():
    x, weight, gate = make_inputs(4, 12, 128, torch.bfloat16)
    x[2] = 0.0
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    min_scale = current_platform.fp8_min_scale()
    assert float(scale[2]) == pytest.approx(min_scale, rel=1e-7)
    assert torch.isfinite(scale).all()
    assert (q[2].float() == 0).all()
    qp, sp = per_token_fp8_quant(torch.zeros(3, 1536, dtype=torch.bfloat16, device=DEVICE))
    assert (qp.float() == 0).all() and torch.allclose(sp, torch.full_like(sp, min_scale))


def test_one_huge_value():
    x, weight, gate = make_inputs(3, 12, 128, torch.float32)
    x[1, 7, 3] = 3.0e4
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)
    assert_within_half_step(q, scale, exact_rmsnorm_gated(x, weight, gate, EPS).reshape(3, -1))

    y = torch.randn(3, 1536, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    y[1, 100] = 1.0e30
    qp, sp = per_token_fp8_quant(y)
    fp8_max = current_platform.fp8_max()
    assert float(qp[1, 100].float()) == fp8_max
    assert float(sp[1]) == pytest.approx(1.0e30 / fp8_max, rel=1e-6)
    assert_within_half_step(qp, sp, y.double())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter
def test_non_finite_token_is_poisoned_and_others_are_not():
    x, weight, gate = make_inputs(4, 3, 64, torch.float32)
    x[1, 2, 5] = float("nan")
    x[3, 0, 0] = float("inf")  # inf * rsqrt(inf) = inf * 0: NaN after the norm
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    for t in (1, 3):
        assert torch.isnan(scale[t]).all() and torch.isnan(scale_ref[t]).all()
        assert torch.isnan(q[t].float()).all() and torch.isnan(q_ref[t].float()).all()
    for t in (0, 2):
        assert_scale_close(scale[t : t + 1], scale_ref[t : t + 1])
        assert_codes_close(q[t : t + 1], q_ref[t : t + 1])

    y = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    y[0, 3] = float("-inf")
    y[2, 7] = float("nan")
    qp, sp = per_token_fp8_quant(y)
    qp_ref, sp_ref = per_token_fp8_quant_ref(y)
    for t in (0, 2):
        assert torch.isnan(sp[t]).all() and torch.isnan(sp_ref[t]).all()
        assert torch.isnan(qp[t].float()).all() and torch.isnan(qp_ref[t].float()).all()
    assert torch.equal(sp[1], sp_ref[1]) and torch.equal(qp[1].float(), qp_ref[1].float())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter
def test_head_whose_sum_of_squares_overflows():
    """|x| ~ 1e20 overflows sum(x^2) to Inf, so rstd = 0: the head is zeroed and the token's
    scale comes from its other heads; where x * weight * sigmoid(gate) itself overflows, y holds
    0 * Inf = NaN and the token is poisoned. Kernel and reference alike."""
    x, weight, gate = make_inputs(3, 4, 64, torch.float32)
    weight = weight.abs() + 1.0
    gate = gate.abs() + 4.0  # sigmoid > 0.98, so 3e38 * weight * sigmoid overflows
    x[0, 1] = 1.0e20
    x[2, 2, 7] = 3.0e38
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert (q[0].view(4, 64)[1].float() == 0).all()
    others = x[0:1, [0, 2, 3]]
    _, scale_others = rmsnorm_gated_fp8_per_token_ref(others, weight, gate[0:1, [0, 2, 3]], EPS)
    assert_scale_close(scale[0:1], scale_others)
    assert_scale_close(scale[:2], scale_ref[:2])
    assert_codes_close(q[:2], q_ref[:2])
    assert torch.isnan(scale[2]).all() and torch.isnan(scale_ref[2]).all()
    assert torch.isnan(q[2].float()).all() and torch.isnan(q_ref[2].float()).all()


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN bytes (0x7F is NaN in e4m3fn; in fp32 0x7F7F7F7F is a finite value)."""
    t.view(torch.uint8).fill_(0x7F)
    if t.dtype == torch.float32:
        t.fill_(float("nan"))
    return t


def test_every_output_written_into_preallocated_buffers():
    tokens, heads, head_dim = 17, 12, 128
    x, weight, gate = make_inputs(tokens, heads, head_dim, torch.bfloat16)
    buf = poison(
        torch.empty(tokens, heads * head_dim + 64, dtype=torch.float8_e4m3fn, device=DEVICE)
    )
    out = buf[:, : heads * head_dim]  # a row stride wider than the row
    scale_out = poison(torch.empty(tokens, 1, dtype=torch.float32, device=DEVICE))
    q, scale = rmsnorm_gated_fp8_per_token(
        x, weight, gate, EPS, torch.float8_e4m3fn, out=out, scale_out=scale_out
    )
    assert q.data_ptr() == out.data_ptr() and scale.data_ptr() == scale_out.data_ptr()
    assert not torch.isnan(q.float()).any() and not torch.isnan(scale).any()
    assert torch.isnan(buf[:, heads * head_dim :].float()).all(), "wrote past the row"
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS, torch.float8_e4m3fn)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)

    y = torch.randn(tokens, 7168, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = poison(torch.empty(tokens, 7168, dtype=torch.float8_e4m3fn, device=DEVICE))
    scale_out = poison(torch.empty(tokens, 1, dtype=torch.float32, device=DEVICE))
    per_token_fp8_quant(y, torch.float8_e4m3fn, out=out, scale_out=scale_out)
    assert not torch.isnan(out.float()).any() and not torch.isnan(scale_out).any()


def test_zero_tokens_launch_nothing(monkeypatch):
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched for T == 0")

    monkeypatch.setattr(op_module, "_rmsnorm_gated_fp8_kernel", NoLaunch())
    monkeypatch.setattr(op_module, "_rmsnorm_gated_fp8_wide_kernel", NoLaunch())
    monkeypatch.setattr(quant_module, "_per_token_fp8_quant_kernel", NoLaunch())
    x, weight, gate = make_inputs(0, 12, 128, torch.bfloat16)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    assert q.shape == (0, 1536) and scale.shape == (0, 1)
    q, scale = per_token_fp8_quant(torch.empty(0, 1536, device=DEVICE))
    assert q.shape == (0, 1536) and scale.shape == (0, 1)


def test_hot_path_does_not_call_finfo(monkeypatch):
    x, weight, gate = make_inputs(2, 12, 128, torch.bfloat16)

    def no_finfo(*args, **kwargs):
        raise AssertionError("torch.finfo on the hot path")

    monkeypatch.setattr(torch, "finfo", no_finfo)
    rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    per_token_fp8_quant(x.reshape(2, -1))


def test_common_case_skips_the_one_by_one_checks(monkeypatch):
    """Valid inputs, strided gate and x included, pass the wrappers' combined check (few tensor
    attribute reads per call); the named checks run only for what it does not accept."""

    def named_check(name, t):
        raise AssertionError(f"the one-by-one checks ran for a valid {name}")

    monkeypatch.setattr(op_module, "check_float_input", named_check)
    monkeypatch.setattr(quant_module, "check_float_input", named_check)
    fp8 = current_platform.fp8_dtype()
    for kwargs in (dict(), dict(x_strided=True), dict(gate_slice=False)):
        x, weight, gate = make_inputs(3, 12, 64, torch.bfloat16, **kwargs)
        q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
        out = torch.empty(3, 12 * 64, dtype=fp8, device=DEVICE)
        scale_out = torch.empty(3, 1, dtype=torch.float32, device=DEVICE)
        rmsnorm_gated_fp8_per_token(x, weight, gate, EPS, out=out, scale_out=scale_out)
        assert torch.equal(out.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(scale_out, scale)
    per_token_fp8_quant(gate.reshape(3, -1))
    per_token_fp8_quant(make_inputs(3, 12, 64, torch.bfloat16)[2].reshape(3, -1))  # row stride


# ---------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------


def _bad_fused_inputs():
    x, w, g = make_inputs(4, 12, 128, torch.bfloat16, gate_slice=False)
    return [
        ("x must be 3-D", dict(x=x.reshape(4, -1))),
        ("gate shape", dict(gate=g[:, :6])),
        ("weight must have shape", dict(weight=w[:64])),
        ("x must have unit stride", dict(x=x.transpose(1, 2).contiguous().transpose(1, 2))),
        ("gate must have unit stride", dict(gate=g.transpose(1, 2).contiguous().transpose(1, 2))),
        ("x must be bfloat16", dict(x=x.to(torch.float64))),
        ("gate must be bfloat16", dict(gate=g.to(torch.int32))),
        ("weight must be bfloat16", dict(weight=w.to(torch.float64))),
        ("gate is 2-D", dict(gate=g.reshape(4, -1))),
        ("one device", dict(weight=w.to("meta"))),
        ("one device", dict(gate=g.to("meta"))),
        ("x must be a torch.Tensor", dict(x=x.tolist())),
        ("gate must be a torch.Tensor", dict(gate=g.float().cpu().numpy())),
        ("weight must be a torch.Tensor", dict(weight=None)),
        ("weight must have unit stride", dict(weight=w.repeat_interleave(2)[::2])),
        ("at least one head", dict(x=x[:, :0], gate=g[:, :0])),
        ("eps must be a positive", dict(eps=float("nan"))),
        ("quant_dtype must be one of", dict(quant_dtype=torch.int8)),
        ("eps must be a positive", dict(eps=-1.0)),
        ("eps must be a positive", dict(eps=0.0)),
        ("out must be", dict(out=torch.empty(4, 1536, dtype=torch.float16, device=DEVICE))),
        ("scale_out must be", dict(scale_out=torch.empty(4, dtype=torch.float32, device=DEVICE))),
        (
            "rows that do not overlap",
            dict(out=torch.empty(1, 1536, dtype=torch.float8_e4m3fn, device=DEVICE).expand(4, -1)),
        ),
    ]


def _case_id(value) -> str:
    """The message, or the overridden arguments' names: never a tensor's (random) values, so
    that every collection (each pytest-xdist worker's) names the cases alike."""
    return value[:30] if isinstance(value, str) else "+".join(value)


@pytest.mark.parametrize("message,override", _bad_fused_inputs(), ids=_case_id)
def test_fused_rejects_bad_input(message, override):
    x, w, g = make_inputs(4, 12, 128, torch.bfloat16, gate_slice=False)
    args = dict(x=x, weight=w, gate=g, eps=EPS, quant_dtype=None, out=None, scale_out=None)
    args.update(override)
    with pytest.raises(ValueError, match=message):
        rmsnorm_gated_fp8_per_token(**args)


@pytest.mark.parametrize(
    "message,x",
    [
        (r"x must be \[tokens, hidden\] or \[tokens, heads, head_dim\]", torch.ones(2, 3, 4, 5)),
        ("x must be bfloat16", torch.ones(2, 8, dtype=torch.float64)),
        ("x must have unit stride", torch.ones(8, 2).t()),
        ("non-empty rows", torch.ones(2, 0)),
        ("non-empty rows", torch.ones(2, 0, 4)),
        ("x must be a torch.Tensor", [[1.0, 2.0]]),
    ],
)
def test_per_token_quant_rejects_bad_input(message, x):
    with pytest.raises(ValueError, match=message):
        per_token_fp8_quant(x.to(DEVICE) if isinstance(x, torch.Tensor) else x)


# ---------------------------------------------------------------------------------------------
# GPU: large shapes, CUDA graphs, the native baseline
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [4096, 65536])
@pytest.mark.parametrize("heads", [8, 12, 32])
def test_gpu_large_shapes(tokens, heads):
    x, weight, gate = make_inputs(tokens, heads, 128, torch.bfloat16, seed=heads)
    q, scale = rmsnorm_gated_fp8_per_token(x, weight, gate, 1e-6)
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, 1e-6)
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)
    exact = exact_rmsnorm_gated(x, weight, gate, 1e-6).reshape(tokens, -1)
    assert_within_half_step(q, scale, exact)
    normed = rmsnorm_gated_ref(x, weight, gate, 1e-6).to(torch.bfloat16).reshape(tokens, -1)
    qs, ss = per_token_fp8_quant(normed)
    qs_ref, ss_ref = per_token_fp8_quant_ref(normed)
    assert_scale_close(ss, ss_ref)
    assert_codes_close(qs, qs_ref)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_matches_eager():
    tokens, heads, head_dim = 64, 12, 128
    x, weight, gate = make_inputs(tokens, heads, head_dim, torch.bfloat16)
    out = torch.empty(tokens, heads * head_dim, dtype=current_platform.fp8_dtype(), device="cuda")
    scale_out = torch.empty(tokens, 1, dtype=torch.float32, device="cuda")
    rmsnorm_gated_fp8_per_token(x, weight, gate, EPS, out=out, scale_out=scale_out)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rmsnorm_gated_fp8_per_token(x, weight, gate, EPS, out=out, scale_out=scale_out)
    new_x, _, new_gate = make_inputs(tokens, heads, head_dim, torch.bfloat16, seed=7)
    x.copy_(new_x)
    gate.copy_(new_gate)
    graph.replay()
    q_eager, scale_eager = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.uint8), q_eager.view(torch.uint8))
    assert torch.equal(scale_out, scale_eager)


@pytest.mark.gpu
@pytest.mark.parametrize("width", [1536, 7168])
def test_gpu_native_per_token_quant_baseline(width):
    from vllm import _custom_ops as ops

    if not ops.has_native_ops():
        pytest.skip("vllm._C is not built")
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(1000, width, generator=gen).to(torch.bfloat16).cuda()
    q, scale = ops.dynamic_per_token_scaled_fp8_quant(x)
    q_ref, scale_ref = per_token_fp8_quant_ref(x)
    # Same scale rule; the native kernel divides where ours multiplies by 1/scale.
    assert_scale_close(scale, scale_ref)
    assert_codes_close(q, q_ref)


@pytest.mark.gpu
def test_gpu_repeated_calls_reuse_the_compiled_kernel():
    """From the second call on, the ops launch the compiled kernel directly
    (vllm.triton_utils.launch); its results equal the first call's, and an unaligned input,
    which takes Triton's plain dispatch every time, still matches the reference."""
    import vllm.triton_utils.launch as launch_module

    tokens, heads, head_dim = 3, 12, 128
    x, weight, gate = make_inputs(tokens, heads, head_dim, torch.bfloat16)
    config = op_module.fused_launch_config(4, heads, head_dim)
    spec = op_module.fused_launch_spec(config, heads, head_dim, use_pdl(x.device))
    spec.compiled.clear()
    first = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    second = rmsnorm_gated_fp8_per_token(x, weight, gate, EPS)
    assert len(spec.compiled) == (1 if launch_module._FAST else 0)
    assert torch.equal(first[0].view(torch.uint8), second[0].view(torch.uint8))
    assert torch.equal(first[1], second[1])
    q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, gate, EPS)
    assert_scale_close(second[1], scale_ref)
    assert_codes_close(second[0], q_ref)

    width = heads * head_dim
    wide = torch.randn(tokens, 4 * width + 17, device="cuda", generator=_cuda_gen(1)).to(
        torch.bfloat16
    )
    unaligned = wide[:, 3 * width + 1 : 4 * width + 1].view(tokens, heads, head_dim)
    for _ in range(2):
        q, scale = rmsnorm_gated_fp8_per_token(x, weight, unaligned, EPS)
        q_ref, scale_ref = rmsnorm_gated_fp8_per_token_ref(x, weight, unaligned, EPS)
        assert_scale_close(scale, scale_ref)
        assert_codes_close(q, q_ref)

    # The quant kernel takes the token count as an argument: one cached launch per count seen.
    _, quant_spec = quant_module._quant_config(32, width, 0, use_pdl(x.device))
    quant_spec.compiled.clear()
    for t in (17, 31, 17, 31):
        y = torch.randn(t, width, device="cuda", generator=_cuda_gen(2)).to(torch.bfloat16)
        qp, sp = per_token_fp8_quant(y)
        qp_ref, sp_ref = per_token_fp8_quant_ref(y)
        assert_scale_close(sp, sp_ref)
        assert_codes_close(qp, qp_ref)
    assert len(quant_spec.compiled) == (2 if launch_module._FAST else 0)


def _cuda_gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def test_use_triton_fp8_on_a_gpu_asks_the_platform_per_dtype(monkeypatch):
    """On a CUDA / ROCm device the answer is the platform's `triton_supports_fp8` for that dtype
    (cached per dtype, so each dtype is asked once)."""
    asked = []

    class Platform:
        def triton_supports_fp8(self, dtype: torch.dtype) -> bool:
            asked.append(dtype)
            return dtype == torch.float8_e4m3fnuz

    monkeypatch.setattr(quant_module, "current_platform", Platform())
    monkeypatch.setattr(quant_module, "HAS_TRITON", True)
    quant_module._gpu_triton_fp8.cache_clear()
    try:
        gpu = torch.device("cuda", 0)
        for _ in range(2):
            assert quant_module.use_triton_fp8(gpu, torch.float8_e4m3fnuz)
            assert not quant_module.use_triton_fp8(gpu, torch.float8_e4m3fn)
        assert asked == [torch.float8_e4m3fnuz, torch.float8_e4m3fn]
    finally:
        quant_module._gpu_triton_fp8.cache_clear()
