"""NVIDIA CUDA platform: e4m3fn FP8, Triton kernels, torch rowwise `_scaled_mm`."""

from functools import cached_property

import torch

from vllm.platforms.interface import Platform, PlatformEnum


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_type = "cuda"

    @cached_property
    def device_capability(self) -> tuple[int, int]:
        return torch.cuda.get_device_capability(0)

    def triton_supports_fp8(self, dtype: torch.dtype) -> bool:
        # Triton emits e4m3fn from sm_89 on; NVIDIA has no e4m3fnuz. Otherwise: torch reference.
        return dtype == torch.float8_e4m3fn and self.device_capability >= (8, 9)
