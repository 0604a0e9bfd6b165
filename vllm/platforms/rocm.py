"""AMD ROCm platform: FP8 flavour from the GCN arch, AITER availability.

Written to the documented ROCm facts (no AMD GPU is available to this project): `is_fp8_fnuz` is
true iff device 0's GCN arch name contains "gfx94" (MI300/MI325); gfx950 (MI355X) uses e4m3fn.
`on_mi3xx` is the arch gate of the FP8 GEMMs (hipBLASLt's rowwise `_scaled_mm`, AITER's hipb_mm).
"""

from functools import cached_property

import torch

from vllm.platforms.interface import Platform, PlatformEnum


class RocmPlatform(Platform):
    _enum = PlatformEnum.ROCM
    device_type = "cuda"  # HIP devices are addressed as "cuda" by torch

    def __init__(self, gcn_arch: str | None = None) -> None:
        # Tests pass the arch string; at run time it is read from device 0 once.
        self._gcn_arch_override = gcn_arch

    @cached_property
    def gcn_arch(self) -> str:
        if self._gcn_arch_override is not None:
            return self._gcn_arch_override
        return torch.cuda.get_device_properties(0).gcnArchName

    def is_fp8_fnuz(self) -> bool:
        return "gfx94" in self.gcn_arch

    def on_mi3xx(self) -> bool:
        """Whether device 0 is CDNA3 or newer: gfx94x (MI300/MI325, e4m3fnuz) or gfx95x (MI355X,
        e4m3fn), the archs with FP8 matrix cores. Upstream's `on_mi3xx` names gfx942 and gfx950;
        the prefixes also take the early MI300 parts (gfx940/941), of the same CDNA3 family."""
        return self.gcn_arch.startswith(("gfx94", "gfx95"))

    def triton_supports_fp8(self, dtype: torch.dtype) -> bool:
        # gfx94x converts to e4m3fnuz, gfx950 to OCP e4m3fn: only the arch's own flavour.
        return dtype == self.fp8_dtype()

    def has_aiter(self) -> bool:
        """Whether the `aiter` package imports. Imported lazily: never at module import."""
        try:
            import aiter  # noqa: F401
        except ImportError:
            return False
        return True
