"""Host time of one Triton launch, by how far into Triton's launch path the call starts.

Eager steps (prefill and mixed batches, which are not CUDA-graphed) pay the host's cost of every
launch, about 250 a step of Kimi-Linear-48B, and the fused op's wrapper target (<= 15 us a call)
is below what a plain `kernel[grid](...)` costs on the H200's host. This times one small kernel
(ten arguments, two of them constexpr) launched four ways, each checked to have written its
output:

  jit        `kernel[grid](*args, **constexprs)`: Triton's dispatch (binding and specialising
             the arguments, the cache lookup) and the launch
  compiled   the `CompiledKernel` that the first call returned, `compiled[grid](*args)`: no
             dispatch, but the launch metadata and the hooks on every call
  run        `compiled.run(...)` with the launch metadata made once: the C launcher alone
  launch     `vllm.triton_utils.launch`: the launch key, then the launcher with the tensors'
             addresses and no hook arguments (what the model's ops call)

and `torch.empty` of the output for scale. The compiled and run forms skip Triton's check that the
arguments still specialise as at the first call (dtypes, 16-byte alignment, integers equal to 1
or divisible by 16): a caller that used them would have to make that check itself.

    python benchmarks/kernels/benchmark_triton_launch.py
"""

import argparse
import sys
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from kernel_bench import require_gpu

from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.utils.cli import run_main

N = 4096
BLOCK = 256


@triton.jit
def _launch_probe_kernel(
    x_ptr, y_ptr, w_ptr, s_ptr, n, stride_a, stride_b, eps, D: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=ok) + eps, mask=ok)


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Host microseconds per call of `fn`, the best of three loops of `calls` after a warm-up."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000, help="launches per timed loop")
    args = parser.parse_args(argv)
    require_gpu(parser, gpu="CUDA or ROCm GPU", dry_run=False)
    if args.calls < 1:
        parser.error("--calls must be >= 1")
    x = torch.randn(N, device="cuda")
    y = torch.empty_like(x)
    w = torch.randn(128, device="cuda")
    s = torch.empty(16, device="cuda")
    grid = (triton.cdiv(N, BLOCK), 1, 1)
    runtime = (x, y, w, s, N, 128, 1, 1e-6)
    constexprs = (128, BLOCK)
    compiled = _launch_probe_kernel[grid](*runtime, D=128, BLOCK=BLOCK)
    runner = compiled[grid]
    stream = torch.cuda.current_stream().cuda_stream
    metadata = compiled.launch_metadata(grid, stream, *runtime, *constexprs)

    def jit() -> None:
        _launch_probe_kernel[grid](*runtime, D=128, BLOCK=BLOCK)

    def through_compiled() -> None:
        runner(*runtime, *constexprs)

    def run() -> None:
        compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, metadata,
                     None, None, *runtime, *constexprs)  # fmt: skip

    spec = LaunchSpec(D=128, BLOCK=BLOCK)

    def through_launch() -> None:
        launch(_launch_probe_kernel, grid, runtime, spec)

    def allocate() -> None:
        torch.empty(N, device="cuda")

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    forms = (("jit", jit), ("compiled", through_compiled), ("run", run), ("launch", through_launch))
    for name, form in forms:
        form()  # `launch`'s first call fills its cache: check the call that is timed
        y.zero_()
        form()
        torch.cuda.synchronize()
        if not torch.equal(y, x + 1e-6):
            print(f"{name}: the kernel did not write its output", file=sys.stderr)
            return 1
        print(f"{name:>12}: {host_us(form, args.calls):6.2f} us a launch")
    print(f"{'torch.empty':>12}: {host_us(allocate, args.calls):6.2f} us a call")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
