"""PTPC FP8 linears: online weight quantization, the FP8 GEMM against fp32 math, consuming a
QuantizedActivation without quantizing again, and tensor parallelism (TP=2 on CPU with gloo)."""

import pytest
import torch
from gloo_tp2 import run_tp2

from vllm.config.quantization import parse_quantization_config
from vllm.envs import EnvVarError
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import dequantized_matmul
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearKernel,
)
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    get_input_quant_key,
)
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
    per_token_fp8_quant,
    per_token_fp8_quant_ref,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym
from vllm.platforms import current_platform

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PTPC = OnlineQuantizationConfig(parse_quantization_config({"linear": "fp8_per_channel"}))


def fp8_half_step(v: torch.Tensor) -> torch.Tensor:
    """Half the e4m3 step at |v| in code units (3 mantissa bits; subnormals below 2^-6)."""
    exponent = torch.floor(torch.log2(v.abs())).clamp(min=-6)
    return torch.exp2(exponent - 3) / 2


def gemm_bound(x: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor, shards: int = 1):
    """Bound on |fp8 GEMM - x @ weight.T| from rounding x (per token, per K shard) and weight (per
    channel) to FP8: sum_k hx|w| + |x|hw + hx hw, with h the absolute half steps."""
    fp8_max = current_platform.fp8_max()
    hx = torch.cat(
        [
            fp8_half_step(part / (s := part.abs().amax(dim=1, keepdim=True) / fp8_max)) * s
            for part in x.chunk(shards, dim=1)
        ],
        dim=1,
    )
    hw = fp8_half_step(weight / w_scale) * w_scale
    return (hx @ weight.abs().t() + x.abs() @ hw.t() + hx @ hw.t()) * (1 + 1e-5)


def ptpc_layer(cls=RowParallelLinear, k=256, n=96, bias=False, seed=0, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen) * 0.2
    layer = cls(k, n, bias=bias, params_dtype=torch.bfloat16, quant_config=PTPC, **kwargs)
    layer.weight_loader(layer.weight, weight.to(torch.bfloat16))
    if bias:
        layer.weight_loader(layer.bias, torch.randn(n, generator=gen).to(torch.bfloat16))
    layer.to(DEVICE)
    layer.process_weights_after_loading()
    return layer, weight.to(torch.bfloat16).float()


