"""Warm L2 with global memory a kernel will load later, without holding registers for it.

``prefetch_l2(ptrs)`` (``@triton.jit``, for kernels) issues NVIDIA's ``prefetch.global.L2`` for
every address of the pointer block: fire and forget, nothing comes back into registers, no
thread waits. A program whose main load has to come after a latency-bound prologue (the load's
registers must not be live during it) or whose software pipeline holds only a tile or two in
flight can start the DRAM reads early this way; the later ``tl.load`` then finds the lines in L2
or already on their way. One address per 128-byte line is enough (a prefetch fetches the line).

Only for compiled CUDA kernels: PTX inline assembly has no meaning on ROCm or in Triton's CPU
interpreter, so kernels take a ``PREFETCH`` constexpr set from ``l2_prefetch_supported`` and skip
the call otherwise.
"""

import torch

from vllm.platforms import current_platform
from vllm.triton_utils import triton_interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton launch no kernel
    triton = None

__all__ = ["L2_LINE_BYTES", "l2_prefetch_supported", "prefetch_l2"]

L2_LINE_BYTES = 128


def l2_prefetch_supported(device: torch.device) -> bool:
    """Whether kernels launched for ``device`` may call ``prefetch_l2``: compiled CUDA kernels."""
    return (
        triton is not None
        and device.type == "cuda"
        and current_platform.is_cuda()
        and not triton_interpreting()
    )


if triton is not None:

    @triton.jit
    def prefetch_l2(ptrs):
        """``prefetch.global.L2`` of every address in the pointer block ``ptrs`` (any shape)."""
        # The dummy output keeps Triton's elementwise-asm form; is_pure=False keeps the
        # instruction although nothing reads the result.
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
