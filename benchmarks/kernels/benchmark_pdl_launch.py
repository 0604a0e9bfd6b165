"""Measure what programmatic dependent launch (PDL) saves between small kernels in a CUDA graph.

A batch-1 decode step of Kimi-Linear-48B runs ~300 kernels of 2-30 us in one CUDA graph, and about
0.6 ms of its ~3.2 ms forward is the gaps between them. PDL (sm_90+) lets a kernel launch while
the previous one drains: Triton's `launch_pdl=True` launch option, with `gdc_wait()` in the kernel
before it reads what the previous kernel wrote and `gdc_launch_dependents()` to release the next
one. This benchmark answers whether that is worth threading through the model's kernels.

It replays chains of --chain launches of one small kernel, each reading the previous one's output
(so the chain is serial), as one CUDA graph, in three forms: plain launches, PDL with the release
at the kernel's end ("late") and PDL with the release before the wait ("early"). Cases: a tiny
elementwise kernel (the 1-4 us launches of a decode step), and a GEMV-like one whose programs
first read an independent bf16 weight slice of --weight-cols columns, which PDL lets them issue
before the wait. Prints microseconds per kernel and checks every chain's result against its
closed form, so a missing dependency (a kernel reading before its producer finished) fails.

    python benchmarks/kernels/benchmark_pdl_launch.py
    python benchmarks/kernels/benchmark_pdl_launch.py --chain 400 --reps 50
"""

import argparse
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from vllm.utils.cli import positive_int, run_main

# (elements, elements per program, with a weight read): 16- and 128-program elementwise chains,
# then two 72-program GEMV-like chains over 2304 / 4608 weight rows.
CASES = [(4096, 256, False), (65536, 512, False), (2304, 32, True), (4608, 64, True)]
FORMS = {"plain": (False, False), "pdl-late": (True, False), "pdl-early": (True, True)}


@triton.jit
def _chain_step_kernel(
    x_ptr, y_ptr, w_ptr, n, stride_w,
    W_COLS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
    WEIGHT: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    acc = tl.zeros([BLOCK], tl.float32)
    if WEIGHT:
        # Independent of the previous kernel: under PDL it overlaps that kernel's tail.
        cols = tl.arange(0, W_COLS)
        w = tl.load(w_ptr + offs[:, None] * stride_w + cols[None, :], mask=ok[:, None], other=0.0)
        acc = tl.sum(w.to(tl.float32), axis=1)
    if PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    # +1 a step: a kernel that read its input before the previous one wrote it is off by 1 or
    # more at the end (a halving chain would have damped that away).
    tl.store(y_ptr + offs, x + acc * 1e-6 + 1.0, mask=ok)
    if PDL and not EARLY:
        gdc_launch_dependents()


def time_chain(
    chain: int, n: int, block: int, weight: bool, pdl: bool, early: bool, w_cols: int, reps: int
) -> tuple[float, float]:
    """(microseconds per kernel, max error of the chain's result against its closed form)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.zeros(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    weights = [
        torch.randn(n, w_cols, generator=gen, device="cuda").to(torch.bfloat16)
        for _ in range(8 if weight else 1)
    ]
    sums = [w.float().sum(1) * 1e-6 for w in weights] if weight else [torch.zeros_like(x)]
    grid = (triton.cdiv(n, block),)

    def run_chain():
        src, dst = x, y
        for i in range(chain):
            w = weights[i % len(weights)]
            _chain_step_kernel[grid](
                src, dst, w, n, w.stride(0), W_COLS=w_cols, BLOCK=block, PDL=pdl, EARLY=early,
                WEIGHT=weight, launch_pdl=pdl, num_warps=4,
            )  # fmt: skip
            src, dst = dst, src

    run_chain()  # compiles outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        run_chain()
    torch.cuda.current_stream().wait_stream(stream)
    x.zero_()
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    expect = torch.zeros_like(x)
    for i in range(chain):
        expect = expect + sums[i % len(sums)] + 1.0
    err = ((x if chain % 2 == 0 else y) - expect).abs().max().item()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / chain, err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chain", type=int, default=200, help="kernels per captured chain")
    parser.add_argument("--reps", type=int, default=20, help="graph replays per timing")
    parser.add_argument(
        "--weight-cols", type=positive_int, default=256, help="weight columns per row"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        parser.error("PDL needs an NVIDIA GPU of compute capability 9.0 or newer")
    if args.chain < 1 or args.reps < 1:
        parser.error("--chain and --reps must be >= 1")
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}; us per kernel (max err)")
    print(f"{'elements':>8} {'block':>5} {'weight':>6} " + " ".join(f"{f:>16}" for f in FORMS))
    worst = 0.0
    for n, block, weight in CASES:
        cells = []
        for pdl, early in FORMS.values():
            us, err = time_chain(
                args.chain, n, block, weight, pdl, early, args.weight_cols, args.reps
            )
            worst = max(worst, err)
            cells.append(f"{us:7.2f} ({err:.0e})")
        print(f"{n:>8} {block:>5} {str(weight):>6} " + " ".join(f"{c:>16}" for c in cells))
    # fp32 rounding of the weight sums only: a kernel that read stale input is off by >= 1.
    if worst > 1e-2:
        print(f"FAILED: a chain's result is off by {worst:.3g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
