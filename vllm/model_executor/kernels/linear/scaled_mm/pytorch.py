"""FP8 scaled-mm kernels built on torch: rowwise `_scaled_mm` (CUDA sm_89+, and ROCm CDNA3+ through
hipBLASLt), a per-tensor kernel, and a portable fallback that runs anywhere (CPU included).
"""

import torch

import vllm.platforms
from vllm.model_executor.kernels.linear import gemv as gemv_op
from vllm.model_executor.kernels.linear import gemv_config as gemv_cfg
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearKernel,
    FP8ScaledMMLinearLayerConfig,
    ptpc_mismatch,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)


class RowWiseTorchFP8ScaledMMLinearKernel(FP8ScaledMMLinearKernel):
    """PTPC GEMM: `torch._scaled_mm` with `[M, 1]` and `[1, N]` fp32 scales, bf16 out, on CUDA
    sm_89+ and on ROCm CDNA3+ (gfx94x, gfx95x: hipBLASLt's rowwise scaled GEMM, which has bf16
    output only; upstream selects it there after the AITER kernels).

    On NVIDIA, at most `max(FP8_GEMV_MAX_M, FP8_DOT_MAX_M)` rows against a weight of at most
    `FP8_GEMV_MAX_WEIGHT_NUMEL` elements (kernels/linear/gemv_config.py) take the Triton GEMV
    instead (it reads such weights at a higher share of HBM bandwidth at these sizes; above
    `FP8_GEMV_MAX_M` rows through FP8 MMAs, see kernels/linear/gemv.py). ROCm never does: the GEMV
    was measured and validated on NVIDIA only.

    Consumes a pre-quantized per-token activation, so the KDA epilogue fusion engages with this
    kernel on both platforms (a deviation: upstream's, ROCm-only there, and its CUDA kernels
    return no key).
    """

    def __init__(self, config: FP8ScaledMMLinearLayerConfig) -> None:
        super().__init__(config)
        # Decided once, off the per-call path: the platform does not change after start-up.
        self._gemv_allowed = vllm.platforms.current_platform.is_cuda()

    @classmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        platform = vllm.platforms.current_platform
        if platform.is_rocm():
            if not platform.on_mi3xx():
                return False, (
                    f"rowwise FP8 _scaled_mm needs CDNA3 or newer (gfx94x, gfx95x) on ROCm, "
                    f"got {platform.gcn_arch}"
                )
            return True, None
        if not platform.is_cuda():
            return False, "needs CUDA or ROCm"
        if platform.device_capability < (8, 9):
            return False, "rowwise FP8 _scaled_mm needs sm_89 or newer"
        return True, None

    @classmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        if reason := ptpc_mismatch(config):
            return False, reason
        if config.out_dtype != torch.bfloat16:
            return False, "rowwise _scaled_mm produces bf16 only"
        n, k = config.weight_shape
        if n % 16 or k % 16:
            return False, f"N and K must be multiples of 16, got N={n} K={k}"
        return True, None

    def input_quant_key(self) -> QuantKey | None:
        return kFp8DynamicTokenSym

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        if not a.is_cuda:  # a layer kept on the CPU of a GPU host (tests, references)
            return dequantized_matmul(a, b, out_dtype, a_scale, b_scale, bias)
        # HIP tensors report is_cuda too: the platform, not the tensor, keeps ROCm off the GEMV.
        if self._gemv_allowed and gemv_cfg.use_fp8_gemv(a.shape[0], b):
            # b.t() is the row-major [N, K] codes the GEMV streams along K; the layer's
            # parameters, static (gemv.py).
            return gemv_op.gemv_fp8(a, a_scale, b.t(), b_scale, bias, out_dtype, static_weight=True)
        # b is the [K, N] transposed view of row-major [N, K] codes: column-major, as required.
        return torch._scaled_mm(
            a, b, scale_a=a_scale, scale_b=b_scale.t(), bias=bias, out_dtype=out_dtype
        )


class PerTensorTorchFP8ScaledMMLinearKernel(FP8ScaledMMLinearKernel):
    """Dynamic per-tensor activation scale with per-channel weights, quantized inside the kernel.

    Cannot take a per-token pre-quantized activation (one scale per tensor), so it returns no
    input key: a producer seeing such a layer hands it the plain activation. Only chosen when
    forced (`VLLM_FP8_LINEAR_KERNEL`).
    """

    @classmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        return True, None

    @classmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        if config.weight_quant_key != kFp8StaticChannelSym:
            return False, "only per-channel weights"
        return True, None

    def quantize_input(self, x_2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        current_platform = vllm.platforms.current_platform
        fp8_max = current_platform.fp8_max()
        xf = x_2d.float()
        # torch's amax of no elements is an error: an empty batch takes the zero-row policy.
        amax = xf.abs().amax().reshape(1, 1) if xf.numel() else xf.new_zeros(1, 1)
        scale = torch.clamp(amax / amax.new_full((), fp8_max), min=current_platform.fp8_min_scale())
        q = (xf * torch.reciprocal(scale)).to(current_platform.fp8_dtype())
        return q, scale.expand(x_2d.shape[0], 1)

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        return dequantized_matmul(a, b, out_dtype, a_scale, b_scale, bias)


class ChannelWiseTorchFP8ScaledMMLinearKernel(FP8ScaledMMLinearKernel):
    """Portable PTPC fallback (CPU and anything else): dequantize and multiply in fp32.

    Exact up to fp32 accumulation order, and it consumes a pre-quantized activation like the GPU
    kernels, so the fused and unfused paths can be compared anywhere.
    """

    @classmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        return True, None

    @classmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        if reason := ptpc_mismatch(config):
            return False, reason
        return True, None

    def input_quant_key(self) -> QuantKey | None:
        return kFp8DynamicTokenSym

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        return dequantized_matmul(a, b, out_dtype, a_scale, b_scale, bias)


def dequantized_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`(a * a_scale) @ (b * b_scale^T)` in fp32: the scales factor out of the integer-like sum."""
    out = (a.float() @ b.float()) * a_scale * b_scale.reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
