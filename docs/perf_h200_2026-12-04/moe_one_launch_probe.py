"""Probe (H200): the one-token routed experts in one launch instead of two.

At one token the step's MoE is two bandwidth-bound launches per layer, gate/up (84.9 MB of w13
for 8 routed experts + the fused shared slot) and down (42.5 MB of w2), each with a ramp at its
start and a tail at its end. Here a persistent grid (`GRID` programs, all resident at once) runs
the gate/up tiles of the production kernel, then every program arrives at a counter (release),
spins until all have arrived (acquire), and runs the down rows; with `PRE` > 0 a program loads
the w2 rows of its first down tile's first `PRE` slots before it spins, so a program that
finishes its gate/up tiles early streams down weights while others finish theirs. The last
program to leave resets the two counters for the next launch.

Timed against the production `moe_experts_triton` (two launches, PDL) in one CUDA graph of 16
chains, each with its own random experts; us per chain and % of the eager copy bandwidth on the
127.4 MB of weights a chain reads. Outputs are compared with the production kernels' (the down
rows here are reduced in another layout, so the sums may differ in the last bits).

On CPU: `TRITON_INTERPRET=1 python moe_one_launch_probe.py --cpu` checks the one-launch kernel
against the production kernels at small shapes with GRID 1 (the interpreter runs programs one
after another, so a grid of several would wait forever at the counter).
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl

from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.fused_moe.experts_triton import _gate_up_step, moe_experts_triton
from vllm.triton_utils.pdl import pdl_options, pdl_wait, use_pdl


@triton.jit
def _down_tile(
    w2_ptr, ids_ptr, topk_w_ptr, a_ptr, out_ptr, tile, w_pre0, w_pre1,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOPK: tl.constexpr, BLOCK_H: tl.constexpr,
    PRE: tl.constexpr,
):  # fmt: skip
    """Down rows `tile * BLOCK_H ...` of all TOPK slots, weighted and summed as the production
    down kernel does; the first PRE slots' w2 rows are the ones passed in."""
    dtype = out_ptr.dtype.element_ty
    ii = tl.arange(0, INTER)
    h = tile * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < HIDDEN
    out = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + j).to(tl.int64)
        # `a` was written by other programs: read it from L2 (L1 is not coherent).
        av = tl.load(a_ptr + j * INTER + ii, cache_modifier=".cg").to(tl.float32)
        if PRE >= 1 and j == 0:
            w = w_pre0
        elif PRE >= 2 and j == 1:
            w = w_pre1
        else:
            w = tl.load(w2_ptr + e * (HIDDEN * INTER) + h[:, None] * INTER + ii[None, :],
                        mask=h_ok[:, None], other=0.0)  # fmt: skip
        acc = tl.sum(w.to(tl.float32) * av[None, :], axis=1)
        weight = tl.load(topk_w_ptr + j).to(tl.float32)
        out += acc.to(dtype).to(tl.float32) * weight
    tl.store(out_ptr + h, out.to(dtype), mask=h_ok)


