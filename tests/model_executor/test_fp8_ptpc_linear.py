"""PTPC FP8 linears: online weight quantization, the FP8 GEMM against fp32 math, consuming a
QuantizedActivation without quantizing again, and tensor parallelism (TP=2 on CPU with gloo)."""

import pytest
import torch
from gloo_tp2 import run_tp2

from vllm.config.quantization import parse_quantization_config
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
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import per_token_fp8_quant
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
    x = (torch.randn(7, 256) * 2).to(torch.bfloat16).to(DEVICE)
    out = layer(x)[0].float().cpu()
    xf = x.float().cpu()
    ref = xf @ weight.t() + layer.bias.float().cpu()
    bound = gemm_bound(xf, weight, layer.weight_scale.cpu()) + ref.abs() * 2**-8  # + bf16 output
    assert ((out - ref).abs() <= bound).all()


def test_prequantized_input_is_not_quantized_again(monkeypatch):
    layer, _ = ptpc_layer()
    assert get_input_quant_key(layer) == kFp8DynamicTokenSym
    x = torch.randn(2, 3, 256).to(torch.bfloat16).to(DEVICE)
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


def test_unquantized_layer_refuses_a_quantized_activation():
    layer = RowParallelLinear(64, 32, bias=False, params_dtype=torch.bfloat16)
    q, scale = per_token_fp8_quant(torch.randn(3, 64, device=DEVICE))
    qa = QuantizedActivation(q, scale, torch.bfloat16, q.shape, kFp8DynamicTokenSym)
    assert get_input_quant_key(layer) is None
    with pytest.raises(ValueError, match="expects None"):
        layer.to(DEVICE)(qa)


def test_merged_column_loads_shards_into_place():
    layer = MergedColumnParallelLinear(16, [8, 24], bias=False, params_dtype=torch.float32)
    a, b = torch.randn(8, 16), torch.randn(24, 16)
    layer.weight_loader(layer.weight, b, 1)
    layer.weight_loader(layer.weight, a, 0)
    assert torch.equal(layer.weight, torch.cat([a, b]))
    with pytest.raises(ValueError, match="shape"):
        layer.weight_loader(layer.weight, torch.randn(9, 16), 0)
    with pytest.raises(ValueError, match="shard_id 2"):
        layer.weight_loader(layer.weight, a, 2)
    fused = torch.randn(32, 16)
    layer.weight_loader(layer.weight, fused)  # the fused tensor as a whole
    assert torch.equal(layer.weight, fused)
    with pytest.raises(ValueError, match="expected 32 rows"):
        layer.weight_loader(layer.weight, torch.randn(33, 16))


def test_replicated_linear_rejects_wrong_shape():
    layer = ReplicatedLinear(16, 8, params_dtype=torch.float32, prefix="m.proj")
    with pytest.raises(ValueError, match=r"m\.proj: checkpoint shape \(8, 15\), expected"):
        layer.weight_loader(layer.weight, torch.randn(8, 15))


# ---------------------------------------------------------------------------------------------
# TP=2 over gloo, two processes
# ---------------------------------------------------------------------------------------------


def _tp_worker(rank: int):
    layer, _ = ptpc_layer(RowParallelLinear, bias=True)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out = layer(x.chunk(2, dim=-1)[rank])[0]
    return layer.weight_scale.clone(), out.clone()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo test runs on CPU")
def test_tp2_row_parallel_matches_tp1():
    layer, weight = ptpc_layer(RowParallelLinear, bias=True)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out_tp1 = layer(x)[0].float()
    xf = x.float()
    exact = xf @ weight.t() + layer.bias.float()
    results = run_tp2(_tp_worker)
    for rank in (0, 1):
        scale, out = results[rank]
        # MAX-reduced channel amax: every shard uses the unsharded layer's scales.
        assert torch.equal(scale, layer.weight_scale)
        # Each rank quantizes its half of x with its own per-token scale and rounds its partial
        # product to bf16 before the sum: the fp8 bound per shard plus three bf16 roundings.
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
    x = torch.randn(4, 256).to(torch.bfloat16).to(DEVICE)
    out = layer(x)[0].float().cpu()
    ref = x.float().cpu() @ weight.t()
    # One scale for the whole tensor: coarser than per token, still within a few percent here.
    assert ((out - ref).norm() / ref.norm()) < 0.05
    q, scale = per_token_fp8_quant(x)
    with pytest.raises(ValueError, match="expects None"):
        layer(QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym))


def test_bad_kernel_override_is_reported(monkeypatch):
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "NoSuchKernel")
    with pytest.raises(ValueError, match="VLLM_FP8_LINEAR_KERNEL='NoSuchKernel' is not one of"):
        ptpc_layer()
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", "AiterPerTokenFp8ScaledMMLinearKernel")
    if not current_platform.is_rocm():
        with pytest.raises(ValueError, match="AiterPerTokenFp8ScaledMMLinearKernel: needs ROCm"):
            ptpc_layer()


@pytest.mark.gpu
def test_gpu_rowwise_scaled_mm_consumes_and_matches_bound():
    if not current_platform.is_cuda():
        pytest.skip("the rowwise torch._scaled_mm kernel is the CUDA choice")
    layer, weight = ptpc_layer(RowParallelLinear, k=1536, n=7168, bias=False)
    assert type(layer.fp8_linear).__name__ == "RowWiseTorchFP8ScaledMMLinearKernel"
    assert get_input_quant_key(layer) == kFp8DynamicTokenSym
    x = torch.randn(33, 1536, device="cuda").to(torch.bfloat16)
    out = layer(x)[0]
    q, scale = per_token_fp8_quant(x)
    fused = layer(QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym))[0]
    assert torch.equal(out, fused)
    xf = x.float().cpu()
    ref = xf @ weight.t()
    bound = gemm_bound(xf, weight, layer.weight_scale.cpu()) + ref.abs() * 2**-8
    assert ((out.float().cpu() - ref).abs() <= bound).all()
