"""``vllm.triton_utils.launch``: which calls reuse a compiled kernel, and (on a GPU) that the
launch key picks the compiled kernel Triton's own dispatch would.

Without a GPU the fast path is driven through stand-ins for Triton's ``JITFunction``,
``CompiledKernel`` and driver, so the caching rules are checked on every machine.
"""

import functools
import inspect
import math
import types

import pytest
import torch

import vllm.triton_utils.launch as launch_module
from vllm.triton_utils.launch import LaunchSpec, launch

# ---------------------------------------------------------------------------------------------
# Caching rules, with stand-ins for Triton
# ---------------------------------------------------------------------------------------------


def _kernel_fn(x_ptr, n, scale, BLOCK, ROWS=4):  # the stand-in kernel's signature
    pass


class FakeCompiled:
    """A CompiledKernel: ``compiled[grid](...)`` (the path with launch hooks) and ``run``, its
    launcher, called with the grid, stream, handle and metadata before the arguments."""

    function = "handle"
    packed_metadata = "packed"

    def __init__(self, log: list) -> None:
        self.log = log

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.log.append(("compiled", grid, args, stream))

        return runner

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        assert (function, packed, metadata, enter, exit_) == ("handle", "packed", None, None, None)
        self.log.append(("run", (gx, gy, gz), args, stream))


class FakeJIT:
    """Launches like a JITFunction: ``kernel[grid](*args, **kwargs)`` returns the compiled one."""

    signature = inspect.signature(_kernel_fn)

    def __init__(self) -> None:
        self.log: list = []
        self.compiled = FakeCompiled(self.log)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("plain", grid, args, kwargs))
            return self.compiled

        return run

    def kinds(self) -> list[str]:
        return [entry[0] for entry in self.log]


class FakeDriver:
    def __init__(self) -> None:
        self.device = 0

    @property
    def active(self):
        return self

    def get_current_device(self) -> int:
        return self.device

    def get_current_stream(self, device: int) -> int:
        return 1000 + device


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on a CUDA device, as the fast path requires."""

    @property
    def is_cuda(self) -> bool:
        return True


def cuda_like(n: int) -> torch.Tensor:
    return torch.zeros(n).as_subclass(CudaLike)


class FakeHookChain:
    def __init__(self) -> None:
        self.calls: list = []


@pytest.fixture
def fake_triton(monkeypatch):
    driver = FakeDriver()
    runtime = types.SimpleNamespace(
        launch_enter_hook=FakeHookChain(), launch_exit_hook=FakeHookChain()
    )
    monkeypatch.setattr(launch_module, "knobs", types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(launch_module, "HookChain", FakeHookChain)
    monkeypatch.setattr(launch_module, "_FAST", True)
    monkeypatch.setattr(launch_module, "JITFunction", FakeJIT)
    monkeypatch.setattr(launch_module, "CompiledKernel", FakeCompiled)
    monkeypatch.setattr(launch_module, "driver", driver)
    return driver


GRID = (3, 5, 7)


def test_second_call_launches_the_compiled_kernel(fake_triton):
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64, num_warps=4)
    x, y = cuda_like(64), cuda_like(64)
    launch(kernel, GRID, (x, 32, 0.5), spec)
    launch(kernel, GRID, (y, 32, 0.5), spec)  # other tensors, same dtype and alignment
    assert kernel.kinds() == ["plain", "run"]
    assert kernel.log[0] == ("plain", GRID, (x, 32, 0.5), {"BLOCK": 64, "num_warps": 4})
    # Every parameter positional, constexprs in signature order (ROWS from its default, no
    # num_warps: not a parameter), addresses for tensors, on the current device's stream.
    assert kernel.log[1] == ("run", GRID, (y.data_ptr(), 32, 0.5, 64, 4), 1000)
    assert spec.num_tensors == 1


@pytest.mark.parametrize(
    "first,second",
    [(16, 48), (16, 1), (1, True), (1, 1.0), (0.5, 0.25), (None, 0), (2**31, 2**31 + 16)],
    ids=str,
)
def test_a_new_non_tensor_value_or_type_takes_the_plain_path_once(fake_triton, first, second):
    """Non-tensors are in the key by value and type: 1, True and 1.0 are equal in Python but
    Triton specializes them apart."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for n in (first, second, first, second):
        launch(kernel, GRID, (x, n, 0.5), spec)
    assert kernel.kinds() == ["plain", "plain", "run", "run"]
    assert kernel.log[3][2][1] is second


