"""`RowWiseTorchFP8ScaledMMLinearKernel` on ROCm, on CPU with the platform faked (no AMD GPU here):
selection by arch and output dtype without AITER, and the rowwise `torch._scaled_mm` call it makes.

`torch._scaled_mm` has no CPU FP8 kernel, so a fake stands in: it checks what hipBLASLt's rowwise
scaled GEMM is handed (FP8 operands, a column-major `[K, N]` weight, `[M, 1]` / `[1, N]` fp32
scales, bf16 out) and computes with `dequantized_matmul`. The activation is a CPU tensor that
reports `is_cuda`, as a HIP tensor does, so the kernel takes its GPU path.
"""

import dataclasses

import pytest
import torch
from ptpc_layer import K, N, ptpc_o_proj

import vllm.platforms
from vllm.model_executor.kernels.linear import gemv as gemv_op
from vllm.model_executor.kernels.linear import init_fp8_linear_kernel
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    RowWiseTorchFP8ScaledMMLinearKernel,
    dequantized_matmul,
)
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    get_input_quant_key,
)
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import CudaPlatform, RocmPlatform

ROWWISE = "RowWiseTorchFP8ScaledMMLinearKernel"
CHANNELWISE = "ChannelWiseTorchFP8ScaledMMLinearKernel"


class HipLike(torch.Tensor):
    """A CPU tensor that reports `is_cuda`, as torch's HIP tensors do."""

    @property
    def is_cuda(self) -> bool:
        return True


@pytest.fixture
def rocm(monkeypatch):
    """Sets a ROCm platform of the given arch, with AITER off (its default) and nothing forced."""
    monkeypatch.delenv("VLLM_ROCM_USE_AITER", raising=False)
    monkeypatch.delenv("VLLM_FP8_LINEAR_KERNEL", raising=False)

    def make(arch: str) -> RocmPlatform:
        platform = RocmPlatform(gcn_arch=arch)
        monkeypatch.setattr(vllm.platforms, "current_platform", platform)
        return platform

    return make


@pytest.fixture
def scaled_mm(monkeypatch):
    """Fakes `torch._scaled_mm` with hipBLASLt's rowwise contract; returns the calls' (M, N, K)."""
    calls = []

    def fake(a, b, *, scale_a, scale_b, bias=None, out_dtype=None, **rest):
        fp8 = vllm.platforms.current_platform.fp8_dtype()
        m = a.shape[0]
        assert not rest and bias is None and out_dtype == torch.bfloat16
        assert a.dtype == b.dtype == fp8 and a.shape == (m, K) and a.is_contiguous()
        assert b.shape == (K, N) and b.stride() == (1, K)  # column-major [K, N]
        assert scale_a.shape == (m, 1) and scale_b.shape == (1, N)
        assert scale_a.dtype == scale_b.dtype == torch.float32
        assert scale_a.is_contiguous() and scale_b.is_contiguous()
        calls.append((m, N, K))
        out = dequantized_matmul(a, b, out_dtype, scale_a, scale_b.t(), bias)
        return out.as_subclass(torch.Tensor)

    monkeypatch.setattr(torch, "_scaled_mm", fake)
    return calls


def quantized_input(m: int, seed: int = 1) -> QuantizedActivation:
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    q, scale = per_token_fp8_quant(x)
    return QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym)


def on_gpu(qa: QuantizedActivation) -> QuantizedActivation:
    """`qa` with its data reporting `is_cuda`, so the kernel takes its GPU path."""
    return dataclasses.replace(qa, data=qa.data.as_subclass(HipLike))


@pytest.mark.parametrize("arch", ["gfx942:sramecc+:xnack-", "gfx950:sramecc+:xnack-"])
def test_selected_on_cdna3_and_newer_without_aiter(rocm, arch):
    rocm(arch)
    layer = ptpc_o_proj()
    assert type(layer.fp8_linear).__name__ == ROWWISE
    # The fused KDA epilogue sees a consumer of pre-quantized per-token input, as with AITER.
    assert get_input_quant_key(layer) == kFp8DynamicTokenSym