@triton.jit
def _moe_one_launch_kernel(
    x_ptr, w13_ptr, w2_ptr, ids_ptr, topk_w_ptr, a_ptr, out_ptr, sem_ptr,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, GRID: tl.constexpr, PRE: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    pid = tl.program_id(0)
    NB: tl.constexpr = INTER // BLOCK_N
    kk = tl.arange(0, BLOCK_K)
    nn = tl.arange(0, BLOCK_N)
    dtype = out_ptr.dtype.element_ty
    for tile in range(pid, TOPK * NB, GRID):
        j = tile // NB
        e = tl.load(ids_ptr + j).to(tl.int64)
        n = (tile % NB) * BLOCK_N + nn
        n_ok = n < INTER
        gate_ptrs = w13_ptr + e * (2 * INTER * HIDDEN) + n[:, None] * HIDDEN + kk[None, :]
        up_ptrs = gate_ptrs + INTER * HIDDEN
        acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in tl.static_range(0, HIDDEN, BLOCK_K):
            acc_gate, acc_up = _gate_up_step(
                x_ptr, gate_ptrs, up_ptrs, kk, k0, HIDDEN, n_ok, acc_gate, acc_up
            )
        gate = acc_gate.to(dtype).to(tl.float32)
        up = acc_up.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        tl.store(a_ptr + j * INTER + n, (act * up).to(dtype), mask=n_ok)
    # Arrive: the barrier orders every thread's stores of `a` before the one-thread release.
    tl.debug_barrier()
    tl.atomic_add(sem_ptr, 1, sem="release", scope="gpu")

    ND: tl.constexpr = HIDDEN // BLOCK_H
    ii = tl.arange(0, INTER)
    h = pid * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < HIDDEN
    # The first tile's first PRE slots' w2 rows, loaded before the wait (w2 is never written).
    w_pre0 = tl.zeros([BLOCK_H, INTER], dtype=dtype)
    w_pre1 = tl.zeros([BLOCK_H, INTER], dtype=dtype)
    if PRE >= 1:
        e0 = tl.load(ids_ptr).to(tl.int64)
        w_pre0 = tl.load(w2_ptr + e0 * (HIDDEN * INTER) + h[:, None] * INTER + ii[None, :],
                         mask=h_ok[:, None], other=0.0)  # fmt: skip
    if PRE >= 2:
        e1 = tl.load(ids_ptr + 1).to(tl.int64)
        w_pre1 = tl.load(w2_ptr + e1 * (HIDDEN * INTER) + h[:, None] * INTER + ii[None, :],
                         mask=h_ok[:, None], other=0.0)  # fmt: skip
    arrived = tl.atomic_add(sem_ptr, 0, sem="acquire", scope="gpu")
    while arrived < GRID:
        arrived = tl.atomic_add(sem_ptr, 0, sem="acquire", scope="gpu")
    # GRID <= ND (checked on the host): every program has a first tile.
    _down_tile(w2_ptr, ids_ptr, topk_w_ptr, a_ptr, out_ptr, pid, w_pre0, w_pre1,
               HIDDEN, INTER, TOPK, BLOCK_H, PRE)  # fmt: skip
    for tile in range(pid + GRID, ND, GRID):
        _down_tile(w2_ptr, ids_ptr, topk_w_ptr, a_ptr, out_ptr, tile, w_pre0, w_pre1,
                   HIDDEN, INTER, TOPK, BLOCK_H, 0)  # fmt: skip
    # Leave: the last program out resets both counters (every program has passed the wait).
    left = tl.atomic_add(sem_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if left == GRID - 1:
        tl.store(sem_ptr, 0)
        tl.store(sem_ptr + 1, 0)


def one_launch(x, w13, w2, tw, ids, a, out, sem, grid, block_n, block_h, pre, warps, pdl):
    hidden, inter = x.shape[1], w2.shape[2]
    if grid > hidden // block_h:
        raise ValueError(f"grid {grid} exceeds the {hidden // block_h} down tiles")
    _moe_one_launch_kernel[(grid,)](
        x, w13, w2, ids, tw, a, out, sem,
        HIDDEN=hidden, INTER=inter, TOPK=ids.shape[1], BLOCK_N=block_n, BLOCK_K=256,
        BLOCK_H=block_h, GRID=grid, PRE=pre, num_warps=warps, **pdl_options(pdl),
    )  # fmt: skip


def resident_per_sm(grid, block_n, block_h, pre, warps, args) -> tuple[int, int]:
    """Programs of this launch one SM holds at once (registers, threads, shared memory)."""
    k = _moe_one_launch_kernel.warmup(
        *args, HIDDEN=2304, INTER=1024, TOPK=9, BLOCK_N=block_n, BLOCK_K=256, BLOCK_H=block_h,
        GRID=grid, PRE=pre, num_warps=warps, grid=(grid,), **pdl_options(use_pdl(args[0].device)),
    )  # fmt: skip
    k._init_handles()  # n_regs is read when the binary is loaded
    threads = 32 * warps
    regs = max(k.n_regs, 1)
    by_regs = 65536 // (((regs + 7) // 8 * 8) * threads)
    by_smem = (227 * 1024) // max(k.metadata.shared, 1)
    return min(by_regs, 2048 // threads, 32, by_smem), k.n_regs


def cpu_check() -> int:
    torch.manual_seed(0)
    H, INTER, E, K = 512, 64, 6, 3
    x = torch.randn(1, H, dtype=torch.float32)
    w13 = torch.randn(E, 2 * INTER, H) * 0.05
    w2 = torch.randn(E, H, INTER) * 0.05
    ids = torch.tensor([[4, 1, 5]], dtype=torch.int64)
    tw = torch.rand(1, K)
    ref = moe_experts_triton(x, w13, w2, tw, ids, SiluAndMul())
    a = torch.empty(K, INTER)
    out = torch.empty(1, H)
    sem = torch.zeros(2, dtype=torch.int32)
    for block_h, pre in ((1, 0), (2, 1), (4, 2)):
        one_launch(x, w13, w2, tw, ids, a, out, sem, 1, 8, block_h, pre, 4, False)
        diff = (out - ref).abs().max().item()
        print(f"cpu block_h {block_h} pre {pre}: max |diff| {diff:.3g}, counters {sem.tolist()}")
        if diff > 1e-5 or sem.tolist() != [0, 0]:
            return 1
    return 0


def graph_us(fn, chains: int, replays: int = 20, reps: int = 7) -> float:
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
        times.append(s.elapsed_time(e) * 1000 / replays / chains)
    return statistics.median(times)


def gpu() -> int:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    H, INTER, E, K = 2304, 1024, 257, 9
    chains = 16
    w13 = torch.randn(E, 2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(E, H, INTER, device=dev, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    ids = [torch.cat([torch.randperm(256, device=dev)[:8], torch.tensor([256], device=dev)])
           .view(1, K) for _ in range(chains)]  # fmt: skip
    tw = [torch.rand(1, K, device=dev) for _ in range(chains)]
    a = [torch.empty(K, INTER, device=dev, dtype=torch.bfloat16) for _ in range(chains)]
    outs = [torch.empty(1, H, device=dev, dtype=torch.bfloat16) for _ in range(chains)]
    sems = [torch.zeros(2, device=dev, dtype=torch.int32) for _ in range(chains)]
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        dst.copy_(src)
    e.record()
    torch.cuda.synchronize()
    copy_bw = 2 * src.numel() * 5 / (s.elapsed_time(e) / 1000)
    del src, dst
    nbytes = K * 3 * INTER * H * 2
    pdl = use_pdl(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; copy {copy_bw / 1e9:.0f} GB/s; {nbytes / 1e6:.1f} MB a chain; "
          f"PDL {pdl}; {sms} SMs")  # fmt: skip

    def prod():
        res = [None] * chains

        def fn():
            for i in range(chains):
                res[i] = moe_experts_triton(x, w13, w2, tw[i], ids[i], SiluAndMul())

        return fn, res

    fn, ref = prod()
    fn()
    torch.cuda.synchronize()
    ref = [r.clone() for r in ref]
    cases = [("production, two launches", prod()[0])]
    # One gate/up tile and one down tile a program where the grid is the tile count.
    for block_n, block_h, pre, warps, grid in ((8, 2, 0, 4, 1152), (8, 2, 1, 4, 1152),
                                               (8, 2, 2, 4, 1152), (16, 4, 0, 4, 576),
                                               (16, 4, 1, 4, 576), (16, 4, 2, 4, 576),
                                               (4, 1, 1, 2, 2304), (8, 2, 1, 4, 1056)):  # fmt: skip
        args = (x, w13, w2, tw[0], ids[0], a[0], outs[0], sems[0])
        fits, regs = resident_per_sm(grid, block_n, block_h, pre, warps, args)
        name = f"one launch n{block_n} h{block_h} pre{pre} w{warps} grid {grid} ({regs} regs)"
        if grid > fits * sms:
            print(f"{name}: skipped, {fits} programs an SM fit")
            continue

        def fn(grid=grid, block_n=block_n, block_h=block_h, pre=pre, warps=warps):
            for i in range(chains):
                one_launch(x, w13, w2, tw[i], ids[i], a[i], outs[i], sems[i], grid, block_n,
                           block_h, pre, warps, pdl)  # fmt: skip

        fn()
        torch.cuda.synchronize()
        pairs = list(zip(outs, ref, strict=True))
        diff = max((o.float() - r.float()).abs().max().item() for o, r in pairs)
        same = all(torch.equal(o, r) for o, r in pairs)
        ok = all(t.tolist() == [0, 0] for t in sems)
        print(f"{name}: max |diff| to production {diff:.3g}, bit-equal {same}, counters reset {ok}")
        cases.append((name, fn))
    results: dict[str, list[float]] = {}
    for _ in range(3):
        for name, fn in cases:
            results.setdefault(name, []).append(graph_us(fn, chains))
    for name, vals in results.items():
        us = statistics.median(vals)
        print(f"{name:52s} {us:7.2f} us  {nbytes / (us * 1e-6) / copy_bw * 100:5.1f}% of copy "
              f"[{', '.join(f'{v:.2f}' for v in vals)}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="check on CPU (TRITON_INTERPRET=1)")
    raise SystemExit(cpu_check() if p.parse_args().cpu else gpu())