def test_tensors_out_of_the_specs_layout_take_the_plain_path(fake_triton):
    """A spec's tensors are its first launch's leading arguments: a tensor after them, or a
    non-tensor among them, takes the plain path every time."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    launch(kernel, GRID, (x, 16, 0.5), spec)
    for _ in range(2):
        launch(kernel, GRID, (x, x, 0.5), spec)
        launch(kernel, GRID, (16, 16, 0.5), spec)
    assert kernel.kinds() == ["plain"] * 5 and len(spec.compiled) == 1
    launch(kernel, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds()[-1] == "run"


def test_dtype_device_and_kernel_are_in_the_key(fake_triton):
    kernel, other, spec = FakeJIT(), FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    launch(kernel, GRID, (x, 16, 0.5), spec)
    launch(kernel, GRID, (x.half(), 16, 0.5), spec)
    fake_triton.device = 1
    launch(kernel, GRID, (x, 16, 0.5), spec)
    launch(other, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds() == ["plain"] * 3 and other.kinds() == ["plain"]
    launch(other, GRID, (x, 16, 0.5), spec)
    assert other.log[-1] == ("run", GRID, (x.data_ptr(), 16, 0.5, 64, 4), 1001)


def test_alignment_is_in_the_key(fake_triton):
    """Triton specializes a pointer on its 16-byte alignment: an unaligned view (a mixed step's
    metadata after an odd number of decode rows) has a key of its own, reused like any other."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for _ in range(3):
        launch(kernel, GRID, (x[1:], 16, 0.5), spec)
    assert kernel.kinds() == ["plain", "run", "run"]
    assert kernel.log[-1][2][0] == x[1:].data_ptr()
    launch(kernel, GRID, (x, 16, 0.5), spec)  # aligned: another key
    launch(kernel, GRID, (x[4:], 16, 0.5), spec)  # 16 bytes in: aligned again
    launch(kernel, GRID, (x[3:], 16, 0.5), spec)  # unaligned another way: the first key
    assert kernel.kinds() == ["plain", "run", "run", "plain", "run", "run"]
    assert len(spec.compiled) == 2


