"""Probe (H200): the time one kernel node of a CUDA graph costs when it moves (almost) no bytes,
back to back, with and without programmatic dependent launch: the per-launch floor that a decode
step of a few hundred kernels pays on top of its bytes / bandwidth floor.

Kernels: `empty` (the PDL wait, nothing else), `touch` (each program loads 16 bytes of its own
and stores them: one dependent round trip), each at 1, 32 and 132 programs, 4 warps; 256 launches
a graph, median of 7 timings of 20 replays.
"""

import statistics

import torch
import triton
import triton.language as tl

from vllm.triton_utils.pdl import pdl_options, pdl_wait


@triton.jit
def _empty_kernel(PDL: tl.constexpr):
    pdl_wait(PDL)


@triton.jit
def _touch_kernel(src, dst, PDL: tl.constexpr):
    pdl_wait(PDL)
    offs = tl.program_id(0) * 4 + tl.arange(0, 4)
    tl.store(dst + offs, tl.load(src + offs) + 1.0)


def graph_us(fn, launches: int, replays: int = 20, reps: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(replays):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1000 / replays / launches)
    return statistics.median(times)


def main() -> int:
    n = 256
    bufs = [torch.zeros(132 * 4, device="cuda") for _ in range(n + 1)]
    name = torch.cuda.get_device_name()
    print(f"# {name}, torch {torch.__version__}, triton {triton.__version__}")
    print("kernel  programs  plain us  PDL us")
    for name in ("empty", "touch"):
        for programs in (1, 32, 132):
            row = []
            for pdl in (False, True):
                opts = pdl_options(pdl)

                def fn(programs=programs, opts=opts, name=name):
                    for i in range(n):
                        if name == "empty":
                            _empty_kernel[(programs,)](**opts)
                        else:
                            _touch_kernel[(programs,)](bufs[i], bufs[i + 1], **opts)

                row.append(graph_us(fn, n))
            print(f"{name:6s}  {programs:8d}  {row[0]:8.2f}  {row[1]:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