@pytest.mark.parametrize("heads,head_dim,padded", [(4, 128, 192), (3, 40, 48), (70, 128, 160)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
# The NaN the test puts in reaches numpy's multiply under Triton's interpreter, which warns.
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_per_token_quant_reads_heads_in_place(heads, head_dim, padded, dtype, triton_launches):
    """`[T, H, D]` heads of padded rows (an attention output's kept columns) give the codes and
    scales of the contiguous `[T, H * D]` copy, bit for bit, in one launch each; 70 x 128 takes
    the two-pass path. Heads back to back, and one head, are rows of the view."""
    gen = torch.Generator().manual_seed(heads)
    wide = torch.randn(5, heads, padded, generator=gen).to(dtype).to(DEVICE)
    wide[1, 0, padded - head_dim] = float("nan")  # the non-finite rule holds through the view
    heads_view = wide[..., padded - head_dim :]
    got = per_token_fp8_quant(heads_view)
    expected = per_token_fp8_quant(heads_view.reshape(5, heads * head_dim))
    assert triton_launches["_per_token_fp8_quant_kernel"] == 2
    assert torch.equal(got[0].view(torch.uint8), expected[0].view(torch.uint8))
    assert bool(got[1][1].isnan()) and torch.equal(
        got[1].nan_to_num(-1.0), expected[1].nan_to_num(-1.0)
    )
    # Heads farther apart than tokens: [H, T, D] memory seen as [T, H, D].
    head_major = wide.transpose(0, 1).contiguous().transpose(0, 1)[..., padded - head_dim :]
    assert head_major.stride(1) > head_major.stride(0)
    got = per_token_fp8_quant(head_major)
    assert triton_launches["_per_token_fp8_quant_kernel"] == 3  # read in place, not copied
    assert torch.equal(got[0].view(torch.uint8), expected[0].view(torch.uint8))
    for view in (heads_view.contiguous(), heads_view[:, :1]):
        got = per_token_fp8_quant(view)
        expected = per_token_fp8_quant(view.reshape(5, -1).clone())
        assert torch.equal(got[0].view(torch.uint8), expected[0].view(torch.uint8))
    with pytest.raises(ValueError, match=r"\[tokens, hidden\] or \[tokens, heads, head_dim\]"):
        per_token_fp8_quant(wide.unsqueeze(0))


@pytest.mark.gpu
def test_gpu_per_token_quant_reads_attention_heads_in_place():
    """MLA's prefill output at Kimi-Linear's sizes: 8192 tokens, the last 128 of each head's 192
    columns; the codes and scales of the contiguous copy."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    wide = torch.randn(8192, 32, 192, generator=gen, device="cuda").to(torch.bfloat16)
    got = per_token_fp8_quant(wide[..., 64:])
    expected = per_token_fp8_quant(wide[..., 64:].reshape(8192, 32 * 128))
    assert torch.equal(got[0].view(torch.uint8), expected[0].view(torch.uint8))
    assert torch.equal(got[1], expected[1])


def test_online_weight_scales_and_codes():
    layer, weight = ptpc_layer()
    fp8_max = current_platform.fp8_max()
    scale = layer.weight_scale.cpu()
    assert scale.shape == (96, 1) and scale.dtype == torch.float32
    expected = (weight.abs().amax(dim=1, keepdim=True).double() / fp8_max).clamp(
        min=current_platform.fp8_min_scale()
    )
    torch.testing.assert_close(scale.double(), expected, rtol=1e-7, atol=0)
    codes = layer.weight.t().float().cpu()  # stored [K, N] as a view of [N, K] codes
    assert codes.shape == (96, 256)
    unfloored = scale.squeeze(1) > current_platform.fp8_min_scale()
    assert unfloored.sum() > 90  # a few rows are tiny enough to hit the floor: fine, but rare
    assert (codes.abs().amax(dim=1)[unfloored] == fp8_max).all()  # a row's amax maps to fp8_max
    # w / scale is rounded to fp32 (2^-24 relative) before rounding to FP8, and an e4m3 half
    # step is at least 2^-5 of the value: within a half step of the exact value up to 2^-19.
    scale, weight = scale.double(), weight.double()
    err = (codes.double() * scale - weight).abs()
    assert (err <= fp8_half_step(weight / scale) * scale * (1 + 2**-19)).all()


def test_process_weights_after_loading_is_idempotent():
    layer, _ = ptpc_layer()
    weight, scale = layer.weight.clone(), layer.weight_scale.clone()
    layer.process_weights_after_loading()
    assert torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8))
    assert torch.equal(layer.weight_scale, scale)


def test_fp8_gemm_within_the_fp8_rounding_bound():
    """|out - x @ w.T| <= what rounding x and w to FP8 and the output to bf16 can cause."""
    layer, weight = ptpc_layer(ColumnParallelLinear, bias=True)
    x = (torch.randn(7, 256, generator=torch.Generator().manual_seed(1)) * 2).to(torch.bfloat16)
    x = x.to(DEVICE)
    out = layer(x)[0].float().cpu()
    xf = x.float().cpu()
    ref = xf @ weight.t() + layer.bias.float().cpu()
    bound = gemm_bound(xf, weight, layer.weight_scale.cpu()) + ref.abs() * 2**-8  # + bf16 output
    assert ((out - ref).abs() <= bound).all()


def test_prequantized_input_is_not_quantized_again(monkeypatch):
    layer, _ = ptpc_layer()
    assert get_input_quant_key(layer) == kFp8DynamicTokenSym
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x = x.to(DEVICE)
    plain = layer(x)[0]
    q, scale = per_token_fp8_quant(x.reshape(-1, 256))

    def fail(*args, **kwargs):
        raise AssertionError("the kernel quantized a pre-quantized activation")

    monkeypatch.setattr(FP8ScaledMMLinearKernel, "quantize_input", fail)
    qa = QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym)
    fused = layer(qa)[0]
    assert fused.shape == (2, 3, 96) and fused.dtype == torch.bfloat16
    assert torch.equal(fused, plain)
    with pytest.raises(AssertionError, match="quantized a pre-quantized"):
        layer(x)


@pytest.mark.parametrize(
    "orig_shape,orig_dtype,message",
    [
        ((2, 3, 128), torch.bfloat16, r"orig_shape \(2, 3, 128\) does not match"),  # last dim
        ((2, 2, 256), torch.bfloat16, r"orig_shape \(2, 2, 256\) does not match"),  # rows
        ((2, 3, 256), torch.float32, "orig_dtype torch.float32 differs"),
    ],
)
def test_layer_refuses_a_quantized_activation_that_misdescribes_its_data(
    orig_shape, orig_dtype, message
):
    layer, _ = ptpc_layer()
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    q, scale = per_token_fp8_quant(x.to(DEVICE))
    qa = QuantizedActivation(q, scale, orig_dtype, torch.Size(orig_shape), kFp8DynamicTokenSym)
    with pytest.raises(ValueError, match=message):
        layer(qa)


def test_unquantized_layer_refuses_a_quantized_activation():
    layer = RowParallelLinear(64, 32, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    q, scale = per_token_fp8_quant(x.to(DEVICE))
    qa = QuantizedActivation(q, scale, torch.bfloat16, q.shape, kFp8DynamicTokenSym)
    assert get_input_quant_key(layer) is None
    with pytest.raises(ValueError, match="expects None"):
        layer.to(DEVICE)(qa)


@pytest.mark.parametrize("shape", [(4, 128), (3, 257), (2, 2, 64), ()], ids=str)
def test_layer_names_an_activation_of_the_wrong_width(shape):
    """A plain activation whose last dim is not the layer's K is a ValueError naming K; the
    reshape to [-1, K] raised torch's shape error (or regrouped the rows) before."""
    layer, _ = ptpc_layer()
    with pytest.raises(ValueError, match="K=256"):
        layer(torch.zeros(shape, dtype=torch.bfloat16, device=DEVICE))


def test_merged_column_loads_shards_into_place():
    layer = MergedColumnParallelLinear(16, [8, 24], bias=False, params_dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(8, 16, generator=gen), torch.randn(24, 16, generator=gen)
    layer.weight_loader(layer.weight, b, 1)
    layer.weight_loader(layer.weight, a, 0)
    assert torch.equal(layer.weight, torch.cat([a, b]))
    with pytest.raises(ValueError, match="shape"):
        layer.weight_loader(layer.weight, torch.randn(9, 16, generator=gen), 0)
    with pytest.raises(ValueError, match="shard_id 2"):
        layer.weight_loader(layer.weight, a, 2)
    fused = torch.randn(32, 16, generator=gen)
    layer.weight_loader(layer.weight, fused)  # the fused tensor as a whole
    assert torch.equal(layer.weight, fused)
    with pytest.raises(ValueError, match="expected 32 rows"):
        layer.weight_loader(layer.weight, torch.randn(33, 16, generator=gen))


def test_replicated_linear_rejects_wrong_shape():
    layer = ReplicatedLinear(16, 8, params_dtype=torch.float32, prefix="m.proj")
    wrong = torch.randn(8, 15, generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match=r"m\.proj: checkpoint shape \(8, 15\), expected"):
        layer.weight_loader(layer.weight, wrong)


# ---------------------------------------------------------------------------------------------
# TP=2 over gloo, two processes
# ---------------------------------------------------------------------------------------------


def _tp_worker(rank: int):
    layer, _ = ptpc_layer(RowParallelLinear, bias=True)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    half = x.chunk(2, dim=-1)[rank]
    out = layer(half)[0]
    q, _ = per_token_fp8_quant(half.contiguous())  # what the kernel quantized, on this process
    return layer.weight_scale.clone(), out.clone(), q.clone()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo test runs on CPU")
def test_tp2_row_parallel_matches_tp1():
    layer, weight = ptpc_layer(RowParallelLinear, bias=True)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out_tp1 = layer(x)[0].float()
    xf = x.float()
    exact = xf @ weight.t() + layer.bias.float()
    results = run_tp2(_tp_worker)
    # What TP=2 computes, rebuilt here: each rank quantizes its half of x per token, multiplies
    # by its K-shard of the (identical) FP8 weight and rounds to bf16; the bf16 all-reduce adds
    # the two partials, then the bias is added in bf16.
    partials = []
    for rank, half in enumerate(x.chunk(2, dim=-1)):
        q, scale = per_token_fp8_quant_ref(half.float())
        w_half = layer.weight.chunk(2, dim=0)[rank]
        partials.append(
            dequantized_matmul(q, w_half, torch.bfloat16, scale, layer.weight_scale, None)
        )
        # the workers' interpreted Triton quantization rounds like torch (the fix installed)
        assert torch.equal(results[rank][2].view(torch.uint8), q.view(torch.uint8))
    rebuilt = ((partials[0] + partials[1]) + layer.bias).float()
    for rank in (0, 1):
        scale, out, _ = results[rank]
        # MAX-reduced channel amax: every shard uses the unsharded layer's scales.
        assert torch.equal(scale, layer.weight_scale)
        # Only the fp32 summation order of the 128-term shard products may differ from the
        # rebuild, which can move a bf16 rounding of a partial or of the sum by one ulp each:
        # two bf16 ulps of the largest term involved.
        ulp = torch.stack([p.float().abs() for p in partials]).amax(0) * 2**-7
        assert ((out.float() - rebuilt).abs() <= 2 * ulp).all()
        # and the fp8 bound per shard plus three bf16 roundings still holds against exact math
        bound = gemm_bound(xf, weight, scale, shards=2) + (xf.abs() @ weight.abs().t()) * 2**-7
        assert ((out.float() - exact).abs() <= bound + exact.abs() * 2**-8).all()
    assert torch.equal(results[0][1], results[1][1])
    assert ((out_tp1 - exact).abs() <= gemm_bound(xf, weight, scale) + exact.abs() * 2**-8).all()


# ---------------------------------------------------------------------------------------------
# Kernel override, and the decline path of a kernel that quantizes inside
# ---------------------------------------------------------------------------------------------


def test_forced_per_tensor_kernel_leaves_the_layer_unmarked(monkeypatch):
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "PerTensorTorchFP8ScaledMMLinearKernel")
    layer, weight = ptpc_layer()
    assert type(layer.fp8_linear).__name__ == "PerTensorTorchFP8ScaledMMLinearKernel"
    assert get_input_quant_key(layer) is None  # a producer must hand it the plain activation
    scales = []
    quantize = layer.fp8_linear.quantize_input

    def record(x_2d):
        q, scale = quantize(x_2d)
        scales.append(scale)
        return q, scale

    monkeypatch.setattr(layer.fp8_linear, "quantize_input", record)
    # Rows five decades apart: per-token scales would follow each row, one tensor scale cannot.
    gen = torch.Generator().manual_seed(4)
    row_size = torch.tensor([[1.0], [1e-2], [1e-4], [1e-5]])
    x = (torch.randn(4, 256, generator=gen) * row_size).to(torch.bfloat16).to(DEVICE)
    out = layer(x)[0].float().cpu()
    xf = x.float().cpu()
    ref = xf @ weight.t()
    (scale,) = scales
    tensor_scale = xf.abs().amax() / current_platform.fp8_max()
    assert torch.equal(scale.cpu(), tensor_scale.expand(4, 1))  # one scale, the tensor's
    # Per-tensor rounding: half a step of x / tensor_scale for every element (the small rows
    # fall into the subnormal range), plus the weight's and the bf16 output's rounding.
    hx = fp8_half_step(xf / tensor_scale) * tensor_scale
    hw = fp8_half_step(weight / layer.weight_scale.cpu()) * layer.weight_scale.cpu()
    bound = hx @ weight.abs().t() + xf.abs() @ hw.t() + hx @ hw.t() + ref.abs() * 2**-8
    assert ((out - ref).abs() <= bound * (1 + 1e-5)).all()
    # ...and it is not per-token: the smallest row (x / tensor_scale ~ 2^-8, at the bottom of the
    # subnormal range, step 2^-9) loses most of its digits, where per-token quantization of the
    # same row keeps it within a few percent.
    q, scale = per_token_fp8_quant(x)
    w_dq = layer.weight.float().cpu().t() * layer.weight_scale.cpu()  # [N, K]
    per_token_out = (q.float().cpu() * scale.cpu()) @ w_dq.t()
    per_token_err = (per_token_out[3] - ref[3]).norm() / ref[3].norm()
    per_tensor_err = (out[3] - ref[3]).norm() / ref[3].norm()
    assert per_token_err < 0.05 and per_tensor_err > 0.25, (per_token_err, per_tensor_err)
    with pytest.raises(ValueError, match="expects None"):
        layer(QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym))


def test_forced_per_tensor_kernel_takes_an_empty_batch(monkeypatch):
    """No tokens (an empty batch) give an empty output, as with the per-token kernels; the
    tensor scale's amax over no elements raised torch's reduction error."""
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "PerTensorTorchFP8ScaledMMLinearKernel")
    layer, weight = ptpc_layer()
    x = torch.empty(0, weight.shape[1], dtype=torch.bfloat16, device=DEVICE)
    out = layer(x)[0]
    assert out.shape == (0, weight.shape[0]) and out.dtype == torch.bfloat16


