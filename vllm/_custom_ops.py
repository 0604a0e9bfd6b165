"""Python entry points of the optional native extension `vllm._C`.

The package works without it; callers check `has_native_ops()` first. Today it holds the unfused
path's native per-token FP8 quantization, used as the faithful baseline in the benchmarks.
"""

import torch

from vllm.platforms import current_platform

try:
    import vllm._C  # noqa: F401  (registers torch.ops._C.*)

    _HAS_C = True
except ImportError:
    _HAS_C = False


def has_native_ops() -> bool:
    """Whether `vllm._C` was built and imported."""
    return _HAS_C


def dynamic_per_token_scaled_fp8_quant(
    x: torch.Tensor, quant_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream-style native per-token FP8 quant of ``x`` ``[T, K]``: ``(q [T, K], scale [T, 1])``.

    Divides by the scale (as upstream's CUDA kernel) rather than multiplying by its reciprocal.
    """
    if not _HAS_C:
        raise RuntimeError("vllm._C is not built; install with VLLM_TARGET_DEVICE=cuda or rocm")
    if quant_dtype is None:
        quant_dtype = current_platform.fp8_dtype()
    out = torch.empty(x.shape, dtype=quant_dtype, device=x.device)
    scale = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(
        out, x, scale, current_platform.fp8_max(quant_dtype)
    )
    return out, scale
