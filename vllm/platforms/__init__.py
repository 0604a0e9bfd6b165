"""`current_platform`: the one place that decides which hardware the fork runs on.

Resolution, once per process: `VLLM_TARGET_PLATFORM` if set (cuda | rocm | cpu), else ROCm when
torch is a HIP build with a visible GPU, CUDA when torch sees a CUDA GPU, CPU otherwise.
"""

import torch

from vllm import envs
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.cuda import CudaPlatform
from vllm.platforms.interface import Platform, PlatformEnum, supported_fp8_dtypes
from vllm.platforms.rocm import RocmPlatform

_PLATFORMS: dict[str, type[Platform]] = {
    "cuda": CudaPlatform,
    "rocm": RocmPlatform,
    "cpu": CpuPlatform,
}


def resolve_platform(name: str | None = None) -> Platform:
    """Build the platform named `name`, or detect it from torch when `name` is empty."""
    if name:
        try:
            return _PLATFORMS[name]()
        except KeyError:
            raise ValueError(
                f"VLLM_TARGET_PLATFORM={name!r} is not one of {sorted(_PLATFORMS)}"
            ) from None
    if torch.version.hip is not None and torch.cuda.is_available():
        return RocmPlatform()
    if torch.cuda.is_available():
        return CudaPlatform()
    return CpuPlatform()


current_platform: Platform = resolve_platform(envs.VLLM_TARGET_PLATFORM)

__all__ = [
    "CpuPlatform",
    "CudaPlatform",
    "Platform",
    "PlatformEnum",
    "RocmPlatform",
    "current_platform",
    "resolve_platform",
    "supported_fp8_dtypes",
]