def test_bad_kernel_override_is_reported(monkeypatch):
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "NoSuchKernel")
    with pytest.raises(EnvVarError, match="VLLM_FP8_LINEAR_KERNEL='NoSuchKernel' is not one of"):
        ptpc_layer()
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "AiterPerTokenFp8ScaledMMLinearKernel")
    if not current_platform.is_rocm():
        forced = "VLLM_FP8_LINEAR_KERNEL='AiterPerTokenFp8ScaledMMLinearKernel' cannot run"
        with pytest.raises(EnvVarError, match=f"{forced} .*: needs ROCm"):
            ptpc_layer()


@pytest.mark.gpu
def test_gpu_rowwise_scaled_mm_consumes_and_matches_bound():
    if not current_platform.is_cuda():
        pytest.skip("a CUDA run; ROCm's is faked on CPU in test_rowwise_rocm_fake.py")
    layer, weight = ptpc_layer(RowParallelLinear, k=1536, n=7168, bias=False)
    assert type(layer.fp8_linear).__name__ == "RowWiseTorchFP8ScaledMMLinearKernel"
    assert get_input_quant_key(layer) == kFp8DynamicTokenSym
    x = torch.randn(33, 1536, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    x = x.cuda()
    out = layer(x)[0]
    q, scale = per_token_fp8_quant(x)
    fused = layer(QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym))[0]
    assert torch.equal(out, fused)
    xf = x.float().cpu()
    ref = xf @ weight.t()
    bound = gemm_bound(xf, weight, layer.weight_scale.cpu()) + ref.abs() * 2**-8
    assert ((out.float().cpu() - ref).abs() <= bound).all()
