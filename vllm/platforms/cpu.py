"""CPU platform: torch reference paths, e4m3fn FP8 (as upstream's base platform)."""

from vllm.platforms.interface import Platform, PlatformEnum


class CpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_type = "cpu"
