"""Launch a Triton kernel for less host time than ``kernel[grid](...)``.

``kernel[grid](*args, **constexprs)`` binds every argument, derives Triton's specialization of
each one, builds a cache key from all of them and looks the compiled kernel up, on every call:
for the fused gated-RMSNorm kernel (14 runtime and 9 constexpr parameters) about 20 us of Python
on the development machine's CPU, Triton 3.6 and 3.9 alike, several times what the kernel takes
at decode sizes. ``launch`` lets Triton do that once per *launch key* and afterwards hands the
arguments straight to the compiled kernel's launcher (``CompiledKernel.run``, the object Triton's
own ``compiled[grid](...)`` calls), with two savings on top of skipping the dispatch:

* tensors are passed as their device addresses. The launcher takes an int as the address
  itself; given a tensor it calls ``data_ptr()`` and asks the driver whether the address is a
  device pointer (``cuPointerGetAttribute``, one driver call a tensor). ``launch`` sends only
  CUDA tensors this way (any other takes the plain path, where Triton reports it).
* no launch metadata and no hook arguments while Triton's launch hooks are empty
  (``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``, empty hook chains unless a tool
  such as Proton adds one). Triton builds the metadata and passes the chains on every call
  otherwise; with a hook registered ``launch`` does the same, through ``compiled[grid]``.
* with Triton 3.5-3.6's CUDA launcher, the compiled C launch function itself
  (``CudaLauncher.launch``) instead of the launcher's Python ``__call__``, which for a kernel
  without scratch memory only inserts the launch's cooperative-grid and PDL flags and two
  ``None`` scratch buffers before the arguments, through a nested function and two calls: about
  1 us of Python a launch (for a kernel with TMA descriptors ``CudaLauncher.launch`` is Triton's
  Python wrapper around it, which builds them). Later launchers (3.7 on: the hook arguments
  named, the kernel's arguments passed as one tuple, a sanitizer's extra arguments) keep ``run``.

The launch key holds what Triton's specialization can depend on, the non-tensor arguments by
value, so a compiled kernel is reused only for calls that Triton's own dispatch would give it:

* the tensors: their dtypes, and whether each address is a multiple of 16 (Triton specializes a
  pointer on that, unless the kernel opts out; the key's split is then finer than Triton's, and
  two keys reuse one compiled kernel);
* TMA tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``) among the leading
  tensors: their base's dtype, block shape, shape, strides and padding (Triton 3.6 and 3.9
  specialize one on its dtype and block shape alone; the rest only makes the split finer). They
  are handed to the launcher as they are: its own wrapper builds each one's TMA descriptor at
  every launch, as for Triton's dispatch;
* every other argument (ints, floats, bools, None) by value and type (``1``, ``True`` and ``1.0``
  are equal in Python and specialize differently);
* the constexprs and launch options: the ``LaunchSpec`` (the key lives in it);
* the current device (a compiled kernel is loaded once per device).

A non-tensor that changes from call to call (a token count) thus costs one plain dispatch per new
value; within a step the same value repeats for every layer. A spec's tensors are the leading
arguments of its first call (``LaunchSpec.num_tensors``); a call with a tensor after them, a
non-tensor among them, or an argument of another type takes the plain path. So do kernels that
are not ``JITFunction`` s (Triton's interpreter, the tests' launch counters) and ROCm, whose
backend also specializes a pointer on the size of its buffer. What Triton does per call besides
the launch runs only when a launch key is first seen: reading its options from the environment
and knobs (``TRITON_DEBUG``, ...), checking that the globals a kernel reads have not changed since
it was compiled, and the ``JITFunction``'s pre-run and cache hooks.
"""

import inspect
from typing import Any, NamedTuple

import torch

from vllm.platforms import current_platform

try:
    from triton import knobs
    from triton.compiler import CompiledKernel
    from triton.knobs import HookChain
    from triton.runtime import JITFunction, driver
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # CPU-only installs without Triton launch no kernel
    CompiledKernel = HookChain = JITFunction = TensorDescriptor = driver = knobs = None

__all__ = ["LaunchSpec", "launch", "launch_spec"]

# Launch keys kept per spec: beyond this many (a non-tensor argument that keeps changing) the
# spec's cache starts over instead of growing.
_MAX_KEYS = 64
_Tensor = torch.Tensor
# The non-tensor argument types a key holds by value.
_SCALARS = frozenset((int, float, bool, type(None)))


class LaunchSpec:
    """The constexpr arguments and launch options (``num_warps``, ...) of one kernel variant,
    and the compiled kernels launched with them.

    Build one per variant and reuse it (from a ``functools.cache``-d builder): each spec holds its
    own cache of compiled kernels, and the number of leading tensor arguments its launches take
    (``num_tensors``, from the first launch).
    """

    __slots__ = ("kwargs", "compiled", "num_tensors")

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        # launch key -> _Compiled
        self.compiled: dict[tuple, _Compiled] = {}
        self.num_tensors: int | None = None

    def __repr__(self) -> str:
        return f"LaunchSpec({self.kwargs})"


# (kernel, constexprs and options) -> its LaunchSpec, for launch_spec.
_SPECS: dict[tuple, LaunchSpec] = {}


