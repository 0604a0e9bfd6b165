"""CUDA PTPC FP8 linear kernel: the Triton small-M GEMM at decode sizes, rowwise `_scaled_mm` above.

Rowwise `torch._scaled_mm` tiles for large M and, on an H200, is slower at every M <= 256 than the
bf16 GEMM it replaces (issue 12). `fp8_small_m_gemm` reads the FP8 weight once for all tokens at
close to HBM bandwidth, so this kernel sends M <= `FP8_SMALL_M_THRESHOLD` there and everything
else to `_scaled_mm`. M is a static shape, so the choice is made per captured CUDA graph, with no
host sync. The weight layout, scales, input key and `QuantizedActivation` handling are
`RowWiseTorchFP8ScaledMMLinearKernel`'s: both paths read the same `[K, N]` view of the codes.
"""

from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    RowWiseTorchFP8ScaledMMLinearKernel,
)
from vllm.model_executor.kernels.linear.small_m_gemm import (
    fp8_small_m_gemm,
    use_fp8_small_m_gemm,
)
from vllm.model_executor.layers.quantization.utils.fp8_per_token import use_triton_fp8
from vllm.triton_utils import HAS_TRITON


class TritonSmallMFP8ScaledMMLinearKernel(RowWiseTorchFP8ScaledMMLinearKernel):
    """PTPC GEMM: `fp8_small_m_gemm` for M <= `FP8_SMALL_M_THRESHOLD`, else rowwise `_scaled_mm`.

    Force the plain rowwise kernel with
    `VLLM_FP8_LINEAR_KERNEL=RowWiseTorchFP8ScaledMMLinearKernel` (to compare, or as a fallback).
    """

    @classmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        if not HAS_TRITON:
            return False, "needs Triton"
        return super().is_supported()

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        if use_fp8_small_m_gemm(a.shape[0]) and use_triton_fp8(a.device, a.dtype):
            # b is the [K, N] view of row-major [N, K] codes: its transpose is the [N, K] rows.
            return fp8_small_m_gemm(a, a_scale, b.t(), b_scale, bias, out_dtype)
        return super().apply_scaled_mm(a, b, out_dtype, a_scale, b_scale, bias)