def test_each_tensors_alignment_is_in_the_key(fake_triton):
    """Triton specializes every pointer apart: with one of two tensors unaligned, which one it is
    picks another compiled kernel (a key of whether all are aligned would launch the wrong one)."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x, y = cuda_like(64), cuda_like(64)
    launch(kernel, GRID, (x[1:], y, 0.5), spec)
    launch(kernel, GRID, (x, y[1:], 0.5), spec)  # the other one unaligned: another key
    launch(kernel, GRID, (x[1:], y[4:], 0.5), spec)  # as the first
    assert kernel.kinds() == ["plain", "plain", "run"]
    assert len(spec.compiled) == 2


def _descriptor(x: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(x.view(-1, 16), block)


def test_tma_descriptors_among_the_leading_tensors_are_passed_as_they_are(fake_triton):
    """A TensorDescriptor among the leading tensors takes the fast path, handed to the launcher
    itself (its wrapper builds the TMA descriptor at each launch); its dtype, block shape, shape
    and strides are in the key."""
    pytest.importorskip("triton.tools.tensor_descriptor")
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x, y = cuda_like(64), cuda_like(64)
    desc = _descriptor(y, [2, 16])
    launch(kernel, GRID, (x, desc, 0.5), spec)
    again = _descriptor(cuda_like(64), [2, 16])  # another base, the same layout
    launch(kernel, GRID, (x, again, 0.5), spec)
    assert kernel.kinds() == ["plain", "run"] and spec.num_tensors == 2
    assert kernel.log[1][2] == (x.data_ptr(), again, 0.5, 64, 4)
    launch(kernel, GRID, (x, _descriptor(y, [4, 16]), 0.5), spec)  # another block shape
    launch(kernel, GRID, (x, _descriptor(y.half(), [2, 16]), 0.5), spec)  # another dtype
    launch(kernel, GRID, (x, _descriptor(y[:32], [2, 16]), 0.5), spec)  # another shape
    assert kernel.kinds()[2:] == ["plain", "plain", "plain"]
    launch(kernel, GRID, (x, _descriptor(y[:32], [2, 16]), 0.5), spec)
    assert kernel.kinds()[-1] == "run" and len(spec.compiled) == 4


def test_a_descriptor_after_the_leading_tensors_or_off_the_gpu_takes_the_plain_path(fake_triton):
    pytest.importorskip("triton.tools.tensor_descriptor")
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for _ in range(2):
        launch(kernel, GRID, (x, 16, _descriptor(x, [2, 16])), spec)
    other = LaunchSpec(BLOCK=64)
    for _ in range(2):
        launch(kernel, GRID, (x, _descriptor(torch.zeros(64), [2, 16]), 0.5), other)
    assert kernel.kinds() == ["plain"] * 4 and not spec.compiled and not other.compiled


@pytest.mark.parametrize("odd", [(1, 2), 2.0j, "s", [1, 2]], ids=str)
def test_other_argument_types_take_the_plain_path(fake_triton, odd):
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for _ in range(2):
        launch(kernel, GRID, (x, odd, 0.5), spec)
    assert kernel.kinds() == ["plain", "plain"] and not spec.compiled


def test_not_a_jit_kernel_takes_the_plain_path(fake_triton):
    class Counted(FakeJIT):  # what the tests' launch counters look like: not the JIT class
        pass

    kernel, spec = Counted(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for _ in range(2):
        launch(kernel, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds() == ["plain", "plain"]


def test_nothing_cached_when_no_compiled_kernel_comes_back(fake_triton):
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    kernel.compiled = None  # e.g. a compile hook that skipped compilation
    x = cuda_like(64)
    for _ in range(2):
        launch(kernel, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds() == ["plain", "plain"] and not spec.compiled


def test_cache_is_bounded(fake_triton):
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for device in range(3 * launch_module._MAX_KEYS):
        fake_triton.device = device
        launch(kernel, GRID, (x, 16, 0.5), spec)
    assert 0 < len(spec.compiled) <= launch_module._MAX_KEYS


def test_plain_path_off_the_fast_platforms(monkeypatch):
    monkeypatch.setattr(launch_module, "_FAST", False)
    monkeypatch.setattr(launch_module, "JITFunction", FakeJIT)
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    for _ in range(2):
        launch(kernel, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds() == ["plain", "plain"]


def test_a_launch_hook_takes_tritons_compiled_runner(fake_triton):
    """With a hook in Triton's chain the launch goes through ``compiled[grid]``, which builds the
    launch metadata and calls the hooks; tensors are passed as tensors there."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    launch(kernel, GRID, (x, 16, 0.5), spec)
    hooks = launch_module.knobs.runtime
    for chain in (hooks.launch_enter_hook, hooks.launch_exit_hook):
        chain.calls.append(print)
        launch(kernel, GRID, (x, 16, 0.5), spec)
        chain.calls.clear()
    hooks.launch_enter_hook = print  # a hook set directly rather than added to the chain
    launch(kernel, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds() == ["plain", "compiled", "compiled", "compiled"]
    assert kernel.log[-1] == ("compiled", GRID, (x, 16, 0.5, 64, 4), 1000)
    hooks.launch_enter_hook = None
    launch(kernel, GRID, (x, 16, 0.5), spec)
    assert kernel.kinds()[-1] == "run"


def test_a_tensor_off_the_gpu_takes_the_plain_path(fake_triton):
    """Its address would reach the kernel unchecked; Triton's dispatch reports it instead."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    x = cuda_like(64)
    launch(kernel, GRID, (x, 16, 0.5), spec)
    for _ in range(2):
        launch(kernel, GRID, (torch.zeros(64), 16, 0.5), spec)
    assert kernel.kinds() == ["plain", "plain", "plain"]


def test_launch_spec_is_one_per_kernel_and_arguments(fake_triton):
    """`launch_spec` hands back the same spec (and so its compiled kernels) for the same kernel
    and arguments, and another for another kernel or other values."""
    kernel, other = FakeJIT(), FakeJIT()
    spec = launch_module.launch_spec(kernel, BLOCK=64, num_warps=4)
    assert launch_module.launch_spec(kernel, BLOCK=64, num_warps=4) is spec
    assert spec.kwargs == {"BLOCK": 64, "num_warps": 4}
    assert launch_module.launch_spec(other, BLOCK=64, num_warps=4) is not spec
    assert launch_module.launch_spec(kernel, BLOCK=32, num_warps=4) is not spec
    x = cuda_like(64)
    for _ in range(2):
        launch(kernel, GRID, (x, 16, 0.5), launch_module.launch_spec(kernel, BLOCK=64, num_warps=4))
    assert kernel.kinds() == ["plain", "run"]


_TRITON_NVIDIA_DRIVER = "triton.backends.nvidia.driver"


class CudaLauncher:
    """Triton 3.5-3.6's launcher: ``__call__`` inserts the flags and scratch buffers before the
    arguments and calls the C ``launch``; here ``launch`` logs what it received."""

    def __init__(self, log: list, global_scratch: int = 0, profile_scratch: int = 0,
                 cooperative: bool = False, pdl: bool = True) -> None:  # fmt: skip
        self.log = log
        self.global_scratch_size, self.profile_scratch_size = global_scratch, profile_scratch
        self.launch_cooperative_grid, self.launch_pdl = cooperative, pdl

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.log.append("__call__")
        sizes = (getattr(self, "global_scratch_size", 0), getattr(self, "profile_scratch_size", 0))
        scratch = [object() if size else None for size in sizes]
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, *scratch, *args)  # fmt: skip

    def launch(self, *args):
        self.log.append(("launch", args))


# Where Triton's own method lives: `_launcher` takes the C launch only behind that method.
CudaLauncher.__call__.__module__ = _TRITON_NVIDIA_DRIVER


def _as_tritons(call):
    call.__module__, call.__qualname__ = _TRITON_NVIDIA_DRIVER, "CudaLauncher.__call__"
    return call


@_as_tritons
def _later_call(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                launch_enter_hook, launch_exit_hook, *args):  # fmt: skip
    self.log.append("__call__")


@functools.wraps(CudaLauncher.__call__)
def _wrapped_call(self, *args, **kwargs):  # a tool's wrapper around Triton's method
    return CudaLauncher.__call__(self, *args, **kwargs)


def _hip_call(self, gridX, gridY, gridZ, stream, function, *args):  # 3.6's HIP order differs
    self.log.append("__call__")


def _subclass_call(self, gridX, gridY, gridZ, stream, function, *args):  # same parameters
    self.log.append("__call__")


class _NoScratchAttributes(CudaLauncher):
    def __init__(self, log: list) -> None:
        super().__init__(log)
        del self.global_scratch_size, self.profile_scratch_size


_hip_call.__module__ = "triton.backends.amd.driver"
# Triton 3.7 on: the metadata and hooks named in `__call__`, so not the 3.5-3.6 form.
LaterCudaLauncher = type("CudaLauncher", (CudaLauncher,), {"__call__": _later_call})
WrappedCudaLauncher = type("CudaLauncher", (CudaLauncher,), {"__call__": _wrapped_call})
HIPLauncher = type("HIPLauncher", (CudaLauncher,), {"__call__": _hip_call})
SubclassLauncher = type("Sub", (CudaLauncher,), {"__call__": _subclass_call})


def _launched_through(run, x: torch.Tensor | None = None) -> list:
    """What the launcher logged over a kernel's two launches on `x` (the second one reuses
    it)."""
    kernel, spec = FakeJIT(), LaunchSpec(BLOCK=64)
    kernel.compiled.run = run
    x = cuda_like(64) if x is None else x
    for _ in range(2):
        launch(kernel, GRID, (x, 16, 0.5), spec)
    return [entry[0] if isinstance(entry, tuple) else entry for entry in run.log]


@pytest.mark.parametrize("cooperative", [False, True])
@pytest.mark.parametrize("pdl", [False, True])
def test_triton_36_launcher_is_called_through_its_c_launch(fake_triton, cooperative, pdl):
    """With Triton 3.5-3.6's launcher and no scratch memory, a reused kernel skips the
    launcher's ``__call__`` and hands its C ``launch`` exactly what ``__call__`` would."""
    log: list = []
    run = CudaLauncher(log, cooperative=cooperative, pdl=pdl)
    x = cuda_like(64)
    assert _launched_through(run, x) == ["launch"]
    ref = CudaLauncher([], cooperative=cooperative, pdl=pdl)
    ref(*GRID, 1000, "handle", "packed", None, None, None, x.data_ptr(), 16, 0.5, 64, 4)
    (direct,) = [entry for entry in log if entry[0] == "launch"]
    assert direct[1] == ref.log[1][1]