def launch_spec(kernel: Any, **kwargs: Any) -> LaunchSpec:
    """The one ``LaunchSpec`` of ``kernel`` with these constexprs and options (hashable values),
    made on first use: for launch sites that would otherwise need a cached builder of their own.

    Looking it up costs about 1 us of host time (a tuple of the arguments, hashed); keyed by the
    kernel too, so two kernels launched with equal arguments never share a spec's compiled
    kernels. The same values in another keyword order make another spec (each caches alike).
    """
    key = (kernel, *kwargs.items())
    spec = _SPECS.get(key)
    if spec is None:
        spec = _SPECS[key] = LaunchSpec(**kwargs)
    return spec


class _Compiled(NamedTuple):
    kernel: Any  # the JITFunction it was compiled from (specs may be shared between kernels)
    compiled: Any  # its CompiledKernel
    constexprs: tuple  # constexpr values in parameter order, passed after the runtime ones
    run: Any  # the launcher, or the C launch function it calls (_launcher)
    function: Any  # compiled.function: the loaded kernel's handle
    head: tuple  # what `run` takes between the handle and the kernel's arguments


# Parameters of Triton 3.5-3.6's `CudaLauncher.__call__`, whose body, for a kernel without
# scratch memory, is `self.launch(grid..., stream, function, launch_cooperative_grid, launch_pdl,
# None, None, *args)`. HIP's launcher of those versions takes the same parameters in another
# order, hence the module and name checks too.
_SPLAT_CALL = ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")
_CUDA_LAUNCHER = ("triton.backends.nvidia.driver", "CudaLauncher.__call__")


def _launcher(compiled: Any) -> tuple[Any, tuple]:
    """``(run, head)``: a kernel launches as ``run(grid..., stream, function, *head, *args)``.

    ``compiled.run`` with the metadata and no hooks, or, for Triton 3.5-3.6's CUDA launcher on a
    kernel without scratch memory, that launcher's C launch function with the arguments its
    ``__call__`` would add (module docstring).
    """
    run = compiled.run
    head = (compiled.packed_metadata, None, None, None)
    call = type(run).__call__
    # Triton's own method only: not a subclass's, nor a wrapper around it (hence no following
    # `__wrapped__` to the parameters of the function it wraps).
    if (
        (getattr(call, "__module__", None), getattr(call, "__qualname__", None)) == _CUDA_LAUNCHER
        and tuple(inspect.signature(call, follow_wrapped=False).parameters) == _SPLAT_CALL
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
    ):
        return run.launch, (run.launch_cooperative_grid, run.launch_pdl, None, None, *head)
    return run, head


# The fast path mirrors the CUDA backend's specialization only.
_FAST = JITFunction is not None and current_platform.is_cuda()


# What may stand among a launch's leading tensors (`launch`).
_TENSOR_LIKE = (_Tensor,) if TensorDescriptor is None else (_Tensor, TensorDescriptor)


def _descriptor_key(desc: Any) -> tuple:
    """A TMA descriptor's part of a launch key (module docstring): more than Triton's
    specialization reads, never less. Its base is 16-byte aligned (the descriptor checks)."""
    return (
        desc.base.dtype, tuple(desc.block_shape), tuple(desc.shape), tuple(desc.strides),
        getattr(desc, "padding", None),
    )  # fmt: skip


def _hook_idle(hook: Any) -> bool:
    return hook is None or (type(hook) is HookChain and not hook.calls)


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
    n = spec.num_tensors
    if n is None:
        n = spec.num_tensors = next(
            (i for i, a in enumerate(args) if not isinstance(a, _TENSOR_LIKE)), len(args)
        )
    active = driver.active
    device = active.get_current_device()
    key = [device]
    ptrs = []
    for a in args[:n]:
        if type(a) is TensorDescriptor and isinstance(a.base, _Tensor) and a.base.is_cuda:
            ptrs.append(a)
            key.append(_descriptor_key(a))
            continue
        if not (isinstance(a, _Tensor) and a.is_cuda):  # a non-tensor, or off the GPU
            kernel[grid](*args, **spec.kwargs)
            return
        ptr = a.data_ptr()
        ptrs.append(ptr)
        key.append(a.dtype)
        key.append(not ptr & 15)
    scalars = args[n:]
    types = tuple(map(type, scalars))
    if not _SCALARS.issuperset(types):  # a tensor past the leading ones, or another type
        kernel[grid](*args, **spec.kwargs)
        return
    key.append(scalars)
    key.append(types)
    key = tuple(key)
    hit = spec.compiled.get(key)
    if hit is not None and hit[0] is kernel:
        _, compiled, constexprs, run, function, head = hit
        stream = active.get_current_stream(device)
        runtime = knobs.runtime
        if _hook_idle(runtime.launch_enter_hook) and _hook_idle(runtime.launch_exit_hook):
            run(
                grid[0], grid[1], grid[2], stream, function, *head, *ptrs, *scalars, *constexprs
            )  # fmt: skip
        else:
            compiled[grid](*args, *constexprs, stream=stream)
        return
    compiled = kernel[grid](*args, **spec.kwargs)
    if isinstance(compiled, CompiledKernel):
        # The JITFunction's own `inspect.signature` of its function (Triton 3.6 and 3.9).
        params = list(kernel.signature.parameters.values())[len(args) :]
        constexprs = tuple(spec.kwargs.get(p.name, p.default) for p in params)
        if len(spec.compiled) >= _MAX_KEYS:
            spec.compiled.clear()
        run, head = _launcher(compiled)
        spec.compiled[key] = _Compiled(kernel, compiled, constexprs, run, compiled.function, head)
