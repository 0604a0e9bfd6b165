"""NVIDIA CUDA platform: e4m3fn FP8, Triton kernels, torch rowwise `_scaled_mm`."""

import torch

from vllm.platforms.interface import Platform, PlatformEnum


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_type = "cuda"

    def triton_supports_fp8(self, dtype: torch.dtype) -> bool:
        # NVIDIA GPUs have no e4m3fnuz conversions; fnuz requests use the torch reference.
        return dtype == torch.float8_e4m3fn

    def get_device_name(self) -> str:
        return torch.cuda.get_device_name(0)
