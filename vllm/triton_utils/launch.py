"""Launch a Triton kernel for less host time than ``kernel[grid](...)``.

``kernel[grid](*args, **constexprs)`` binds every argument, derives Triton's specialization of
each one, builds a cache key from all of them and looks the compiled kernel up, on every call:
for the fused gated-RMSNorm kernel (14 runtime and 9 constexpr parameters) about 20 us of Python
on the development machine's CPU, Triton 3.6 and 3.9 alike, several times what the kernel takes
at decode sizes. ``launch`` does that once per *launch key* and afterwards calls the compiled
kernel the way Triton's tutorials launch the one ``warmup`` returns: ``compiled[grid](*args)``,
every parameter positional: about 4 us by the same measure (the C launcher left out of
both). Launch hooks still run on every launch.

The launch key must determine the specialization Triton picks, which Triton 3.6 and 3.9 derive
alike (tests/triton_utils/test_launch.py checks the key against ``JITFunction.warmup`` on a GPU):

* a tensor: its dtype and whether its address is a multiple of 16. The key takes that bit for all
  tensors at once: a call with any unaligned tensor takes the plain path, every time;
* an int: whether it is 1 (then passed as a constant), whether 16 divides it, and its width
  (i32, i64 or u64);
* a float: nothing (always fp32);
* the constexprs and launch options: the ``LaunchSpec`` (the key lives in it);
* the current device (a compiled kernel is loaded once per device).

Any other argument type takes the plain path, as do kernels that are not ``JITFunction`` s
(Triton's interpreter, the tests' launch counters) and ROCm, whose backend also specializes a
pointer on the size of its buffer. Triton's options from the environment (``TRITON_DEBUG``, ...)
are read, and its check that the globals a kernel reads have not changed since it was compiled
runs, when a launch key is first seen.
"""

import inspect
from typing import Any

import torch

from vllm.platforms import current_platform

try:
    from triton.compiler import CompiledKernel
    from triton.runtime import JITFunction, driver
except ImportError:  # CPU-only installs without Triton launch no kernel
    CompiledKernel = JITFunction = driver = None

__all__ = ["LaunchSpec", "launch"]

# Launch keys kept per spec: beyond this many (argument dtypes or int classes that keep changing)
# the spec's cache starts over instead of growing.
_MAX_KEYS = 64
_I32_MIN, _I32_MAX, _U64_MIN = -(2**31), 2**31 - 1, 2**63
_Tensor = torch.Tensor


class LaunchSpec:
    """The constexpr arguments and launch options (``num_warps``, ...) of one kernel variant,
    and the compiled kernels launched with them.

    Build one per variant and reuse it (from a ``functools.cache``-d builder): each spec holds its
    own cache of compiled kernels.
    """

    __slots__ = ("kwargs", "compiled")

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        # launch key -> (kernel, compiled kernel, constexpr values in parameter order)
        self.compiled: dict[tuple, tuple[Any, Any, tuple]] = {}

    def __repr__(self) -> str:
        return f"LaunchSpec({self.kwargs})"


# The fast path mirrors the CUDA backend's specialization only.
_FAST = JITFunction is not None and current_platform.is_cuda()


def launch(kernel: Any, grid: tuple[int, int, int], args: tuple, spec: LaunchSpec) -> None:
    """``kernel[grid](*args, **spec.kwargs)``, without Triton's argument binding after the first
    call with a launch key (see the module docstring).

    Args:
        kernel: a ``@triton.jit`` kernel, or anything that launches like one.
        grid: the program counts along the three axes.
        args: the kernel's runtime parameters (those before its first constexpr), in order.
        spec: the constexpr parameters and launch options.
    """
    if not _FAST or type(kernel) is not JITFunction:
        kernel[grid](*args, **spec.kwargs)
        return
    device = driver.active.get_current_device()
    key = [device]
    ptrs = 0
    for a in args:
        kind = type(a)
        if kind is int:
            if a == 1:
                key.append(None)
            elif _I32_MIN <= a <= _I32_MAX:
                key.append(not a & 15)
            else:
                key.append((a >= _U64_MIN, not a & 15))
        elif kind is float:
            key.append(float)
        elif isinstance(a, _Tensor):
            ptrs |= a.data_ptr()
            key.append(a.dtype)
        else:
            ptrs = 1  # a type the key does not mirror: plain path
            break
    if ptrs & 15:
        kernel[grid](*args, **spec.kwargs)
        return
    key = tuple(key)
    hit = spec.compiled.get(key)
    if hit is not None and hit[0] is kernel:
        hit[1][grid](*args, *hit[2], stream=driver.active.get_current_stream(device))
        return
    compiled = kernel[grid](*args, **spec.kwargs)
    if isinstance(compiled, CompiledKernel):
        params = list(inspect.signature(kernel.fn).parameters.values())[len(args) :]
        constexprs = tuple(spec.kwargs.get(p.name, p.default) for p in params)
        if len(spec.compiled) >= _MAX_KEYS:
            spec.compiled.clear()
        spec.compiled[key] = (kernel, compiled, constexprs)