@pytest.mark.parametrize(
    "run",
    [
        lambda: CudaLauncher([], global_scratch=64),
        lambda: CudaLauncher([], profile_scratch=64),
        lambda: LaterCudaLauncher([]),
        lambda: WrappedCudaLauncher([]),
        lambda: HIPLauncher([]),
        lambda: SubclassLauncher([]),
        lambda: _NoScratchAttributes([]),
    ],
    ids=[
        "global scratch", "profile scratch", "triton 3.7 on", "wrapped call", "hip",
        "subclass call", "no scratch attributes",
    ],
)  # fmt: skip
def test_other_launchers_keep_their_call(fake_triton, run):
    """Anything but Triton's own 3.5-3.6 CUDA method on a kernel without scratch memory is
    called as the launcher itself."""
    assert _launched_through(run())[0] == "__call__"


def test_the_installed_tritons_launcher():
    """Triton's real ``CudaLauncher`` (no GPU needed: made without its compile step): the C
    launch is taken exactly when its ``__call__`` has the 3.5-3.6 form, with the arguments that
    ``__call__`` hands it; any other version keeps the launcher."""
    nvidia = pytest.importorskip("triton.backends.nvidia.driver")
    import triton

    run = nvidia.CudaLauncher.__new__(nvidia.CudaLauncher)
    run.num_ctas, run.global_scratch_size, run.profile_scratch_size = 1, 0, 0
    run.global_scratch_align = run.profile_scratch_align = 1
    run.launch_cooperative_grid, run.launch_pdl = False, True
    seen = []
    run.launch = lambda *args: seen.append(args)
    compiled = types.SimpleNamespace(run=run, packed_metadata="packed")
    fn, head = launch_module._launcher(compiled)
    splat = triton.__version__.startswith(("3.5.", "3.6."))
    assert (fn is run.launch) == splat and (fn is run) != splat
    if splat:
        args = (7, 8, 9)
        fn(1, 2, 3, 99, "handle", *head, *args)
        run(1, 2, 3, 99, "handle", "packed", None, None, None, *args)
        assert seen[0] == seen[1]


