"""The `Platform` base class: every hardware question the fork asks has its answer here.

Subclasses (`cuda.py`, `rocm.py`, `cpu.py`) override what differs. FP8 numbers used for dynamic
quantization live here and nowhere else, so the fused op, `per_token_fp8_quant`, the linear kernels
and the online weight quantization agree on them.
"""

import enum

import torch

# Dynamic-quantization maxima per FP8 dtype. e4m3fnuz can represent 240, but vLLM quantizes to 224
# (upstream `get_fp8_min_max` and the C++ `quant_type_max`): 240 measurably hurts accuracy of
# dynamic quantization on ROCm, so we follow upstream.
_FP8_MAX: dict[torch.dtype, float] = {
    torch.float8_e4m3fn: 448.0,
    torch.float8_e4m3fnuz: 224.0,
}


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    ROCM = enum.auto()
    CPU = enum.auto()


class Platform:
    """A device family. Instances are stateless apart from cached device facts."""

    _enum: PlatformEnum
    device_type: str

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_rocm(self) -> bool:
        return self._enum == PlatformEnum.ROCM

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_fp8_fnuz(self) -> bool:
        """Whether the platform's FP8 is the `fnuz` flavour (gfx94x only)."""
        return False

    def fp8_dtype(self) -> torch.dtype:
        """The FP8 dtype activations and weights are quantized to on this platform."""
        return torch.float8_e4m3fnuz if self.is_fp8_fnuz() else torch.float8_e4m3fn

    def fp8_max(self, dtype: torch.dtype | None = None) -> float:
        """The quantization maximum of `dtype`: 448 for e4m3fn, 224 for e4m3fnuz."""
        if dtype is None:
            dtype = self.fp8_dtype()
        try:
            return _FP8_MAX[dtype]
        except KeyError:
            raise ValueError(
                f"unsupported fp8 dtype {dtype}; expected one of {sorted(map(str, _FP8_MAX))}"
            ) from None

    def fp8_min_scale(self, dtype: torch.dtype | None = None) -> float:
        """Smallest dynamic scale `1 / (fp8_max * 512)`, as upstream's C++ kernel and QuantFP8."""
        return 1.0 / (self.fp8_max(dtype) * 512.0)

    def triton_supports_fp8(self, dtype: torch.dtype) -> bool:
        """Whether Triton kernels on this platform's GPU can emit `dtype`.

        The base answer is for Triton's CPU interpreter, which handles both flavours.
        """
        return dtype in _FP8_MAX

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def supported_fp8_dtypes() -> tuple[torch.dtype, ...]:
    """The FP8 dtypes this fork can quantize to."""
    return tuple(_FP8_MAX)