def test_older_arch_falls_back_to_the_portable_kernel(rocm, vllm_records):
    rocm("gfx90a:sramecc+:xnack-")  # MI250 (CDNA2): no FP8 matrix cores
    assert RowWiseTorchFP8ScaledMMLinearKernel.is_supported() == (
        False,
        "rowwise FP8 _scaled_mm needs CDNA3 or newer (gfx94x, gfx95x) on ROCm, "
        "got gfx90a:sramecc+:xnack-",
    )
    assert type(ptpc_o_proj().fp8_linear).__name__ == CHANNELWISE
    assert any("needs CDNA3 or newer" in r.getMessage() for r in vllm_records)


def test_fp16_output_is_refused(rocm, vllm_records):
    rocm("gfx950:sramecc+:xnack-")

    def selected(dtype: torch.dtype) -> str:
        keys = (kFp8DynamicTokenSym, kFp8StaticChannelSym)
        return type(init_fp8_linear_kernel(*keys, dtype, dtype, (N, K))).__name__

    assert selected(torch.bfloat16) == ROWWISE
    # hipBLASLt's rowwise scaled GEMM writes bf16 only: an fp16 layer takes the portable kernel.
    assert selected(torch.float16) == CHANNELWISE
    said = [r.getMessage() for r in vllm_records]
    assert any(f"{ROWWISE}: rowwise _scaled_mm produces bf16 only" in s for s in said), said


@pytest.mark.parametrize("m", [1, 5, 200])  # 1 and 5 rows take the GEMV on NVIDIA, 200 does not
def test_output_equals_the_portable_kernel_and_skips_the_gemv(rocm, scaled_mm, monkeypatch, m):
    # gfx950: its FP8 (e4m3fn) is the one this CPU process bound its quant keys to at import.
    rocm("gfx950:sramecc+:xnack-")
    monkeypatch.setattr(gemv_op, "gemv_fp8", lambda *a, **k: pytest.fail("GEMV called on ROCm"))
    layer = ptpc_o_proj()
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", CHANNELWISE)
    reference = ptpc_o_proj()  # the portable kernel on the same weights
    assert type(layer.fp8_linear).__name__ == ROWWISE
    assert type(reference.fp8_linear).__name__ == CHANNELWISE

    qa = quantized_input(m)
    out = layer(on_gpu(qa))[0]
    assert scaled_mm == [(m, N, K)]
    assert out.dtype == torch.bfloat16 and out.shape == (m, N)
    assert torch.equal(out, reference(qa)[0])


def test_nvidia_still_takes_the_gemv(monkeypatch, scaled_mm):
    """The control for the test above: the same call on CUDA goes to the GEMV, so that test's
    `_scaled_mm` is ROCm's doing, not the shape's. The layer's weight goes as a static one
    (gemv.py: its first tiles loaded before the PDL wait)."""
    hopper = CudaPlatform()
    hopper.__dict__["device_capability"] = (9, 0)  # cached_property: no GPU needed
    monkeypatch.setattr(vllm.platforms, "current_platform", hopper)
    monkeypatch.delenv("VLLM_FP8_LINEAR_KERNEL", raising=False)
    gemv_calls = []

    def gemv_fp8(a, a_scale, weight, w_scale, bias, out_dtype, *, static_weight):
        gemv_calls.append((tuple(a.shape), static_weight))
        return dequantized_matmul(a, weight.t(), out_dtype, a_scale, w_scale, bias)

    monkeypatch.setattr(gemv_op, "gemv_fp8", gemv_fp8)
    layer = ptpc_o_proj()
    assert type(layer.fp8_linear).__name__ == ROWWISE
    out = layer(on_gpu(quantized_input(1)))[0]
    assert gemv_calls == [((1, K), True)] and scaled_mm == []
    assert out.shape == (1, N)