# ---------------------------------------------------------------------------------------------
# GPU: the key against Triton's own dispatch
# ---------------------------------------------------------------------------------------------


def _gpu_probe_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe(x_ptr, y_ptr, n, a, b, scale, BLOCK: tl.constexpr):
        # y = x * scale + a % 7 + b % 5: every runtime argument reaches the output.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = x * scale + a % 7 + b % 5
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    return probe


def _probe_expected(x, scale, a, b, dtype):
    # Triton's % truncates like C (math.fmod), Python's floors.
    return (x.float() * scale + math.fmod(a, 7) + math.fmod(b, 5)).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 100, 4096])
@pytest.mark.parametrize(
    "dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.float16)], ids=str
)
@pytest.mark.parametrize(
    "a,b", [(1, 2), (16, 17), (2**31 - 16, -16), (2**31, 2**40 + 3), (-(2**33), 48)], ids=str
)
def test_gpu_reused_kernel_is_the_one_triton_picks(n, dtypes, a, b):
    """Whenever the launch key reuses a compiled kernel, Triton's dispatch (``warmup``) picks
    that same kernel for those arguments, and the launch computes the right values."""
    if not launch_module._FAST:
        pytest.skip("the fast path is CUDA-only")
    probe = _gpu_probe_kernel()
    dtype_in, dtype_out = dtypes
    spec = LaunchSpec(BLOCK=128, num_warps=4)
    grid = (-(-n // 128), 1, 1)
    x = torch.randn(n, device="cuda", generator=_cuda_gen(1)).to(dtype_in)
    y = torch.empty(n, dtype=dtype_out, device="cuda")
    launch(probe, grid, (x, y, n, a, b, 0.5), spec)  # plain: fills the cache
    assert torch.equal(y, _probe_expected(x, 0.5, a, b, dtype_out))
    (entry,) = spec.compiled.values()

    x2 = torch.randn(n, device="cuda", generator=_cuda_gen(2)).to(dtype_in)
    y2 = torch.empty(n, dtype=dtype_out, device="cuda")
    args2 = (x2, y2, n, a, b, 0.5)
    assert probe.warmup(*args2, grid=grid, **spec.kwargs) is entry.compiled
    launch(probe, grid, args2, spec)  # reuses it
    assert len(spec.compiled) == 1
    assert torch.equal(y2, _probe_expected(x2, 0.5, a, b, dtype_out))


@pytest.mark.gpu
def test_gpu_unaligned_view_launches_correctly():
    if not launch_module._FAST:
        pytest.skip("the fast path is CUDA-only")
    probe = _gpu_probe_kernel()
    spec = LaunchSpec(BLOCK=128, num_warps=4)
    # 4 bytes past an aligned address
    x = torch.randn(1001, device="cuda", generator=_cuda_gen(3))[1:]
    y = torch.empty(1000, device="cuda")
    for _ in range(2):
        y.zero_()
        launch(probe, (8, 1, 1), (x, y, 1000, 3, 4, 0.5), spec)
        assert torch.equal(y, _probe_expected(x, 0.5, 3, 4, torch.float32))
    # Cached under its own key, as the kernel Triton's dispatch compiled for the unaligned view.
    (entry,) = spec.compiled.values()
    assert probe.warmup(x, y, 1000, 3, 4, 0.5, grid=(8, 1, 1), **spec.kwargs) is entry.compiled
    aligned = torch.randn(1000, device="cuda", generator=_cuda_gen(5))
    launch(probe, (8, 1, 1), (aligned, y, 1000, 3, 4, 0.5), spec)
    assert torch.equal(y, _probe_expected(aligned, 0.5, 3, 4, torch.float32))
    assert len(spec.compiled) == 2
    assert len({e.compiled for e in spec.compiled.values()}) == 2  # Triton specialized them apart


@pytest.mark.gpu
def test_gpu_launch_hooks_run_on_reused_kernels():
    """A hook added to Triton's chain sees every launch, cached ones included; removed, the
    launch goes back to the bare launcher and still computes the right values."""
    if not launch_module._FAST:
        pytest.skip("the fast path is CUDA-only")
    from triton import knobs

    probe = _gpu_probe_kernel()
    spec = LaunchSpec(BLOCK=128, num_warps=4)
    y = torch.empty(1000, device="cuda")
    inputs = [torch.randn(1000, device="cuda", generator=_cuda_gen(4 + i)) for i in range(3)]
    launch(probe, (8, 1, 1), (inputs[0], y, 1000, 3, 4, 0.5), spec)
    seen = []

    def hook(metadata) -> None:
        seen.append(metadata)

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch(probe, (8, 1, 1), (inputs[1], y, 1000, 3, 4, 0.5), spec)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 1 and len(spec.compiled) == 1
    assert torch.equal(y, _probe_expected(inputs[1], 0.5, 3, 4, torch.float32))
    launch(probe, (8, 1, 1), (inputs[2], y, 1000, 3, 4, 0.5), spec)
    assert len(seen) == 1
    assert torch.equal(y, _probe_expected(inputs[2], 0.5, 3, 4, torch.float32))


def _cuda_gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


@pytest.mark.gpu
def test_gpu_reused_kernel_takes_the_c_launch_of_a_triton_36_launcher():
    """Where Triton's launcher has the 3.5-3.6 form, the cached launch calls its C ``launch``
    (elsewhere the launcher itself), and the values are right either way."""
    if not launch_module._FAST:
        pytest.skip("the fast path is CUDA-only")
    probe = _gpu_probe_kernel()
    spec = LaunchSpec(BLOCK=128, num_warps=4)
    x = torch.randn(1000, device="cuda", generator=_cuda_gen(7))
    y = torch.empty(1000, device="cuda")
    launch(probe, (8, 1, 1), (x, y, 1000, 3, 4, 0.5), spec)
    (entry,) = spec.compiled.values()
    import triton

    launcher = entry.compiled.run
    splat = triton.__version__.startswith(("3.5.", "3.6."))
    assert entry.run is (launcher.launch if splat else launcher)
    y.zero_()
    launch(probe, (8, 1, 1), (x, y, 1000, 3, 4, 0.5), spec)
    assert torch.equal(y, _probe_expected(x, 0.5, 3, 4, torch.float32))
