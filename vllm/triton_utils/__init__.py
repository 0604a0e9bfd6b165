"""Where the fork's Triton kernels run: the one switch every op consults.

On a GPU (CUDA or ROCm, both `device.type == "cuda"` in torch) an op launches its Triton kernel.
On CPU it runs its torch reference, unless ``TRITON_INTERPRET=1`` asks for Triton's interpreter
(the tests do, to check the kernels without a GPU). The variable is read at each call, so a test
or a worker process can switch it without re-importing the ops.
"""

import os
from functools import cache

import torch

try:
    import triton
except ImportError:  # CPU-only installs without Triton use the torch references
    triton = None

HAS_TRITON = triton is not None


def triton_interpreting() -> bool:
    """Whether Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(device: torch.device) -> bool:
    """Whether an op on tensors of `device` launches its Triton kernel (else its reference)."""
    if not HAS_TRITON:
        return False
    return device.type == "cuda" or (device.type == "cpu" and triton_interpreting())


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= `n` (1 for `n <= 1`): Triton block sizes must be powers of
    two. Here, not from Triton, so launch configurations can be computed without it."""
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """The ceiling of `a / b` for host ints (grids, split counts). Not `triton.cdiv`, which
    Triton 3.9 makes a constexpr function: about 1.7 us of argument unwrapping a call on the
    development machine's CPU against 0.1 us, in launch paths that run it per layer."""
    return -(-a // b)


@cache
def _max_shared_memory(index: int) -> int:
    return getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0)


def max_shared_memory(device: torch.device) -> int:
    """Shared memory one program may use on `device` (bytes), for launch heuristics: no limit
    for the interpreter; 0 where torch does not report it (ROCm, old torch), which callers take
    as "only the small-memory launches"."""
    if device.type != "cuda":
        return 2**31
    return _max_shared_memory(
        device.index if device.index is not None else torch.cuda.current_device()
    )


def supports_tma(device: torch.device) -> bool:
    """Whether Triton kernels on `device` may load through TMA tensor descriptors
    (`triton.tools.tensor_descriptor.TensorDescriptor`): NVIDIA GPUs from Hopper (sm_90) on,
    which have the TMA unit (measured on the H200 only; later NVIDIA generations take the same
    descriptors). Not ROCm, where the kernels that could take them were not measured, and not
    the CPU interpreter, which runs them (the tests ask for them explicitly) but gains nothing."""
    if not HAS_TRITON or device.type != "cuda" or torch.version.hip is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index)[0] >= 9


@cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def num_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors (compute units on ROCm) of `device`, or of the current GPU when
    `device` is None: what launch heuristics size their grids by. 1 off the GPU, where the
    interpreter runs programs one after another."""
    if device is None:
        if not torch.cuda.is_available():
            return 1
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _num_sms(index)


@cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
